package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
	"github.com/minipy-go/minipy/internal/testproc"
)

// connectInProcess serves a new server over in-memory transports and returns a client
// session on it.
func connectInProcess(t *testing.T, server *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	serverSide, clientSide := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, serverSide, nil)
	require.NoError(t, err)
	t.Cleanup(func() { ss.Close() })
	return connectClient(t, clientSide)
}

func connectClient(t *testing.T, transport mcp.Transport) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-mcp-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), transport, legacy)
	require.NoError(t, err)
	t.Cleanup(func() { cs.Close() })
	return cs
}

// legacy pins a client to the last MCP revision with protocol sessions (2025-11-25): the
// tests of sessions use it; the SDK's client otherwise speaks 2026-07-28, which has none
// (handles_test.go).
var legacy = &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}

// call calls a tool and returns its text and isError.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err)
	require.Len(t, res.Content, 1)
	text, ok := res.Content[0].(*mcp.TextContent)
	require.True(t, ok, "content is %T", res.Content[0])
	return text.Text, res.IsError
}

func run(t *testing.T, cs *mcp.ClientSession, args map[string]any) (string, bool) {
	t.Helper()
	return call(t, cs, minipy.ToolName, args)
}

func TestListTools(t *testing.T) {
	opts := &minipy.Options{Timeout: 5 * time.Second, MaxOutput: 1000}
	cs := connectInProcess(t, mcpfront.NewServer(minipy.InProcess(), opts))
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, res.Tools, 2)
	byName := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		byName[tool.Name] = tool
	}

	want := minipy.ToolSchemaFor(opts)
	got := byName[minipy.ToolName]
	require.NotNil(t, got)
	assert.Equal(t, want.Description, got.Description)
	wantSchema, err := json.Marshal(want.InputSchema)
	require.NoError(t, err)
	gotSchema, err := json.Marshal(got.InputSchema)
	require.NoError(t, err)
	assert.JSONEq(t, string(wantSchema), string(gotSchema))
	assert.Contains(t, got.Description, "stopped after 5 seconds")

	require.Contains(t, byName, mcpfront.ResetToolName)
}

// Each client session has a namespace of its own, which persists between its calls until
// it resets it.
func TestSessionsHaveTheirOwnNamespace(t *testing.T) {
	server := mcpfront.NewServer(minipy.InProcess(), &minipy.Options{})
	first := connectInProcess(t, server)
	second := connectInProcess(t, server)

	text, isError := run(t, first, map[string]any{"code": "x = 41\ndef f(): return x + 1"})
	require.False(t, isError, text)
	text, isError = run(t, first, map[string]any{"code": "f()"})
	assert.False(t, isError)
	assert.Equal(t, "[value]\n42\n", text)

	text, isError = run(t, second, map[string]any{"code": "x"})
	assert.True(t, isError)
	assert.Contains(t, text, "NameError: name 'x' is not defined")

	text, isError = call(t, first, mcpfront.ResetToolName, map[string]any{})
	assert.False(t, isError)
	assert.Contains(t, text, "[reset]")
	text, isError = run(t, first, map[string]any{"code": "x"})
	assert.True(t, isError)
	assert.Contains(t, text, "NameError: name 'x' is not defined")
	text, isError = run(t, first, map[string]any{"code": "y = 2\ny * 3"})
	assert.False(t, isError)
	assert.Equal(t, "[value]\n6\n", text)
}

