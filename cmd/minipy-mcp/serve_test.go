package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/minipy-go/minipy/internal/worker"
)

// The tests of serving people who do not trust each other run the real binary over real
// TCP: tokens, sessions apart, caps, drain, health and metrics.

// serverProc is a minipy-mcp process serving HTTP on 127.0.0.1.
type serverProc struct {
	cmd  *exec.Cmd
	base string // http://127.0.0.1:PORT
	log  *lockedBuffer
	done chan struct{} // closed when the process has exited
	err  error         // its exit, once done
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var listening = regexp.MustCompile(`serving MCP over HTTP at (http://\S+)/mcp`)

// startServer starts the binary with -http 127.0.0.1:0 and args, and waits until it
// listens. The test's end stops it (SIGTERM, then SIGKILL) if it still runs.
func startServer(t *testing.T, args ...string) *serverProc {
	t.Helper()
	return startServerAt(t, listening, append([]string{"-http", "127.0.0.1:0"}, args...)...)
}

// startServerAt starts the binary with args and waits until its log says where it listens
// (the first group of listening, which becomes its base).
func startServerAt(t testing.TB, listening *regexp.Regexp, args ...string) *serverProc {
	t.Helper()
	cmd := exec.Command(buildServer(t), args...)
	// Its engine's private directory in a directory of the test's: a server killed hard
	// (SIGKILL) leaves it behind, which the test's end then removes. (The workers' user
	// passes through it, as through /tmp.)
	tmp := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(tmp), 0o711))
	require.NoError(t, os.Chmod(tmp, 0o711))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &serverProc{cmd: cmd, log: &lockedBuffer{}, done: make(chan struct{})}
	found := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			fmt.Fprintln(s.log, lines.Text())
			if m := listening.FindStringSubmatch(lines.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		s.err = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() { s.stop(t) })
	select {
	case s.base = <-found:
	case <-s.done:
		t.Fatalf("the server exited: %v\n%s", s.err, s.log)
	case <-time.After(60 * time.Second):
		t.Fatalf("the server never said where it listens:\n%s", s.log)
	}
	return s
}

// stop ends the server (SIGTERM; SIGKILL after 20 s) and checks that none of its
// processes outlives it.
func (s *serverProc) stop(t testing.TB) {
	select {
	case <-s.done:
		return
	default:
	}
	pids := descendantsOf(s.cmd.Process.Pid)
	s.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // may have exited
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill() //nolint:errcheck // stuck
		<-s.done
		t.Errorf("the server did not stop at SIGTERM:\n%s", s.log)
	}
	assert.Eventually(t, func() bool { return len(alive(pids)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"processes of the server outlived it: %v", alive(pids))
	for _, p := range alive(pids) {
		syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck // nothing may outlive the test
	}
	assert.Empty(t, removeCgroupsOf(t, s.cmd.Process.Pid), "a server stopped by SIGTERM removes its engines' cgroups")
}

// removeCgroupsOf removes the engines' cgroups that the server process pid, which has
// ended, left (a server killed hard cannot remove them), and returns them.
func removeCgroupsOf(t testing.TB, pid int) []string {
	left := worker.LeftCgroups(pid)
	for _, d := range left {
		assert.NoError(t, worker.RemoveCgroup(d))
	}
	return left
}

// descendantsOf lists pid's descendants (from /proc).
func descendantsOf(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		out = append(out, children[queue[0]]...)
		queue = append(queue, children[queue[0]]...)
	}
	return out
}

// alive keeps the pids whose processes run (zombies are gone for this purpose).
func alive(pids []int) []int {
	var out []int
	for _, p := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		if fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(fields) > 0 && fields[0] != "Z" {
			out = append(out, p)
		}
	}
	return out
}

// bearer adds a token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// dial connects an MCP client with token (none: "").
func (s *serverProc) dial(token string) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-serve-test", Version: "0"}, nil)
	return client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: s.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{token}}}, legacy)
}

func (s *serverProc) connect(t *testing.T, token string) *mcp.ClientSession {
	t.Helper()
	cs, err := s.dial(token)
	require.NoError(t, err)
	t.Cleanup(func() { cs.Close() })
	return cs
}

