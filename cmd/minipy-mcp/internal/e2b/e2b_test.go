package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// The parts of the E2B front that need no engine; cmd/minipy-mcp's e2b_test.go runs the
// whole of it with E2B's SDK and the isolated engine.

func TestResultMessage(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nrest")
	msg := resultMessage(map[string][]byte{
		"text/plain": []byte("'quoted'"), "image/png": png, "application/json": []byte(`{"a": [1, 2]}`),
		"text/html": []byte("<b>x</b>"), "application/vnd.custom+json": []byte("{}"), "image/gif": []byte("GIF89a"),
	}, true)
	b, err := json.Marshal(msg)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, map[string]any{
		"type": "result", "is_main_result": true,
		"text":                        "quoted", // E2B's server takes a string's quotes off
		"png":                         "iVBORw0KGgpyZXN0",
		"json":                        map[string]any{"a": []any{1.0, 2.0}},
		"html":                        "<b>x</b>",
		"application/vnd.custom+json": "e30=", // not a known key: under its MIME type, as bytes
		"image/gif":                   "R0lGODlh",
	}, got)
	assert.Equal(t, "'", resultMessage(map[string][]byte{"text/plain": []byte("'")}, false)["text"])
}

func TestResults(t *testing.T) {
	res := &minipy.Result{HasValue: true, Repr: "42", Displays: []minipy.Display{
		{Data: map[string][]byte{"text/plain": []byte("<Figure>"), "image/png": []byte("p")}},
	}}
	got := results(res)
	require.Len(t, got, 2)
	assert.Equal(t, false, got[0]["is_main_result"])
	assert.Equal(t, map[string]any{"type": "result", "is_main_result": true, "text": "42"}, got[1])
	// A value with a rich form is its own display: no second main result.
	res.Displays = append(res.Displays, minipy.Display{Value: true, Data: map[string][]byte{"text/plain": []byte("df")}})
	got = results(res)
	require.Len(t, got, 2)
	assert.Equal(t, true, got[1]["is_main_result"])
}

// recorder keeps a stream's messages.
func streamed(t *testing.T, w *httptest.ResponseRecorder) []map[string]any {
	var msgs []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(w.Body.String(), "\n"), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		msgs = append(msgs, m)
	}
	return msgs
}

func TestStreamWriterSendsLines(t *testing.T) {
	w := httptest.NewRecorder()
	sw := (&stream{w: w}).writer("stdout")
	for _, piece := range []string{"tick", " ", "0", "\n", "tick 1\nhalf", " a line", "\rbar"} {
		sw.Write([]byte(piece)) //nolint:errcheck // never fails
	}
	sw.flush()
	var texts []string
	for _, m := range streamed(t, w) {
		assert.Equal(t, "stdout", m["type"])
		texts = append(texts, m["text"].(string))
	}
	assert.Equal(t, []string{"tick 0\n", "tick 1\n", "half a line\r", "bar"}, texts)

	// A line longer than maxPending goes in pieces, none of them inside a character.
	w = httptest.NewRecorder()
	sw = (&stream{w: w}).writer("stderr")
	long := strings.Repeat("é", maxPending) // two bytes each
	for i := 0; i < len(long); i += 999 {
		sw.Write([]byte(long[i:min(i+999, len(long))])) //nolint:errcheck // never fails
	}
	sw.flush()
	var all strings.Builder
	for _, m := range streamed(t, w) {
		text := m["text"].(string)
		assert.NotContains(t, text, "\uFFFD", "a character was cut")
		all.WriteString(text)
	}
	assert.Equal(t, long, all.String())
}