// The cases the issue names, checked on any client session (in-process or the binary).
func checkTimeoutSyntaxErrorAndHugeOutput(t *testing.T, cs *mcp.ClientSession, budget int) {
	t.Run("timeout", func(t *testing.T) {
		started := time.Now()
		text, isError := run(t, cs, map[string]any{"code": "import time\nprint('started')\ntime.sleep(60)", "timeout": 0.5})
		assert.True(t, isError)
		assert.Contains(t, text, "[stdout]\nstarted\n[timeout]\nThe run was stopped after 0.5s, its timeout of 0.5 seconds.")
		assert.Less(t, time.Since(started), 30*time.Second)
	})
	t.Run("timeout as a string", func(t *testing.T) {
		text, isError := run(t, cs, map[string]any{"code": "while True: pass", "timeout": "0.3"})
		assert.True(t, isError)
		assert.Contains(t, text, "[timeout]\nThe run was stopped after 0.3s")
	})
	t.Run("syntax error", func(t *testing.T) {
		text, isError := run(t, cs, map[string]any{"code": "def f(:\n    pass"})
		assert.True(t, isError)
		assert.Contains(t, text, "[error]\n")
		assert.Contains(t, text, "SyntaxError: invalid syntax")
	})
	t.Run("huge output", func(t *testing.T) {
		text, isError := run(t, cs, map[string]any{"code": "print('x' * 10**7)\n'done'"})
		assert.False(t, isError)
		assert.Less(t, utf8.RuneCountInString(text), budget+200)
		assert.Contains(t, text, fmt.Sprintf("[... %d characters of stdout omitted ...]", 10_000_001-budget+len("'done'")))
		assert.Contains(t, text, "[value]\n'done'\n")
	})
	t.Run("bad arguments", func(t *testing.T) {
		text, isError := run(t, cs, map[string]any{"source": "1"})
		assert.True(t, isError)
		assert.Contains(t, text, "[bad arguments]\n\"code\" is missing.")
	})
}

func TestInProcess(t *testing.T) {
	checkTimeoutSyntaxErrorAndHugeOutput(t, connectInProcess(t, mcpfront.NewServer(minipy.InProcess(), &minipy.Options{})), minipy.DefaultToolOutput)
}

// buildServer builds the command into a temporary directory.
// buildServer builds the binary once per test run, into a directory TestMain removes.
func buildServer(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "minipy-mcp-test-")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		bin := filepath.Join(dir, "minipy-mcp")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build: %w: %s", err, out)
			return
		}
		built.bin = bin
	})
	require.NoError(t, built.err)
	return built.bin
}

var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := testproc.Run(m) // (and no test leaves a process behind)
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func TestBinary(t *testing.T) {
	bin := buildServer(t)
	cs := connectClient(t, &mcp.CommandTransport{Command: exec.Command(bin, "-max-output", "20000")})
	checkTimeoutSyntaxErrorAndHugeOutput(t, cs, 20000)
	checkImages(t, cs)

	t.Run("state and reset", func(t *testing.T) {
		text, isError := run(t, cs, map[string]any{"code": "n = 10"})
		require.False(t, isError, text)
		text, _ = run(t, cs, map[string]any{"code": "n * 2"})
		assert.Equal(t, "[value]\n20\n", text)
		call(t, cs, mcpfront.ResetToolName, map[string]any{})
		text, isError = run(t, cs, map[string]any{"code": "n"})
		assert.True(t, isError)
		assert.Contains(t, text, "NameError")
	})
	// Bytes written to fd 1 by the code itself must not corrupt the protocol on stdout.
	t.Run("writes to fd 1", func(t *testing.T) {
		text, isError := run(t, cs, map[string]any{"code": "import os, subprocess\nos.write(1, b'not json\\n')\nsubprocess.run(['echo', 'nor this'])\n'still talking'"})
		assert.False(t, isError, text)
		assert.Contains(t, text, "[value]\n'still talking'\n")
		text, _ = run(t, cs, map[string]any{"code": "1 + 1"})
		assert.Equal(t, "[value]\n2\n", text)
	})
}

