package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The E2B front (-e2b) is tested with E2B's own SDK (testdata/e2bclient, installed by
// `make deps`) and, for what a hostile client would try, with plain HTTP: the real binary,
// the isolated engine, over real TCP.

var servingE2B = regexp.MustCompile(`serving E2B's API and sandboxes at (http://\S+) `)

const (
	aliceKey = "alice-key-0123456789abcdef"
	bobKey   = "bob-key-0123456789abcdef00"
)

// startE2B starts minipy-mcp serving E2B alone, with the tokens of alice and bob (in the
// file e2bTokens(s)).
func startE2B(t testing.TB, args ...string) *serverProc {
	t.Helper()
	toks := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(toks, []byte("alice:"+aliceKey+"\nbob:"+bobKey+"\n"), 0o600))
	return startServerAt(t, servingE2B, append([]string{"-backend", "isolated", "-e2b", "127.0.0.1:0", "-tokens", toks},
		args...)...)
}

// The code interpreter SDK, unmodified, runs its README's examples and more: state,
// streaming, errors, a figure, environment variables, files both ways, contexts, two
// sandboxes apart, list, info, connect, kill, a wrong key.
func TestE2BWithSDK(t *testing.T) {
	s := startE2B(t)
	checkClientScript(t, s)
	assert.Eventually(t, func() bool { return strings.Count(s.log.String(), "ended: killed through the API") == 3 },
		5*time.Second, 10*time.Millisecond, "%s", s.log)
}

// checkClientScript runs client.mjs against s and checks what it saw.
func checkClientScript(t *testing.T, s *serverProc) {
	got := runE2BScript(t, s, "client.mjs")
	id := got["id"]
	want := map[string]any{
		"state": "2", "stdout": "tick 0\ntick 1\ntick 2\n", "stderr": "warn\n",
		"error": map[string]any{"name": "ZeroDivisionError", "value": "division by zero",
			"traceback": got["error"].(map[string]any)["traceback"]},
		"plot": []any{map[string]any{"formats": []any{"png"}, "main": false, "head": "89504e47"}},
		"html": []any{"<b>bold</b>"},
		"env":  "hi", "runEnv": "yes", "runEnvAfter": "gone",
		"readByCode": `a,b\n1,2\n`, "cwd": "/home/user", "download": "from python", "missingFile": "FileNotFoundError",
		"ctxOwn": "5", "ctxApart": "False", "contexts": 2.0, "ctxRestarted": "False", "contextsAfter": 1.0,
		"apart": "False", "sandboxes": []any{id},
		"madeDir": true, "madeAgain": false,
		"listed":   []any{"dir:/home/user/reports/2026", "file:/home/user/reports/final.txt"},
		"deep":     3.0,
		"fileInfo": map[string]any{"name": "final.txt", "type": "file", "size": 7.0},
		"exists":   []any{true, false}, "byCode": "quarter", "existsAfterRemove": false,
		"outside":   "InvalidArgumentError",
		"info":      map[string]any{"state": "running", "metadata": map[string]any{"purpose": "e2b-test"}, "template": "code-interpreter-v1"},
		"connected": "2", "killed": true, "runningAfterKill": false, "afterKill": "TimeoutError",
		"wrongKey": "AuthenticationError",
		"paused":   true, "pausedAgain": false, "pausedState": "paused", "whilePaused": "TimeoutError",
		"resumed": "hi you 6 saved", "resumedState": "running", "resumedElsewhere": []any{"tmp\n", "app\n"},
	}
	for k, v := range want {
		assert.Equal(t, v, got[k], k)
	}
	assert.Contains(t, got["streamed"], "out:tick 0")
	assert.Contains(t, got["streamed"], "err:warn")
	assert.Contains(t, got["error"].(map[string]any)["traceback"], "return 1/0")
}

