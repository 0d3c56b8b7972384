// Command minipy runs Python code the way an LLM tool loop would and prints what the model
// would see: the output as it comes, then the last expression's value, or the traceback.
//
//	minipy -c 'import math; math.factorial(12)'
//	minipy script.py [ARGS...]
//	echo 'print("hi")' | minipy --json
//	minipy                       # on a terminal: a REPL with one persistent namespace
//	minipy --save-images plots -c 'import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()'
//	minipy --isolated --put sales.csv --out results -c 'import pandas as pd; pd.read_csv("sales.csv").describe().to_csv("summary.csv")'
//
// Rich outputs (display() calls, matplotlib figures, an image or DataFrame value) show in
// the output as their text form, an image as "[image 1: PNG 640x480, 23 KB]"; --json lists
// them in full under "displays", and --save-images DIR writes the images into DIR as
// image-1.png, image-2.png, ... numbered on across runs, never over an existing file.
//
// --backend picks the engine: inprocess (the embedded interpreter), isolated (sandboxed
// worker processes) or auto (the default: isolated on the project's virtualenv when the
// current directory belongs to one, as minipy.Auto decides; in-process otherwise).
//
// An isolated run works in a directory of its own (the code sees it as /work and starts
// there), not in this machine's files. --put LOCAL[:NAME] copies a local file, or a
// directory's files recursively (not its symbolic links, special files or empty folders),
// in as NAME (by default LOCAL's base name; "data/" puts it in data/, "." takes a
// directory's files to the top) before the run, or before the REPL's first cell. --out DIR
// copies the files a run created or changed (Result.Files) out into DIR after it, also
// after one that raised or timed out, keeping their relative paths and overwriting what is
// there; --put files the run left unchanged are not copied. When a run changed more files
// than Result.Files lists (Result.MoreFiles, or may have: MoreFilesUnknown), --out copies the rest too: the files of the
// working directory modified from one second before the run began. It says on stderr where
// each file went, or with --json lists them under "files", which an isolated run's
// --json document has even without --out. Both flags make the backend isolated.
//
// It exits 1 when the code raised (or timed out) and 2 on bad usage.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
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
	Displays   []jsonDisplay   `json:"displays,omitempty"`
	Error      *jsonError      `json:"error,omitempty"`
	DurationMS float64         `json:"duration_ms"`
	TimedOut   bool            `json:"timed_out,omitempty"`
	Cancelled  bool            `json:"cancelled,omitempty"`
	// Files are the files the run created or changed in its working directory (isolated
	// runs: Result.Files), with where --out copied each; MoreFiles counts those left out
	// (Result.MoreFiles; -1: some may be, how many is not known), which --out finds and
	// lists here too.
	Files     []jsonFile `json:"files,omitempty"`
	MoreFiles int        `json:"more_files,omitempty"`
}

// jsonFile is one of a run's files in the --json document.
type jsonFile struct {
	Name string `json:"name"` // relative to the working directory, slash-separated
	Size int64  `json:"size"`
	// Path is where --out wrote it.
	Path string `json:"path,omitempty"`
}

// jsonDisplay is one of Result.Displays in the --json document, as Jupyter's nbformat
// keeps an output's data: text types (isTextMIME) as strings, binary ones (images, PDF)
// as standard base64.
type jsonDisplay struct {
	Data  map[string]string `json:"data"`
	Value bool              `json:"value"`
	// Offset and Caption are Display's: the byte offset into stdout where it was shown,
	// and the text a model reads there.
	Offset  int    `json:"offset"`
	Caption string `json:"caption,omitempty"`
	// Path is where --save-images wrote the display's image: with --json the paths are
	// here, for whatever reads the document, rather than on stderr.
	Path string `json:"path,omitempty"`
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
	saveImages string // --save-images DIR
	puts       []putSpec
	outDir     string // --out DIR
	isolated   minipy.IsolatedConfig
	isoFlags   []string // isolated-only flags given
}

