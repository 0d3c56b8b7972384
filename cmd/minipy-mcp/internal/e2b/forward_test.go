package e2b

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/minipy-go/minipy/internal/testproc"
)

// replicaServer is a server of a store at url that advertises its own address there
// (Config.Advertise), as a replica behind a round-robin balancer.
func replicaServer(t *testing.T, storeURL string) (*Server, string) {
	s, base, _ := replicaWith(t, storeURL, 0, 0)
	return s, base
}

// replicaWith is replicaServer with leases of lease and idle saves after idle (0: the
// defaults; none), and a func that kills it hard: its address and leases are no longer
// renewed, and it answers nothing more; its engine and sandboxes live on, as a replica cut
// off would.
func replicaWith(t *testing.T, storeURL string, lease, idle time.Duration, onIdleDeath ...func(minipy.IdleDeath)) (*Server, string, func()) {
	return replicaOf(t, storeURL, lease, Config{StateIdle: idle}, onIdleDeath...)
}

// replicaOf is replicaWith of a server configured as cfg (its engine, store, address and
// authentication set here).
func replicaOf(t *testing.T, storeURL string, lease time.Duration, cfg Config, onIdleDeath ...func(minipy.IdleDeath)) (*Server, string, func()) {
	store, err := session.Open(storeURL, session.StoreOptions{TTL: time.Hour, Lease: lease})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	ecfg := minipy.IsolatedConfig{WorkDirPath: Home, Spares: -1}
	if len(onIdleDeath) > 0 {
		ecfg.OnIdleDeath = onIdleDeath[0]
	}
	eng, err := minipy.NewIsolated(ecfg)
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	var s *Server
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.ServeHTTP(w, r) }))
	cfg.Engine, cfg.Store, cfg.Advertise = eng, store, "http://"+ts.Listener.Addr().String()
	cfg.Authenticate = func(key string) (string, bool) { return key, key != "" }
	s = New(cfg)
	ts.Start()
	t.Cleanup(func() { ts.Close(); s.Close() })
	die := func() {
		s.fwd.stop()
		s.fwd.done.Wait()
		ts.CloseClientConnections()
		ts.Listener.Close()
	}
	return s, ts.URL, die
}

// A replica killed hard: once its lease has expired, the next request for its sandbox on
// another replica brings the sandbox back there from its last idle save, under the same id
// and access token, with its variables and files (what came after the save is lost); the
// dead replica's copy, should it live on cut off, ends at its next save, fenced.
func TestRecoverFromIdleSave(t *testing.T) {
	dir := t.TempDir()
	const lease, idle = 600 * time.Millisecond, 100 * time.Millisecond
	a, baseA, dieA := replicaWith(t, dir, lease, idle)
	b, baseB, _ := replicaWith(t, dir, lease, idle)
	code, sb := callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{"timeout": 300}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	require.Equal(t, "", run(t, baseB, sb, "x = 7\n_ = open('f.txt', 'w').write('kept')"))
	ran := time.Now()
	require.Eventually(t, func() bool {
		meta, err := b.cfg.Store.Stat(session.KindRunning, id)
		return err == nil && meta.Saved.After(ran) && !a.lookup(id).isDirty()
	}, 30*time.Second, 20*time.Millisecond, "saved when idle")
	code, sbInfo := callAs(t, "ann", "GET", baseB+"/sandboxes/"+id, "")
	require.Equal(t, http.StatusOK, code, "%v", sbInfo)

	dieA()
	// The first request after the death finds A unreachable, waits for its lease to expire,
	// and goes on on B.
	start := time.Now()
	assert.Equal(t, "(7, 'kept')", run(t, baseB, sb, "x, open('f.txt').read()"), "back on B, the same token")
	assert.Less(t, time.Since(start), 30*time.Second)
	code, _ = callAs(t, "bob", "GET", baseB+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNotFound, code, "another user's")
	assert.Equal(t, 1, b.Stats().Recovered)
	code, info := callAs(t, "ann", "GET", baseB+"/sandboxes/"+id, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "running", info["state"])
	assert.NotEmpty(t, info["minipyRestoredFrom"], "the info says which save it came back from")

	// A's copy, cut off, saves once more: fenced, it ends itself.
	old := a.lookup(id)
	require.NotNil(t, old)
	old.mu.Lock()
	old.dirty = true
	old.mu.Unlock()
	a.idleSave(old)
	assert.Nil(t, a.lookup(id), "A ended its copy")
	assert.Equal(t, "(7, 'kept')", run(t, baseB, sb, "x, open('f.txt').read()"), "B's save is B's")
	code, _ = callAs(t, "ann", "DELETE", baseB+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNoContent, code)
	_, err := b.cfg.Store.Stat(session.KindRunning, id)
	assert.Error(t, err, "a kill removes its idle save")
}

