package e2b

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/templates"
)

// buildTemplate builds the template name (one RUN step, a start command and its ready
// check) through the API at url, and waits for it.
func buildTemplate(t *testing.T, url, name string) {
	t.Helper()
	code, made := call(t, "POST", url+"/v3/templates", `{"name": "`+name+`"}`)
	require.Equal(t, http.StatusAccepted, code, "%v", made)
	id, build := made["templateID"].(string), made["buildID"].(string)
	code, _ = call(t, "POST", url+"/v2/templates/"+id+"/builds/"+build, `{"fromTemplate": "base", "steps": [`+
		`{"type": "RUN", "args": ["echo built > /tmp/built"]}], "startCmd": "echo $$ > /tmp/started; exec sleep 600", `+
		`"readyCmd": "test -s /tmp/started"}`)
	require.Equal(t, http.StatusAccepted, code)
	require.Eventually(t, func() bool {
		_, st := call(t, "GET", url+"/templates/"+id+"/builds/"+build+"/status", "")
		require.NotEqual(t, "error", st["status"], "%v", st)
		return st["status"] == "ready"
	}, time.Minute, 20*time.Millisecond)
}

// A template build in use gets a warm spare: the create after the first is served from it,
// its start command running; a create that asks for its own environment is not; the spare
// holds no place under the caps (a user at their cap still creates), and it ends with its
// template and with the server.
func TestTemplateSpares(t *testing.T) {
	var mu sync.Mutex
	holding := 0 // places held: contexts of sandboxes (not of spares)
	admit := func(string) (func(), string) {
		mu.Lock()
		defer mu.Unlock()
		if holding >= 3 {
			return nil, "cap"
		}
		holding++
		return sync.OnceFunc(func() { mu.Lock(); holding--; mu.Unlock() }), ""
	}
	s, url := pauseServer(t, Config{Admit: admit})
	buildTemplate(t, url, "warm")
	spares := func() int { return s.Stats().Spares }
	create := func(body string) (int, map[string]any) { return call(t, "POST", url+"/sandboxes", body) }
	run := func(sb map[string]any, cmd string) string {
		id := sb["sandboxID"].(string)
		s.mu.Lock()
		x := s.sandboxes[id]
		s.mu.Unlock()
		require.NotNil(t, x)
		out, err := runIn(x, cmd)
		require.NoError(t, err)
		return out
	}

	code, first := create(`{"templateID": "warm"}`)
	require.Equal(t, http.StatusCreated, code, "%v", first)
	assert.Equal(t, 0, s.Stats().FromSpare)
	require.Eventually(t, func() bool { return spares() == 1 }, 30*time.Second, 10*time.Millisecond, "a spare made")
	mu.Lock()
	assert.Equal(t, 1, holding, "the spare holds no place")
	mu.Unlock()

	code, second := create(`{"templateID": "warm", "metadata": {"who": "second"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", second)
	assert.Equal(t, 1, s.Stats().FromSpare, "served from the spare")
	assert.Equal(t, "built\n", run(second, "cat /tmp/built"))
	pid := strings.TrimSpace(run(second, "cat /tmp/started"))
	assert.Equal(t, "sleep", strings.TrimSpace(run(second, "cat /proc/"+pid+"/comm")), "its start command runs")
	code, listed := call(t, "GET", url+"/sandboxes/"+second["sandboxID"].(string), "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, map[string]any{"who": "second"}, listed["metadata"])

	require.Eventually(t, func() bool { return spares() == 1 }, 30*time.Second, 10*time.Millisecond, "made again")
	code, third := create(`{"templateID": "warm", "envVars": {"A": "1"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", third)
	assert.Equal(t, 1, s.Stats().FromSpare, "its own environment: not from a spare")
	s.mu.Lock()
	assert.Equal(t, "1", s.sandboxes[third["sandboxID"].(string)].envs["A"])
	s.mu.Unlock()

	// At the cap (3 places), the spare is no sandbox: a create is refused as before.
	code, refused := create(`{"templateID": "warm"}`)
	assert.Equal(t, http.StatusTooManyRequests, code, "%v", refused)

	code, _ = call(t, "DELETE", url+"/templates/warm", "")
	require.Equal(t, http.StatusNoContent, code)
	assert.Equal(t, 0, spares(), "a template's delete ends its spare")
	for _, sb := range []map[string]any{first, second, third} {
		code, _ := call(t, "DELETE", url+"/sandboxes/"+sb["sandboxID"].(string), "")
		assert.Equal(t, http.StatusNoContent, code)
	}
	mu.Lock()
	assert.Equal(t, 0, holding, "every place given back")
	mu.Unlock()
}

// runIn runs the shell command in sb's default context's sandbox and returns its stdout.
func runIn(sb *sandbox, cmd string) (string, error) {
	ns := sb.namespace()
	if ns == nil {
		return "", errNotRunning
	}
	m := sandboxMachine{sb: sb}
	var out strings.Builder
	code, err := m.Run(context.Background(), templates.Cmd{Line: cmd, Dir: Home}, func(line string) {
		out.WriteString(line + "\n")
	})
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d: %s", code, out.String())
	}
	return out.String(), err
}