// parseArgs parses the command line into a config; false when there is nothing to run: -h,
// which prints the usage, or bad usage, said on stderr (with the usage text when a flag
// did not parse).
func parseArgs(args []string, stderr io.Writer) (*config, bool) {
	c := &config{}
	var puts []string
	fs := flag.NewFlagSet("minipy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.runFlags(fs)
	isolated := fs.Bool("isolated", false, "same as --backend isolated")
	c.isolatedFlags(fs, &puts)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: minipy [flags] [-c CODE | FILE [ARGS...]]\n\n"+
			"Runs Python code (from -c, a file, or stdin; a REPL on a terminal) in an embedded CPython\n"+
			"and prints what a model would see: the output as it comes, then the value or the traceback.\n"+
			"An isolated run works in a directory of its own: --put copies files in, --out copies out those it makes or changes.\n\n"+
			"  minipy --isolated --put sales.csv --out results -c 'import pandas as pd; ...'\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, false
	}
	if *isolated {
		c.backend = minipy.BackendIsolated
	}
	if !c.check(fs, puts, stderr) {
		return nil, false
	}
	return c, true
}

// runFlags registers the flags of what to run and how: the code, --json, --save-images,
// the timeout, the output cap and the backend.
func (c *config) runFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.code, "c", "", "Python code to run (default: a FILE, else stdin, else a REPL on a terminal)")
	fs.BoolVar(&c.asJSON, "json", false, "print the result as JSON (value, repr, stdout, stderr, displays, error, duration, files) at the end instead of streaming; "+
		"a display's data is a string for text types (text/*, application/json, application/javascript, *+json, *+xml such as SVG) "+
		"and base64 for the rest (images, PDF), as in Jupyter's notebook files")
	fs.StringVar(&c.saveImages, "save-images", "", "write each image a run shows (figures, display(), an image value) into `DIR` as image-N.png (.jpg, .gif, .webp), "+
		"numbered on across runs and skipping names already taken; the paths go to stderr, or with --json to each display's \"path\"")
	fs.DurationVar(&c.timeout, "timeout", 0, "stop each run after this long (0: 30s for -c and stdin, none for a FILE or the REPL; negative: none)")
	fs.IntVar(&c.maxOutput, "max-output", 0, "cap each of stdout, stderr and the repr of the result at this many characters (0: default, negative: none)")
	fs.StringVar(&c.backend, "backend", minipy.BackendAuto, "`engine`: inprocess, isolated (sandboxed worker processes), or auto (isolated on the project's virtualenv if there is one, else inprocess)")
}

// isolatedFlags registers the flags that only the isolated engine takes (each turns it on:
// check); --put's values go to puts, checked once the flags are parsed.
func (c *config) isolatedFlags(fs *flag.FlagSet, puts *[]string) {
	fs.StringVar(&c.isolated.Python, "python", "", "isolated: the worker's python executable (default: the one matching the linked libpython)")
	fs.BoolVar(&c.isolated.Network, "network", false, "isolated: let the code reach the network")
	fs.BoolVar(&c.isolated.RootUser, "root-user", false, "isolated: give the sandbox a root user its code may become "+
		"(sudo; a root host's: root over the sandbox alone)")
	fs.Func("egress-allow", "isolated: let the code reach these hosts (a comma-separated `list` of names, *.domain, "+
		"name:port; pypi for PyPI) through the sandbox's egress proxy, and nothing else (repeatable)", func(v string) error {
		if c.isolated.Egress == nil {
			c.isolated.Egress = &minipy.Egress{}
		}
		for _, e := range strings.Split(v, ",") {
			switch e = strings.TrimSpace(e); e {
			case "":
			case "pypi":
				c.isolated.Egress.Allow = append(c.isolated.Egress.Allow, "pypi.org", "files.pythonhosted.org")
			default:
				c.isolated.Egress.Allow = append(c.isolated.Egress.Allow, e)
			}
		}
		return nil
	})
	fs.Int64Var(&c.isolated.MemoryLimit, "memory-limit", 0, "isolated: cap the worker's address space at this many bytes (0: none)")
	fs.Int64Var(&c.isolated.WorkSize, "work-size", 0, "isolated: the `bytes` the working directory may hold, a tmpfs (memory): "+
		"past it writes fail with ENOSPC (0: 1 GiB; negative: on the disk, no cap)")
	fs.Func("mount", "isolated: share a host path, `SOURCE[:TARGET][:rw]` (read-only unless :rw; repeatable)", func(v string) error {
		m, err := parseMount(v)
		c.isolated.Mounts = append(c.isolated.Mounts, m)
		return err
	})
	fs.Func("env", "isolated: set `KEY=VALUE` in the worker's environment, which has none of this shell's (repeatable)", func(v string) error {
		c.isolated.Env = append(c.isolated.Env, v)
		return nil
	})
	fs.Func("put", "isolated: copy the local file or directory into the run's working directory (where the code starts, /work "+
		"in the sandbox) before it runs, as `LOCAL[:NAME]` (NAME: LOCAL's base name by default; ending in / to put it in that "+
		"directory; . for a directory's files at the top); a directory's files go recursively, links and special files are "+
		"skipped (repeatable)", func(v string) error {
		*puts = append(*puts, v) // checked below: an error there needs no usage text
		return nil
	})
	fs.StringVar(&c.outDir, "out", "", "isolated: after each run, also one that raised or timed out, copy the files it created or "+
		"changed in its working directory into `DIR` with their relative paths, overwriting; the paths go to stderr, "+
		"or with --json to \"files\"")
}