// getFile reads the file at path of sandbox sb (its create answer) through envd at base.
func getFile(t *testing.T, base string, sb map[string]any, path string) (int, string) {
	req, err := http.NewRequest("GET", base+"/files?path="+path, nil)
	require.NoError(t, err)
	req.Header.Set("E2b-Sandbox-Id", sb["sandboxID"].(string))
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", sb["envdAccessToken"].(string))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Three replicas share a store; each request lands on any of them, as a round-robin
// balancer sends it: the one that runs the sandbox answers, through the others (the API,
// the interpreter's stream, envd's files, the list); a pause puts it in the store, a resume
// elsewhere moves its holder; a kill from anywhere ends it; another user finds nothing.
func TestForwardToHolder(t *testing.T) {
	t.Run("dir", func(t *testing.T) { forwardToHolder(t, t.TempDir()) })
	t.Run("redis", func(t *testing.T) { forwardToHolder(t, redistest.Start(t).URL()) })
}

func forwardToHolder(t *testing.T, storeURL string) {
	a, baseA := replicaServer(t, storeURL)
	b, baseB := replicaServer(t, storeURL)
	_, baseC := replicaServer(t, storeURL)
	code, sb := callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{"metadata": {"k": "v"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	assert.Equal(t, "", run(t, baseB, sb, "x = 41\n_ = open('f.txt', 'w').write('hi')"), "run through B, on A")
	assert.Equal(t, "42", run(t, baseC, sb, "x + 1"), "through C")
	code, body := getFile(t, baseC, sb, "f.txt")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "hi", body)
	for _, base := range []string{baseA, baseB, baseC} {
		assert.Equal(t, map[string]string{id: "running"}, listAs(t, "ann", base), "listed once, from %s", base)
		assert.Empty(t, listAs(t, "bob", base), "not another user's")
	}
	// A signed file URL names no sandbox (E2B_SANDBOX_URL): the replica that gets it finds
	// the one whose sandbox signed it.
	exp := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	sig := fileSignature("/home/user/f.txt", "read", "user", sb["envdAccessToken"].(string), exp)
	signedURL := "/files?path=%2Fhome%2Fuser%2Ff.txt&username=user&signature=" + url.QueryEscape(sig) +
		"&signature_expiration=" + exp
	for _, base := range []string{baseB, baseC, baseA} {
		resp, err := http.Get(base + signedURL)
		require.NoError(t, err)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", base, got)
		assert.Equal(t, "hi", string(got))
	}
	resp, err := http.Get(baseB + strings.Replace(signedURL, "f.txt", "g.txt", 1))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a signature of no sandbox's")

	code, info := callAs(t, "ann", "GET", baseB+"/sandboxes/"+id, "")
	require.Equal(t, http.StatusOK, code, "%v", info)
	assert.Equal(t, "running", info["state"])
	code, _ = callAs(t, "bob", "GET", baseB+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNotFound, code, "another user's: the holder says so")
	code, _ = callAs(t, "ann", "POST", baseC+"/sandboxes/"+id+"/timeout", `{"timeout": 120}`)
	assert.Equal(t, http.StatusNoContent, code)
	assert.Positive(t, b.Stats().Forwarded)
	assert.Zero(t, a.Stats().Forwarded, "A runs it: nothing of it forwarded from A")

	// A run whose request ends is stopped on the holder: the cancellation goes through.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	js, _ := json.Marshal(map[string]string{"code": "import time\ntime.sleep(60)\ny = 1"})
	req, err := http.NewRequestWithContext(ctx, "POST", baseB+"/execute", strings.NewReader(string(js)))
	require.NoError(t, err)
	toInterpreter(req, sb)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // (ends with the context)
		resp.Body.Close()
	}
	cancel()
	start := time.Now()
	assert.Equal(t, "NameError: name 'y' is not defined", run(t, baseB, sb, "y"))
	assert.Less(t, time.Since(start), 30*time.Second, "the cancelled run stopped")

	code, body2 := callAs(t, "ann", "POST", baseB+"/sandboxes/"+id+"/pause", "")
	require.Equal(t, http.StatusNoContent, code, "%v", body2)
	code, sbC := callAs(t, "ann", "POST", baseC+"/v2/sandboxes/"+id+"/connect", `{"timeout": 60}`)
	require.Equal(t, http.StatusCreated, code, "%v", sbC)
	assert.Equal(t, "41", run(t, baseA, sbC, "x"), "resumed on C, reached through A")
	code, _ = callAs(t, "ann", "DELETE", baseA+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNoContent, code, "killed from A, on C")
	for _, base := range []string{baseA, baseB, baseC} {
		assert.Empty(t, listAs(t, "ann", base))
		assert.True(t, strings.HasPrefix(run(t, base, sbC, "x"), "HTTP 502"), "ended, from %s", base)
	}
}

// A request that says it comes from a replica is refused unless its mark verifies under
// the store's key, for this request, within a minute: a client cannot pass as a replica,
// nor a replica of another store, nor replay a mark on another request or later.
func TestForwardMarkRefused(t *testing.T) {
	s, base := replicaServer(t, t.TempDir())
	other, _ := replicaServer(t, t.TempDir())
	for name, mark := range map[string]func(r *http.Request){
		"made up":         func(r *http.Request) { r.Header.Set(session.MarkHeader, "x 1 AAAA") },
		"another store's": func(r *http.Request) { other.cfg.Store.Mark(r) },
		"old":             func(r *http.Request) { s.cfg.Store.MarkAt(r, time.Now().Add(-2*time.Minute)) },
		"another request's": func(r *http.Request) {
			r.URL.Path = "/sandboxes"
			s.cfg.Store.Mark(r)
			r.URL.Path = replicaListPath
		},
	} {
		req, err := http.NewRequest("GET", base+replicaListPath, nil)
		require.NoError(t, err)
		req.Header.Set("X-API-KEY", "ann")
		mark(req)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, name)
	}
	req, err := http.NewRequest("GET", base+replicaListPath, nil)
	require.NoError(t, err)
	req.Header.Set("X-API-KEY", "ann")
	s.cfg.Store.Mark(req)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a valid mark: the test can fail")
	code, _ := callAs(t, "ann", "GET", base+replicaListPath, "")
	assert.Equal(t, http.StatusNotFound, code, "the replicas' list is theirs alone")
	code, _ = callAs(t, "ann", "GET", base+replicaSignedPath+"?method=GET&path=x&signature=v1_x", "")
	assert.Equal(t, http.StatusNotFound, code, "the replicas' search of signed URLs is theirs alone")
}

