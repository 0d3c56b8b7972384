package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A sandbox's network rules (allowInternetAccess, network.allowOut and denyOut, and
// updateNetwork) narrow the server's -egress-allow for that sandbox alone, and never widen
// it. (The "internet" is two servers on 127.0.0.2 and 127.0.0.3, which -egress-allow-nets
// lets through; nothing leaves this machine.)
func TestE2BNetworkRules(t *testing.T) {
	var ports []string
	for _, addr := range []string{"127.0.0.2:0", "127.0.0.3:0"} {
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "reached")
		})}}
		srv.Start()
		defer srv.Close()
		_, port, _ := net.SplitHostPort(l.Addr().String())
		ports = append(ports, port)
	}
	s := startE2B(t, "-egress-allow", "127.0.0.2:"+ports[0]+",127.0.0.3:"+ports[1], "-egress-allow-nets",
		"127.0.0.2/32,127.0.0.3/32")
	alice := &e2bClient{t, s.base, aliceKey}
	fetch := fmt.Sprintf(`import urllib.request, urllib.error
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        return e.code
[get("http://127.0.0.2:%s/"), get("http://127.0.0.3:%s/")]`, ports[0], ports[1])
	reach := func(sb e2bSandbox) any {
		msgs := alice.execute(sb, fetch)
		require.NotEmpty(t, msgs)
		return msgs[len(msgs)-1]["json"]
	}
	both, first, none := []any{"reached", "reached"}, []any{"reached", 403.0}, []any{403.0, 403.0}

	open := alice.create(nil)
	assert.Equal(t, both, reach(open), "the server's policy alone")
	only := alice.create(map[string]any{"network": map[string]any{"denyOut": []string{"0.0.0.0/0"},
		"allowOut": []string{"127.0.0.2"}}})
	assert.Equal(t, first, reach(only), "allowOut over denyOut")
	denied := alice.create(map[string]any{"network": map[string]any{"denyOut": []string{"127.0.0.3/32"}}})
	assert.Equal(t, first, reach(denied))
	offline := alice.create(map[string]any{"allowInternetAccess": false})
	assert.Equal(t, none, reach(offline))
	assert.Equal(t, both, reach(open), "each sandbox's rules are its own")

	update := func(sb e2bSandbox, body map[string]any) int {
		b, _ := json.Marshal(body)
		req, err := http.NewRequest("PUT", s.base+"/sandboxes/"+sb.SandboxID+"/network", bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("X-API-Key", aliceKey)
		req.Header.Set("Content-Type", "application/json")
		code, _ := alice.do(req)
		return code
	}
	require.Equal(t, http.StatusNoContent, update(open, map[string]any{"denyOut": []string{"127.0.0.2"}}))
	assert.Equal(t, []any{403.0, "reached"}, reach(open), "updated: a previously reachable address denied")
	require.Equal(t, http.StatusNoContent, update(open, map[string]any{}))
	assert.Equal(t, both, reach(open), "omitted fields clear the rules")
	require.Equal(t, http.StatusNoContent, update(offline, map[string]any{"allowOut": []string{"10.0.0.0/8", "127.0.0.0/8"},
		"allow_internet_access": false}))
	assert.Equal(t, both, reach(offline), "allowed again, within the server's policy")
	assert.Equal(t, http.StatusBadRequest, update(open, map[string]any{"denyOut": []string{"example.com"}}), "names deny nothing")
	code, body := alice.api("POST", "/sandboxes", map[string]any{"network": map[string]any{"allowOut": []string{"a b"}}})
	assert.Equal(t, http.StatusBadRequest, code, "%s", body)
}
