// Command minipy runs Python code the way an LLM tool loop would and prints what the model
// would see: the output as it comes, then the last expression's value, or the traceback.
//
//	minipy -c 'import math; math.factorial(12)'
//	minipy script.py [ARGS...]
//	echo 'print("hi")' | minipy --json
//	minipy                       # on a terminal: a REPL with one persistent namespace
//
// --backend picks the engine: inprocess (the embedded interpreter), isolated (sandboxed
// worker processes) or auto (the default: isolated on the project's virtualenv when the
// current directory belongs to one, as minipy.Auto decides; in-process otherwise).
//
// It exits 1 when the code raised (or timed out) and 2 on bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// defaultTimeout bounds -c and stdin code when --timeout is 0; a file and the REPL have no
// limit then (Ctrl-C stops them).
const defaultTimeout = 30 * time.Second

// jsonResult is the --json document.
type jsonResult struct {
	HasValue bool `json:"has_value"`
	// Value is null when the value has no JSON form (NaN, or no Go equivalent); Repr has it.
	Value      json.RawMessage `json:"value"`
	Repr       string          `json:"repr"`
	Stdout     string          `json:"stdout"`
	Stderr     string          `json:"stderr"`
	Error      *jsonError      `json:"error,omitempty"`
	DurationMS float64         `json:"duration_ms"`
	TimedOut   bool            `json:"timed_out,omitempty"`
	Cancelled  bool            `json:"cancelled,omitempty"`
}

type jsonError struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback"`
}

// config is the command line, parsed.
type config struct {
	code, file string
	hasCode    bool
	argv       []string // sys.argv for a file
	asJSON     bool
	timeout    time.Duration
	maxOutput  int
	backend    string
	isolated   minipy.IsolatedConfig
	isoFlags   []string // isolated-only flags given
}

func parseArgs(args []string, stderr io.Writer) (*config, bool) {
	c := &config{}
	fs := flag.NewFlagSet("minipy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.code, "c", "", "Python code to run (default: a FILE, else stdin, else a REPL on a terminal)")
	fs.BoolVar(&c.asJSON, "json", false, "print the result as JSON (value, repr, stdout, stderr, error, duration) at the end instead of streaming")
	fs.DurationVar(&c.timeout, "timeout", 0, "stop each run after this long (0: 30s for -c and stdin, none for a FILE or the REPL; negative: none)")
	fs.IntVar(&c.maxOutput, "max-output", 0, "cap each of stdout, stderr and the repr of the result at this many characters (0: default, negative: none)")
	fs.StringVar(&c.backend, "backend", minipy.BackendAuto, "`engine`: inprocess, isolated (sandboxed worker processes), or auto (isolated on the project's virtualenv if there is one, else inprocess)")
	isolated := fs.Bool("isolated", false, "same as --backend isolated")
	fs.StringVar(&c.isolated.Python, "python", "", "isolated: the worker's python executable (default: the one matching the linked libpython)")
	fs.BoolVar(&c.isolated.Network, "network", false, "isolated: let the code reach the network")
	fs.Int64Var(&c.isolated.MemoryLimit, "memory-limit", 0, "isolated: cap the worker's address space at this many bytes (0: none)")
	fs.Func("mount", "isolated: share a host path, `SOURCE[:TARGET][:rw]` (read-only unless :rw; repeatable)", func(v string) error {
		m, err := parseMount(v)
		c.isolated.Mounts = append(c.isolated.Mounts, m)
		return err
	})
	fs.Func("env", "isolated: set `KEY=VALUE` in the worker's environment, which has none of this shell's (repeatable)", func(v string) error {
		c.isolated.Env = append(c.isolated.Env, v)
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: minipy [flags] [-c CODE | FILE [ARGS...]]\n\n"+
			"Runs Python code (from -c, a file, or stdin; a REPL on a terminal) in an embedded CPython\n"+
			"and prints what a model would see: the output as it comes, then the value or the traceback.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, false
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "c":
			c.hasCode = true
		case "python", "network", "memory-limit", "mount", "env":
			c.isoFlags = append(c.isoFlags, "--"+f.Name)
		}
	})
	if *isolated {
		c.backend = minipy.BackendIsolated
	}
	switch c.backend {
	case minipy.BackendAuto, minipy.BackendInProcess, minipy.BackendIsolated:
	default:
		fmt.Fprintf(stderr, "%v, not %q\n", minipy.ErrBackend, c.backend)
		return nil, false
	}
	if len(c.isoFlags) > 0 {
		if c.backend == minipy.BackendInProcess {
			fmt.Fprintf(stderr, "minipy: %s only apply to --backend isolated\n", strings.Join(c.isoFlags, ", "))
			return nil, false
		}
		c.backend = minipy.BackendIsolated
	}
	if fs.NArg() > 0 {
		if c.hasCode {
			fmt.Fprintf(stderr, "minipy: unexpected arguments %q after -c (quote the code: minipy -c 'CODE')\n", fs.Args())
			return nil, false
		}
		c.file, c.argv = fs.Arg(0), fs.Args()
	}
	return c, true
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c, ok := parseArgs(args, stderr)
	if !ok {
		return 2
	}
	interactive := !c.hasCode && c.file == "" && !c.asJSON && isTerminal(stdin)
	src := c.code
	switch {
	case c.file != "":
		b, err := os.ReadFile(c.file)
		if err != nil {
			fmt.Fprintf(stderr, "minipy: %v\n", err)
			return 2
		}
		src = string(b)
	case !c.hasCode && !interactive:
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintf(stderr, "minipy: reading code from stdin: %v\n", err)
			return 2
		}
		src = string(b)
	}
	opts := &minipy.Options{Timeout: c.timeout, MaxOutput: c.maxOutput}
	if c.timeout == 0 {
		opts.Timeout = defaultTimeout
		if c.file != "" || interactive {
			opts.Timeout = -1
		}
	}

	eng, err := newEngine(c)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	defer eng.Close()
	if interactive {
		return repl(eng, opts, stdin.(*os.File), stdout, stderr)
	}
	if c.file != "" {
		ns := eng.NewNamespace()
		defer ns.Close()
		if err := setArgv(eng, ns, c.file, c.argv); err != nil {
			fmt.Fprintf(stderr, "minipy: %v\n", err)
			return 1
		}
		opts.Globals = ns
	}

	// Ctrl-C cancels the run (the code gets the interrupt) instead of killing the process.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if c.asJSON {
		res, err := eng.Run(ctx, src, opts)
		if res == nil {
			fmt.Fprintf(stderr, "%v\n", err)
			return 1
		}
		return printJSON(stdout, stderr, res, err)
	}
	out, errOut := &tailWriter{w: stdout}, &tailWriter{w: stderr}
	opts.Stdout, opts.Stderr = out, errOut
	res, err := eng.Run(ctx, src, opts)
	return report(res, err, out, errOut)
}

