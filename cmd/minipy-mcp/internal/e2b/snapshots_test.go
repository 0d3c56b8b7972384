package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
)

// getAs is a GET with key's API key: the status, the JSON body and the next page's token.
func getAs(t *testing.T, key, url string, v any) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(b, v), "%s", b)
	}
	return resp.StatusCode, resp.Header.Get("X-Next-Token")
}

// A snapshot keeps a sandbox's contexts (variables, files) as they are, and the sandbox
// goes on; sandboxes start from it by its id or its name, each a copy apart from the
// others; it is its user's alone (listed, used and deleted by no one else); deleting it
// gives its bytes back, and a second delete is 404. In the server's memory, and sealed in
// the state store (a directory, Redis).
func TestSnapshots(t *testing.T) {
	auth := func(key string) (string, bool) { return key, key != "" }
	t.Run("memory", func(t *testing.T) {
		snapshots(t, func() (*Server, string) { return pauseServer(t, Config{Authenticate: auth}) })
	})
	t.Run("dir", func(t *testing.T) {
		snapshots(t, func() (*Server, string) { return storeServer(t, t.TempDir(), Config{}) })
	})
	t.Run("redis", func(t *testing.T) {
		snapshots(t, func() (*Server, string) { return storeServer(t, redistest.Start(t).URL(), Config{}) })
	})
}

func snapshots(t *testing.T, serve func() (*Server, string)) {
	s, base := serve()
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{"metadata": {"k": "v"}, "envVars": {"A": "1"}}`)
	require.Equal(t, http.StatusCreated, code)
	id := sb["sandboxID"].(string)
	assert.Equal(t, "3", run(t, base, sb, "import os\nos.makedirs('app')\nopen('app/data.txt', 'w').write('kept')\nx = 3\nx"))

	code, snap := callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/snapshots", `{"name": "snap-one"}`)
	require.Equal(t, http.StatusCreated, code, "%v", snap)
	snapID := snap["snapshotID"].(string)
	assert.Equal(t, []any{"snap-one"}, snap["names"])
	assert.Equal(t, "4", run(t, base, sb, "x += 1\nx"), "the sandbox goes on")
	code, _ = callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/snapshots", `{"name": "no spaces"}`)
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/snapshots", `{"name": "base"}`)
	assert.Equal(t, http.StatusBadRequest, code, "a served template's name")

	for _, ref := range []string{snapID, "snap-one"} {
		code, from := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{"templateID": "`+ref+`", "envVars": {"B": "2"}}`)
		require.Equal(t, http.StatusCreated, code, "%v", from)
		assert.Equal(t, Templates[0], from["templateID"], "the sandbox's template")
		assert.Equal(t, "(3, 'kept', '1', '2')", run(t, base, from,
			"x, open('app/data.txt').read(), os.environ.get('A'), os.environ.get('B')"))
		run(t, base, from, "x = 100\nopen('app/data.txt', 'w').write('changed')")
	}
	assert.Equal(t, "(4, 'kept')", run(t, base, sb, "x, open('app/data.txt').read()"), "each a copy apart")

	var list []snapshotBody
	code, _ = getAs(t, "ann", base+"/snapshots", &list)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, []snapshotBody{{snapID, []string{"snap-one"}}}, list)
	for query, want := range map[string]int{"?sandboxID=" + id: 1, "?sandboxID=other": 0, "?name=snap-one": 1,
		"?name=" + snapID: 1, "?name=snap-one-does-not-exist": 0} {
		getAs(t, "ann", base+"/snapshots"+query, &list)
		assert.Len(t, list, want, query)
	}

	// Bob sees nothing of ann's snapshot, starts nothing from it, deletes nothing.
	getAs(t, "bob", base+"/snapshots", &list)
	assert.Empty(t, list)
	code, _ = callAs(t, "bob", "POST", base+"/v2/sandboxes", `{"templateID": "`+snapID+`"}`)
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = callAs(t, "bob", "DELETE", base+"/templates/"+snapID, "")
	assert.Equal(t, http.StatusNotFound, code)

	// Pages, newest first; the name moves to the newest snapshot that takes it.
	var ids []string
	for range 2 {
		_, more := callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/snapshots", `{"name": "snap-one"}`)
		ids = append([]string{more["snapshotID"].(string)}, ids...)
	}
	ids = append(ids, snapID)
	_, next := getAs(t, "ann", base+"/snapshots?limit=2", &list)
	require.Len(t, list, 2)
	assert.Equal(t, []string{ids[0], ids[1]}, []string{list[0].SnapshotID, list[1].SnapshotID})
	assert.Equal(t, []string{"snap-one"}, list[0].Names)
	assert.Empty(t, list[1].Names)
	require.NotEmpty(t, next)
	getAs(t, "ann", base+"/snapshots?limit=2&nextToken="+next, &list)
	require.Len(t, list, 1)
	assert.Equal(t, snapID, list[0].SnapshotID)

	for _, one := range ids {
		code, _ = callAs(t, "ann", "DELETE", base+"/templates/"+one, "")
		assert.Equal(t, http.StatusNoContent, code)
	}
	code, _ = callAs(t, "ann", "DELETE", base+"/templates/"+snapID, "")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = callAs(t, "ann", "POST", base+"/v2/sandboxes", `{"templateID": "`+snapID+`"}`)
	assert.Equal(t, http.StatusBadRequest, code, "gone")
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Zero(t, s.pausedBytes, "the snapshots' bytes are given back")
	assert.Empty(t, s.snapshots)
}