func TestWorkPath(t *testing.T) {
	for in, want := range map[string]string{
		"/home/user/a.csv": "a.csv", "a.csv": "a.csv", "/home/user/d/../b": "b", "d/e": "d/e", "/home/user": "",
		"/home/user/": "",
	} {
		got, ok := workPath(in, Home)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	// Root's relative paths are in its home.
	for in, want := range map[string]string{"a.csv": "/root/a.csv", "/home/user/a": "a", "../x": "/x", "": ""} {
		got, ok := workPath(in, RootHome)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	// Elsewhere, the absolute path, clean, for the file methods to reach or refuse.
	for in, want := range map[string]string{"/etc/passwd": "/etc/passwd", "../x": "/home/x", "/home/user/../x": "/home/x",
		"/home/userx": "/home/userx", "/": "/", "/tmp/a/": "/tmp/a"} {
		got, ok := workPath(in, Home)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	_, ok := workPath("/tmp/"+strings.Repeat("a", maxPath), Home)
	assert.False(t, ok, "past PATH_MAX")
	for name, want := range map[string]string{"a.csv": "/home/user/a.csv", "": "/home/user", "/tmp/x": "/tmp/x"} {
		assert.Equal(t, want, sandboxPath(name), name)
	}
}

func TestHostSandbox(t *testing.T) {
	for host, want := range map[string][2]string{
		"49999-abc.sandbox.example.com": {"abc", "49999"},
		"49983-abc.example.com:443":     {"abc", "49983"},
		"example.com":                   {"", ""},
		"api.example.com":               {"", ""},
		"localhost:8080":                {"", ""},
		"x-abc.example.com":             {"", ""},
	} {
		id, port := hostSandbox(host)
		assert.Equal(t, want, [2]string{id, port}, host)
	}
}

// newTestServer has one sandbox of alice's, with no namespace (the calls tested need
// none).
func newTestServer() (*Server, *sandbox) {
	s := New(Config{Authenticate: func(key string) (string, bool) {
		user, ok := map[string]string{"ka": "alice", "kb": "bob"}[key]
		return user, ok
	}})
	sb := &sandbox{id: "sb1", token: "tok", user: "alice", template: Templates[0], metadata: map[string]string{"k": "v"},
		started: time.Now(), end: time.Now().Add(time.Minute), timer: time.NewTimer(time.Hour), state: stateRunning,
		inflight: make(chan struct{}, maxInflight)}
	s.sandboxes[sb.id] = sb
	return s, sb
}

func TestRouting(t *testing.T) {
	s, _ := newTestServer()
	call := func(host string, headers map[string]string) int {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = host
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Code
	}
	assert.Equal(t, http.StatusNoContent, call("x", map[string]string{"E2b-Sandbox-Id": "sb1", "E2b-Sandbox-Port": "49983",
		"X-Access-Token": "tok"}))
	assert.Equal(t, http.StatusNoContent, call("49983-sb1.sandboxes.example.com", map[string]string{"X-Access-Token": "tok"}))
	assert.Equal(t, http.StatusUnauthorized, call("49983-sb1.example.com", nil))
	assert.Equal(t, http.StatusUnauthorized, call("49983-sb1.example.com", map[string]string{"X-Access-Token": "tok2"}))
	// A sandbox that does not run: 502 to a token the server made for it, which its client
	// had; else 401, as for a live one without its token (which ids live is no one's to learn).
	assert.Equal(t, http.StatusBadGateway, call("49983-nope.example.com", map[string]string{"X-Access-Token": s.tokens.make("nope")}))
	assert.Equal(t, http.StatusUnauthorized, call("49983-nope.example.com", map[string]string{"X-Access-Token": "tok"}))
	assert.Equal(t, http.StatusUnauthorized, call("49983-nope.example.com", nil))
	assert.Equal(t, http.StatusUnauthorized, call("49983-nope.example.com", map[string]string{"X-Access-Token": s.tokens.make("sb1")}))
	assert.Equal(t, http.StatusBadGateway, call("8080-sb1.example.com", map[string]string{"X-Access-Token": "tok"}))
	assert.Equal(t, http.StatusOK, call("49999-sb1.example.com", map[string]string{"E2B-Traffic-Access-Token": "tok"}))
	assert.Equal(t, http.StatusNotFound, call("api.example.com", nil), "the API has no /health")
	// Past maxInflight requests in progress on a sandbox, the next is refused.
	sb := s.sandboxes["sb1"]
	for range maxInflight {
		sb.inflight <- struct{}{}
	}
	assert.Equal(t, http.StatusTooManyRequests, call("49983-sb1.example.com", map[string]string{"X-Access-Token": "tok"}))
	<-sb.inflight
	assert.Equal(t, http.StatusNoContent, call("49983-sb1.example.com", map[string]string{"X-Access-Token": "tok"}))
}

func TestCheckCreate(t *testing.T) {
	s, _ := newTestServer()
	seconds := func(n int) *int { return &n }
	resume := createRequest{}
	resume.AutoResume = &struct {
		Enabled bool `json:"enabled"`
	}{true}
	for name, req := range map[string]createRequest{
		"template": {TemplateID: "my-template"},
		"volumes":  {VolumeMounts: []any{map[string]any{"name": "v", "path": "/data"}}},
		"resume":   resume,
		"zero":     {Timeout: seconds(0)},
		"too long": {Timeout: seconds(3601)},
		"env name": {EnvVars: map[string]string{"A=B": "x"}},
		"env NUL":  {EnvVars: map[string]string{"A": "x\x00y"}},
		"env none": {EnvVars: map[string]string{"": "x"}},
	} {
		_, _, why := s.checkCreate(&req)
		assert.NotEmpty(t, why, name)
	}
	template, life, why := s.checkCreate(&createRequest{})
	assert.Empty(t, why)
	assert.Equal(t, "code-interpreter-v1", template)
	assert.Equal(t, DefaultSandboxTimeout, life)
	template, life, why = s.checkCreate(&createRequest{TemplateID: "base", Timeout: seconds(3600), MCP: map[string]any{}})
	assert.Empty(t, why, "mcp: E2B's SDK starts the gateway itself, as a command (there is none: it fails, and kills the sandbox)")
	assert.Equal(t, "base", template)
	assert.Equal(t, time.Hour, life)
}

// Sandbox.list as E2B's API serves it: newest first (order=asc: oldest first), filtered by
// metadata, states, template and start times, in pages whose token holds the place even when
// the sandbox it names is gone; a query it cannot read is 400.
func TestList(t *testing.T) {
	s, _ := newTestServer()
	for i, user := range []string{"alice", "alice", "bob", "alice"} {
		id := string(rune('a' + i))
		s.sandboxes[id] = &sandbox{id: id, user: user, metadata: map[string]string{"n": id}, template: "base",
			started: time.Unix(int64(i), 0), end: time.Now(), timer: time.NewTimer(time.Hour), state: stateRunning}
	}
	get := func(key, query string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/v2/sandboxes?"+query, nil)
		r.Header.Set("X-API-KEY", key)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	list := func(key, query string) ([]string, string) {
		w := get(key, query)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		var got []listedSandbox
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
		ids := []string{}
		for _, l := range got {
			ids = append(ids, l.SandboxID)
		}
		return ids, w.Header().Get("X-Next-Token")
	}
	ids, next := list("ka", "")
	assert.Equal(t, []string{"sb1", "d", "b", "a"}, ids, "newest first")
	assert.Empty(t, next)
	ids, _ = list("ka", "order=asc")
	assert.Equal(t, []string{"a", "b", "d", "sb1"}, ids)
	ids, next = list("ka", "limit=2")
	assert.Equal(t, []string{"sb1", "d"}, ids)
	delete(s.sandboxes, "d") // (killed between pages: the next page goes on where it was)
	ids, next = list("ka", "limit=2&nextToken="+url.QueryEscape(next))
	assert.Equal(t, []string{"b", "a"}, ids)
	assert.Empty(t, next, "no page after the last")
	ids, next = list("ka", "order=asc&limit=1")
	assert.Equal(t, []string{"a"}, ids)
	ids, _ = list("ka", "order=asc&limit=1&nextToken="+url.QueryEscape(next))
	assert.Equal(t, []string{"b"}, ids)
	ids, _ = list("ka", "metadata=n%3Db")
	assert.Equal(t, []string{"b"}, ids)
	ids, _ = list("ka", "template=base")
	assert.Equal(t, []string{"b", "a"}, ids)
	ids, _ = list("ka", "template=unknown-template")
	assert.Empty(t, ids)
	ids, _ = list("ka", "order=asc&startedAfter="+time.Unix(1, 0).UTC().Format(time.RFC3339Nano))
	assert.Equal(t, []string{"b", "sb1"}, ids, "at or after")
	ids, _ = list("ka", "startedBefore="+time.Unix(1, 0).UTC().Format(time.RFC3339Nano))
	assert.Equal(t, []string{"a"}, ids, "before")
	ids, _ = list("ka", "state=paused")
	assert.Empty(t, ids)
	s.sandboxes["b"].state = statePaused
	ids, _ = list("ka", "state=paused")
	assert.Equal(t, []string{"b"}, ids)
	ids, _ = list("ka", "state=running,paused")
	assert.Len(t, ids, 3)
	ids, _ = list("kb", "")
	assert.Equal(t, []string{"c"}, ids)
	for _, bad := range []string{"order=up", "limit=0", "limit=101", "limit=x", "startedAfter=yesterday",
		"nextToken=abc", "metadata=a%3D%25zz"} {
		assert.Equal(t, http.StatusBadRequest, get("ka", bad).Code, bad)
	}
}

// A fork's request is checked before anything is copied: its count and timeout (before the
// sandbox is looked up, as E2B's schema check: the SDK's own test forks "sbx-test" with
// count 0 and expects a 400), and a sandbox that does not run.
func TestForkRefused(t *testing.T) {
	s, _ := newTestServer()
	s.sandboxes["p"] = &sandbox{id: "p", user: "alice", started: time.Now(), end: time.Now(),
		timer: time.NewTimer(time.Hour), state: statePaused}
	postAs := func(key, id, body string) int {
		r := httptest.NewRequest("POST", "/sandboxes/"+id+"/fork", strings.NewReader(body))
		r.Header.Set("X-API-KEY", key)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w.Code
	}
	post := func(id, body string) int { return postAs("ka", id, body) }
	for _, body := range []string{`{"count": 0}`, `{"count": 101}`, `{"count": "x"}`, `{"timeout": -1}`, `{"timeout": 999999}`} {
		assert.Equal(t, http.StatusBadRequest, post("sb1", body), body)
		assert.Equal(t, http.StatusBadRequest, post("nope", body), body)
		// The SDK's own test: a made-up key and count 0 is E2B's 400 (the body's schema is
		// checked before the key), which the SDK raises as InvalidArgumentError.
		assert.Equal(t, http.StatusBadRequest, postAs("e2b_made_up", "sbx-test", body), body)
	}
	assert.Equal(t, http.StatusUnauthorized, postAs("e2b_made_up", "sb1", `{"count": 1}`), "a good body still needs a key")
	assert.Equal(t, http.StatusUnauthorized, postAs("", "sb1", `{}`))
	assert.Equal(t, http.StatusConflict, post("p", `{}`), "paused")
	assert.Equal(t, http.StatusNotFound, post("nope", `{}`))
	r := httptest.NewRequest("POST", "/sandboxes/sb1/fork", strings.NewReader(`{}`))
	r.Header.Set("X-API-KEY", "kb")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	assert.Equal(t, http.StatusNotFound, w.Code, "another user's sandbox is not found, not forked")
}

// A create while the engine cannot start a sandbox (Config.Ready: its worker starts fail,
// such as at the host's process limit) is refused with why (503), not answered with a
// sandbox whose every run fails; once it can again, creates succeed.
func TestCreateRefusedWhenUnready(t *testing.T) {
	var mu sync.Mutex
	why := errors.New("fork the sandbox's pid 1: [Errno 11] (the host's process limit is reached)")
	_, base := pauseServer(t, Config{Ready: func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return why
	}})
	code, body := call(t, "POST", base+"/v2/sandboxes", `{}`)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body["message"], "process limit is reached")
	mu.Lock()
	why = nil
	mu.Unlock()
	code, _ = call(t, "POST", base+"/v2/sandboxes", `{}`)
	assert.Equal(t, http.StatusCreated, code)
}