// initialize opens a session by hand: the raw response, for status codes and headers.
func (s *serverProc) initialize(t *testing.T, token string, header ...string) *http.Response {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
		`"capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`
	req, err := http.NewRequest(http.MethodPost, s.base+"/mcp", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func (s *serverProc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(s.base + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// tokenFile writes NAME:TOKEN lines to a file of the test's.
func tokenFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

const (
	tokenAlice = "alice-0123456789abcdef"
	tokenBob   = "bob-fedcba9876543210aa"
)

// Two users of the isolated engine, as the official TypeScript SDK's clients: neither sees
// the other's files (working directory and its subfolders, /tmp, /dev/shm), variables or
// processes; B cannot use A's session; no token or a wrong one gets 401.
func TestServeUsersApart(t *testing.T) {
	dir, node := tsClient(t)
	s := startServer(t, "-backend", "isolated", "-tokens", tokenFile(t, "alice:"+tokenAlice, "bob:"+tokenBob))
	cmd := exec.Command(node, "tenants.mjs", s.base+"/mcp", tokenAlice, tokenBob)
	cmd.Dir = dir
	out, err := cmd.Output()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		t.Fatalf("the TypeScript client failed: %v\n%s\nserver:\n%s", err, exitErr.Stderr, s.log)
	}
	require.NoError(t, err)
	type refusal struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	var got struct {
		Wrote, Probe, StillA, AfterHijack    string
		Links, ListA, ListB                  []string
		ReadText, ReadBlob                   string
		Hijack, NoToken, WrongToken, ReadByB refusal
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.Equal(t, "[stdout]\n/work\n", got.Wrote)
	assert.Equal(t, []string{
		"minipy://files/blob.bin blob.bin application/octet-stream 256",
		"minipy://files/sub/deeper/tenant_a.txt sub/deeper/tenant_a.txt text/plain 13",
		"minipy://files/sub/tenant_a.txt sub/tenant_a.txt text/plain 13",
		"minipy://files/tenant_a.txt tenant_a.txt text/plain 13",
	}, got.Links, "A's new files are linked after the text (not /tmp's)")
	assert.Equal(t, []string{"blob.bin", "sub/deeper/tenant_a.txt", "sub/tenant_a.txt", "tenant_a.txt"}, got.ListA)
	assert.Equal(t, "tenant-a-7731", got.ReadText)
	assert.Equal(t, "application/octet-stream 256", got.ReadBlob)
	assert.Empty(t, got.ListB, "B's resources are its own files: none")
	assert.NotZero(t, got.ReadByB.Code, "B cannot read A's file: %s", got.ReadByB.Message)
	var probe struct {
		Hits      []string `json:"hits"`
		Secret    bool     `json:"secret"`
		Sleeper   bool     `json:"sleeper"`
		Processes int      `json:"processes"`
		Cwd       string   `json:"cwd"`
		Listing   []string `json:"listing"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(got.Probe, "[stdout]\n")), &probe), got.Probe)
	assert.Empty(t, probe.Hits, "B finds none of A's files")
	assert.False(t, probe.Secret, "nor A's variables")
	assert.False(t, probe.Sleeper, "nor A's processes")
	assert.Less(t, probe.Processes, 6, "B's /proc shows its own sandbox only")
	assert.Equal(t, "/work", probe.Cwd)
	assert.Empty(t, probe.Listing)
	assert.Equal(t, "[stdout]\ntenant-a-7731 tenant-a-7731 tenant-a-7731\n", got.StillA)
	assert.Equal(t, http.StatusForbidden, got.Hijack.Code, "another user's session is refused: %s", got.Hijack.Message)
	assert.Equal(t, "[stdout]\ntenant-a-7731\n", got.AfterHijack, "and A's session goes on")
	assert.Equal(t, http.StatusUnauthorized, got.NoToken.Code, got.NoToken.Message)
	assert.Equal(t, http.StatusUnauthorized, got.WrongToken.Code, got.WrongToken.Message)
	for _, token := range []string{tokenAlice, tokenBob, "not-a-token-of-this-server"} {
		assert.NotContains(t, s.log.String(), token, "a token reached the log")
	}
}

// The same refusals, from Go, with the headers: 401 asks for a bearer token; a session id
// of another user's is 403 whatever the method.
func TestServeTokens(t *testing.T) {
	s := startServer(t, "-backend", "inprocess", "-tokens", tokenFile(t, "# users", "", "alice:"+tokenAlice,
		"bob : "+tokenBob))
	for _, token := range []string{"", "wrong-token-0123456789", tokenAlice + "x"} {
		resp := s.initialize(t, token)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "token %q", token)
		assert.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer")
	}
	alice := s.connect(t, tokenAlice)
	text, _ := run(t, alice, map[string]any{"code": "mine = 1"})
	assert.Equal(t, "[no output]\n", text)
	id := alice.ID()
	require.NotEmpty(t, id)
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
		req, err := http.NewRequest(method, s.base+"/mcp", strings.NewReader(
			`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"minipy","arguments":{"code":"mine"}}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Authorization", "Bearer "+tokenBob)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s with bob's token on alice's session", method)
	}
	text, _ = run(t, alice, map[string]any{"code": "mine"})
	assert.Equal(t, "[value]\n1\n", text, "alice's session is untouched")

	// SIGHUP reads the file again: a new user gets in, a removed one is out; a file that
	// fails to parse changes nothing.
	path := s.cmd.Args[len(s.cmd.Args)-1]
	carol := "carol-00112233445566778899"
	tiny := "x7q"
	require.NoError(t, os.WriteFile(path, []byte("alice:"+tokenAlice+"\ncarol:"+carol+"\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.log.String(), "read again: 2 tokens of 2 users") },
		10*time.Second, 20*time.Millisecond, s.log.String())
	assert.Equal(t, http.StatusUnauthorized, s.initialize(t, tokenBob).StatusCode, "bob's token is gone")
	assert.Equal(t, http.StatusOK, s.initialize(t, carol).StatusCode, "carol's is in")
	require.NoError(t, os.WriteFile(path, []byte("carol:"+tiny+"\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.log.String(), "the tokens stay as they were") },
		10*time.Second, 20*time.Millisecond, s.log.String())
	assert.Equal(t, http.StatusOK, s.initialize(t, tokenAlice).StatusCode)
	for _, token := range []string{tokenAlice, tokenBob, carol, tiny} {
		assert.NotContains(t, s.log.String(), token, "a token reached the log")
	}
}

// A token file that is not right stops the server at start, naming the line, not the token.
func TestServeTokenFileErrors(t *testing.T) {
	bin := buildServer(t)
	for _, tc := range []struct{ name, content, want string }{
		{"no colon", "alice " + tokenAlice, "line 1 is not NAME:TOKEN"},
		{"short", "alice:abc", "shorter than 16"},
		{"bad name", "al ice:" + tokenAlice, "line 1: the name"},
		{"shared token", "alice:" + tokenAlice + "\nbob:" + tokenAlice, "lines 1 and 2 give the same token"},
		{"empty", "# nobody\n", "no NAME:TOKEN line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(bin, "-http", "127.0.0.1:0", "-tokens", tokenFile(t, tc.content)).CombinedOutput()
			require.Error(t, err)
			assert.Contains(t, string(out), tc.want)
			assert.NotContains(t, string(out), tokenAlice)
		})
	}
	out, err := exec.Command(bin, "-http", "127.0.0.1:0", "-tokens", "/nonexistent/tokens").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "no such file")
}

// Listening beyond loopback needs tokens, or -allow-anonymous to say so.
func TestServeBeyondLoopbackNeedsTokens(t *testing.T) {
	bin := buildServer(t)
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0"} {
		out, err := exec.Command(bin, "-http", addr).CombinedOutput()
		require.Error(t, err, addr)
		assert.Contains(t, string(out), "give -tokens FILE", addr)
	}
	s := startServer(t, "-backend", "inprocess", "-allow-anonymous", "-http", "0.0.0.0:0")
	// Connect over loopback with a loopback Host (the SDK's DNS rebinding check).
	s.base = strings.NewReplacer("0.0.0.0", "127.0.0.1", "[::]", "127.0.0.1").Replace(s.base)
	assert.Equal(t, http.StatusOK, s.initialize(t, "").StatusCode, "-allow-anonymous says so")
	out, err := exec.Command(bin, "-tokens", "x").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "-tokens applies to -http")
	for _, addr := range []string{"127.0.0.1:80", "localhost:80", "[::1]:80"} {
		assert.True(t, isLoopback(addr), addr)
	}
	for _, addr := range []string{":80", "0.0.0.0:80", "10.0.0.1:80", "example.com:80", "[::]:80", "nonsense"} {
		assert.False(t, isLoopback(addr), addr)
	}
}

// Past -max-sessions or -max-sessions-per-user a new session gets 503 with Retry-After and
// the limit's name; the sessions that are open go on; a closed session frees its place.
func TestServeSessionCaps(t *testing.T) {
	s := startServer(t, "-backend", "inprocess", "-max-sessions", "3", "-max-sessions-per-user", "2",
		"-tokens", tokenFile(t, "alice:"+tokenAlice, "bob:"+tokenBob))
	a1, a2 := s.connect(t, tokenAlice), s.connect(t, tokenAlice)
	run(t, a1, map[string]any{"code": "x = 'a1'"})
	resp := s.initialize(t, tokenAlice)
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "10", resp.Header.Get("Retry-After"))
	assert.Contains(t, string(body), "-max-sessions-per-user")
	_, err := s.dial(tokenAlice)
	assert.Error(t, err, "the Go SDK's client is refused too")

	b1 := s.connect(t, tokenBob)
	resp = s.initialize(t, tokenBob)
	body, _ = io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, string(body), "limit of 3 sessions (-max-sessions)")

	text, _ := run(t, a1, map[string]any{"code": "x"})
	assert.Equal(t, "[value]\n'a1'\n", text, "no open session is disturbed")
	run(t, b1, map[string]any{"code": "1"})

	require.NoError(t, a2.Close()) // DELETE: its place is free
	require.Eventually(t, func() bool {
		cs, err := s.dial(tokenAlice)
		if err == nil {
			t.Cleanup(func() { cs.Close() })
		}
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "a closed session's place was not freed")
	metrics := scrape(t, s)
	assert.Equal(t, 3.0, gauge(metrics, "minipy_sessions_active"))
	assert.GreaterOrEqual(t, counter(metrics, "minipy_sessions_rejected_total", "reason", "max_sessions_per_user"), 2.0)
	assert.GreaterOrEqual(t, counter(metrics, "minipy_sessions_rejected_total", "reason", "max_sessions"), 1.0)
}

// SIGTERM drains: /readyz turns 503, new sessions and new calls are refused, the running
// call finishes with its result, and the process exits, its workers with it.
func TestServeDrain(t *testing.T) {
	s := startServer(t, "-backend", "isolated", "-drain-timeout", "30s")
	running, idle := s.connect(t, ""), s.connect(t, "")
	run(t, idle, map[string]any{"code": "1"})
	code, _ := s.get(t, "/readyz")
	assert.Equal(t, http.StatusOK, code)
	result := make(chan string, 1)
	go func() {
		res, err := running.CallTool(context.Background(), &mcp.CallToolParams{Name: minipy.ToolName,
			Arguments: map[string]any{"code": "import time\ntime.sleep(3)\nprint('finished')"}})
		if err != nil {
			result <- "error: " + err.Error()
			return
		}
		result <- res.Content[0].(*mcp.TextContent).Text
	}()
	waitNamespaces(t, s, 2) // the call is running
	pids := descendantsOf(s.cmd.Process.Pid)
	require.NotEmpty(t, pids)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { code, _ := s.get(t, "/readyz"); return code == http.StatusServiceUnavailable },
		5*time.Second, 10*time.Millisecond, "readyz while draining")
	code, _ = s.get(t, "/healthz")
	assert.Equal(t, http.StatusOK, code, "healthz: still serving")
	resp := s.initialize(t, "")
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, string(body), "shutting down")
	text, isError := run(t, idle, map[string]any{"code": "2"})
	assert.True(t, isError)
	assert.Equal(t, mcpfront.DrainingText, text, "a new call in an open session")
	select {
	case text := <-result:
		assert.Equal(t, "[stdout]\nfinished\n", text, "the running call finishes; server:\n%s", s.log)
	case <-time.After(20 * time.Second):
		t.Fatal("the running call did not finish")
	}
	select {
	case <-s.done:
		assert.NoError(t, s.err, "a drained server exits 0")
	case <-time.After(20 * time.Second):
		t.Fatalf("the server did not exit after the drain:\n%s", s.log)
	}
	assert.Eventually(t, func() bool { return len(alive(pids)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the workers outlived the server: %v", alive(pids))
	assert.Contains(t, s.log.String(), "drained")
}

// serverWithALongCall starts a server with -drain-timeout drain and a call that sleeps a
// minute, and returns once the call runs.
func serverWithALongCall(t *testing.T, drain string) *serverProc {
	t.Helper()
	s := startServer(t, "-backend", "isolated", "-drain-timeout", drain)
	cs := s.connect(t, "")
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: minipy.ToolName, //nolint:errcheck // cut off
		Arguments: map[string]any{"code": "import time\ntime.sleep(60)"}})
	waitNamespaces(t, s, 1)
	return s
}

