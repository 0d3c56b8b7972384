package main

// The third hardening round (issue 66): each attack on the server's network face, its
// state store and its pause, tried as the attacker would, against the real binary.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// rawPost sends what a web page can send without a preflight: a POST of text/plain to
// target, with the Host and Origin its browser would set (none where empty), and extra
// headers. It returns the status and the body.
func rawPost(t *testing.T, target, host, origin, body string, extra ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "text/plain;charset=UTF-8")
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	_, err = io.Copy(&b, io.LimitReader(resp.Body, 1<<20))
	require.NoError(t, err)
	return resp.StatusCode, b.String()
}

// A web page the user opens, against a server on loopback without -tokens: DNS rebinding
// (its own name, rebound to 127.0.0.1, in Host) and a cross-origin POST (its Origin) are
// refused by both fronts with 403, before anything runs; the SDKs' own requests (no Origin,
// a loopback Host) and a page served from localhost are not.
func TestWebPageRefused(t *testing.T) {
	e2b := startServerAt(t, servingE2B, "-backend", "isolated", "-e2b", "127.0.0.1:0")
	mcpSrv := startServer(t, "-backend", "isolated")
	port := func(base string) string { u, _ := url.Parse(base); return u.Port() }
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
		`"capabilities":{},"clientInfo":{"name":"page","version":"0"}}}`
	// (MCP's endpoint takes JSON only: a page's POST of it is preflighted, and the server
	// answers no preflight; it is sent here as the server would see it.)
	for _, c := range []struct {
		name, target, body string
		headers            []string
	}{
		{"e2b", e2b.base + "/sandboxes", `{"templateID":"base"}`, nil},
		{"mcp", mcpSrv.base + "/mcp", initialize, []string{"Accept", "application/json, text/event-stream",
			"Content-Type", "application/json"}},
	} {
		rebound := "attacker.example:" + port(c.target)
		code, body := rawPost(t, c.target, rebound, "http://"+rebound, c.body, c.headers...)
		assert.Equal(t, http.StatusForbidden, code, "%s: DNS rebinding: %s", c.name, body)
		code, body = rawPost(t, c.target, "", "http://attacker.example", c.body, c.headers...)
		assert.Equal(t, http.StatusForbidden, code, "%s: a cross-origin page: %s", c.name, body)
		code, body = rawPost(t, c.target, "", "null", c.body, c.headers...)
		assert.Equal(t, http.StatusForbidden, code, "%s: an opaque origin (a sandboxed frame, a file): %s", c.name, body)
		code, body = rawPost(t, c.target, "localhost:"+port(c.target), "http://localhost:3000", c.body, c.headers...)
		assert.Less(t, code, 300, "%s: a page on localhost: %s", c.name, body)
	}
	// Nothing the refused requests asked for was made: one sandbox, the localhost page's.
	req, err := http.NewRequest(http.MethodGet, e2b.base+"/v2/sandboxes", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var listed strings.Builder
	io.Copy(&listed, resp.Body) //nolint:errcheck // read what came
	assert.Equal(t, 1, strings.Count(listed.String(), `"sandboxID"`), listed.String())
}

// With -tokens, a browser app of another origin that holds a token is a client like any
// other (E2B's JS SDK runs in browsers); the Host rule still holds.
func TestWebPageWithTokens(t *testing.T) {
	s := startE2B(t)
	code, body := rawPost(t, s.base+"/sandboxes", "", "https://app.example", `{}`, "X-API-KEY", aliceKey)
	assert.Equal(t, http.StatusCreated, code, body)
	code, body = rawPost(t, s.base+"/sandboxes", "attacker.example", "", `{}`, "X-API-KEY", aliceKey)
	assert.Equal(t, http.StatusForbidden, code, body)
}

// rssOf is the resident memory of process pid, in bytes (VmRSS).
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if kb, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64)
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// gzipped is data compressed with gzip.
func gzipped(t *testing.T, data []byte) []byte {
	var b bytes.Buffer
	z, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	_, err = z.Write(data)
	require.NoError(t, err)
	require.NoError(t, z.Close())
	return b.Bytes()
}

