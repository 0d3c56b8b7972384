package minipy

import (
	"context"
	"encoding/json"
)

// Engine runs Python code for a tool loop. There are two: the in-process interpreter
// (InProcess: a run costs microseconds, the code shares the host's process) and worker
// processes (NewIsolated: sandboxed, hard-killed at the deadline, crash-proof, a few tens
// of microseconds more per run). Auto picks one for a project directory. Code written
// against Engine works with either; Options, Result, Namespace and the errors are the same.
//
// A Namespace belongs to the engine that made it. Every method is safe for concurrent use.
// Engine is implemented only by this package's engines (or by types that embed one), so
// that methods can be added to it.
type Engine interface {
	// Run runs code with opts (nil: defaults), stopping it when opts.Timeout passes or ctx
	// ends. The error is a *PythonError when the code raised and an *InterruptedError when
	// it was stopped; the Result carries what was printed in both cases.
	Run(ctx context.Context, code string, opts *Options) (*Result, error)
	// NewNamespace makes a fresh namespace in this engine. Close it when done.
	NewNamespace() *Namespace
	// CallTool serves one call of the tool that ToolSchemaFor describes (see the package
	// function CallTool for the text it returns).
	CallTool(ctx context.Context, input json.RawMessage, opts *Options) (text string, isError bool)
	// CallToolResult is CallTool that also returns the images the code showed, for
	// clients that can send images to the model (see ToolResult).
	CallToolResult(ctx context.Context, input json.RawMessage, opts *Options) ToolResult
	// ToolSchemaFor describes the tool for this engine's Python: its version and libraries,
	// and the timeout and output budget of opts.
	ToolSchemaFor(opts *Options) *Tool
	// Close releases the engine: an isolated engine kills its workers; the in-process
	// interpreter lives as long as the process, so its Close does nothing.
	Close() error

	isEngine()
}

// InProcess returns the in-process engine: the process's embedded interpreter, started on
// first use (with Start's configuration when Start came first). Its methods are the package
// functions Run, NewNamespace, CallTool and ToolSchemaFor; all InProcess values are the
// same engine, and their namespaces work with each other.
func InProcess() Engine { return inProcessAPI{} }

// inProcessAPI is the in-process engine as an Engine.
type inProcessAPI struct{}

func (inProcessAPI) Run(ctx context.Context, code string, opts *Options) (*Result, error) {
	return Run(ctx, code, opts)
}

func (inProcessAPI) NewNamespace() *Namespace { return NewNamespace() }

func (inProcessAPI) CallTool(ctx context.Context, input json.RawMessage, opts *Options) (string, bool) {
	return CallTool(ctx, input, opts)
}

func (inProcessAPI) CallToolResult(ctx context.Context, input json.RawMessage, opts *Options) ToolResult {
	return CallToolResult(ctx, input, opts)
}

func (inProcessAPI) ToolSchemaFor(opts *Options) *Tool { return ToolSchemaFor(opts) }

func (inProcessAPI) Close() error { return nil }

func (inProcessAPI) isEngine() {}

func (*Isolated) isEngine() {}

var (
	_ Engine = inProcessAPI{}
	_ Engine = (*Isolated)(nil)
)