// What E2B's own suites expect of the behaviours they share with minipy (conformance.mjs):
// each failed there before it was fixed here.
func TestE2BConformance(t *testing.T) {
	s := startE2B(t)
	got := runE2BScript(t, s, "conformance.mjs")
	link := func(target string) map[string]any {
		return map[string]any{"type": "symlink", "mode": 511.0, "permissions": "Lrwxrwxrwx", "symlinkTarget": target}
	}
	want := map[string]any{
		"indented": "42",
		"context":  map[string]any{"cwd": "/home/user", "listed": "/home/user", "runs": "42"},
		"files": map[string]any{
			"file": map[string]any{"type": "file", "mode": 420.0, "permissions": "-rw-r--r--", "symlinkTarget": nil},
			"dir":  map[string]any{"type": "dir", "mode": 493.0, "permissions": "drwxr-xr-x", "symlinkTarget": nil},
			"link": link("/home/user/notes/a.txt"), "out": link("/etc/hostname"),
			"listed": []any{"a.txt:644:", "link:777:/home/user/notes/a.txt", "out:777:/etc/hostname"},
		},
		"removedNothing": true,
		"signed": map[string]any{"plain": []any{200.0, "signed hello"}, "expiring": []any{200.0, "signed hello"},
			"expired": []any{401.0, `{"code":401,"message":"signature is already expired"}` + "\n"},
			"upload":  200.0, "uploaded": "via url"},
		"results": map[string]any{
			"data": map[string]any{"a": []any{1.0, 2.0}, "t": []any{"2026-01-02T00:00:00", nil}}, "html": "string",
			"dict": map[string]any{"k": []any{1.0, 2.5, nil}, "n": map[string]any{"x": true}}, "list": []any{1.0, "two"},
			"tuple": nil, "saved": []any{[]any{"string", false}, []any{"undefined", true}},
		},
		"fork": map[string]any{"forked": []any{
			map[string]any{"apart": true, "running": true, "kept": "[1, 2, 3]", "file": "in first"},
			map[string]any{"apart": true, "running": true, "kept": "[1, 2, 3]", "file": "in second"}},
			"original": "before fork", "originalKept": "[1, 2]", "byId": 1.0, "killed": "SandboxNotFoundError"},
		"list": map[string]any{"desc": []any{"second", "first"}, "asc": []any{"first", "second"},
			"template": []any{"second", "first"}, "unknownTemplate": []any{}, "after": []any{"second"},
			"pages": []any{[]any{"second"}, []any{"first"}, false}},
		"killedRun": "TimeoutError: true", "killedCommand": "TimeoutError: true",
		"metrics": true,
		"metadata": map[string]any{"wrote": map[string]any{"author": "mish", "purpose": "upload"},
			"info": map[string]any{"author": "mish", "purpose": "upload"}, "octet": map[string]any{"source": "octet"},
			"listed": []any{[]any{"a.txt", map[string]any{"author": "mish", "purpose": "upload"}},
				[]any{"c.txt", map[string]any{"source": "octet"}}},
			"renamed": map[string]any{"source": "octet"}, "cleared": nil, "after": nil},
		"snapshots": map[string]any{"names": 1.0, "file": "before fork", "value": "in snapshot", "listed": true,
			"bySandbox": true, "byName": true, "deleted": true, "deletedAgain": false},
	}
	for k, v := range want {
		assert.Equal(t, v, got[k], k)
	}
}

// runE2BScript runs a script of testdata/e2bclient against s as alice, and returns the
// JSON object it prints.
func runE2BScript(t testing.TB, s *serverProc, script string, env ...string) map[string]any {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "e2bclient"))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter"))
	require.NoError(t, err, "E2B's SDK is not installed: run `make deps` (npm ci in %s)", dir)
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node is needed: make deps installs it")
	cmd := exec.Command(node, script)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "E2B_API_URL="+s.base, "E2B_SANDBOX_URL="+s.base, "E2B_API_KEY="+aliceKey), env...)
	out, err := cmd.Output()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		t.Fatalf("the E2B client failed: %v\n%s\nserver:\n%s", err, exitErr.Stderr, s.log)
	}
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	return got
}

// With -state-dir, sandboxes outlive the server: a paused one, and one that was running
// at SIGTERM (paused then), are resumed by the next server with their state, through
// the unmodified SDK.
func TestE2BStateDirRestart(t *testing.T) {
	dir := t.TempDir()
	s := startE2B(t, "-state-dir", dir)
	before := runE2BScript(t, s, "restart.mjs", "PHASE=before")
	assert.Equal(t, true, before["paused"])
	ids := before["ids"].([]any)
	s.stop(t)
	assert.Contains(t, s.log.String(), "paused (", "the running sandbox was paused at SIGTERM")

	s = startE2B(t, "-state-dir", dir)
	after := runE2BScript(t, s, "restart.mjs", "PHASE=after", fmt.Sprintf("IDS=%s,%s", ids[0], ids[1]))
	assert.Equal(t, map[string]any{"paused": "paused", "running": "paused"}, after["listed"])
	assert.Equal(t, "82", after["x"])
	assert.Equal(t, "kept", after["note"])
	assert.Equal(t, "42", after["y"])
	assert.Equal(t, 2.0, after["running"])
}

