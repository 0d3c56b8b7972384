package minipy_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// A sandbox's own egress rules narrow the engine's policy for it alone, E2B's way (Allow
// first, then Deny); they change at once, outlive a lost worker, and never widen the
// engine's policy.
func TestEgressRules(t *testing.T) {
	in := newInternet(t)
	port := in.port(in.http)
	// (intranet.test is 10.0.0.1, which the engine's address rule refuses.)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test:" + port, "evil.test:" + port, "127.0.0.2:" + port,
		"intranet.test:" + port}}, nil)
	a, b := e.NewNamespace(), e.NewNamespace()
	defer a.Close()
	defer b.Close()
	get := fmt.Sprintf(`import http.client
def get(host):
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
    c.request("GET", "http://%%s:%s/x" %% host)
    return c.getresponse().status
[get(h) for h in ("example.test", "evil.test", "127.0.0.2", "intranet.test")]`, port)
	ok, no := int64(200), int64(403)
	assert.Equal(t, []any{ok, ok, ok, no}, valueIn(t, e, a, get), "the engine's policy alone")

	require.NoError(t, a.SetEgressRules(&minipy.EgressRules{Allow: []string{"example.test"}, Deny: []string{"0.0.0.0/0"}}))
	assert.Equal(t, []any{ok, no, no, no}, valueIn(t, e, a, get), "only what Allow names")
	assert.Equal(t, []any{ok, ok, ok, no}, valueIn(t, e, b, get), "another sandbox's rules are its own")

	require.NoError(t, a.SetEgressRules(&minipy.EgressRules{Deny: []string{"127.0.0.2"}}))
	assert.Equal(t, []any{no, no, no, no}, valueIn(t, e, a, get), "an address denied, whatever its name")

	require.NoError(t, a.SetEgressRules(&minipy.EgressRules{Allow: []string{"127.0.0.0/8", "10.0.0.0/8"}, Deny: []string{"*"}}))
	assert.Equal(t, []any{ok, ok, ok, no}, valueIn(t, e, a, get), "a CIDR allowed; never what the engine refuses")

	require.NoError(t, a.SetEgressRules(&minipy.EgressRules{Deny: []string{"*"}}))
	_, err := e.Minipy("import os; os._exit(3)", &minipy.Options{Globals: a})
	require.Error(t, err)
	assert.Equal(t, []any{no, no, no, no}, valueIn(t, e, a, get), "the rules outlive a lost worker")
	require.NoError(t, a.SetEgressRules(nil))
	assert.Equal(t, []any{ok, ok, ok, no}, valueIn(t, e, a, get), "nil: the engine's policy alone again")
	in.requireDialedOnly(t)

	for _, bad := range []minipy.EgressRules{{Deny: []string{"example.test"}}, {Allow: []string{"example.test:80"}},
		{Allow: []string{"*"}}, {Deny: []string{"10.0.0.0/33"}}} {
		assert.Error(t, a.SetEgressRules(&bad), "%v", bad)
	}
	plain := newIsolated(t, minipy.IsolatedConfig{})
	ns := plain.NewNamespace()
	defer ns.Close()
	assert.ErrorIs(t, ns.SetEgressRules(&minipy.EgressRules{Deny: []string{"*"}}), minipy.ErrNoEgress, "no proxy to narrow")
	assert.Error(t, ns.SetEgressRules(&minipy.EgressRules{Deny: []string{"example.test"}}), "a bad rule, first")
	assert.NoError(t, minipy.EgressRules{Allow: []string{"*.example.test", "10.0.0.0/8"}, Deny: []string{"*"}}.Check())
}
