// Command minipy runs Python code the way an LLM tool loop would and prints what the model
// would see: the output, then the last expression's value, or the traceback.
//
//	minipy -c 'import math; math.factorial(12)'
//	echo 'print("hi")' | minipy --json
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

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("minipy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	code := fs.String("c", "", "Python code to run (default: read it from stdin)")
	asJSON := fs.Bool("json", false, "print the result as JSON (value, repr, stdout, stderr, error, duration)")
	timeout := fs.Duration("timeout", 30*time.Second, "stop the code after this long (negative: no limit)")
	maxOutput := fs.Int("max-output", 0, "cap each of stdout, stderr and the repr at this many characters (0: default, negative: none)")
	isolated := fs.Bool("isolated", false, "run in a sandboxed worker process (hard timeout, crash-proof, no network) instead of in-process")
	python := fs.String("python", "", "with --isolated: the worker's python executable (default: the one matching the linked libpython)")
	network := fs.Bool("network", false, "with --isolated: let the code reach the network")
	memoryLimit := fs.Int64("memory-limit", 0, "with --isolated: cap the worker's address space at this many bytes (0: none)")
	var mounts []minipy.Mount
	var env []string
	fs.Func("mount", "with --isolated: share a host path, `SOURCE[:TARGET][:rw]` (read-only unless :rw; repeatable)", func(v string) error {
		m, err := parseMount(v)
		mounts = append(mounts, m)
		return err
	})
	fs.Func("env", "with --isolated: set `KEY=VALUE` in the worker's environment, which has none of this shell's (repeatable)", func(v string) error {
		env = append(env, v)
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: minipy [--json] [--timeout D] [-c CODE]\n\nRuns Python code (from -c or stdin) in an embedded CPython and prints what a model would see.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "minipy: unexpected arguments %q (quote the code: minipy -c 'CODE')\n", fs.Args())
		return 2
	}
	src := *code
	if !flagSet(fs, "c") {
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintf(stderr, "minipy: reading code from stdin: %v\n", err)
			return 2
		}
		src = string(b)
	}

	// Ctrl-C cancels the run (the code gets the interrupt) instead of killing the process.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	opts := &minipy.Options{Timeout: *timeout, MaxOutput: *maxOutput}
	eng := minipy.InProcess()
	if *isolated {
		iso, err := minipy.NewIsolated(minipy.IsolatedConfig{Python: *python, Network: *network, MemoryLimit: *memoryLimit,
			Mounts: mounts, Env: env})
		if err != nil {
			fmt.Fprintf(stderr, "%v\n", err)
			return 1
		}
		eng = iso
	}
	defer eng.Close()
	res, err := eng.Run(ctx, src, opts)
	if res == nil && err != nil {
		var pyErr *minipy.PythonError
		if !errors.As(err, &pyErr) {
			fmt.Fprintf(stderr, "%v\n", err)
			return 1
		}
		res = &minipy.Result{}
	}
	if *asJSON {
		return printJSON(stdout, stderr, res, err)
	}
	fmt.Fprint(stdout, res.Text())
	if text := res.Text(); text != "" && text[len(text)-1] != '\n' {
		fmt.Fprintln(stdout)
	}
	if err != nil {
		var pyErr *minipy.PythonError
		if errors.As(err, &pyErr) {
			fmt.Fprint(stderr, pyErr.Traceback)
		}
		var stopped *minipy.InterruptedError
		if errors.As(err, &stopped) || !errors.As(err, &pyErr) || errors.Is(err, minipy.ErrLimit) {
			fmt.Fprintln(stderr, err) // a stop, a lost worker, a limit: say so
		}
		return 1
	}
	return 0
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

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
