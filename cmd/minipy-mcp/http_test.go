package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
)

// The binary serves Streamable HTTP with -http: two clients over real TCP, each with its
// own namespace.
func TestHTTPBinary(t *testing.T) {
	s := startServer(t, "-backend", "isolated") // stopped (SIGTERM) and checked at the test's end
	url := s.base + "/mcp"
	a := connectClient(t, &mcp.StreamableClientTransport{Endpoint: url})
	b := connectClient(t, &mcp.StreamableClientTransport{Endpoint: url})
	text, isError := run(t, a, map[string]any{"code": "import socket\nsecret = 'a'\nsocket.gethostname()"})
	require.False(t, isError, text)
	assert.Equal(t, "[value]\n'minipy'\n", text, "-backend isolated runs in the sandbox")
	text, isError = run(t, b, map[string]any{"code": "'secret' in dir()"})
	require.False(t, isError, text)
	assert.Equal(t, "[value]\nFalse\n", text, "sessions do not share a namespace")
	text, _ = run(t, a, map[string]any{"code": "secret"})
	assert.Equal(t, "[value]\n'a'\n", text)
	checkTimeoutSyntaxErrorAndHugeOutput(t, b, minipy.DefaultToolOutput)
}

// A session idle for the timeout is closed, and its namespace freed.
func TestHTTPSessionsExpire(t *testing.T) {
	front := mcpfront.New(mcpfront.Config{Engine: minipy.InProcess(), Idle: 300 * time.Millisecond})
	srv := httptest.NewServer(front.Handler())
	defer srv.Close()
	cs := connectClient(t, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp"})
	text, isError := run(t, cs, map[string]any{"code": "x = 1\nx"})
	require.False(t, isError, text)
	assert.Equal(t, 1, front.Namespaces())
	require.Eventually(t, func() bool {
		return front.Namespaces() == 0
	}, 10*time.Second, 20*time.Millisecond, "the idle session's namespace was not freed")
}

// A client that asks for progress gets the run's output while it runs.
func TestProgressCarriesOutput(t *testing.T) {
	var mu sync.Mutex
	var notes []*mcp.ProgressNotificationParams
	var resultAt time.Time
	client := mcp.NewClient(&mcp.Implementation{Name: "progress-test", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			if resultAt.IsZero() {
				notes = append(notes, req.Params)
			}
		},
	})
	for _, tc := range []struct {
		name string
		eng  minipy.Engine
	}{{"inprocess", minipy.InProcess()}, {"isolated", isolatedEngine(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			notes, resultAt = nil, time.Time{}
			mu.Unlock()
			serverSide, clientSide := mcp.NewInMemoryTransports()
			ss, err := mcpfront.NewServer(tc.eng, &minipy.Options{}).Connect(context.Background(), serverSide, nil)
			require.NoError(t, err)
			defer ss.Close()
			cs, err := client.Connect(context.Background(), clientSide, nil)
			require.NoError(t, err)
			defer cs.Close()
			params := &mcp.CallToolParams{Name: minipy.ToolName, Arguments: map[string]any{
				"code": "import time\nfor i in range(5):\n    print('step', i, flush=True)\n    time.sleep(0.5)"}}
			params.SetProgressToken("run-1")
			res, err := cs.CallTool(context.Background(), params)
			require.NoError(t, err)
			mu.Lock()
			resultAt = time.Now()
			got := notes
			mu.Unlock()
			require.False(t, res.IsError)
			require.NotEmpty(t, got, "no progress while the run went on")
			assert.Equal(t, "run-1", got[0].ProgressToken)
			assert.Contains(t, got[0].Message, "step 0")
			for i := 1; i < len(got); i++ {
				assert.Greater(t, got[i].Progress, got[i-1].Progress, "progress only grows")
			}
		})
	}
}

func isolatedEngine(t *testing.T) minipy.Engine {
	iso, err := minipy.NewIsolated(minipy.IsolatedConfig{Workers: 1})
	require.NoError(t, err)
	t.Cleanup(func() { iso.Close() })
	return iso
}

// The official TypeScript SDK's client over HTTP (testdata/tsclient; `make deps` installs
// it): tools, a session's namespace across calls, progress with the output, errors.
func TestHTTPWithTypeScriptClient(t *testing.T) {
	dir, err := filepath.Abs(filepath.Join("testdata", "tsclient"))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk"))
	require.NoError(t, err, "the TypeScript SDK is not installed: run `make deps` (npm ci in %s)", dir)
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node is needed: make deps installs it")

	front := mcpfront.New(mcpfront.Config{Engine: minipy.InProcess(), Idle: time.Minute})
	srv := httptest.NewServer(front.Handler())
	defer srv.Close()
	cmd := exec.Command(node, "client.mjs", srv.URL+"/mcp")
	cmd.Dir = dir
	out, err := cmd.Output()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		t.Fatalf("the TypeScript client failed: %v\n%s", err, exitErr.Stderr)
	}
	require.NoError(t, err)
	var got struct {
		Tools    []string `json:"tools"`
		First    string   `json:"first"`
		Progress []string `json:"progress"`
		Second   string   `json:"second"`
		Error    struct {
			IsError bool   `json:"isError"`
			Text    string `json:"text"`
		} `json:"error"`
		Plot []struct {
			Type     string `json:"type"`
			MIMEType string `json:"mimeType"`
			Text     string `json:"text"`
			Head     string `json:"head"`
		} `json:"plot"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.Equal(t, []string{minipy.ToolName, mcpfront.ResetToolName}, got.Tools)
	assert.Equal(t, "[stdout]\ntick 0\ntick 1\ntick 2\n", got.First)
	require.NotEmpty(t, got.Progress, "no progress notification reached the client")
	assert.Contains(t, got.Progress[0], "tick 0")
	assert.Equal(t, "[value]\n42\n", got.Second)
	assert.True(t, got.Error.IsError)
	assert.Contains(t, got.Error.Text, "ZeroDivisionError")
	// A figure arrives as an image after the text that names it.
	require.Len(t, got.Plot, 2, "%s", out)
	assert.Equal(t, "text", got.Plot[0].Type)
	assert.Contains(t, got.Plot[0].Text, "[image 1: PNG")
	assert.Equal(t, "image", got.Plot[1].Type)
	assert.Equal(t, "image/png", got.Plot[1].MIMEType)
	assert.Equal(t, "89504e47", got.Plot[1].Head, "the data is not a PNG file (\\x89PNG)")
}

// -max-sessions's default divides the memory budget (or, with none, what the server may
// use) by what a session may hold, at least 4.
func TestDefaultMaxSessions(t *testing.T) {
	avail := minipy.HostMemory()
	require.Positive(t, avail)
	assert.Equal(t, int(max(4, avail/(256<<20))), defaultMaxSessions(0, 256<<20), "no budget")
	assert.Equal(t, 16, defaultMaxSessions(8<<30, 512<<20))
	assert.Equal(t, 4, defaultMaxSessions(1<<30, 512<<20), "at least 4")
}