// Bodies are bounded before they are decompressed or parsed: a 64 KiB gzip body that
// inflates to a 64 MiB path (envd's Stat), a plain one of 8 MiB, and a path of 1 MiB get
// a refusal that repeats no more than a little of them, and the server's memory does not
// grow with them (it grew by 447 MiB for one such request).
func TestBodiesBounded(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	stat := func(body []byte, encoding string) (int, []byte) {
		req := alice.sandboxRequest(sb, sb.EnvdAccessToken, 49983, http.MethodPost, "/filesystem.Filesystem/Stat",
			bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		return alice.do(req)
	}
	code, body := stat([]byte(`{"path": "/home/user"}`), "")
	require.Equal(t, http.StatusOK, code, "%s", body)
	before := rssOf(t, s.cmd.Process.Pid)
	path := func(n int) []byte { return []byte(`{"path": "/home/user/` + strings.Repeat("a", n) + `"}`) }
	bomb := gzipped(t, path(64<<20))
	require.Less(t, len(bomb), 100<<10)
	for _, c := range []struct {
		name     string
		body     []byte
		encoding string
	}{
		{"a gzip bomb", bomb, "gzip"},
		{"8 MiB", path(8 << 20), ""},
		{"a path of 1 MiB", path(1<<20 - 64), ""},
	} {
		for range 4 {
			code, body := stat(c.body, c.encoding)
			assert.GreaterOrEqual(t, code, 400, "%s: %.300s", c.name, body)
			assert.Less(t, len(body), 1024, "%s: the refusal repeats the input: %.300s", c.name, body)
		}
	}
	grew := rssOf(t, s.cmd.Process.Pid) - before
	t.Logf("the server's RSS grew by %d KiB", grew>>10)
	assert.Less(t, grew, int64(64<<20), "the server's memory grew with the bodies")
}

// A command's start holds a place among its sandbox's requests in progress until its
// command has started: 16 requests whose bodies never end hold them all, and a 17th,
// Process/Start, is refused (429) instead of waiting beside them.
func TestStartCountsInflight(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	var writers []*io.PipeWriter
	defer func() {
		for _, w := range writers {
			w.CloseWithError(errors.New("the test ends")) //nolint:errcheck // always nil
		}
	}()
	slow := func(procedure string) {
		r, w := io.Pipe()
		writers = append(writers, w)
		req := alice.sandboxRequest(sb, sb.EnvdAccessToken, 49983, http.MethodPost, procedure, r)
		req.Header.Set("Content-Type", "application/json")
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		_, err := w.Write([]byte(`{"path": `)) // (and no more)
		require.NoError(t, err)
	}
	for range 16 {
		slow("/filesystem.Filesystem/Stat")
	}
	// (Until the 16 have reached the server, a start goes through, and fails or not.)
	code, body := 0, []byte(nil)
	for end := time.Now().Add(30 * time.Second); code != http.StatusTooManyRequests && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
		req := alice.sandboxRequest(sb, sb.EnvdAccessToken, 49983, http.MethodPost, "/process.Process/Start",
			strings.NewReader(`{"process": {"cmd": "/bin/true"}}`))
		req.Header.Set("Content-Type", "application/connect+json")
		code, body = alice.do(req)
	}
	assert.Equal(t, http.StatusTooManyRequests, code, "a start beside 16 requests in progress: %q", body)
}

