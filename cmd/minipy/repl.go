package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/chzyer/readline"

	"github.com/minipy-go/minipy"
)

// isTerminal reports whether r is a terminal (the REPL's condition).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && readline.IsTerminal(int(f.Fd()))
}

// repl reads cells from the terminal and runs them in one namespace, as Python's REPL does:
// a compound statement or an open bracket continues on "... " lines until it is complete
// (a blank line ends a block), values are echoed as the tool shows them, errors printed.
// Ctrl-C at the prompt drops the input; during a run it stops the run, not the REPL.
// Ctrl-D on an empty line exits.
//
// --put's files go into the namespace before the first cell; --out copies each cell's files.
func repl(eng minipy.Engine, opts *minipy.Options, saver *imageSaver, files *runFiles, in *os.File, stdout, stderr io.Writer) int {
	ns := eng.NewNamespace()
	defer ns.Close()
	if status, err := files.put(ns); err != nil {
		fmt.Fprintf(stderr, "minipy: %v\n", err)
		return status
	}
	cfg := &readline.Config{
		Prompt:          ">>> ",
		Stdin:           in,
		Stdout:          stdout,
		Stderr:          stderr,
		InterruptPrompt: "^C",
		EOFPrompt:       "",
	}
	if home, err := os.UserHomeDir(); err == nil {
		cfg.HistoryFile = filepath.Join(home, ".minipy_history")
	}
	rl, err := readline.NewEx(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "minipy: %v\n", err)
		return 1
	}
	defer rl.Close()

	run := *opts
	run.Globals = ns
	// SIGINT only reaches us while a cell runs (readline reads Ctrl-C as a key): it stops
	// the run instead of the process.
	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, os.Interrupt)
	defer signal.Stop(sigint)

	fmt.Fprintf(stdout, "minipy %s, %s. Ctrl-D exits, Ctrl-C stops a running cell.\n", pythonVersion(eng), backendName(eng, ns))
	var cell []string
	for {
		if len(cell) == 0 {
			rl.SetPrompt(">>> ")
		} else {
			rl.SetPrompt("... ")
		}
		line, err := rl.Readline()
		switch {
		case errors.Is(err, readline.ErrInterrupt):
			cell = nil
			fmt.Fprintln(stdout, "KeyboardInterrupt")
			continue
		case errors.Is(err, io.EOF):
			if len(cell) == 0 {
				fmt.Fprintln(stdout)
				return 0
			}
			line = "" // Ctrl-D ends the cell, as a blank line does
		case err != nil:
			fmt.Fprintf(stderr, "minipy: %v\n", err)
			return 1
		}
		cell = append(cell, line)
		src := strings.Join(cell, "\n")
		if strings.TrimSpace(src) == "" {
			cell = nil
			continue
		}
		if needsMore(src) {
			continue
		}
		cell = nil
		runCell(eng, &run, saver, files, src, sigint, stdout, stderr)
	}
}

// runCell runs one cell, stopping it when Ctrl-C arrives, prints what it gave and saves
// its images (--save-images) and files (--out): a stopped cell's too, they were made.
func runCell(eng minipy.Engine, opts *minipy.Options, saver *imageSaver, files *runFiles, src string, sigint <-chan os.Signal,
	stdout, stderr io.Writer) {
	for len(sigint) > 0 {
		<-sigint // a Ctrl-C that came between cells
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		select {
		case <-sigint:
			cancel()
		case <-done:
		}
	}()
	out, errOut := &tailWriter{w: stdout}, &tailWriter{w: stderr}
	opts.Stdout, opts.Stderr = out, errOut
	started := time.Now()
	res, err := eng.Run(ctx, src, opts)
	close(done)
	cancel()
	if errors.Is(err, context.Canceled) {
		out.startLine()
		errOut.startLine()
		fmt.Fprintln(errOut, "KeyboardInterrupt")
	} else {
		report(res, err, out, errOut)
	}
	saver.saveAndReport(res, errOut)
	files.collect(opts.Globals, res, started, errOut)
}

// needsMore reports whether src is an unfinished cell: inside brackets, a triple-quoted
// string or a backslash continuation, or a block (a first line that ends with ':' or a
// decorator) not yet closed by a blank line, as in Python's own REPL.
func needsMore(src string) bool {
	depth, quote, triple := 0, byte(0), false
	for i := 0; i < len(src); i++ {
		ch := src[i]
		switch {
		case quote != 0:
			switch {
			case ch == '\\':
				i++
			case triple && strings.HasPrefix(src[i:], strings.Repeat(string(quote), 3)):
				quote, i = 0, i+2
			case !triple && ch == quote:
				quote = 0
			case !triple && ch == '\n':
				quote = 0 // an unterminated string: a SyntaxError the run will report
			}
		case ch == '#':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case ch == '"' || ch == '\'':
			quote, triple = ch, strings.HasPrefix(src[i:], strings.Repeat(string(ch), 3))
			if triple {
				i += 2
			}
		case strings.IndexByte("([{", ch) >= 0:
			depth++
		case strings.IndexByte(")]}", ch) >= 0 && depth > 0:
			depth--
		}
	}
	if (quote != 0 && triple) || depth > 0 || strings.HasSuffix(src, "\\") {
		return true
	}
	lines := strings.Split(src, "\n")
	first := strings.TrimSpace(stripComment(lines[0]))
	block := strings.HasSuffix(first, ":") || strings.HasPrefix(first, "@")
	return block && strings.TrimSpace(lines[len(lines)-1]) != ""
}

// stripComment drops a trailing comment from a line that holds no string.
func stripComment(line string) string {
	if strings.ContainsAny(line, `"'`) {
		return line
	}
	before, _, _ := strings.Cut(line, "#")
	return before
}

// pythonVersion is the engine's Python version ("Python 3.11.2"), asked in a namespace of its own.
func pythonVersion(eng minipy.Engine) string {
	ns := eng.NewNamespace()
	defer ns.Close()
	res, err := eng.Run(context.Background(), "import sys\n'Python ' + sys.version.split()[0]", &minipy.Options{Globals: ns})
	if err != nil || res == nil {
		return "Python"
	}
	if s, ok := res.Value.(string); ok {
		return s
	}
	return "Python"
}

// backendName names the engine, and the host directory of ns's working directory (/work in
// the sandbox) if it has one.
func backendName(eng minipy.Engine, ns *minipy.Namespace) string {
	if _, ok := eng.(*minipy.Isolated); ok {
		if dir := ns.WorkDir(); dir != "" {
			return "isolated engine (working directory " + dir + ")"
		}
		return "isolated engine"
	}
	return "in-process engine"
}