// A drain that runs out of time stops the calls still running, and exits.
func TestServeDrainTimeout(t *testing.T) {
	s := serverWithALongCall(t, "500ms")
	start := time.Now()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.done:
		assert.Less(t, time.Since(start), 15*time.Second)
	case <-time.After(20 * time.Second):
		t.Fatalf("the server did not exit:\n%s", s.log)
	}
	assert.Contains(t, s.log.String(), "with 1 calls running")
}

// A second SIGTERM ends a drain at once; the workers go with the server.
func TestServeSecondSignal(t *testing.T) {
	s := serverWithALongCall(t, "5m")
	pids := descendantsOf(s.cmd.Process.Pid)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(s.log.String(), "waiting for 1 running calls") },
		10*time.Second, 10*time.Millisecond)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.done:
		var exit *exec.ExitError
		require.ErrorAs(t, s.err, &exit)
		assert.Equal(t, 1, exit.ExitCode())
		assert.Contains(t, s.log.String(), "a second signal: stopping now")
	case <-time.After(10 * time.Second):
		t.Fatalf("a second SIGTERM did not end the server:\n%s", s.log)
	}
	assert.Eventually(t, func() bool { return len(alive(pids)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the workers outlived the server: %v", alive(pids))
}

// /metrics is Prometheus text: the runs by outcome, their durations, the MCP operations
// (OpenTelemetry's names), the sessions and the workers move as runs happen.
func TestServeMetrics(t *testing.T) {
	s := startServer(t, "-backend", "isolated")
	before := scrape(t, s)
	cs := s.connect(t, "")
	for _, code := range []string{"1 + 1", "1/0", "import os; os._exit(1)", "import time; time.sleep(10)"} {
		args := map[string]any{"code": code}
		if strings.Contains(code, "sleep") {
			args["timeout"] = 0.3
		}
		run(t, cs, args)
	}
	call(t, cs, minipy.ToolName, map[string]any{"cod": "1"})
	after := scrape(t, s)
	for outcome, n := range map[string]float64{"ok": 1, "python_error": 1, "rolled_back": 1, "timeout": 1,
		"invalid_arguments": 1} {
		assert.Equal(t, n, counter(after, "minipy_runs_total", "outcome", outcome)-
			counter(before, "minipy_runs_total", "outcome", outcome), outcome)
	}
	assert.Equal(t, uint64(4), histogramCount(after, "minipy_run_duration_seconds")-
		histogramCount(before, "minipy_run_duration_seconds"), "runs that ran")
	calls := histogramCount(after, "mcp_server_operation_duration_seconds", "mcp_method_name", "tools/call",
		"gen_ai_tool_name", "minipy", "gen_ai_operation_name", "execute_tool", "error_type", "tool_error",
		"network_transport", "tcp")
	assert.Equal(t, uint64(4), calls, "the four calls that failed, as OTel's mcp.server.operation.duration")
	assert.Positive(t, histogramCount(after, "mcp_server_operation_duration_seconds", "mcp_method_name", "initialize"))
	assert.Equal(t, 1.0, gauge(after, "minipy_sessions_active"))
	assert.Equal(t, 1.0, gauge(after, "minipy_namespaces"))
	assert.Positive(t, gauge(after, "minipy_worker_processes"))
	assert.Greater(t, gauge(after, "minipy_worker_memory_bytes"), float64(1<<20))
	assert.Equal(t, 0.0, gauge(after, "minipy_draining"))
	assert.Positive(t, counter(after, "minipy_worker_starts_total", "result", "ok"))
	assert.Contains(t, after, "go_goroutines", "the Go runtime's collectors")

	require.NoError(t, cs.Close())
	require.Eventually(t, func() bool {
		m := scrape(t, s)
		return gauge(m, "minipy_sessions_active") == 0 && gauge(m, "minipy_namespaces") == 0 &&
			histogramCount(m, "mcp_server_session_duration_seconds") == 1
	}, 10*time.Second, 50*time.Millisecond, "the session's end")
}

// Host calls (the -upstream servers' tools) are counted by function and outcome.
func TestMetricsCountHostCalls(t *testing.T) {
	g := session.NewGate(0, 0)
	m := session.NewMetrics(minipy.InProcess(), g)
	add := minipy.Func("add", "Adds.", func(_ context.Context, in struct {
		A int `json:"a"`
		B int `json:"b"`
	}) (int, error) {
		if in.A < 0 {
			return 0, errors.New("negative")
		}
		return in.A + in.B, nil
	})
	boom := minipy.Function{Name: "boom", Call: func(context.Context, map[string]any) (any, error) { panic("boom") }}
	server := mcpfront.New(mcpfront.Config{Engine: minipy.InProcess(), Functions: []minipy.Function{add, boom},
		Metrics: m, Transport: "pipe", Gate: g}).Server()
	cs := connectInProcess(t, server)
	text, isError := run(t, cs, map[string]any{"code": "add(a=1, b=2) + add(a=2, b=3)"})
	require.False(t, isError, text)
	run(t, cs, map[string]any{"code": "add(a=-1, b=0)"})
	run(t, cs, map[string]any{"code": "boom()"})
	families, err := m.Registry().Gather()
	require.NoError(t, err)
	var text2 bytes.Buffer
	for _, f := range families {
		expfmt.MetricFamilyToText(&text2, f) //nolint:errcheck // a buffer
	}
	metrics := parseMetrics(t, text2.String())
	assert.Equal(t, 2.0, counter(metrics, "minipy_host_calls_total", "function", "add", "outcome", "ok"))
	assert.Equal(t, 1.0, counter(metrics, "minipy_host_calls_total", "function", "add", "outcome", "error"))
	assert.Equal(t, 1.0, counter(metrics, "minipy_host_calls_total", "function", "boom", "outcome", "error"))
	assert.Equal(t, 1.0, counter(metrics, "minipy_runs_total", "outcome", "ok"))
	assert.Equal(t, 2.0, counter(metrics, "minipy_runs_total", "outcome", "python_error"))
}

// One hundred sessions at once, each checking its own variables and files: no error, and
// afterwards the server's processes are back to what they were (the template, the spare:
// the pool grown by the burst shrinks back once its calls are 10 s old).
func TestServeHundredSessions(t *testing.T) {
	const n = 100
	s := startServer(t, "-backend", "isolated", "-max-sessions", strconv.Itoa(n))
	settled := func() int { return len(alive(descendantsOf(s.cmd.Process.Pid))) }
	// The baseline once the count holds still for half a second: the spare worker and its
	// snapshot start after the template, and a fork's first process lives a moment.
	baseline, same := -1, 0
	require.Eventually(t, func() bool {
		if n := settled(); n > 0 && n == baseline {
			same++
		} else {
			baseline, same = n, 0
		}
		return same == 10
	}, 20*time.Second, 50*time.Millisecond)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- oneSession(s, i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err, "server:\n%s", s.log)
	}
	t.Logf("%d sessions, each 3 calls and closed: %v", n, time.Since(start).Round(time.Millisecond))
	if !assert.Eventually(t, func() bool { return settled() == baseline }, 30*time.Second, 50*time.Millisecond,
		"the server's processes did not come back to the %d of before", baseline) {
		for _, pid := range alive(descendantsOf(s.cmd.Process.Pid)) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Logf("alive: %d %.100q", pid, cmdline)
		}
	}
	m := scrape(t, s)
	assert.Equal(t, 0.0, gauge(m, "minipy_sessions_active"))
	assert.Equal(t, 0.0, gauge(m, "minipy_namespaces"))
	assert.Equal(t, 1+gauge(m, "minipy_spares"), gauge(m, "minipy_workers"),
		"the spares and the engine's default namespace's")
	assert.LessOrEqual(t, gauge(m, "minipy_spares"), 32.0, "the adaptive pool's ceiling")
	assert.GreaterOrEqual(t, counter(m, "minipy_spare_takes_total", "result", "hit")+
		counter(m, "minipy_spare_takes_total", "result", "miss"), float64(n), "each session took a spare or found none")
	if made := counter(m, "minipy_cgroups_total", "how", "made"); made > 0 { // (a server with a cgroup)
		assert.GreaterOrEqual(t, made+counter(m, "minipy_cgroups_total", "how", "reused"), float64(n),
			"each session's sandbox got a cgroup")
	}
	assert.Equal(t, float64(3*n), counter(m, "minipy_runs_total", "outcome", "ok"))
}