// E2B's base SDK: its default template, files several at once, gzipped, as bytes and as a
// stream; commands: output, streaming, exit codes, environment, working directory, stdin,
// background commands listed and killed; a terminal; a pause without its memory.
func TestE2BBaseSDK(t *testing.T) { checkBaseScript(t, startE2B(t)) }

// checkBaseScript runs base.mjs against s and checks what it saw.
func checkBaseScript(t *testing.T, s *serverProc) {
	got := runE2BScript(t, s, "base.mjs")
	want := map[string]any{
		"template": "base", "running": true, "written": []any{"/home/user/in/a.txt", "/home/user/in/b.bin"},
		"gzipped": "compressed on the wire", "bytes": []any{0.0, 1.0, 2.0, 255.0}, "streamed": "alpha",
		"listed": []any{"a.txt", "b.bin"}, "killed": true, "runningAfter": false,
		"run":    map[string]any{"stdout": "hi me from /home/user\nalpha", "stderr": "warn\n", "exitCode": 0.0},
		"ticks":  "tick 1\ntick 2\ntick 3\n",
		"failed": map[string]any{"kind": "CommandExitError", "exitCode": 7.0, "stdout": "partial\n"},
		"cwd":    "/home/user/in\n", "stdin": "echoed back\n", "listedCommands": true, "killedCommand": true,
		"listedAfterKill": false,
		"sleeperEnd":      "CommandExitError",
		"pty":             map[string]any{"exitCode": 0.0, "abc": true, "cols": true},
		"coldBoot":        map[string]any{"newBoot": true, "file": "on disk"},
	}
	for k, v := range want {
		assert.Equal(t, v, got[k], k)
	}
}

// e2bClient speaks E2B's HTTP as a user with key.
type e2bClient struct {
	t    *testing.T
	base string
	key  string
}

type e2bSandbox struct {
	SandboxID          string `json:"sandboxID"`
	EnvdAccessToken    string `json:"envdAccessToken"`
	TrafficAccessToken string `json:"trafficAccessToken"`
}

// api calls the API; the body is JSON.
func (c *e2bClient) api(method, path string, body any) (int, []byte) {
	c.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(c.t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, r)
	require.NoError(c.t, err)
	req.Header.Set("X-API-KEY", c.key)
	return c.do(req)
}

// sandbox calls a port of sb with token (its own: sb.EnvdAccessToken).
func (c *e2bClient) sandbox(sb e2bSandbox, token string, port int, method, path string, body io.Reader) (int, []byte) {
	c.t.Helper()
	return c.do(c.sandboxRequest(sb, token, port, method, path, body))
}

// sandboxRequest is a request to a port of sb with token ("": none), as the SDKs route it.
func (c *e2bClient) sandboxRequest(sb e2bSandbox, token string, port int, method, path string, body io.Reader) *http.Request {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, body)
	require.NoError(c.t, err)
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", fmt.Sprint(port))
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	return req
}

// awaitFile waits (up to 30 s) until the sandbox has the file path: what a run in
// progress made, to say it is running.
func (c *e2bClient) awaitFile(sb e2bSandbox, path string) {
	c.t.Helper()
	require.Eventually(c.t, func() bool {
		code, _ := c.sandbox(sb, sb.EnvdAccessToken, 49983, "GET", "/files?path="+url.QueryEscape(path), nil)
		return code == http.StatusOK
	}, 30*time.Second, 10*time.Millisecond, "the run started (%s)", path)
}

func (c *e2bClient) do(req *http.Request) (int, []byte) {
	c.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, b
}

func (c *e2bClient) create(body map[string]any) e2bSandbox {
	c.t.Helper()
	code, b := c.api("POST", "/v2/sandboxes", body)
	require.Equal(c.t, http.StatusCreated, code, "%s", b)
	var sb e2bSandbox
	require.NoError(c.t, json.Unmarshal(b, &sb))
	return sb
}