// A kept-alive connection that sends nothing more is closed (-conn-idle-timeout, 1 minute
// by default), on both fronts: 1,000 of them once stayed open for good.
func TestIdleConnectionsClose(t *testing.T) {
	e2b := startServerAt(t, servingE2B, "-backend", "isolated", "-e2b", "127.0.0.1:0", "-conn-idle-timeout", "300ms")
	mcpSrv := startServer(t, "-backend", "isolated", "-conn-idle-timeout", "300ms")
	for _, base := range []string{e2b.base, mcpSrv.base} {
		u, err := url.Parse(base)
		require.NoError(t, err)
		c, err := net.Dial("tcp", u.Host)
		require.NoError(t, err)
		defer c.Close()
		_, err = fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", u.Host)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // read to its end
		resp.Body.Close()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
		n, err := c.Read(make([]byte, 1))
		assert.Equal(t, 0, n)
		assert.ErrorIs(t, err, io.EOF, "%s: the server closed the idle connection", base)
	}
	assert.Equal(t, session.DefaultConnIdle, session.HTTPServer(nil, 0).IdleTimeout, "on by default")
}

// revoke rewrites s's -tokens file with lines and sends SIGHUP, waiting until the server
// has read it (the n-th reading).
func revoke(t *testing.T, s *serverProc, n int, lines ...string) {
	t.Helper()
	path := s.cmd.Args[slices.Index(s.cmd.Args, "-tokens")+1]
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Count(s.log.String(), "-tokens: read again") >= n },
		10*time.Second, 10*time.Millisecond, "%s", s.log)
}

// A key removed from -tokens (SIGHUP) cuts its user off at once: their sandboxes' access
// tokens stop working (they ran code until the sandbox's timeout), and their sandboxes are
// paused into the store, to be resumed, with their variables, once the user has a key again;
// without a store they are killed. Another user's sandbox is untouched.
func TestRevokedKeyEndsSandboxes(t *testing.T) {
	for _, store := range []bool{true, false} {
		t.Run(map[bool]string{true: "store", false: "no store"}[store], func(t *testing.T) {
			var args []string
			if store {
				args = []string{"-state-dir", t.TempDir()}
			}
			s := startE2B(t, args...)
			alice, bob := &e2bClient{t, s.base, aliceKey}, &e2bClient{t, s.base, bobKey}
			sa, sb := alice.create(nil), bob.create(nil)
			alice.execute(sa, "x = 41")
			revoke(t, s, 1, "bob:"+bobKey)
			body, err := json.Marshal(map[string]any{"code": "x"})
			require.NoError(t, err)
			code, out := alice.sandbox(sa, sa.EnvdAccessToken, 49999, "POST", "/execute", bytes.NewReader(body))
			// (401 as the key goes; 502 once the sandbox has been paused or killed)
			assert.Contains(t, []int{http.StatusUnauthorized, http.StatusBadGateway}, code,
				"alice's access token after her key went: %s", out)
			assert.Equal(t, "y", lastText(bob.execute(sb, "'y'")), "bob's sandbox runs on")
			ended := map[bool]string{true: "1 paused into the store, 0 killed", false: "0 paused into the store, 1 killed"}[store]
			require.Eventually(t, func() bool { return strings.Contains(s.log.String(), ended) }, 10*time.Second,
				10*time.Millisecond, "%s", s.log)

			revoke(t, s, 2, "bob:"+bobKey, "alice:alice-second-key-0123456789")
			alice = &e2bClient{t, s.base, "alice-second-key-0123456789"}
			code, out = alice.api("POST", "/v2/sandboxes/"+sa.SandboxID+"/connect", map[string]any{"timeout": 60})
			if !store {
				assert.Equal(t, http.StatusNotFound, code, "killed: %s", out)
				return
			}
			require.Equal(t, http.StatusCreated, code, "resumed: %s", out)
			var back e2bSandbox
			require.NoError(t, json.Unmarshal(out, &back))
			assert.Equal(t, "42", lastText(alice.execute(back, "x + 1")))
		})
	}
}

// lastText is the text of an execution's last result (its value), or of its error.
func lastText(msgs []map[string]any) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if text, ok := msgs[i]["text"].(string); ok {
			return text
		}
		if v, ok := msgs[i]["value"].(string); ok {
			return v
		}
	}
	return fmt.Sprint(msgs)
}

