package minipy

import (
	"context"
	"io"
	"math"
	"strings"
	"time"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// DefaultTimeout bounds a run whose Options.Timeout is 0 (toolslm's minipy uses an hour).
const DefaultTimeout = time.Hour

// DefaultMaxOutput is the cap, in characters, on each of a run's stdout, stderr and repr
// when Options.MaxOutput is 0.
const DefaultMaxOutput = 64 << 10

// Options configure one run. A nil *Options means all defaults.
type Options struct {
	// Globals is the namespace the code runs in. Nil means the engine's default namespace,
	// shared by every run that passes none (toolslm's "caller globals").
	Globals *Namespace
	// Locals is the local namespace, as in exec(code, globals, locals). Nil means Globals,
	// which is what almost all code wants: functions then see the cell's imports.
	Locals *Namespace
	// Timeout bounds the run. 0 means DefaultTimeout; negative means none (the context's
	// deadline, if any, still applies).
	Timeout time.Duration
	// MaxOutput caps each of stdout, stderr and the value's repr, in characters; the
	// first and last halves are kept around a marker that says how much was left out.
	// 0 means DefaultMaxOutput; negative means no cap.
	MaxOutput int
	// Stdout and Stderr, when set, receive what the code prints while it runs, in order:
	// print and sys.stdout/sys.stderr writes, and in an isolated worker also what C code and
	// child processes write to fds 1 and 2. The Result still has all of it (capped). A slow
	// writer never stalls the code: past 1 MiB behind, output is dropped from the live feed
	// with a note saying how much (see output.go for the exact rule). Run returns only after
	// the writers have taken the run's output, or a second after the run if one is stuck.
	Stdout, Stderr io.Writer
	// MaxImages caps the images one run may show (display(), figures, an image value);
	// later ones are left out, and the text says so where they would have been. 0 means
	// DefaultMaxImages; negative means no cap.
	MaxImages int
	// MaxImageBytes caps each image's size. A larger figure or PIL image is rendered again
	// smaller; any other image is left out with a note. 0 means DefaultMaxImageBytes;
	// negative means no cap.
	MaxImageBytes int
}

// Result is what a run produced. When the code raises, the Result still carries the
// output printed before the error.
type Result struct {
	// Value is the last expression's value as a plain Go value (see the type table in the
	// package doc), or nil when it has no Go equivalent; Repr is set either way.
	Value any
	// Repr is the value as IPython shows it (text/plain, by its pretty printer's rules:
	// types as int, functions with their signature, 1,000 items of a sequence then ...,
	// lines of 79 columns, _repr_pretty_), its text alone: ValueText adds a figure's
	// image marker under it.
	Repr string
	// HasValue reports whether the code ended with an expression whose value is not None
	// and which was not silenced with a trailing ';'.
	HasValue bool
	// Stdout and Stderr are what the code and its child processes wrote, exactly, each
	// capped at MaxOutput. Displays are not in them, as Jupyter keeps them out of its
	// streams: Output puts their text back where they happened.
	Stdout, Stderr string
	// Displays are the run's rich outputs in the order they were produced: display()
	// calls, matplotlib figures (plt.show() and those left open at the end), and the value
	// when it has more than a text form (a PIL image, a figure, a DataFrame's HTML). Each
	// one's place in Stdout is its Offset, and the text a model reads there its Caption
	// ("[image 1: PNG 640x480, 23 KB]" for an image).
	Displays []Display
	// Duration is the wall time of the call, waiting for the interpreter included.
	Duration time.Duration
	// Files are the files under the namespace's working directory that the run created or
	// changed (written, made, moved there; not removed, not directories, not Hidden ones
	// such as the caches libraries keep there), as they are when it ends, sorted by name,
	// at most MaxResultFiles; MoreFiles counts the rest. Only
	// isolated engines with local workers track them (Namespace.WorkDir); writes made
	// between runs (the host's WriteFile, threads the code left running) do not count.
	Files []FileInfo
	// MoreFiles is how many changed files Files leaves out: 0 when it names them all, and
	// MoreFilesUnknown (-1) when the run may have changed files that Files leaves out but
	// how many is not known. Test MoreFiles != 0 for "Files is not the whole list".
	MoreFiles int
}

// MaxResultFiles caps Result.Files.
const MaxResultFiles = 100

// MoreFilesUnknown is Result.MoreFiles when the run may have changed files that Files
// leaves out, but how many is not known; Files names those the engine saw. The engine's
// watches are bounded, for each namespace and for the engine, and the end of a run walks
// the folders without one up to a bound of its own (docs/isolated.md, "Files in and
// out"): a working directory past both, or with a folder the host cannot read (the code
// made it mode 0), gives its runs this. ListFiles finds the rest (ModTime after the run
// began).
const MoreFilesUnknown = -1

// Text renders the result as a model should read it: the printed output with the
// displays' captions in their places (Output), then stderr, then the value (ValueText),
// each on lines of its own.
func (r *Result) Text() string {
	if r == nil {
		return ""
	}
	var b strings.Builder
	for _, part := range [...]string{r.Output(), r.Stderr, r.ValueText()} {
		if part == "" {
			continue
		}
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
		b.WriteString(part)
	}
	return b.String()
}

// Output is Stdout with the caption of each display that is not the value on a line of
// its own at the display's Offset: the output as a notebook shows it, in text ("[image
// 1: PNG 640x480, 23 KB]" where a plot was shown).
func (r *Result) Output() string {
	if r == nil {
		return ""
	}
	var b strings.Builder
	at := 0
	for _, d := range r.Displays {
		if d.Value || d.Caption == "" {
			continue
		}
		off := min(max(d.Offset, at), len(r.Stdout))
		b.WriteString(r.Stdout[at:off])
		at = off
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n') // a display starts a line, as in a notebook
		}
		b.WriteString(d.Caption)
		if !strings.HasSuffix(d.Caption, "\n") {
			b.WriteByte('\n')
		}
	}
	if b.Len() == 0 {
		return r.Stdout
	}
	b.WriteString(r.Stdout[at:])
	return b.String()
}