// With -isolated the code runs in worker processes: a crash costs the session only the run
// (its namespace is rolled back), or, without rollback, its variables; never the server.
func TestIsolated(t *testing.T) {
	for _, c := range []struct {
		cfg   minipy.IsolatedConfig
		says  string
		after string
	}{
		{minipy.IsolatedConfig{}, "the namespace was rolled back to before this run", "[value]\nTrue\n"},
		{minipy.IsolatedConfig{Workers: 1, NoRollback: true}, "variables are lost", "[value]\nFalse\n"},
	} {
		iso, err := minipy.NewIsolated(c.cfg)
		require.NoError(t, err)
		defer iso.Close()
		cs := connectInProcess(t, mcpfront.NewServer(iso, &minipy.Options{}))
		text, isError := run(t, cs, map[string]any{"code": fmt.Sprintf("import os\nx = 6\nos.getpid() != %d", os.Getpid())})
		require.False(t, isError, text)
		assert.Equal(t, "[value]\nTrue\n", text, "the code runs in another process")
		text, isError = run(t, cs, map[string]any{"code": "import os; os._exit(1)"})
		assert.True(t, isError)
		assert.Contains(t, text, c.says)
		text, isError = run(t, cs, map[string]any{"code": "'x' in dir()"})
		require.False(t, isError, text)
		assert.Equal(t, c.after, text, "the session goes on, rolled back or with a fresh namespace")
		checkTimeoutSyntaxErrorAndHugeOutput(t, cs, minipy.DefaultToolOutput)
	}
}

// plotCode shows one matplotlib figure.
const plotCode = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"

// callContent calls the minipy tool and returns its whole result.
func callContent(t *testing.T, cs *mcp.ClientSession, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: minipy.ToolName, Arguments: args})
	require.NoError(t, err)
	return res
}

// checkImages checks that a figure reaches the client as an ImageContent after the text
// that names it, and that a run without images gives the text alone.
func checkImages(t *testing.T, cs *mcp.ClientSession) {
	t.Run("figure", func(t *testing.T) {
		res := callContent(t, cs, map[string]any{"code": plotCode})
		require.False(t, res.IsError)
		require.Len(t, res.Content, 2)
		text, ok := res.Content[0].(*mcp.TextContent)
		require.True(t, ok, "content[0] is %T", res.Content[0])
		assert.Contains(t, text.Text, "[image 1: PNG")
		img, ok := res.Content[1].(*mcp.ImageContent)
		require.True(t, ok, "content[1] is %T", res.Content[1])
		assert.Equal(t, "image/png", img.MIMEType)
		assert.True(t, bytes.HasPrefix(img.Data, []byte("\x89PNG\r\n\x1a\n")), "not a PNG file: % x", img.Data[:min(8, len(img.Data))])
	})
	t.Run("several, in order", func(t *testing.T) {
		res := callContent(t, cs, map[string]any{"code": plotCode + "\nplt.plot([3, 1])\nplt.show()\nprint('done')"})
		require.False(t, res.IsError)
		require.Len(t, res.Content, 3)
		text := res.Content[0].(*mcp.TextContent).Text
		assert.Contains(t, text, "[image 1: PNG")
		assert.Contains(t, text, "[image 2: PNG")
		assert.Contains(t, text, "done")
		for _, c := range res.Content[1:] {
			img, ok := c.(*mcp.ImageContent)
			require.True(t, ok, "content is %T", c)
			assert.Equal(t, "image/png", img.MIMEType)
		}
	})
	t.Run("an error after a figure", func(t *testing.T) {
		res := callContent(t, cs, map[string]any{"code": plotCode + "\n1/0"})
		assert.True(t, res.IsError)
		require.Len(t, res.Content, 2)
		assert.Contains(t, res.Content[0].(*mcp.TextContent).Text, "ZeroDivisionError")
		assert.IsType(t, &mcp.ImageContent{}, res.Content[1])
	})
	t.Run("no images", func(t *testing.T) {
		res := callContent(t, cs, map[string]any{"code": "print('hi')\n6 * 7"})
		require.False(t, res.IsError)
		require.Len(t, res.Content, 1)
		text, ok := res.Content[0].(*mcp.TextContent)
		require.True(t, ok, "content is %T", res.Content[0])
		assert.Equal(t, "[stdout]\nhi\n[value]\n42\n", text.Text)
	})
}

func TestImages(t *testing.T) {
	for _, tc := range []struct {
		name string
		eng  minipy.Engine
	}{{"inprocess", minipy.InProcess()}, {"isolated", isolatedEngine(t)}} {
		t.Run(tc.name, func(t *testing.T) {
			checkImages(t, connectInProcess(t, mcpfront.NewServer(tc.eng, &minipy.Options{})))
		})
	}
}