// newEngine starts the engine --backend asks for (auto: for the current directory).
func newEngine(c *config) (minipy.Engine, error) {
	dir, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	return minipy.NewBackend(c.backend, dir, c.isolated)
}

// setArgv gives a file's run sys.argv and __file__, as python FILE ARGS would.
func setArgv(eng minipy.Engine, ns *minipy.Namespace, file string, argv []string) error {
	abs, err := filepath.Abs(file)
	if err != nil {
		return err
	}
	if err := ns.Set("__file__", abs); err != nil {
		return err
	}
	if err := ns.Set("_minipy_argv", argv); err != nil {
		return err
	}
	_, err = eng.Run(context.Background(), "import sys as _minipy_sys\n_minipy_sys.argv = _minipy_argv\ndel _minipy_sys, _minipy_argv",
		&minipy.Options{Globals: ns})
	return err
}

// report prints, after output that was streamed through out and errOut, the value or the
// error, and returns the exit status.
func report(res *minipy.Result, err error, out, errOut *tailWriter) int {
	if res != nil && res.HasValue {
		out.startLine()
		fmt.Fprintln(out, res.Repr)
	}
	if err == nil {
		out.startLine()
		return 0
	}
	out.startLine()
	errOut.startLine()
	var pyErr *minipy.PythonError
	if errors.As(err, &pyErr) {
		fmt.Fprint(errOut, pyErr.Traceback)
	}
	var stopped *minipy.InterruptedError
	if errors.As(err, &stopped) || !errors.As(err, &pyErr) || errors.Is(err, minipy.ErrLimit) {
		errOut.startLine()
		fmt.Fprintln(errOut, err) // a stop, a lost worker, a limit: say so
	}
	return 1
}

// tailWriter remembers whether what went through it ended a line.
type tailWriter struct {
	w       io.Writer
	midLine bool
}

func (t *tailWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		t.midLine = p[len(p)-1] != '\n'
	}
	return t.w.Write(p)
}

// startLine ends a line the output left open.
func (t *tailWriter) startLine() {
	if t.midLine {
		t.Write([]byte("\n")) //nolint:errcheck // best effort, like the output itself
	}
}

func printJSON(stdout, stderr io.Writer, res *minipy.Result, err error) int {
	doc := jsonResult{
		HasValue:   res.HasValue,
		Value:      json.RawMessage("null"),
		Repr:       res.Repr,
		Stdout:     res.Stdout,
		Stderr:     res.Stderr,
		DurationMS: float64(res.Duration.Microseconds()) / 1000,
		TimedOut:   errors.Is(err, minipy.ErrTimeout),
		Cancelled:  errors.Is(err, context.Canceled),
	}
	if v, e := json.Marshal(res.Value); e == nil {
		doc.Value = v
	}
	var pyErr *minipy.PythonError
	if errors.As(err, &pyErr) {
		doc.Error = &jsonError{Type: pyErr.Type, Message: pyErr.Message, Traceback: pyErr.Traceback}
	} else if err != nil {
		doc.Error = &jsonError{Type: "minipy.Error", Message: err.Error()}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if e := enc.Encode(doc); e != nil {
		fmt.Fprintf(stderr, "minipy: %v\n", e)
		return 1
	}
	if err != nil {
		return 1
	}
	return 0
}

// parseMount parses --mount's SOURCE[:TARGET][:rw] (a relative SOURCE is taken from the
// current directory).
func parseMount(v string) (minipy.Mount, error) {
	var m minipy.Mount
	if rest, ok := strings.CutSuffix(v, ":rw"); ok {
		v, m.Writable = rest, true
	} else if rest, ok := strings.CutSuffix(v, ":ro"); ok {
		v = rest
	}
	m.Source, m.Target, _ = strings.Cut(v, ":")
	if m.Source == "" {
		return m, errors.New("want SOURCE[:TARGET][:rw]")
	}
	abs, err := filepath.Abs(m.Source)
	m.Source = abs
	return m, err
}
