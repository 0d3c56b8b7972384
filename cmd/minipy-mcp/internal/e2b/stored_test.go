package e2b

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// callAs is call with an API key, which the servers of these tests take as the user.
func callAs(t *testing.T, key, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m) //nolint:errcheck // not every answer is an object
	return resp.StatusCode, m
}

// listAs is the API's list of key's sandboxes: their ids by state.
func listAs(t *testing.T, key, base string) map[string]string {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/v2/sandboxes", nil)
	require.NoError(t, err)
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var list []listedSandbox
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	out := map[string]string{}
	for _, l := range list {
		out[l.SandboxID] = l.State
	}
	return out
}

// toInterpreter addresses req to the code interpreter (port 49999) of sandbox sb (the
// create or connect answer), with its access token, as the SDKs do.
func toInterpreter(req *http.Request, sb map[string]any) {
	req.Header.Set("E2b-Sandbox-Id", sb["sandboxID"].(string))
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("X-Access-Token", sb["envdAccessToken"].(string))
}

// run executes code in sandbox sb (the create or connect answer) and returns its main
// result's text, or its error's name and value.
func run(t *testing.T, base string, sb map[string]any, code string) string {
	t.Helper()
	js, _ := json.Marshal(map[string]string{"code": code})
	req, err := http.NewRequest("POST", base+"/execute", strings.NewReader(string(js)))
	require.NoError(t, err)
	toInterpreter(req, sb)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "HTTP " + resp.Status
	}
	out := ""
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(lines.Bytes(), &m))
		switch m["type"] {
		case "result":
			out += m["text"].(string)
		case "error":
			out += m["name"].(string) + ": " + m["value"].(string)
		}
	}
	return out
}