// check completes c from the parsed flags and refuses the combinations that make no sense,
// saying why on stderr: -c or --isolated flags with another backend, a bad --put, arguments
// after -c.
func (c *config) check(fs *flag.FlagSet, puts []string, stderr io.Writer) bool {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "c":
			c.hasCode = true
		case "python", "network", "memory-limit", "work-size", "mount", "env", "put", "out", "egress-allow", "root-user":
			c.isoFlags = append(c.isoFlags, "--"+f.Name)
		}
	})
	switch c.backend {
	case minipy.BackendAuto, minipy.BackendInProcess, minipy.BackendIsolated:
	default:
		fmt.Fprintf(stderr, "%v, not %q\n", minipy.ErrBackend, c.backend)
		return false
	}
	if len(c.isoFlags) > 0 {
		if c.backend == minipy.BackendInProcess {
			verb := "applies"
			if len(c.isoFlags) > 1 {
				verb = "apply"
			}
			fmt.Fprintf(stderr, "minipy: %s only %s to --backend isolated\n", strings.Join(c.isoFlags, ", "), verb)
			return false
		}
		c.backend = minipy.BackendIsolated
	}
	for _, v := range puts {
		p, err := parsePut(v)
		if err != nil {
			fmt.Fprintf(stderr, "minipy: --put %s: %v\n", v, err)
			return false
		}
		c.puts = append(c.puts, p)
	}
	if fs.NArg() > 0 {
		if c.hasCode {
			fmt.Fprintf(stderr, "minipy: unexpected arguments %q after -c (quote the code: minipy -c 'CODE')\n", fs.Args())
			return false
		}
		c.file, c.argv = fs.Arg(0), fs.Args()
	}
	return true
}

// run is the command: it parses args, runs the code (or the REPL) and reports what a model
// would see. Its exit status is 1 when the code raised or timed out, or the engine, the
// images or the files failed, and 2 on bad usage or -h.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c, ok := parseArgs(args, stderr)
	if !ok {
		return 2
	}
	interactive := !c.hasCode && c.file == "" && !c.asJSON && isTerminal(stdin)
	src, ok := c.source(interactive, stdin, stderr)
	if !ok {
		return 2
	}
	opts := c.options(interactive)
	saver, files := c.imageSaver(), c.runFiles()

	eng, err := newEngine(c)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	defer eng.Close()
	defer closeOnTerminate(eng)()
	if interactive {
		return repl(eng, opts, saver, files, stdin.(*os.File), stdout, stderr)
	}
	ns, status := c.prepare(eng, files, opts, stderr)
	if ns != nil {
		defer ns.Close()
	}
	if status != 0 {
		return status
	}

	// Ctrl-C cancels the run (the code gets the interrupt) instead of killing the process.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if c.asJSON {
		return runJSON(ctx, eng, src, opts, saver, files, ns, stdout, stderr)
	}
	return runStreamed(ctx, eng, src, opts, saver, files, ns, stdout, stderr)
}

