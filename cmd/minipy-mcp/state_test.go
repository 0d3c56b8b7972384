package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/internal/testproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// switchable sends each request to the current replica, as a load balancer would, with a
// bearer token.
type switchable struct {
	to    atomic.Pointer[string]
	token string
}

func (s *switchable) RoundTrip(r *http.Request) (*http.Response, error) {
	base, _ := url.Parse(*s.to.Load())
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = base.Scheme, base.Host, base.Host
	r.Header.Set("Authorization", "Bearer "+s.token)
	return http.DefaultTransport.RoundTrip(r)
}

func (s *switchable) send(to *serverProc) { s.to.Store(&to.base) }

// savedSessions lists the saved sessions in dir.
func savedSessions(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.session"))
	require.NoError(t, err)
	return names
}

// A session outlives its replica: two replicas share a state directory; a rolling restart
// of both, one at a time, keeps a session's variables, functions, classes and files, under
// its own Mcp-Session-Id, for its own user only; the client ending it forgets its state.
func TestServeStateAcrossReplicas(t *testing.T) {
	dir := t.TempDir()
	tokens := tokenFile(t, "alice:"+tokenAlice, "bob:"+tokenBob)
	args := []string{"-backend", "isolated", "-tokens", tokens, "-state-dir", dir, "-state-idle", "100ms"}
	a, b := startServer(t, args...), startServer(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("A's log:\n%s\nB's log:\n%s", a.log, b.log)
		}
	})

	lb := &switchable{token: tokenAlice}
	lb.send(a)
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-state-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: a.base + "/mcp", HTTPClient: &http.Client{Transport: lb}}, legacy)
	require.NoError(t, err)
	defer cs.Close()
	text, isError := runText(t, cs, map[string]any{"code": "x = 41\ndef f(v):\n    return v + 1\n" +
		"class K:\n    def __init__(self):\n        self.n = 7\nk = K()\nopen('note.txt', 'w').write('kept')\nx"})
	require.False(t, isError, text)
	require.Eventually(t, func() bool { return len(savedSessions(t, dir)) == 1 }, 10*time.Second, 20*time.Millisecond,
		"saved after -state-idle")

	// B is asked for it while A holds it: it waits for A's lease, which A renews.
	// (Asserted by the unit test of leases; here A drains, and B takes it over.)
	a.stop(t)
	assert.Contains(t, a.log.String(), "drained")
	lb.send(b)
	text, isError = runText(t, cs, map[string]any{"code": "f(x), k.n, open('note.txt').read()"})
	require.False(t, isError, "%s\nB's log:\n%s", text, b.log)
	assert.Equal(t, "[value]\n(42, 7, 'kept')\n", text)

	a2 := startServer(t, args...)
	runText(t, cs, map[string]any{"code": "x += 1"})
	b.stop(t)

	// Bob has Alice's session id: the saved session is not his.
	hijack := postTo(t, a2, tokenBob, cs.ID(), `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":`+
		`{"name":"minipy","arguments":{"code":"x"}}}`)
	assert.Equal(t, http.StatusNotFound, hijack.StatusCode)

	lb.send(a2)
	text, isError = runText(t, cs, map[string]any{"code": "x, f(x)"})
	require.False(t, isError, "%s\nA2's log:\n%s", text, a2.log)
	assert.Equal(t, "[value]\n(42, 43)\n", text, "the call on B before its drain is kept")

	require.NoError(t, cs.Close()) // DELETE: the client ends it
	assert.Eventually(t, func() bool { return len(savedSessions(t, dir)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"an ended session's state is removed")
}

// runText runs code in cs and returns the reply's text (the first content: files add links).
func runText(t *testing.T, cs *mcp.ClientSession, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: minipy.ToolName, Arguments: args})
	require.NoError(t, err)
	require.NotEmpty(t, res.Content)
	text, ok := res.Content[0].(*mcp.TextContent)
	require.True(t, ok, "content is %T", res.Content[0])
	return text.Text, res.IsError
}