// execute runs code in sb's default context and returns the NDJSON messages.
func (c *e2bClient) execute(sb e2bSandbox, code string) []map[string]any {
	c.t.Helper()
	body, err := json.Marshal(map[string]any{"code": code})
	require.NoError(c.t, err)
	status, out := c.sandbox(sb, sb.EnvdAccessToken, 49999, "POST", "/execute", bytes.NewReader(body))
	require.Equal(c.t, http.StatusOK, status, "%s", out)
	var msgs []map[string]any
	lines := bufio.NewScanner(bytes.NewReader(out))
	for lines.Scan() {
		var m map[string]any
		require.NoError(c.t, json.Unmarshal(lines.Bytes(), &m), "%s", lines.Bytes())
		msgs = append(msgs, m)
	}
	return msgs
}

// Users are apart: another user's sandbox is not found through the API, and a sandbox's
// ports answer only its own access token.
func TestE2BUsersApart(t *testing.T) {
	s := startE2B(t)
	alice, bob := &e2bClient{t, s.base, aliceKey}, &e2bClient{t, s.base, bobKey}
	a := alice.create(nil)
	b := bob.create(nil)
	for _, call := range []struct{ method, path string }{
		{"GET", "/sandboxes/" + a.SandboxID}, {"DELETE", "/sandboxes/" + a.SandboxID},
		{"POST", "/sandboxes/" + a.SandboxID + "/timeout"}, {"POST", "/v2/sandboxes/" + a.SandboxID + "/connect"},
	} {
		code, body := bob.api(call.method, call.path, map[string]any{"timeout": 30})
		assert.Equal(t, http.StatusNotFound, code, "%s %s: %s", call.method, call.path, body)
	}
	code, body := bob.api("GET", "/v2/sandboxes", nil)
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, string(body), a.SandboxID)
	assert.Contains(t, string(body), b.SandboxID)
	for _, token := range []string{"", b.EnvdAccessToken, aliceKey} {
		code, body := bob.sandbox(a, token, 49999, "POST", "/execute", strings.NewReader(`{"code": "1"}`))
		assert.Equal(t, http.StatusUnauthorized, code, "token %q: %s", token, body)
		code, _ = bob.sandbox(a, token, 49983, "GET", "/files?path=x", nil)
		assert.Equal(t, http.StatusUnauthorized, code, "token %q", token)
	}
	code, _ = (&e2bClient{t, s.base, "not-a-key-of-the-server"}).api("GET", "/v2/sandboxes", nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	// The server's own endpoints, beside E2B's API, without a key.
	nobody := &e2bClient{t, s.base, ""}
	for _, p := range []string{"/healthz", "/readyz"} {
		code, body := nobody.api("GET", p, nil)
		assert.Equal(t, http.StatusOK, code, "%s: %s", p, body)
	}
	code, body = nobody.api("GET", "/metrics", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, string(body), "minipy_e2b_sandboxes 2\n")
	assert.Contains(t, string(body), "minipy_e2b_sandboxes_created_total 2\n")
	// Alice's sandbox still answers her.
	msgs := alice.execute(a, "6*7")
	assert.Equal(t, "42", msgs[len(msgs)-1]["text"], "%v", msgs)
	alice.execute(a, "1/0")
	_, body = nobody.api("GET", "/metrics", nil)
	metrics := parseMetrics(t, string(body))
	assert.Equal(t, 1.0, counter(metrics, "minipy_runs_total", "outcome", "ok"), "the server's run counts have E2B's")
	assert.Equal(t, 1.0, counter(metrics, "minipy_runs_total", "outcome", "python_error"))
	assert.Equal(t, 7.0, counter(metrics, "minipy_unauthorized_requests_total"), "a wrong key, six wrong access tokens")
}