// oneSession opens a session, keeps a value and a file in it, reads both back and checks
// that it sees nobody else's, and closes it.
func oneSession(s *serverProc, i int) error {
	cs, err := s.dial("")
	if err != nil {
		return fmt.Errorf("session %d: %w", i, err)
	}
	defer cs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, step := range []struct{ code, want string }{
		{fmt.Sprintf("me = %d\n_ = open('me.txt', 'w').write(str(me))", i), "[no output]\n"},
		{"import os\nsorted(os.listdir('.')), open('me.txt').read()", fmt.Sprintf("[value]\n(['me.txt'], '%d')\n", i)},
		{"me", fmt.Sprintf("[value]\n%d\n", i)},
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: minipy.ToolName, Arguments: map[string]any{"code": step.code}})
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		if got := res.Content[0].(*mcp.TextContent).Text; got != step.want || res.IsError {
			return fmt.Errorf("session %d: %q gave %q, want %q", i, step.code, got, step.want)
		}
	}
	return nil
}

// ---- /metrics, parsed with Prometheus's own text parser -------------------------------

func scrape(t *testing.T, s *serverProc) map[string]*dto.MetricFamily {
	t.Helper()
	return parseMetrics(t, scrapeText(t, s))
}

// waitNamespaces waits until the server's isolated engine holds n namespaces: a session's
// namespace is made when its first call starts.
func waitNamespaces(t *testing.T, s *serverProc, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return gauge(scrape(t, s), "minipy_namespaces") == float64(n) },
		30*time.Second, 20*time.Millisecond, "the server never held %d namespaces", n)
}