// postTo posts body to s in session id with token, and returns the response.
func postTo(t *testing.T, s *serverProc, token, id, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.base+"/mcp", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Session-Id", id)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// hwmOf is the peak resident memory of process pid so far (VmHWM), in bytes.
func hwmOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if kb, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// A session's save streams from its working directory into the state directory, and its
// resume streams back: 64 MiB of files, the server's peak memory grows by less than 32 MiB
// either way (0.4 MiB and 0.8 MiB; 197 MiB and 129 MiB when the store took a save whole).
func TestStateStreams(t *testing.T) {
	dir := t.TempDir()
	args := []string{"-backend", "isolated", "-work-size", "134217728", "-state-dir", dir, "-state-idle", "100ms"}
	a := startServer(t, args...)
	lb := &switchable{}
	lb.send(a)
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-state-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: a.base + "/mcp", HTTPClient: &http.Client{Transport: lb}}, legacy)
	require.NoError(t, err)
	defer cs.Close()
	before := hwmOf(t, a.cmd.Process.Pid)
	text, isError := runText(t, cs, map[string]any{"code": "import hashlib, os\nh = hashlib.sha256()\n" +
		"for i in range(8):\n    data = os.urandom(8 << 20)\n    h.update(data)\n" +
		"    open('part%d.bin' % i, 'wb').write(data)\ndel data\nwant = h.hexdigest()\nlen(want)"})
	require.False(t, isError, text)
	require.Eventually(t, func() bool {
		names := savedSessions(t, dir)
		if len(names) != 1 {
			return false
		}
		info, err := os.Stat(names[0])
		return err == nil && info.Size() > 64<<20
	}, 60*time.Second, 50*time.Millisecond, "saved after -state-idle")
	grew := hwmOf(t, a.cmd.Process.Pid) - before
	t.Logf("saving 64 MiB of files, the server's peak memory grew by %d KiB", grew>>10)
	assert.Less(t, grew, int64(32<<20))

	a.stop(t)
	b := startServer(t, args...)
	lb.send(b)
	before = hwmOf(t, b.cmd.Process.Pid)
	text, isError = runText(t, cs, map[string]any{"code": "h = hashlib.sha256()\nfor i in range(8):\n" +
		"    h.update(open('part%d.bin' % i, 'rb').read())\nh.hexdigest() == want"})
	require.False(t, isError, "%s\n%s", text, b.log)
	assert.Equal(t, "[value]\nTrue\n", text)
	grew = hwmOf(t, b.cmd.Process.Pid) - before
	t.Logf("resuming 64 MiB of files, the server's peak memory grew by %d KiB", grew>>10)
	assert.Less(t, grew, int64(32<<20))
}

// An E2B pause into the store streams each context's save through the seal into it, and
// connect streams them back: 64 MiB of files, the server's peak memory grows by less than
// 32 MiB either way.
func TestE2BPauseStreams(t *testing.T) {
	s := startE2B(t, "-work-size", "134217728", "-state-dir", t.TempDir())
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	require.Equal(t, "64", lastText(alice.execute(sb, "import hashlib, os\nh = hashlib.sha256()\n"+
		"for i in range(8):\n    data = os.urandom(8 << 20)\n    h.update(data)\n"+
		"    open('part%d.bin' % i, 'wb').write(data)\ndel data\nwant = h.hexdigest()\nlen(want)")))
	before := hwmOf(t, s.cmd.Process.Pid)
	code, body := alice.api("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil)
	require.Equal(t, http.StatusNoContent, code, "%s", body)
	grew := hwmOf(t, s.cmd.Process.Pid) - before
	t.Logf("pausing 64 MiB of files into the store, the server's peak memory grew by %d KiB", grew>>10)
	assert.Less(t, grew, int64(32<<20))

	before = hwmOf(t, s.cmd.Process.Pid)
	code, body = alice.api("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 60})
	require.Equal(t, http.StatusCreated, code, "%s", body)
	grew = hwmOf(t, s.cmd.Process.Pid) - before
	t.Logf("resuming them, the server's peak memory grew by %d KiB", grew>>10)
	assert.Less(t, grew, int64(32<<20))
	assert.Equal(t, "True", lastText(alice.execute(sb, "h = hashlib.sha256()\nfor i in range(8):\n"+
		"    h.update(open('part%d.bin' % i, 'rb').read())\nh.hexdigest() == want")))
}

// A session whose sandbox's pid 1 dies between calls (killed from outside: its code
// cannot) comes back from its last save: the next call finds its variables and files as
// they were saved, and runs, instead of an empty namespace.
func TestServeSessionPidOneDies(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, "-backend", "isolated", "-tokens", tokenFile(t, "alice:"+tokenAlice), "-state-dir", dir,
		"-state-idle", "100ms")
	lb := &switchable{token: tokenAlice}
	lb.send(s)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "minipy-state-test", Version: "0"}, nil).Connect(
		context.Background(), &mcp.StreamableClientTransport{Endpoint: s.base + "/mcp", HTTPClient: &http.Client{Transport: lb}},
		legacy)
	require.NoError(t, err)
	defer cs.Close()
	marker := "marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	text, isError := runText(t, cs, map[string]any{"code": "x = 41\n_ = open('note.txt', 'w').write('kept')\n" +
		"open('/tmp/" + marker + "', 'w').close()"})
	require.False(t, isError, text)
	require.Eventually(t, func() bool { return len(savedSessions(t, dir)) == 1 }, 30*time.Second, 20*time.Millisecond,
		"saved after -state-idle")
	pid := testproc.SandboxPidOne(marker)
	require.Positive(t, pid, "the session's sandbox's pid 1")
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return strings.Contains(s.log.String(), "a worker ended between runs") },
		30*time.Second, 20*time.Millisecond, "the server saw it end")
	text, isError = runText(t, cs, map[string]any{"code": "x + 1, open('note.txt').read()"})
	require.False(t, isError, "%s\n%s", text, s.log)
	assert.Equal(t, "[value]\n(42, 'kept')\n", text)
	assert.Contains(t, s.log.String(), "was brought back from its save")
}