// The files API reaches where the sandbox writes (its working directory, /tmp, /dev/shm, its
// own root) only: the image (/usr, /etc) and /proc, /dev are refused, and a link the code
// made is not followed out by the host.
func TestE2BFilesStayInside(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	for _, p := range []string{"/etc/passwd", "/home/user/../../etc/passwd", "/usr/lib/x", "/home/user", "/proc/self/environ",
		"/dev/null", "/namespaces/work/x"} {
		code, body := alice.sandbox(sb, sb.EnvdAccessToken, 49983, "POST", "/files?path="+p, strings.NewReader("x"))
		assert.Equal(t, http.StatusBadRequest, code, "upload to %s: %s", p, body)
		code, body = alice.sandbox(sb, sb.EnvdAccessToken, 49983, "GET", "/files?path="+p, nil)
		assert.Equal(t, http.StatusBadRequest, code, "download of %s: %s", p, body)
	}
	msgs := alice.execute(sb, "import os\nos.symlink('/etc/hostname', 'link')\nos.symlink('/proc/1/environ', 'env')")
	require.NotContains(t, msgs[len(msgs)-1]["type"], "error", "%v", msgs)
	for _, name := range []string{"link", "env"} {
		code, body := alice.sandbox(sb, sb.EnvdAccessToken, 49983, "GET", "/files?path=/home/user/"+name, nil)
		assert.NotEqual(t, http.StatusOK, code, "%s was followed: %q", name, body)
	}
	// The filesystem service (connect, JSON): the same bounds, and links listed, not followed.
	rpc := func(method, body string) (int, string) {
		req := alice.sandboxRequest(sb, sb.EnvdAccessToken, 49983, "POST", "/filesystem.Filesystem/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		code, out := alice.do(req)
		return code, string(out)
	}
	for _, call := range [][2]string{{"ListDir", `{"path": "/etc"}`}, {"ListDir", `{"path": "/home/user/../../usr"}`},
		{"Remove", `{"path": "/home/user/../user"}`}, {"Move", `{"source": "link", "destination": "/tmp/x"}`},
		{"MakeDir", `{"path": "/home/user/link/x"}`}, {"Stat", `{"path": "/home/user/link/hostname"}`}} {
		code, body := rpc(call[0], call[1])
		assert.NotEqual(t, http.StatusOK, code, "%s %s: %s", call[0], call[1], body)
	}
	code, body := rpc("ListDir", `{"path": "/home/user", "depth": 5}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"path":"/home/user/link"`)
	assert.Contains(t, body, `"symlinkTarget":"/etc/hostname"`, "a link's target is named")
	assert.NotContains(t, body, `"name":"hostname"`, "a link was followed")
}

// The files API writes and reads anywhere the sandbox writes, as E2B's git helpers and
// coding agents do: a repository under /tmp, an app at the root; the code sees the same
// files, and the host sees the code's.
func TestE2BFilesAnywhere(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	for _, p := range []string{"/tmp/repo/README.md", "/app/main.py", "/0/multi_test_file0.txt", "/dev/shm/seg"} {
		code, body := alice.sandbox(sb, sb.EnvdAccessToken, 49983, "POST", "/files?path="+p, strings.NewReader("at "+p))
		require.Equal(t, http.StatusOK, code, "upload to %s: %s", p, body)
		assert.Contains(t, string(body), `"path":"`+p+`"`)
	}
	msgs := alice.execute(sb, `import os
os.makedirs("/srv/out", exist_ok=True); open("/srv/out/r.txt", "w").write("from the code")
[open(p).read() for p in ("/tmp/repo/README.md", "/app/main.py", "/0/multi_test_file0.txt", "/dev/shm/seg")]`)
	require.NotEmpty(t, msgs)
	assert.Equal(t, []any{"at /tmp/repo/README.md", "at /app/main.py", "at /0/multi_test_file0.txt", "at /dev/shm/seg"},
		msgs[len(msgs)-1]["json"], "%v", msgs)
	code, body := alice.sandbox(sb, sb.EnvdAccessToken, 49983, "GET", "/files?path=/srv/out/r.txt", nil)
	require.Equal(t, http.StatusOK, code, "%s", body)
	assert.Equal(t, "from the code", string(body))
}

// A sandbox's time ends: it is killed, as E2B's are, and its ports answer 502.
func TestE2BSandboxTimeout(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(map[string]any{"timeout": 3}) // (its first call comes well within 3 s, even on a loaded machine)
	code, _ := alice.sandbox(sb, sb.EnvdAccessToken, 49983, "GET", "/health", nil)
	assert.Equal(t, http.StatusNoContent, code)
	assert.Eventually(t, func() bool {
		code, _ := alice.sandbox(sb, sb.EnvdAccessToken, 49983, "GET", "/health", nil)
		return code == http.StatusBadGateway
	}, 10*time.Second, 50*time.Millisecond)
	code, _ = alice.api("GET", "/sandboxes/"+sb.SandboxID, nil)
	assert.Equal(t, http.StatusNotFound, code)
	assert.Eventually(t, func() bool { return strings.Contains(s.log.String(), "ended: its time ended") },
		5*time.Second, 10*time.Millisecond)
	for _, timeout := range []int{0, -1, 3601} {
		code, body := alice.api("POST", "/v2/sandboxes", map[string]any{"timeout": timeout})
		assert.Equal(t, http.StatusBadRequest, code, "timeout %d: %s", timeout, body)
	}
}

// A kill stops the run in progress: its connection drops at once, as E2B's does.
func TestE2BKillDuringRun(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	done := make(chan error, 1)
	req := alice.sandboxRequest(sb, sb.EnvdAccessToken, 49999, "POST", "/execute", strings.NewReader(`{"code": `+
		`"import time\nopen('started', 'w').close()\nprint('started', flush=True)\ntime.sleep(60)"}`))
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		done <- err
	}()
	alice.awaitFile(sb, "/home/user/started")
	start := time.Now()
	code, body := alice.api("DELETE", "/sandboxes/"+sb.SandboxID, nil)
	require.Equal(t, http.StatusNoContent, code, "%s", body)
	select {
	case err := <-done:
		assert.Less(t, time.Since(start), 20*time.Second)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "the connection dropped, as E2B's does (the SDK's TimeoutError)")
	case <-time.After(30 * time.Second):
		t.Fatal("the run went on after its sandbox was killed")
	}
}

