package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// pauseServer serves cfg with an isolated engine of its own over httptest.
func pauseServer(t *testing.T, cfg Config) (*Server, string) {
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{WorkDirPath: Home, Spares: -1})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	cfg.Engine = eng
	s := New(cfg)
	srv := httptest.NewServer(s)
	t.Cleanup(func() { srv.Close(); s.Close() })
	return s, srv.URL
}

func call(t *testing.T, method, url, body string) (int, map[string]any) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var m map[string]any
	json.Unmarshal(b, &m) //nolint:errcheck // not every answer is an object
	return resp.StatusCode, m
}

// A sandbox created with autoPause is paused when its time ends, not killed; connect
// resumes it; a paused sandbox is forgotten after PausedTTL.
func TestAutoPause(t *testing.T) {
	s, base := pauseServer(t, Config{PausedTTL: 2 * time.Second})
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{"timeout": 1, "autoPause": true}`)
	require.Equal(t, http.StatusCreated, code)
	id := sb["sandboxID"].(string)
	assert.Eventually(t, func() bool {
		_, info := call(t, "GET", base+"/sandboxes/"+id, "")
		return info["state"] == "paused"
	}, 10*time.Second, 20*time.Millisecond)
	code, _ = call(t, "POST", base+"/v2/sandboxes/"+id+"/connect", `{"timeout": 1}`)
	assert.Equal(t, http.StatusCreated, code, "resumed")
	assert.Eventually(t, func() bool {
		_, info := call(t, "GET", base+"/sandboxes/"+id, "")
		return info["state"] == "paused"
	}, 10*time.Second, 20*time.Millisecond, "paused again at its time's end")
	assert.Equal(t, 1, s.Stats().Paused)
	assert.Zero(t, s.Stats().Running)
	assert.Eventually(t, func() bool {
		code, _ := call(t, "GET", base+"/sandboxes/"+id, "")
		return code == http.StatusNotFound
	}, 10*time.Second, 20*time.Millisecond, "forgotten after PausedTTL")
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Zero(t, s.pausedBytes, "its bytes are released")
}

// A pause past MaxPausedBytes is refused, and the sandbox goes on running.
func TestPauseOverLimit(t *testing.T) {
	_, base := pauseServer(t, Config{MaxPausedBytes: 1})
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	id := sb["sandboxID"].(string)
	code, body := call(t, "POST", base+"/sandboxes/"+id+"/pause", "")
	assert.Equal(t, http.StatusInsufficientStorage, code, "%v", body)
	_, info := call(t, "GET", base+"/sandboxes/"+id, "")
	assert.Equal(t, "running", info["state"])
	req, _ := http.NewRequest("GET", base+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", sb["envdAccessToken"].(string))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNoContent, resp.StatusCode, "still running")
}
