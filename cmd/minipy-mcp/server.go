package main

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
)

// resetToolName is the tool that empties the session's namespace.
const resetToolName = "reset"

// newServer returns an MCP server with the minipy tool, run on eng with opts (their Globals
// are ignored: each client session gets a namespace of its own), and the reset tool.
func newServer(eng minipy.Engine, opts *minipy.Options) *mcp.Server {
	s := &sessions{eng: eng, opts: *opts, spaces: map[*mcp.ServerSession]*minipy.Namespace{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "minipy", Version: version}, nil)
	tool := eng.ToolSchemaFor(opts)
	server.AddTool(&mcp.Tool{Name: tool.Name, Description: tool.Description, InputSchema: tool.InputSchema.Map()}, s.run)
	server.AddTool(&mcp.Tool{
		Name:        resetToolName,
		Description: "Empty the Python namespace of the " + tool.Name + " tool: forget every variable, function and import of this session.",
		InputSchema: map[string]any{"type": "object", "properties": map[string]any{}},
	}, s.reset)
	return server
}

// sessions holds one namespace per client session, made on its first run and freed when
// the session ends.
type sessions struct {
	eng    minipy.Engine
	opts   minipy.Options
	mu     sync.Mutex
	spaces map[*mcp.ServerSession]*minipy.Namespace
}

func (s *sessions) namespace(ss *mcp.ServerSession) *minipy.Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns, ok := s.spaces[ss]
	if !ok {
		ns = s.eng.NewNamespace()
		s.spaces[ss] = ns
		go s.forgetWhenClosed(ss) // reset keeps the entry, so this runs once per session
	}
	return ns
}

func (s *sessions) forgetWhenClosed(ss *mcp.ServerSession) {
	ss.Wait() //nolint:errcheck // the session is over either way
	s.mu.Lock()
	ns := s.spaces[ss]
	delete(s.spaces, ss)
	s.mu.Unlock()
	if ns != nil {
		ns.Close() //nolint:errcheck // freeing is best effort
	}
}

func (s *sessions) run(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	opts := s.opts
	opts.Globals, opts.Locals = s.namespace(req.Session), nil
	text, isError := s.eng.CallTool(ctx, json.RawMessage(req.Params.Arguments), &opts)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: isError}, nil
}

func (s *sessions) reset(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	s.mu.Lock()
	old := s.spaces[req.Session]
	if old != nil {
		s.spaces[req.Session] = s.eng.NewNamespace()
	}
	s.mu.Unlock()
	if old != nil {
		old.Close() //nolint:errcheck // freeing is best effort
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
		Text: "[reset]\nThe namespace is empty: every variable, function and import of this session is gone.\n"}}}, nil
}