// roundRobin sends each request to the next of its replicas, as a balancer without
// affinity does, with a bearer token.
type roundRobin struct {
	bases []string
	next  atomic.Int64
	token string
}

func (rr *roundRobin) RoundTrip(r *http.Request) (*http.Response, error) {
	base, _ := url.Parse(rr.bases[int(rr.next.Add(1))%len(rr.bases)])
	r = r.Clone(r.Context())
	r.URL.Scheme, r.URL.Host, r.Host = base.Scheme, base.Host, base.Host
	r.Header.Set("Authorization", "Bearer "+rr.token)
	return http.DefaultTransport.RoundTrip(r)
}

// MCP sessions forward too (-advertise-http): two replicas share a state directory, and a
// client's requests alternate between them. Each call reaches the replica that holds the
// session, which keeps what a move would lose (an open file, which a save leaves out), and
// none moves it; a request that says it comes from a replica without a valid mark is
// refused.
func TestServeSessionsForwarded(t *testing.T) {
	dir := t.TempDir()
	pa, pb := freePort(t), freePort(t)
	args := func(port int) []string {
		addr := "127.0.0.1:" + strconv.Itoa(port)
		return []string{"-http", addr, "-backend", "isolated", "-tokens", tokenFile(t, "alice:"+tokenAlice),
			"-state-dir", dir, "-state-idle", "100ms", "-advertise-http", "http://" + addr}
	}
	a, b := startServer(t, args(pa)...), startServer(t, args(pb)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("A's log:\n%s\nB's log:\n%s", a.log, b.log)
		}
	})
	rr := &roundRobin{bases: []string{a.base, b.base}, token: tokenAlice}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "minipy-forward-test", Version: "0"}, nil).Connect(
		context.Background(), &mcp.StreamableClientTransport{Endpoint: a.base + "/mcp", HTTPClient: &http.Client{Transport: rr}},
		legacy)
	require.NoError(t, err)
	defer cs.Close()
	text, isError := runText(t, cs, map[string]any{"code": "f = open('log.txt', 'w')\nn = 1"})
	require.False(t, isError, text)
	for i := range 6 {
		text, isError = runText(t, cs, map[string]any{"code": "f.write('x')\nn += 1\nn"})
		require.False(t, isError, "call %d: %s", i, text)
		assert.Equal(t, fmt.Sprintf("[value]\n%d\n", i+2), text, "call %d", i)
	}
	req, err := http.NewRequest("POST", b.base+"/mcp", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tokenAlice)
	req.Header.Set("Minipy-Forward", "x 1 AAAA")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a made-up mark")
}