// closeOnTerminate has SIGTERM and SIGHUP (timeout(1), a closed terminal, a service
// manager's stop) close eng before the CLI ends with status 128 + the signal: its
// sandboxes, their cgroups and its private directory go as at a normal exit, where the
// signal's default action would leave the directory behind. The func it returns stops it;
// once a signal came, it waits for that exit instead (the run the engine's close ended
// returns first, and its status is not the CLI's).
func closeOnTerminate(eng minipy.Engine) func() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	var terminating atomic.Bool
	go func() {
		select {
		case sig := <-sigs:
			terminating.Store(true)
			eng.Close()
			os.Exit(128 + int(sig.(syscall.Signal)))
		case <-done:
		}
	}()
	return func() {
		if terminating.Load() {
			time.Sleep(time.Minute) // (the exit comes first)
		}
		signal.Stop(sigs)
		close(done)
	}
}

// options are the runs' options from --timeout and --max-output. A zero --timeout bounds
// -c and stdin code by defaultTimeout and leaves a FILE and the REPL unbounded, as Ctrl-C
// stops those.
func (c *config) options(interactive bool) *minipy.Options {
	opts := &minipy.Options{Timeout: c.timeout, MaxOutput: c.maxOutput}
	if c.timeout == 0 {
		opts.Timeout = defaultTimeout
		if c.file != "" || interactive {
			opts.Timeout = -1
		}
	}
	return opts
}

// imageSaver is what writes the images of --save-images; nil without the flag.
func (c *config) imageSaver() *imageSaver {
	if c.saveImages == "" {
		return nil
	}
	return &imageSaver{dir: c.saveImages}
}

// runFiles is what puts the --put files in and copies the --out files out; nil with
// neither flag.
func (c *config) runFiles() *runFiles {
	if len(c.puts) == 0 && c.outDir == "" {
		return nil
	}
	files := &runFiles{puts: c.puts}
	if c.outDir != "" {
		files.out = &outCopier{dir: c.outDir}
	}
	return files
}

// runStreamed runs src with its output streamed to stdout and stderr as it comes, then
// prints the value or the traceback, the saved images and the copied files; its exit
// status.
func runStreamed(ctx context.Context, eng minipy.Engine, src string, opts *minipy.Options, saver *imageSaver,
	files *runFiles, ns *minipy.Namespace, stdout, stderr io.Writer) int {
	out, errOut := &tailWriter{w: stdout}, &tailWriter{w: stderr}
	opts.Stdout, opts.Stderr = out, errOut
	started := time.Now()
	res, err := eng.Run(ctx, src, opts)
	// The output already named each image ("[image 1: ...]" where it was shown, the value's
	// in its repr); the saved paths follow, after the value or traceback, then the files.
	status := report(res, err, out, errOut)
	if !saver.saveAndReport(res, errOut) {
		status = 1
	}
	if !files.collect(ns, res, started, errOut) {
		status = 1
	}
	return status
}

// source is the code to run: -c's, the FILE's, or stdin's (none for the REPL); false when
// it could not be read, which it says on stderr.
func (c *config) source(interactive bool, stdin io.Reader, stderr io.Writer) (string, bool) {
	switch {
	case c.file != "":
		b, err := os.ReadFile(c.file)
		if err != nil {
			fmt.Fprintf(stderr, "minipy: %v\n", err)
			return "", false
		}
		return string(b), true
	case !c.hasCode && !interactive:
		b, err := io.ReadAll(stdin)
		if err != nil {
			fmt.Fprintf(stderr, "minipy: reading code from stdin: %v\n", err)
			return "", false
		}
		return string(b), true
	}
	return c.code, true
}

// prepare makes the run's own namespace when it needs one (a FILE, --put or --out), sets
// its sys.argv or starts its worker, and puts the files in; a non-zero status when that
// failed, said on stderr. The caller closes the namespace.
func (c *config) prepare(eng minipy.Engine, files *runFiles, opts *minipy.Options, stderr io.Writer) (*minipy.Namespace, int) {
	var ns *minipy.Namespace // the run's, when it needs one of its own
	if c.file != "" || files != nil {
		ns = eng.NewNamespace()
		opts.Globals = ns
	}
	if c.file != "" {
		if err := setArgv(eng, ns, c.file, c.argv); err != nil {
			fmt.Fprintf(stderr, "minipy: %v\n", err)
			return ns, 1
		}
	} else if ns != nil {
		// Start the namespace's worker (setArgv does for a file), so that --timeout bounds
		// the code, not the worker's start too, as with the default namespace's.
		if _, err := eng.Run(context.Background(), "pass", &minipy.Options{Globals: ns, Timeout: -1}); err != nil {
			fmt.Fprintf(stderr, "minipy: %v\n", err)
			return ns, 1
		}
	}
	if status, err := files.put(ns); err != nil {
		fmt.Fprintf(stderr, "minipy: %v\n", err)
		return ns, status
	}
	return ns, 0
}