// The same for MCP: the user's sessions end (saved first, with a store), and come back with
// their variables once the user has a token again.
func TestRevokedTokenEndsSessions(t *testing.T) {
	s := startServer(t, "-backend", "isolated", "-tokens", tokenFile(t, "alice:"+tokenAlice, "bob:"+tokenBob),
		"-state-dir", t.TempDir())
	alice, bob := s.connect(t, tokenAlice), s.connect(t, tokenBob)
	text, isError := runText(t, alice, map[string]any{"code": "x = 41"})
	require.False(t, isError, text)
	text, isError = runText(t, bob, map[string]any{"code": "y = 1"})
	require.False(t, isError, text)
	revoke(t, s, 1, "bob:"+tokenBob)
	require.Eventually(t, func() bool { return strings.Contains(s.log.String(), `user "alice"'s MCP sessions: 1 ended`) },
		10*time.Second, 10*time.Millisecond, "%s", s.log)
	_, err := alice.CallTool(context.Background(), &mcp.CallToolParams{Name: "minipy", Arguments: map[string]any{"code": "x"}})
	assert.Error(t, err, "alice's token is gone")
	text, _ = runText(t, bob, map[string]any{"code": "y"})
	assert.Equal(t, "[value]\n1\n", text, "bob's session is untouched")

	// (The SDK's client closes itself at a 401: the session is called by hand.)
	revoke(t, s, 2, "bob:"+tokenBob, "alice:"+tokenAlice)
	resp := postTo(t, s, tokenAlice, alice.ID(),
		`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"minipy","arguments":{"code":"x + 1"}}}`)
	answer, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", answer)
	assert.Contains(t, string(answer), `[value]\n42\n`, "alice's session, saved as it ended, is back")
}

// Without its token, a live sandbox and an id that never was answer alike (401): the
// answers once told which ids live (401) and which not (502). The client of a sandbox that
// ended still gets the 502 that E2B's SDKs read as "not running", to the token it had.
func TestSandboxIDsTellNothing(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	live, gone := alice.create(nil), alice.create(nil)
	code, body := alice.api("DELETE", "/sandboxes/"+gone.SandboxID, nil)
	require.Equal(t, http.StatusNoContent, code, "%s", body)
	never := e2bSandbox{SandboxID: "abcdefghijklmnopqrst"}
	for _, token := range []string{"", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", live.EnvdAccessToken[:16] + "AAAAAAAAAAAAAAAA"} {
		for _, sb := range []e2bSandbox{live, gone, never} {
			code, body := alice.sandbox(sb, token, 49983, "GET", "/health", nil)
			assert.Equal(t, http.StatusUnauthorized, code, "%s with token %q: %s", sb.SandboxID, token, body)
		}
	}
	code, _ = alice.sandbox(gone, gone.EnvdAccessToken, 49983, "GET", "/health", nil)
	assert.Equal(t, http.StatusBadGateway, code, "its own client learns that it ended")
	code, _ = alice.sandbox(never, live.EnvdAccessToken, 49983, "GET", "/health", nil)
	assert.Equal(t, http.StatusUnauthorized, code, "another sandbox's token")
	code, _ = alice.sandbox(live, live.EnvdAccessToken, 49983, "GET", "/health", nil)
	assert.Equal(t, http.StatusNoContent, code)
}

// sparseCode makes 8 sparse files of just under 32 MiB each: 0 bytes of the working
// directory, each within -work-size 32 MiB alone, 256 MiB claimed in all.
const sparseCode = "for i in range(8):\n    with open('s%d.bin' % i, 'wb') as f:\n        f.truncate((32 << 20) - 4096)\n"