// A snapshot's bytes count with the paused sandboxes': past a user's share, 507; in the
// server's memory and in the store alike.
func TestSnapshotsBounded(t *testing.T) {
	auth := func(key string) (string, bool) { return key, key != "" }
	for what, base := range map[string]string{
		"memory": func() string { _, b := pauseServer(t, Config{MaxPausedBytes: 4 << 20, Authenticate: auth}); return b }(),
		"store":  func() string { _, b := storeServer(t, t.TempDir(), Config{MaxPausedBytes: 4 << 20}); return b }(),
	} {
		code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, code)
		run(t, base, sb, "import os\nn = open('big.bin', 'wb').write(os.urandom(2 << 20))")
		code, _ = callAs(t, "ann", "POST", base+"/sandboxes/"+sb["sandboxID"].(string)+"/snapshots", `{}`)
		assert.Equal(t, http.StatusInsufficientStorage, code, "%s: 2 MiB past a share of 1 MiB", what)
	}
}

// Snapshots in the store outlive their server, and every server sharing the store serves
// them: listed, started from (by id and name) and deleted from any; a name taken by a newer
// snapshot on one server is the newer one's on the others.
func TestSnapshotsInStore(t *testing.T) {
	dir := t.TempDir()
	a, baseA := storeServer(t, dir, Config{})
	code, sb := callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{"envVars": {"A": "1"}}`)
	require.Equal(t, http.StatusCreated, code)
	id := sb["sandboxID"].(string)
	run(t, baseA, sb, "x = 1\nn = open('f.txt', 'w').write('one')")
	code, first := callAs(t, "ann", "POST", baseA+"/sandboxes/"+id+"/snapshots", `{"name": "mine"}`)
	require.Equal(t, http.StatusCreated, code, "%v", first)
	a.Close() // (the sandbox with it: its snapshot stays)

	_, baseB := storeServer(t, dir, Config{})
	var list []snapshotBody
	getAs(t, "ann", baseB+"/snapshots", &list)
	assert.Equal(t, []snapshotBody{{first["snapshotID"].(string), []string{"mine"}}}, list, "another server lists it")
	code, from := callAs(t, "ann", "POST", baseB+"/v2/sandboxes", `{"templateID": "mine"}`)
	require.Equal(t, http.StatusCreated, code, "%v", from)
	assert.Equal(t, "(1, 'one', '1')", run(t, baseB, from, "import os\nx, open('f.txt').read(), os.environ['A']"))
	run(t, baseB, from, "x = 2\nn = open('f.txt', 'w').write('two')")
	code, second := callAs(t, "ann", "POST", baseB+"/sandboxes/"+from["sandboxID"].(string)+"/snapshots", `{"name": "mine"}`)
	require.Equal(t, http.StatusCreated, code)

	_, baseC := storeServer(t, dir, Config{})
	getAs(t, "ann", baseC+"/snapshots", &list)
	assert.Equal(t, []snapshotBody{{second["snapshotID"].(string), []string{"mine"}}, {first["snapshotID"].(string), []string{}}},
		list, "the name moved to the newer one")
	code, again := callAs(t, "ann", "POST", baseC+"/v2/sandboxes", `{"templateID": "mine"}`)
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "(2, 'two')", run(t, baseC, again, "x, open('f.txt').read()"))
	getAs(t, "bob", baseC+"/snapshots", &list)
	assert.Empty(t, list, "not another user's")
	// Template.exists: the served templates, and one's own snapshots' names.
	var alias map[string]any
	code, _ = getAs(t, "ann", baseC+"/templates/aliases/mine", &alias)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, second["snapshotID"], alias["templateID"])
	code, _ = getAs(t, "bob", baseC+"/templates/aliases/mine", &alias)
	assert.Equal(t, http.StatusNotFound, code, "not another user's")
	code, _ = getAs(t, "bob", baseC+"/templates/aliases/base", &alias)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, map[string]any{"templateID": "base", "public": true}, alias)
	code, _ = getAs(t, "ann", baseC+"/templates/aliases/nonexistent", &alias)
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = callAs(t, "ann", "DELETE", baseC+"/templates/"+first["snapshotID"].(string), "")
	assert.Equal(t, http.StatusNoContent, code)
	getAs(t, "ann", baseB+"/snapshots", &list)
	assert.Len(t, list, 1, "deleted on every server")
}
