package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
)

// everythingConfig writes an mcpServers file naming the reference server-everything
// (installed by `make deps`: npm ci in testdata/upstream) and returns its path.
func everythingConfig(t *testing.T, extra map[string]upstreamServer) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "upstream"))
	require.NoError(t, err)
	entry := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
	_, err = os.Stat(entry)
	require.NoError(t, err, "server-everything is not installed: run `make deps` (npm ci in %s)", dir)
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node is needed: make deps installs it")
	servers := map[string]upstreamServer{"everything": {Command: node, Args: []string{entry, "stdio"},
		Env: map[string]string{"UPSTREAM_SETTING": "on"}}}
	for k, v := range extra {
		servers[k] = v
	}
	raw, err := json.Marshal(upstreamConfig{MCPServers: servers})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "mcp.json")
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	return path
}

// Code mode against a real upstream server nobody here wrote: the reference
// server-everything, and minipy-mcp itself.
func TestUpstreamEverything(t *testing.T) {
	t.Setenv("MINIPY_TEST_SECRET", "s3cret") // not passed on to the upstream servers
	bin := buildServer(t)
	path := everythingConfig(t, map[string]upstreamServer{
		"inner-minipy": {Command: bin, Args: []string{"-backend", "inprocess"}},
	})
	ctx := context.Background()
	up, err := connectUpstreams(ctx, path)
	require.NoError(t, err)
	defer up.Close()

	for _, e := range []struct {
		name string
		eng  minipy.Engine
	}{{"inprocess", minipy.InProcess()}, {"isolated", isolatedEngine(t)}} {
		t.Run(e.name, func(t *testing.T) {
			cs := connectInProcess(t, mcpfront.NewServer(e.eng, &minipy.Options{}, up.functions...))
			// The model is told what it can call.
			tools, err := cs.ListTools(ctx, nil)
			require.NoError(t, err)
			desc := tools.Tools[0].Description
			assert.Contains(t, desc, "\n  everything.echo(message: str) — Echoes back the input")
			assert.Contains(t, desc, "\n  everything.get_sum(a: float, b: float) — ")
			assert.Contains(t, desc, `everything.get_structured_content(location: Literal["New York", "Chicago", "Los Angeles"]) -> dict`)
			assert.Contains(t, desc, "\n  inner_minipy.minipy(code: str, timeout: float | None = None) — Run Python code")

			res := callContent(t, cs, map[string]any{"code": `
print(everything.echo(message="hi"))
print(everything.get_sum(2, 3))
w = everything.get_structured_content(location="Chicago")
print(sorted(w), type(w["temperature"]).__name__)
print(everything.get_tiny_image())
print(inner_minipy.minipy(code="6 * 7"))
try:
    everything.get_sum(a="x", b=1)
except TypeError as e:
    print("TypeError:", e)
`})
			// The upstream image is shown as the run's image, after the text.
			require.Len(t, res.Content, 2)
			text, isError := res.Content[0].(*mcp.TextContent).Text, res.IsError
			img, ok := res.Content[1].(*mcp.ImageContent)
			require.True(t, ok, "content[1] is %T", res.Content[1])
			assert.Equal(t, "image/png", img.MIMEType)
			assert.True(t, bytes.HasPrefix(img.Data, []byte("\x89PNG")))
			require.False(t, isError, text)
			assert.Contains(t, text, "[stdout]\nEcho: hi\nThe sum of 2 and 3 is 5.\n"+
				"['conditions', 'humidity', 'temperature'] int\n")
			assert.Contains(t, text, "[image 1: PNG ")
			assert.Contains(t, text, "[image: image/png, ")
			assert.Contains(t, text, "[value]\n42\n")
			assert.Contains(t, text, "TypeError: everything.get_sum() argument 'a' must be float, not str")

			// A started server gets PATH and HOME, and the config's env, but not the rest of
			// minipy-mcp's environment.
			text, isError = run(t, cs, map[string]any{"code": "env = everything.get_env()\n" +
				"('PATH' in env, 'MINIPY_TEST_SECRET' in env, 's3cret' in env, 'UPSTREAM_SETTING' in env)"})
			require.False(t, isError, text)
			assert.Equal(t, "[value]\n(True, False, False, True)\n", text)

			// An upstream error raises HostError with its text.
			text, isError = run(t, cs, map[string]any{"code": "inner_minipy.minipy(code='1/0')"})
			assert.True(t, isError)
			assert.Contains(t, text, "minipy.HostError: [error]")
			assert.Contains(t, text, "ZeroDivisionError")
		})
	}
}

func TestUpstreamConfigErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "mcp.json")
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	_, err := connectUpstreams(ctx, filepath.Join(dir, "missing.json"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	for body, want := range map[string]string{
		`{"mcpServers": {}}`:        `no servers under "mcpServers"`,
		`{"mcpServers": {"a": {}}}`: `upstream "a": neither "command" nor "url" is set`,
		`{"mcpServers": {"a": {"command": "x", "url": "http://x"}}}`: `upstream "a": give "command" or "url", not both`,
		`{"mcpServers": {"a": {"url": "http://x", "type": "ws"}}}`:   `upstream "a": unknown type "ws"`,
		`{"mcpServers": {"a": {"command": "/nonexistent/server"}}}`:  `upstream "a": `,
		`{"mcpServers": [}`: `mcp.json: `,
	} {
		_, err := connectUpstreams(ctx, write(body))
		require.Error(t, err, body)
		assert.Contains(t, err.Error(), want, body)
	}
	// A disabled server is skipped.
	up, err := connectUpstreams(ctx, write(`{"mcpServers": {"a": {"command": "/nonexistent/server", "disabled": true}}}`))
	require.NoError(t, err)
	assert.Empty(t, up.functions)
}

func TestResultValue(t *testing.T) {
	assert.Nil(t, resultValue("s.t()", &mcp.CallToolResult{}))
	assert.Equal(t, "hi", resultValue("s.t()", &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "hi"}}}))
	assert.Equal(t, json.RawMessage(`{"n":3}`), resultValue("s.t()", &mcp.CallToolResult{StructuredContent: map[string]any{"n": 3},
		Content: []mcp.Content{&mcp.TextContent{Text: `{"n": 3}`}}}))
	assert.Equal(t, []any{"a", "[image: image/png, 3 bytes]", map[string]any{"type": "resource_link", "uri": "file:///x", "name": "x"},
		map[string]any{"type": "resource", "uri": "file:///y", "text": "body"}},
		plainValue(&mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "a"},
			&mcp.ImageContent{MIMEType: "image/png", Data: []byte{1, 2, 3}},
			&mcp.ResourceLink{URI: "file:///x", Name: "x"},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///y", Text: "body"}},
		}}))
	assert.Equal(t, "a\nb", resultText(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a"}, &mcp.TextContent{Text: "b"}}}))
}