func storeServer(t *testing.T, url string, cfg Config) (*Server, string) {
	store, err := session.Open(url, session.StoreOptions{TTL: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { store.Close() })
	cfg.Store = store
	cfg.Authenticate = func(key string) (string, bool) { return key, key != "" }
	return pauseServer(t, cfg)
}

// With a store (a directory, Redis), a pause seals the sandbox there: another server
// sharing it lists it and resumes it (variables, files, environment, metadata), once; the
// first then finds it gone; a kill anywhere removes it; another user finds nothing.
func TestPauseIntoStore(t *testing.T) {
	t.Run("dir", func(t *testing.T) { pauseIntoStore(t, t.TempDir()) })
	t.Run("redis", func(t *testing.T) { pauseIntoStore(t, redistest.Start(t).URL()) })
}

func pauseIntoStore(t *testing.T, url string) {
	a, baseA := storeServer(t, url, Config{})
	b, baseB := storeServer(t, url, Config{})
	code, sb := callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{"envVars": {"FOO": "bar"}, "metadata": {"k": "v"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	require.Equal(t, "", run(t, baseA, sb, "x = 41\nopen('f.txt', 'w').write('hi')\nimport os\nos.environ['LATER'] = 'yes'"))
	code, body := callAs(t, "ann", "POST", baseA+"/sandboxes/"+id+"/pause", "")
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	assert.Equal(t, map[string]string{id: "paused"}, listAs(t, "ann", baseA))
	assert.Equal(t, map[string]string{id: "paused"}, listAs(t, "ann", baseB), "the other server lists it")
	assert.Empty(t, listAs(t, "bob", baseB), "not another user")
	assert.Equal(t, 1, a.Stats().Paused)
	assert.Equal(t, 1, b.Stats().Paused)
	assert.Zero(t, a.Stats().Running)
	assert.True(t, strings.HasPrefix(run(t, baseA, sb, "x"), "HTTP 502"), "paused: not running")

	code, _ = callAs(t, "bob", "POST", baseB+"/v2/sandboxes/"+id+"/connect", `{}`)
	assert.Equal(t, http.StatusNotFound, code, "another user's")
	code, info := callAs(t, "ann", "GET", baseB+"/sandboxes/"+id, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "paused", info["state"])
	assert.Equal(t, map[string]any{"k": "v"}, info["metadata"])
	code, sbB := callAs(t, "ann", "POST", baseB+"/v2/sandboxes/"+id+"/connect", `{"timeout": 60}`)
	require.Equal(t, http.StatusCreated, code, "%v", sbB)
	assert.Equal(t, sb["envdAccessToken"], sbB["envdAccessToken"], "its access token, for its life (E2B's)")
	// (The environment the code changed is the process's, which a pause does not keep: the
	// sandbox's envVars are set again.)
	assert.Equal(t, "(42, 'hi', 'bar', None)", run(t, baseB, sbB,
		"import os\nx + 1, open('f.txt').read(), os.environ['FOO'], os.environ.get('LATER')"))
	assert.Equal(t, "41", run(t, baseB, sb, "x"), "the create's answer reaches it where it resumed")
	assert.Empty(t, b.cfg.Store.List(session.KindSandbox), "out of the store")

	code, _ = callAs(t, "ann", "POST", baseA+"/v2/sandboxes/"+id+"/connect", `{}`)
	assert.Equal(t, http.StatusNotFound, code, "resumed elsewhere: not resumed twice")
	assert.Empty(t, listAs(t, "ann", baseA))
	assert.Equal(t, map[string]string{id: "running"}, listAs(t, "ann", baseB))

	code, _ = callAs(t, "ann", "POST", baseB+"/sandboxes/"+id+"/pause", "")
	require.Equal(t, http.StatusNoContent, code)
	code, _ = callAs(t, "bob", "DELETE", baseA+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = callAs(t, "ann", "DELETE", baseA+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNoContent, code, "killed while paused, from the other server")
	code, _ = callAs(t, "ann", "GET", baseB+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Empty(t, listAs(t, "ann", baseB))
	assert.Zero(t, b.Stats().Paused)
}

// A server that closes with a store pauses its running sandboxes into it (a run in
// progress stopped first), and the next server resumes them.
func TestCloseIntoStore(t *testing.T) {
	dir := t.TempDir()
	a, baseA := storeServer(t, dir, Config{})
	code, sb := callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	id := sb["sandboxID"].(string)
	require.Equal(t, "", run(t, baseA, sb, "y = 7"))
	running := make(chan string)
	go func() { running <- run(t, baseA, sb, "import time\nwhile True: time.sleep(0.01)") }()
	time.Sleep(200 * time.Millisecond)
	a.Close()
	<-running
	code, _ = callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{}`)
	assert.Equal(t, http.StatusServiceUnavailable, code, "closed")

	_, baseC := storeServer(t, dir, Config{})
	assert.Equal(t, map[string]string{id: "paused"}, listAs(t, "ann", baseC))
	code, sbC := callAs(t, "ann", "POST", baseC+"/v2/sandboxes/"+id+"/connect", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", sbC)
	assert.Equal(t, "7", run(t, baseC, sbC, "y"))
}

// The store's paused sandboxes together stay within MaxPausedBytes.
func TestStorePausedLimit(t *testing.T) {
	_, base := storeServer(t, t.TempDir(), Config{MaxPausedBytes: 1})
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	id := sb["sandboxID"].(string)
	code, body := callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/pause", "")
	assert.Equal(t, http.StatusInsufficientStorage, code, "%v", body)
	assert.Equal(t, map[string]string{id: "running"}, listAs(t, "ann", base))
	assert.Equal(t, "2", run(t, base, sb, "1 + 1"), "still running")
}

// encodeStored is sb's paused contexts as a pause of before the streams stored them (each
// context's save sized in the head), which readStored still reads.
func encodeStored(sb *sandbox, paused []pausedContext) (json.RawMessage, []byte, error) {
	info, err := json.Marshal(storedInfo{ID: sb.id, Template: sb.template, Metadata: sb.metadata, Started: sb.started})
	if err != nil {
		return nil, nil, err
	}
	head := storedHead{Envs: sb.envs, AutoPause: sb.autoPause}
	for _, p := range paused {
		head.Contexts = append(head.Contexts, storedContext{ID: p.id, Language: p.language, Cwd: p.cwd, Count: p.count,
			Size: len(p.saved)})
	}
	js, err := json.Marshal(head)
	if err != nil {
		return nil, nil, err
	}
	blob := binary.LittleEndian.AppendUint32(nil, uint32(len(js)))
	blob = append(blob, js...)
	for _, p := range paused {
		blob = append(blob, p.saved...)
	}
	return info, blob, nil
}

// A paused sandbox's contexts' saves go into its blob as chunks, one after another, and
// are read back each to its end; one cut short is an error.
func TestStoredChunks(t *testing.T) {
	var blob bytes.Buffer
	saves := []string{"", "one", strings.Repeat("long", 50_000)}
	for _, save := range saves {
		cw := &chunkWriter{w: &blob}
		_, err := io.Copy(cw, strings.NewReader(save))
		require.NoError(t, err)
		require.NoError(t, cw.Close())
	}
	whole := blob.Bytes()
	r := bytes.NewReader(whole)
	for _, want := range saves {
		got, err := io.ReadAll(&chunkReader{r: r})
		require.NoError(t, err)
		assert.Equal(t, want, string(got))
	}
	_, err := io.ReadAll(&chunkReader{r: bytes.NewReader(whole[:len(whole)-100])})
	require.NoError(t, err, "the first save is whole")
	cut := bytes.NewReader(whole[:len(whole)-100])
	for range 2 {
		io.ReadAll(&chunkReader{r: cut}) //nolint:errcheck // (the first two)
	}
	_, err = io.ReadAll(&chunkReader{r: cut})
	assert.ErrorIs(t, err, errStoredCorrupt, "the third, cut")
}

// A paused sandbox's blob is read back as written; a damaged one is an error.
func TestStoredBlob(t *testing.T) {
	sb := &sandbox{id: "i", template: "base", envs: map[string]string{"A": "1"}, autoPause: true}
	paused := []pausedContext{{id: "c1", language: "python", cwd: Home, count: 3, saved: []byte("one")},
		{id: "c2", language: "python", cwd: "/home/user/x", saved: []byte("")}}
	_, blob, err := encodeStored(sb, paused)
	require.NoError(t, err)
	head, got, err := decodeStored(blob)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"A": "1"}, head.Envs)
	assert.True(t, head.AutoPause)
	assert.Equal(t, len(paused), len(got))
	for i := range paused {
		assert.Equal(t, paused[i].id, got[i].id)
		assert.Equal(t, paused[i].cwd, got[i].cwd)
		assert.Equal(t, paused[i].count, got[i].count)
		assert.Equal(t, string(paused[i].saved), string(got[i].saved))
	}
	head, got, err = readStored(bytes.NewReader(blob))
	require.NoError(t, err, "a pause of before the streams is read still")
	assert.Equal(t, map[string]string{"A": "1"}, head.Envs)
	require.Len(t, got, 2)
	assert.Equal(t, "one", string(got[0].saved))
	for _, bad := range [][]byte{nil, {1, 0, 0}, {200, 0, 0, 0, '{'}, blob[:len(blob)-1], append([]byte{2, 0, 0, 0}, "{}"...)} {
		_, _, err := decodeStored(bad)
		assert.ErrorIs(t, err, errStoredCorrupt, "%q", bad)
	}
}
