package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
)

// callText calls tool with args and returns the reply's text, whether it is an error, and
// its structuredContent's session handle.
func callText(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err)
	require.NotEmpty(t, res.Content)
	text, _ := res.Content[0].(*mcp.TextContent)
	require.NotNil(t, text)
	h := ""
	if m, ok := res.StructuredContent.(map[string]any); ok {
		h, _ = m[mcpfront.HandleArg].(string)
	}
	return text.Text, res.IsError, h
}

// A client of MCP 2026-07-28 (the Go SDK's default) has no protocol session: a call without
// a handle starts a session and returns its handle, which later calls pass back to keep
// their variables; the handle is mirrored in the Mcp-Param-Session header; an unknown one
// is a clear error; reset takes one too.
func TestSessionlessRevisionUsesHandles(t *testing.T) {
	front := mcpfront.New(mcpfront.Config{Engine: minipy.InProcess(), Handles: true, Idle: time.Minute})
	var params []string
	var seen = make(chan string, 100)
	handler := front.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Mcp-Param-Session"); v != "" {
			seen <- v
		}
		handler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-handles-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp"}, nil)
	require.NoError(t, err)
	defer cs.Close()
	require.Equal(t, mcpfront.SessionlessRevision, cs.InitializeResult().ProtocolVersion, "the client speaks the new revision")

	tools, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	for _, tool := range tools.Tools {
		js, _ := tool.InputSchema.(map[string]any)
		props, _ := js["properties"].(map[string]any)
		prop, _ := props[mcpfront.HandleArg].(map[string]any)
		assert.Equal(t, mcpfront.HandleHeader, prop["x-mcp-header"], "%s's session argument is mirrored in a header", tool.Name)
	}

	text, isError, h := callText(t, cs, minipy.ToolName, map[string]any{"code": "x = 41"})
	require.False(t, isError, text)
	require.True(t, strings.HasPrefix(h, mcpfront.HandlePrefix), "structuredContent carries the handle: %q", h)
	assert.Contains(t, text, "[session]\n"+h+": pass it as \"session\"")

	text, isError, h2 := callText(t, cs, minipy.ToolName, map[string]any{"code": "x + 1", mcpfront.HandleArg: h})
	require.False(t, isError, text)
	assert.Equal(t, "[value]\n42\n", text, "the handle's variables, and no new handle in the text")
	assert.Equal(t, h, h2)
	select {
	case v := <-seen:
		params = append(params, v)
	case <-time.After(5 * time.Second):
	}
	assert.Equal(t, []string{h}, params, "the client mirrored the handle in Mcp-Param-Session")

	text, _, h3 := callText(t, cs, minipy.ToolName, map[string]any{"code": "'x' in dir()"})
	assert.True(t, strings.HasPrefix(text, "[value]\nFalse\n"), text)
	assert.NotEqual(t, h, h3, "no handle: a new session")

	text, isError, _ = callText(t, cs, minipy.ToolName, map[string]any{"code": "1", mcpfront.HandleArg: "mpy_not-a-session"})
	assert.True(t, isError)
	assert.Contains(t, text, `The session "mpy_not-a-session" is unknown`)
	assert.Contains(t, text, "Nothing ran")

	text, isError, _ = callText(t, cs, mcpfront.ResetToolName, map[string]any{mcpfront.HandleArg: h})
	require.False(t, isError, text)
	text, _, _ = callText(t, cs, minipy.ToolName, map[string]any{"code": "'x' in dir()", mcpfront.HandleArg: h})
	assert.Equal(t, "[value]\nFalse\n", text, "reset emptied the handle's session")
}

