// Package pyrt holds minipy's Python half: the code that runs a cell (last expression,
// output capture, tracebacks, the timeout handler, the value codec). Both engines load
// this same source, the in-process one into the embedded interpreter and the isolated
// one into each worker process, so the rules of a run are written once.
package pyrt

import _ "embed"

// Source is runtime.py. It must be compiled with the file name RuntimeFile so that the
// runtime's own frames can be told apart from the user's and left out of tracebacks.
//
//go:embed runtime.py
var Source string

// WorkerSource is worker.py: the isolated engine's worker process around the runtime (the
// protocol, fd-level output capture, kicks, resource limits). The Go side sends it to the
// worker's bootstrap and compiles it, like Source, with the file name RuntimeFile.
//
//go:embed worker.py
var WorkerSource string

// RuntimeFile is the file name the runtime's code objects carry.
const RuntimeFile = "<minipy-runtime>"

// Request ops understood by dispatch() in runtime.py.
const (
	OpRun byte = iota + 1
	OpNew
	OpFree
	OpSet
	OpGet
	OpNames
	OpInfo
)

// DefaultNamespace is the id of the namespace that runs without Globals use.
const DefaultNamespace = 1