// runJSON runs src and prints the result as JSON (--json), with the images saved and the
// files copied out; its exit status.
func runJSON(ctx context.Context, eng minipy.Engine, src string, opts *minipy.Options, saver *imageSaver,
	files *runFiles, ns *minipy.Namespace, stdout, stderr io.Writer) int {
	started := time.Now()
	res, err := eng.Run(ctx, src, opts)
	if res == nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	// Images and files are saved even when the code raised: those made before the error
	// are real.
	saved, saveErr := saver.save(res)
	var copied []outFile
	var notes []string
	var copyErr error
	if files != nil && files.out != nil {
		copied, notes, copyErr = files.out.copyResult(ns, res, started)
	}
	status := printJSON(stdout, stderr, res, err, saved, copied, files != nil && files.out != nil)
	if saveErr != nil {
		fmt.Fprintf(stderr, "minipy: saving images: %v\n", saveErr)
		status = 1
	}
	for _, note := range notes {
		fmt.Fprintf(stderr, "minipy: %s\n", note)
	}
	if copyErr != nil {
		status = 1
	}
	return status
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
		fmt.Fprintln(out, res.ValueText())
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

// printJSON prints the --json document of a run, with the paths its images were saved to
// and the files --out copied (out: --out was given; copied then lists every file found).
func printJSON(stdout, stderr io.Writer, res *minipy.Result, err error, saved []savedImage, copied []outFile, out bool) int {
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
	for _, d := range res.Displays {
		jd := jsonDisplay{Data: make(map[string]string, len(d.Data)), Value: d.Value, Offset: d.Offset, Caption: d.Caption}
		for mime, data := range d.Data {
			if isTextMIME(mime) {
				jd.Data[mime] = string(data)
			} else {
				jd.Data[mime] = base64.StdEncoding.EncodeToString(data)
			}
		}
		doc.Displays = append(doc.Displays, jd)
	}
	for _, si := range saved {
		doc.Displays[si.display].Path = si.path
	}
	doc.Files, doc.MoreFiles = jsonFiles(res, copied, out)
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
	enc.SetEscapeHTML(false) // a person reads this too: "<div>" in text/html, not "\u003cdiv\u003e"
	if e := enc.Encode(doc); e != nil {
		fmt.Fprintf(stderr, "minipy: %v\n", e)
		return 1
	}
	if err != nil {
		return 1
	}
	return 0
}

// jsonFiles lists a run's files for the --json document: Result.Files, with where --out
// copied each, then the files --out found and copied beyond them (Result.MoreFiles), and
// how many remain unlisted.
func jsonFiles(res *minipy.Result, copied []outFile, out bool) ([]jsonFile, int) {
	var files []jsonFile
	at := make(map[string]int, len(copied))
	for i, f := range copied {
		at[f.name] = i
	}
	listed := make(map[string]bool, len(res.Files))
	for _, fi := range res.Files {
		jf := jsonFile{Name: fi.Name, Size: fi.Size}
		if i, ok := at[fi.Name]; ok {
			jf.Size, jf.Path = copied[i].size, copied[i].path
		}
		files = append(files, jf)
		listed[fi.Name] = true
	}
	if !out {
		return files, res.MoreFiles
	}
	more := res.MoreFiles
	for _, f := range copied {
		if !listed[f.name] {
			files = append(files, jsonFile{Name: f.name, Size: f.size, Path: f.path})
			more--
		}
	}
	if res.MoreFiles == minipy.MoreFilesUnknown {
		more = 0 // --out's walk looked for all of them
	}
	return files, max(more, 0)
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
