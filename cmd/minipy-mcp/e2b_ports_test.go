package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// portServer is a server the sandbox's code starts on port: GET answers the Host and the
// headers it was given; an Upgrade request is switched and echoed, as a WebSocket's frames.
const portServer = `import http.server, json, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.headers.get("Upgrade"):
            self.send_response(101); self.send_header("Upgrade", "echo"); self.send_header("Connection", "Upgrade")
            self.end_headers(); self.wfile.flush()
            while True:
                b = self.rfile.read1(4096)
                if not b:
                    return
                self.wfile.write(b); self.wfile.flush()
        body = json.dumps({"host": self.headers["Host"], "headers": dict(self.headers), "path": self.path}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("0.0.0.0", %d), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
"serving"`

// A server the code starts is reached at E2B's PORT-ID host and by E2b-Sandbox-Port, with
// no token (public, as E2B's), HTTP and an upgraded connection both; the tokens that route
// the request are not given to it.
func TestE2BPorts(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	msgs := alice.execute(sb, fmt.Sprintf(portServer, 8000))
	require.Contains(t, fmt.Sprint(msgs), "serving", "%v", msgs)

	req := alice.sandboxRequest(sb, sb.EnvdAccessToken, 8000, "GET", "/page?q=1", nil)
	code, body := alice.do(req)
	require.Equal(t, http.StatusOK, code, "%s", body)
	var seen struct {
		Host    string            `json:"host"`
		Headers map[string]string `json:"headers"`
		Path    string            `json:"path"`
	}
	require.NoError(t, json.Unmarshal(body, &seen))
	assert.Equal(t, "/page?q=1", seen.Path)
	assert.NotContains(t, string(body), sb.EnvdAccessToken, "the sandbox's token is not the code's server's")
	assert.NotContains(t, seen.Headers, "E2b-Sandbox-Id")

	// E2B's host routing, as getHost(8000) gives it, without any token.
	u, err := url.Parse(s.base)
	require.NoError(t, err)
	host := "8000-" + sb.SandboxID + ".localhost" // (a server on loopback answers loopback names alone: loopguard)
	req, err = http.NewRequest("GET", s.base+"/", nil)
	require.NoError(t, err)
	req.Host = host
	code, body = alice.do(req)
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.NoError(t, json.Unmarshal(body, &seen))
	assert.Equal(t, host, seen.Host, "the Host the client asked for")

	// An upgraded connection, streamed both ways.
	c, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	for _, msg := range []string{"ping", "pong, longer"} {
		_, err = io.WriteString(c, msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(br, got)
		require.NoError(t, err)
		assert.Equal(t, msg, string(got))
	}

	// A port nothing listens on; a sandbox that is gone.
	code, body = alice.do(alice.sandboxRequest(sb, "", 8001, "GET", "/", nil))
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, string(body), "port is not open")
	code, _ = alice.api("DELETE", "/sandboxes/"+sb.SandboxID, nil)
	require.Equal(t, http.StatusNoContent, code)
	code, body = alice.do(alice.sandboxRequest(sb, "", 8000, "GET", "/", nil))
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, string(body), `"sandboxId":"`+sb.SandboxID+`"`)
	assert.Contains(t, string(body), "The sandbox was not found")
}

// network.allowPublicTraffic false: the ports answer only the traffic access token;
// maskRequestHost sets the Host the code's server sees.
func TestE2BPortsPrivate(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(map[string]any{"network": map[string]any{"allowPublicTraffic": false,
		"maskRequestHost": "localhost:${PORT}"}})
	require.Contains(t, fmt.Sprint(alice.execute(sb, fmt.Sprintf(portServer, 3000))), "serving")
	code, _ := alice.do(alice.sandboxRequest(sb, "", 3000, "GET", "/", nil))
	assert.Equal(t, http.StatusUnauthorized, code, "no token")
	req := alice.sandboxRequest(sb, "", 3000, "GET", "/", nil)
	req.Header.Set("E2B-Traffic-Access-Token", sb.TrafficAccessToken)
	code, body := alice.do(req)
	require.Equal(t, http.StatusOK, code, "%s", body)
	assert.Contains(t, string(body), `"host": "localhost:3000"`)
	assert.False(t, strings.Contains(string(body), sb.TrafficAccessToken), "the token is not passed on")
}
