// Package minipy runs Python code strings in a real, embedded CPython, for LLM tool loops:
// the last expression's value, the printed output and a clean traceback, with a timeout
// that user code cannot swallow, in namespaces that persist between runs.
//
// # Quick start
//
// An Engine runs code: InProcess (the embedded interpreter), NewIsolated (sandboxed worker
// processes) or Auto (the isolated engine on a project's virtualenv, else in-process).
//
//	eng := minipy.InProcess()  // or minipy.NewIsolated(cfg), minipy.Auto(dir)
//	defer eng.Close()
//	ns := eng.NewNamespace()   // a session's variables
//	defer ns.Close()
//	opts := &minipy.Options{Globals: ns, Timeout: 10 * time.Second}
//	r, err := eng.Run(ctx, "import math\nprint('hi')\nmath.factorial(12)", opts)
//	// r.Stdout == "hi\n", r.Value == int64(479001600), r.Repr == "479001600"
//
// The package functions Minipy, Run, NewNamespace, CallTool and ToolSchema are the short
// path to the in-process engine:
//
//	r, err = minipy.Minipy("sum([1, 2, 3])", nil) // r.Value == int64(6)
//
// A run is one cell, as in IPython: if the code ends with an expression, its value is the
// result (Result.HasValue, Value, Repr), unless it is None or the expression ends with
// ';'. Statements, blocks and empty code give no value. stdout and stderr are captured
// separately and exactly, each capped at Options.MaxOutput characters (head and tail kept
// around a marker); Options.Stdout and Options.Stderr also receive them while the code runs.
// Rich outputs (display(), plots) are Result.Displays, kept out of Stdout as Jupyter keeps
// them out of its streams; Result.Text, what a model reads, names each in its place.
// input() sees end of file. Nothing is left behind in the namespace but
// what the code itself assigned.
//
// A cell that is not valid Python may use IPython's syntax, with or without IPython
// installed: !cmd and x = !cmd, line and cell magics (%time, %timeit, %pip, %cd, %env,
// %who, %%bash, %%writefile, %%capture, ...) and obj? / obj?? for help. Valid Python is
// never changed, and line numbers stay the user's (docs/notebook.md lists each magic). Output
// of child processes (subprocess, os.system, !cmd) is the run's output on both engines.
//
// # Values
//
// Result.Value and Namespace.Get convert Python to Go; Namespace.Set converts Go to Python:
//
//	Python                   Go (out)                Go (in, Namespace.Set)
//	None                     nil                     nil, nil pointer/slice/map
//	bool                     bool                    bool
//	int                      int64, or *big.Int      any int or uint kind, *big.Int, big.Int
//	                         beyond int64
//	float                    float64                 float32, float64
//	str                      string                  string (invalid UTF-8 becomes U+FFFD)
//	bytes, bytearray         []byte                  []byte, [N]byte
//	list, tuple              []any                   []any and any other slice or array
//	dict with str keys       map[string]any          map[string]any, any map with string keys,
//	                                                 structs (their JSON form: json tags,
//	                                                 omitempty, embedding; time.Time as text)
//	subclasses of the above  as their base type
//	numpy scalars            as their Python value
//	anything else            Value nil, Repr set     *UnsupportedTypeError
//
// A container holding anything without a Go equivalent (a set, a dict with int keys, an
// object, a cycle) converts as a whole to nil; Repr always shows the value.
//
// # Errors
//
// Code that raises gives a *PythonError (Type, Message, Traceback) alongside a Result with
// what it printed before the error. Syntax errors are PythonErrors too. SystemExit,
// KeyboardInterrupt and any other BaseException are contained the same way: they never end
// or crash the host process. Tracebacks show the user's source lines (each run is the file
// "<cell-N>") and none of minipy's own frames.
//
// A run that is stopped gives an *InterruptedError: errors.Is(err, ErrTimeout) when its
// Options.Timeout or its context's deadline passed (and errors.Is(err,
// context.DeadlineExceeded) for the latter), errors.Is(err, context.Canceled) when its
// context was cancelled, and errors.As(err, &pyErr) reaches the traceback of where the code
// was stopped. Namespace errors match ErrNameNotFound, ErrUnsupportedValue,
// ErrNamespaceClosed and ErrInterpreterBusy. The isolated engine adds ErrStateLost (its
// worker was killed or crashed: the namespace's variables are gone), *WorkerLostError (what
// happened: signal, exit code, limit, or ErrProtocol when its code broke the worker's
// protocol), *LimitError, ErrTooLarge, ErrNoSandbox and ErrSandboxAccess; its
// namespaces' file methods ErrBadPath (and fs.ErrNotExist), in-process ones ErrNoFiles;
// DialPort ErrNoPorts and ErrTooManyConnections, SetEgressRules ErrNoEgress.
//
// # Timeouts and their limits
//
// At the deadline minipy sends a signal (Config.KickSignal, SIGRTMAX-3 by default) to the
// interpreter's thread; its handler raises minipy.TimeoutInterrupt, a BaseException that
// `except Exception:` does not catch, and interrupts blocking calls (sleep, input, socket
// reads, join, subprocess waits; the subprocess is killed). Code that swallows it with a
// bare `except:` gets it again on every line 100 ms later. Threads the run started are
// stopped too. A C call that holds the GIL (sum(range(10**10))) cannot be interrupted in a
// process: the call returns ErrTimeout 500 ms after the deadline with Abandoned set, and
// the interpreter stays busy until that C call ends; later runs wait for it within their
// own deadlines, and Namespace methods fail with ErrInterpreterBusy. Code that must be
// bounded hard (or that may crash, call os._exit, or exhaust memory) belongs in the
// isolated engine's worker processes.
//
// The in-process engine owns its kick signal: the host must not use it. User code cannot
// replace the host's signal handlers: signal.signal, faulthandler.enable, os._exit and
// similar raise RuntimeError in the in-process engine.
//
// # Two engines
//
// InProcess (and the package functions) use one CPython embedded in your program, about
// 12 us per small run. NewIsolated starts the isolated engine: the same Engine API over
// python3 worker processes with hard kills, crash survival, a sandbox, resource limits, no
// network by default, and one run at a time per worker in parallel. Choose it for code from
// a model or a user; choose in-process for trusted, quick code. Auto chooses by project.
//
// # Host functions
//
// Namespace.Register binds Go functions into a namespace (Function, or Func for a typed Go
// function whose input schema comes from its struct): the model's code calls them like
// Python functions, loops over their results and prints only what it needs, on either
// engine (an isolated worker calls back into the host over its protocol). Arguments are
// checked against the schema before Go is called (TypeError), errors and panics raise
// minipy.HostError, and the run's deadline and context reach the function's ctx. The
// tool description (ToolSchemaFor) lists the functions of Options.Globals as Python
// signatures.
//
// # The LLM tool
//
// ToolSchema and ToolSchemaFor describe the tool (toolslm's get_schema shape, which
// Anthropic's API takes; InputSchema.Map and Tool.OpenAI for other SDKs), and CallTool runs
// a model's tool call and renders the labelled text it reads back.
//
// # Concurrency
//
// Minipy, Run and every Namespace method are safe to call from any goroutine. The
// embedded interpreter runs one thing at a time, on one OS thread that minipy locks for the
// life of the process (CPython's signal handling works only on the thread that initialised
// it), so runs from many goroutines take turns and their outputs never mix. For
// parallelism use the isolated engine with several workers.
//
// # Building
//
// minipy needs cgo and the headers and library of CPython 3.11 or later: on Debian and
// Ubuntu, `apt-get install python3-dev pkg-config` (it links the library named by
// `pkg-config python3-embed`). 3.11, 3.12 and 3.13 (also free-threaded) are tested; the
// table in docs/building.md says what differs. A build with CGO_ENABLED=0 compiles, but every run
// returns an error that says so. The in-process engine is Linux-only (it uses futexes and real-time
// signals). github.com/go-python/cpy3 is not used: it does not compile against Python 3.9+.
package minipy