func scrapeText(t *testing.T, s *serverProc) string {
	t.Helper()
	code, body := s.get(t, "/metrics")
	require.Equal(t, http.StatusOK, code, body)
	return body
}

func parseMetrics(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err, text)
	return families
}

// find returns the metrics of family name whose labels include labels (name, value, ...).
func find(families map[string]*dto.MetricFamily, name string, labels ...string) []*dto.Metric {
	f := families[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
	for _, m := range f.Metric {
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			match = match && found
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// sum adds up value of the metrics of family name with labels.
func sum[T float64 | uint64](families map[string]*dto.MetricFamily, value func(*dto.Metric) T, name string,
	labels ...string) T {
	var total T
	for _, m := range find(families, name, labels...) {
		total += value(m)
	}
	return total
}

func counter(families map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	return sum(families, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() }, name, labels...)
}

func gauge(families map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	return sum(families, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() }, name, labels...)
}

func histogramCount(families map[string]*dto.MetricFamily, name string, labels ...string) uint64 {
	return sum(families, func(m *dto.Metric) uint64 { return m.GetHistogram().GetSampleCount() }, name, labels...)
}

// tsClient is the TypeScript SDK's directory and node, which `make deps` installs.
func tsClient(t *testing.T) (dir, node string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "tsclient"))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk"))
	require.NoError(t, err, "the TypeScript SDK is not installed: run `make deps` (npm ci in %s)", dir)
	node, err = exec.LookPath("node")
	require.NoError(t, err, "node is needed: make deps installs it")
	return dir, node
}