// ValueText is Repr with the caption of the value's display, if it has one, on a line
// under it: a figure's "[image 1: PNG 640x480, 23 KB]".
func (r *Result) ValueText() string {
	if r == nil {
		return ""
	}
	for _, d := range r.Displays {
		if d.Value && d.Caption != "" {
			if r.Repr == "" {
				return d.Caption
			}
			return r.Repr + "\n" + d.Caption
		}
	}
	return r.Repr
}

// Minipy runs code in the in-process interpreter with opts (nil: defaults) and returns its
// result. It is Run with context.Background().
func Minipy(code string, opts *Options) (*Result, error) {
	return Run(context.Background(), code, opts)
}

// Run runs code in the in-process interpreter, stopping it when opts.Timeout passes or
// ctx ends (see the package doc on timeouts). The error is a *PythonError when the code
// raised, an *InterruptedError when it was stopped, and the Result carries what was
// printed in both cases. Safe for concurrent use: runs take turns on the interpreter.
func Run(ctx context.Context, code string, opts *Options) (*Result, error) {
	e, err := inProcess()
	if err != nil {
		return nil, err
	}
	return e.run(ctx, code, opts)
}

// engine is what the in-process and isolated engines share: runs and namespace operations.
type engine interface {
	run(ctx context.Context, code string, opts *Options) (*Result, error)
	// do sends one namespace request (see pyrt's ops) and returns its decoded reply.
	do(ns *Namespace, op byte, args ...any) (any, error)
	name() string
	// hosts is the engine's registered host functions.
	hosts() *hostRegistry
}

// namespaceIDs resolves opts' namespaces for engine e.
func namespaceIDs(e engine, opts *Options) (gid, lid uint32, err error) {
	gid = pyrt.DefaultNamespace
	if opts == nil {
		return gid, 0, nil
	}
	if opts.Globals != nil {
		if gid, err = opts.Globals.idFor(e); err != nil {
			return 0, 0, err
		}
	}
	if opts.Locals != nil && opts.Locals != opts.Globals {
		if lid, err = opts.Locals.idFor(e); err != nil {
			return 0, 0, err
		}
	}
	return gid, lid, nil
}

func maxOutput(opts *Options) int {
	switch {
	case opts == nil || opts.MaxOutput == 0:
		return DefaultMaxOutput
	case opts.MaxOutput < 0:
		return -1
	}
	return opts.MaxOutput
}

// imageLimits are a run's caps on images (negative: none), as the run request carries them.
type imageLimits struct{ count, bytes int }

func imageLimitsOf(opts *Options) imageLimits {
	l := imageLimits{DefaultMaxImages, DefaultMaxImageBytes}
	if opts != nil && opts.MaxImages != 0 {
		l.count = max(opts.MaxImages, -1)
	}
	if opts != nil && opts.MaxImageBytes != 0 {
		l.bytes = max(min(opts.MaxImageBytes, math.MaxInt32), -1)
	}
	return l
}

func timeoutOf(opts *Options) time.Duration {
	if opts == nil {
		return 0
	}
	return opts.Timeout
}