// A sandbox whose pid 1 dies between runs (killed from outside: the sandbox's code cannot)
// comes back from its last idle save, as its replica's death would bring it back: the
// next run finds its variables and files as they were saved, and runs.
func TestRestoreWhenPidOneDies(t *testing.T) {
	died := make(chan minipy.IdleDeath, 8)
	b, base, _ := replicaWith(t, t.TempDir(), 0, 100*time.Millisecond, func(d minipy.IdleDeath) { died <- d })
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	marker := "marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	require.Equal(t, "", run(t, base, sb, "x = 5\n_ = open('f.txt', 'w').write('kept')\nopen('/tmp/"+marker+"', 'w').close()"))
	ran := time.Now()
	require.Eventually(t, func() bool {
		meta, err := b.cfg.Store.Stat(session.KindRunning, id)
		return err == nil && meta.Saved.After(ran) && !b.lookup(id).isDirty()
	}, 30*time.Second, 20*time.Millisecond, "saved when idle")
	pid := testproc.SandboxPidOne(marker)
	require.Positive(t, pid, "the sandbox's pid 1")
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	select { // (the engine learns of it between runs, however long a loaded machine takes)
	case d := <-died:
		require.Positive(t, d.Namespaces, "%+v", d)
	case <-time.After(30 * time.Second):
		t.Fatal("the engine never saw the sandbox end")
	}
	assert.Equal(t, "(5, 'kept')", run(t, base, sb, "x, open('f.txt').read()"))
	assert.Equal(t, 1, b.Stats().Restored)
}