// Sparse files at pause: a pause read them whole (the server grew by 920 MiB before it
// answered 507), and MCP's idle save did the same with no request at all, writing a 268 MB
// save to the host's disk. The files together may claim -work-size: the pause is 507 and
// the idle save fails, having read none of them, and the server's memory stays put.
func TestSparseFilesAtPause(t *testing.T) {
	dir := t.TempDir()
	s := startE2B(t, "-work-size", "33554432", "-state-dir", dir)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	alice.execute(sb, sparseCode)
	before := rssOf(t, s.cmd.Process.Pid)
	code, body := alice.api("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil)
	assert.Equal(t, http.StatusInsufficientStorage, code, "%s", body)
	assert.Contains(t, string(body), "in all")
	grew := rssOf(t, s.cmd.Process.Pid) - before
	t.Logf("the E2B server's RSS grew by %d KiB", grew>>10)
	assert.Less(t, grew, int64(64<<20))
	assert.Equal(t, "1", lastText(alice.execute(sb, "1")), "the sandbox runs on")

	m := startServer(t, "-backend", "isolated", "-work-size", "33554432", "-state-dir", dir, "-state-idle", "100ms")
	cs := m.connect(t, "")
	text, isError := runText(t, cs, map[string]any{"code": sparseCode})
	require.False(t, isError, text)
	before = rssOf(t, m.cmd.Process.Pid)
	require.Eventually(t, func() bool { return strings.Contains(m.log.String(), "-state-dir: saving") },
		10*time.Second, 10*time.Millisecond, "the idle save")
	assert.Contains(t, m.log.String(), "in all")
	grew = rssOf(t, m.cmd.Process.Pid) - before
	t.Logf("the MCP server's RSS grew by %d KiB", grew>>10)
	assert.Less(t, grew, int64(64<<20))
	assert.Empty(t, savedSessions(t, dir), "no save of the sparse files on the host's disk")
}

// Someone who can write the state directory but not read the key (-state-key-file
// elsewhere) copies bob's paused sandbox over alice's: alice's resume once ran bob's
// planted function. Now nothing of either is in clear on disk, and the moved save does not
// open: alice's connect fails, and nothing of bob's runs as alice's.
func TestStoredSandboxMoved(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(t.TempDir(), "state-key")
	require.NoError(t, os.WriteFile(keyFile, []byte("an-operators-secret-key-0123456789\n"), 0o600))
	s := startE2B(t, "-state-dir", dir, "-state-key-file", keyFile)
	alice, bob := &e2bClient{t, s.base, aliceKey}, &e2bClient{t, s.base, bobKey}
	pausedFile := func(c *e2bClient, code string) (e2bSandbox, string) {
		before, _ := filepath.Glob(filepath.Join(dir, "*.paused"))
		sb := c.create(map[string]any{"envVars": map[string]string{"SECRET_ENV": "env-value-in-clear"}})
		c.execute(sb, code)
		status, body := c.api("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil)
		require.Equal(t, http.StatusNoContent, status, "%s", body)
		after, _ := filepath.Glob(filepath.Join(dir, "*.paused"))
		require.Len(t, after, len(before)+1)
		for _, f := range after {
			if !slices.Contains(before, f) {
				return sb, f
			}
		}
		return sb, ""
	}
	sa, fa := pausedFile(alice, "x = 'alice-value-in-clear'")
	sbob, fb := pausedFile(bob, "def planted():\n    return 'bob-planted-in-clear'")
	for _, f := range []string{fa, fb} {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, clear := range []string{"in-clear", "alice", "bob", "SECRET_ENV", "planted"} {
			assert.NotContains(t, string(raw), clear, "in clear in %s", f)
		}
	}
	// The attack: bob's save in alice's place, its metadata rewritten as alice's where it
	// can be read (it could, before saves were sealed).
	raw, err := os.ReadFile(fb)
	require.NoError(t, err)
	raw = bytes.ReplaceAll(raw, []byte(`"user":"bob"`), []byte(`"user":"alice"`))
	raw = bytes.ReplaceAll(raw, []byte(sbob.SandboxID), []byte(sa.SandboxID))
	require.NoError(t, os.WriteFile(fa, raw, 0o600))
	code, body := alice.api("POST", "/v2/sandboxes/"+sa.SandboxID+"/connect", map[string]any{"timeout": 60})
	require.NotEqual(t, http.StatusCreated, code, "the moved save resumed: %s", body)
	assert.NotContains(t, s.log.String(), "resumed")
}