// The official TypeScript SDK v2's client, negotiating versions, speaks 2026-07-28 with the
// server and keeps its variables through the handle: it mirrors it in Mcp-Param-Session.
func TestSessionlessTypeScriptClient(t *testing.T) {
	dir, err := filepath.Abs(filepath.Join("testdata", "tsclient2"))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "client"))
	require.NoError(t, err, "the TypeScript SDK v2 is not installed: run `make deps` (npm ci in %s)", dir)
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node is needed: make deps installs it")
	front := mcpfront.New(mcpfront.Config{Engine: minipy.InProcess(), Handles: true, Idle: time.Minute})
	srv := httptest.NewServer(front.Handler())
	defer srv.Close()
	cmd := exec.Command(node, "handles.mjs", srv.URL+"/mcp")
	cmd.Dir = dir
	out, err := cmd.Output()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		t.Fatalf("the TypeScript client failed: %v\n%s", err, exitErr.Stderr)
	}
	require.NoError(t, err)
	var got struct {
		Version, Header, First, Handle, Second, Fresh string
		Unknown                                       struct {
			IsError bool
			Text    string
		}
		Mirrored bool
		Versions []string
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.Equal(t, mcpfront.SessionlessRevision, got.Version)
	assert.Equal(t, []string{mcpfront.SessionlessRevision}, got.Versions, "every request of the revision")
	assert.Equal(t, mcpfront.HandleHeader, got.Header)
	assert.True(t, strings.HasPrefix(got.Handle, mcpfront.HandlePrefix), got.Handle)
	assert.Contains(t, got.First, "[session]\n"+got.Handle)
	assert.Equal(t, "[value]\n42\n", got.Second)
	assert.Contains(t, got.Fresh, "[value]\nFalse\n")
	assert.True(t, got.Unknown.IsError)
	assert.Contains(t, got.Unknown.Text, "is unknown")
	assert.True(t, got.Mirrored, "the handle went in Mcp-Param-Session")
}

// Handles outlive their replica and move between replicas that share -state-dir: a call
// with a handle that another replica holds asks it to let go (it saves it), and runs where
// it came; another user cannot use the handle.
func TestHandlesAcrossReplicas(t *testing.T) {
	dir := t.TempDir()
	tokens := tokenFile(t, "alice:"+tokenAlice, "bob:"+tokenBob)
	args := []string{"-backend", "isolated", "-tokens", tokens, "-state-dir", dir}
	a, b := startServer(t, args...), startServer(t, args...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("A's log:\n%s\nB's log:\n%s", a.log, b.log)
		}
	})
	lb := &switchable{token: tokenAlice}
	lb.send(a)
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-handles-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: a.base + "/mcp", HTTPClient: &http.Client{Transport: lb}}, nil)
	require.NoError(t, err)
	defer cs.Close()
	_, err = cs.ListTools(context.Background(), nil) // (a client learns which argument goes in a header)
	require.NoError(t, err)

	text, isError, h := callText(t, cs, minipy.ToolName, map[string]any{"code": "n = 1\nopen('f.txt', 'w').write('on a')"})
	require.False(t, isError, text)
	require.NotEmpty(t, h)
	for i, to := range []*serverProc{b, a, b} {
		lb.send(to)
		text, isError, _ = callText(t, cs, minipy.ToolName, map[string]any{"code": "n += 1\nn, open('f.txt').read()",
			mcpfront.HandleArg: h})
		require.False(t, isError, "move %d: %s", i, text)
		assert.Equal(t, "[value]\n("+string(rune('2'+i))+", 'on a')\n", text, "move %d", i)
	}

	bob := &switchable{token: tokenBob}
	bob.send(a)
	other, err := mcp.NewClient(&mcp.Implementation{Name: "bob", Version: "0"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: a.base + "/mcp", HTTPClient: &http.Client{Transport: bob}}, nil)
	require.NoError(t, err)
	defer other.Close()
	_, err = other.ListTools(context.Background(), nil) // (as a client does first: it learns which argument goes in a header)
	require.NoError(t, err)
	text, isError, _ = callText(t, other, minipy.ToolName, map[string]any{"code": "n", mcpfront.HandleArg: h})
	assert.True(t, isError)
	assert.Contains(t, text, "is unknown", "Alice's handle is not Bob's")
}