// The server's caps count sandboxes and contexts: past them, 429 with the reason.
func TestE2BCaps(t *testing.T) {
	s := startE2B(t, "-max-sessions-per-user", "2")
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	code, body := alice.sandbox(sb, sb.EnvdAccessToken, 49999, "POST", "/contexts", strings.NewReader(`{}`))
	require.Equal(t, http.StatusOK, code, "%s", body)
	code, body = alice.api("POST", "/v2/sandboxes", nil)
	assert.Equal(t, http.StatusTooManyRequests, code, "%s", body)
	assert.Contains(t, string(body), "-max-sessions-per-user")
	bob := &e2bClient{t, s.base, bobKey}
	bob.create(nil) // the cap is per user
	code, _ = alice.api("DELETE", "/sandboxes/"+sb.SandboxID, nil)
	require.Equal(t, http.StatusNoContent, code)
	alice.create(nil) // its places came back
}

// SIGHUP reads the tokens again (serving E2B alone: nothing else catches it).
func TestE2BTokensReload(t *testing.T) {
	s := startE2B(t)
	toks := s.cmd.Args[slices.Index(s.cmd.Args, "-tokens")+1]
	carol := &e2bClient{t, s.base, "carol-key-0123456789abcdef"}
	code, _ := carol.api("GET", "/v2/sandboxes", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	require.NoError(t, os.WriteFile(toks, []byte("carol:carol-key-0123456789abcdef\n"), 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	assert.Eventually(t, func() bool {
		code, _ := carol.api("GET", "/v2/sandboxes", nil)
		return code == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "%s", s.log)
	code, _ = (&e2bClient{t, s.base, aliceKey}).api("GET", "/v2/sandboxes", nil)
	assert.Equal(t, http.StatusUnauthorized, code, "a token the file dropped")
}

// SIGTERM drains: the running execution finishes and streams its end; then the server ends.
func TestE2BDrain(t *testing.T) {
	s := startE2B(t)
	alice := &e2bClient{t, s.base, aliceKey}
	sb := alice.create(nil)
	done := make(chan []map[string]any, 1)
	go func() {
		done <- alice.execute(sb, "import time\nopen('started', 'w').close()\ntime.sleep(2)\nprint('finished')")
	}()
	alice.awaitFile(sb, "/home/user/started")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	msgs := <-done
	assert.Equal(t, "finished\n", msgs[len(msgs)-1]["text"], "%v", msgs)
	select {
	case <-s.done:
		assert.NoError(t, s.err, "%s", s.log)
	case <-time.After(20 * time.Second):
		t.Fatalf("the server did not end after its drain:\n%s", s.log)
	}
}

// -e2b's flags: beyond loopback it needs tokens; its sandboxes need a worker process each;
// MCP's session flags do not apply to it alone. The state store's: one of -state-dir and
// -state-store, a store that answers.
func TestE2BFlags(t *testing.T) {
	bin := buildServer(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-e2b", "0.0.0.0:0"}, "give -tokens FILE"},
		{[]string{"-e2b", "127.0.0.1:0", "-backend", "inprocess"}, "-e2b needs -backend isolated"},
		{[]string{"-e2b", "127.0.0.1:0", "-backend", "isolated", "-workers", "1"}, "a worker process per sandbox"},
		{[]string{"-e2b", "127.0.0.1:0", "-state-idle", "1s"}, "-state-idle applies to MCP sessions"},
		{[]string{"-http", "127.0.0.1:0", "-e2b-max-timeout", "2h"}, "-e2b-max-timeout applies to -e2b"},
		{[]string{"-e2b-max-timeout", "2h"}, "-e2b-max-timeout applies to -http and -e2b"},
		{[]string{"-state-store", "redis://127.0.0.1:1/0"}, "-state-store applies to -http and -e2b"},
		{[]string{"-http", "127.0.0.1:0", "-state-dir", t.TempDir(), "-state-store", "redis://127.0.0.1:1/0"},
			"give -state-dir or -state-store, not both"},
		{[]string{"-e2b", "127.0.0.1:0", "-backend", "isolated", "-state-store", "redis://127.0.0.1:1/0"},
			"-state-store 127.0.0.1:1: "},
		{[]string{"-http", "127.0.0.1:0", "-advertise", "http://127.0.0.1:1"}, "-advertise applies to -e2b"},
		{[]string{"-e2b", "127.0.0.1:0", "-backend", "isolated", "-advertise", "http://127.0.0.1:1"},
			"-advertise needs -state-dir or -state-store"},
		{[]string{"-e2b", "127.0.0.1:0", "-backend", "isolated", "-state-dir", t.TempDir(), "-advertise", "10.0.0.5:8081"},
			"an http(s)://HOST:PORT URL"},
		{[]string{"-e2b", "127.0.0.1:0", "-backend", "isolated", "-advertise-http", "http://127.0.0.1:1"},
			"-advertise-http applies to MCP sessions (-http)"},
		{[]string{"-http", "127.0.0.1:0", "-backend", "isolated", "-advertise-http", "http://127.0.0.1:1"},
			"-advertise-http needs -state-dir or -state-store"},
	} {
		cmd := exec.Command(bin, c.args...)
		tmp := t.TempDir()
		require.NoError(t, os.Chmod(filepath.Dir(tmp), 0o711))
		require.NoError(t, os.Chmod(tmp, 0o711))
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, string(out), c.want, "%v", c.args)
		left, _ := os.ReadDir(tmp)
		assert.Empty(t, left, "%v: a refusal after the engine started closes it (its private directory goes)", c.args)
	}
}

// A hostile command: it cannot kill the sandbox's pid 1 (the guardian) nor read its memory
// or descriptors; a sandbox runs at most 16 commands; another sandbox's token reaches none.
func TestE2BCommandsHostile(t *testing.T) {
	s := startE2B(t)
	got := runE2BScript(t, s, "hostile.mjs")
	want := map[string]any{
		"tries": "pid 1 alive\nmem refused\nfds refused\n", "stillThere": "42", "seventeenth": "RateLimitError",
		"afterKills": "room again\n", "forged": "AuthenticationError",
	}
	for k, v := range want {
		assert.Equal(t, v, got[k], k)
	}
}

// On a root host each sandbox has a root user: E2B's base SDK, unmodified, runs commands
// as root and sudo, writes and reads files as root (its relative paths in /root, signed
// URLs too), sees root's files as root's, and finds them so after a pause; a user the
// sandbox has not is envd's "invalid username". (TestRootUser* in the root package holds
// what root cannot do.)
func TestE2BRootUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a root user needs a root host")
	}
	got := runE2BScript(t, startE2B(t), "root.mjs")
	assert.Equal(t, map[string]any{"whoami": "user", "root": "root\n/root\n/root", "sudo": "root\n[]", "sudoUser": "1000"},
		got["commands"], "sudo resets the environment, as sudo does (E2B's 'bash command scoped env vars')")
	assert.Equal(t, "/root/hello.txt", got["written"])
	assert.Equal(t, "hello root", got["readAsRoot"])
	assert.NotEqual(t, "read", got["readAsUser"], "root's home is not the user's")
	assert.Equal(t, "root", got["owner"])
	assert.Equal(t, []any{"hello.txt:root"}, got["listed"])
	assert.Equal(t, "root 644\nroot 700", got["stat"])
	assert.Equal(t, "hello root", got["signed"])
	assert.Equal(t, []any{map[string]any{"name": "up.txt", "path": "/root/up.txt", "type": "file"}}, got["uploaded"])
	assert.Contains(t, got["badUser"], "invalid username: 'admin'")
	assert.Contains(t, got["badCommandUser"], "invalid username: 'admin'")
	assert.Equal(t, "root 600 /root/key\nroot 644 /srv/s\nsecret", got["afterPause"])
	assert.Equal(t, true, got["watched"], "a watch as root")
	assert.NotEqual(t, "watched", got["watchAsUser"])
	assert.Contains(t, got["mcp"], "Failed to start MCP gateway")
	assert.Equal(t, 0.0, got["mcpLeft"])
}

// E2B's base SDK builds a template (its files uploaded, its steps run in a sandbox of the
// user's: COPY, RUN, ENV, WORKDIR, a symlink, a start command and its ready check), starts
// a sandbox of it, and meets the refusals: a failing step, another image, a user the
// sandbox has not, root where the server has none (steps as root where it has). A template built on one of the user's own sees its files; a build of
// its name with a tag takes the name, the first keeps its own tag (default). COPY is
// Docker's (the SDK turns a Dockerfile's COPY into it as it is): folder/* matches folder/sub,
// whose contents are copied.
func TestE2BTemplates(t *testing.T) {
	for name, args := range map[string][]string{"memory": nil, "store": {"-state-dir", t.TempDir()}} {
		t.Run(name, func(t *testing.T) { testE2BTemplates(t, startE2B(t, args...)) })
	}
}

func testE2BTemplates(t *testing.T, s *serverProc) {
	got := runE2BScript(t, s, "templates.mjs", "CONTEXT="+t.TempDir())
	assert.Equal(t, map[string]any{"name": got["built"].(map[string]any)["name"], "hasID": true}, got["built"])
	assert.Equal(t, true, got["logged"])
	assert.Equal(t, []any{true, false}, got["exists"])
	assert.Equal(t, map[string]any{"pwd": "/app", "copied": "This is a test file.", "folder": "deep.txt link.txt test.txt",
		"link": "test.txt", "script": "ran", "greeting": "hello template", "env": "hello template", "tmp": "kept",
		"started": true}, got["inside"], "started: by the sandbox's own start command (its boot id), not the build's")
	assert.Equal(t, "BuildError: failed to run command 'echo before && exit 3': command failed: exit status 3", got["failedStep"])
	assert.Contains(t, got["otherImage"], "BuildError: 400: the template cannot be built: not served by minipy: fromImage \"ubuntu:22.04\"")
	if os.Geteuid() == 0 { // (the sandboxes have a root user: steps run as root when they say so)
		assert.Equal(t, "built", got["asRoot"])
	} else {
		assert.Contains(t, got["asRoot"], "BuildError: not served by minipy: failed to run command 'test \"$(whoami)\" = root': root")
	}
	assert.Equal(t, "BuildError: failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root123'", got["noUser"])
	assert.Equal(t, "built", got["fromMine"])
	assert.Contains(t, []any{"building", "ready"}, got["background"])
	assert.Equal(t, []any{"v2", "v2", "none"}, got["tags"], "the name and name:v2 are the newest build's, name:default the first's")
	assert.Equal(t, "default v2", got["tagsListed"])
	assert.Equal(t, map[string]any{"tags": []any{"prod", "stable"}, "hasBuild": true}, got["assigned"])
	assert.Equal(t, "v2", got["prodIsV2"])
	assert.Equal(t, "none", got["prodMoved"], "prod moved to the first build")
	assert.Equal(t, false, got["stableGone"])
	assert.Equal(t, "TemplateError", got["removeMissing"])
	assert.Equal(t, "TemplateError", got["assignMissing"])
	assert.Equal(t, "default prod v2", got["tagsAfter"])
	assert.Equal(t, []any{false, "default v2"}, got["prodGone"], "a removed tag does not fall back to a build it left")
	assert.Equal(t, []any{false, true}, got["takenGone"], "nor to a build a newer one took it from")
	assert.Equal(t, []any{false, false, false}, got["existsAfterDelete"], "a template's delete takes every build")
}

// Sleeping and autoResume through the unmodified SDK (sleep.mjs): an idle sandbox sleeps,
// is listed running, and wakes at its next runCode with its variables; one its timeout
// paused with autoResume wakes at its next runCode.
func TestE2BSleepWithSDK(t *testing.T) {
	s := startE2B(t, "-e2b-sleep-idle", "300ms")
	got := runE2BScript(t, s, "sleep.mjs")
	assert.Equal(t, map[string]any{
		"listed": []any{"running"}, "info": "running", "wokenBefore": 0.0, "x": "42", "wokenAfter": 1.0,
		"running": true, "lifecycle": map[string]any{"onTimeout": "pause", "autoResume": true}, "y": "8",
		"wokenByTraffic": 1.0,
	}, got)
}
