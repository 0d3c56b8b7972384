package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/testproc"
)

// TestMain lets the tests run this command as a process of its own (the test binary with
// MINIPY_CLI_MAIN=1 is the command): a terminal, signals and exit codes need one.
func TestMain(m *testing.M) {
	if os.Getenv("MINIPY_CLI_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(testproc.Run(m)) // (and no test leaves a process behind)
}

// command is this CLI as a process with args.
func command(t *testing.T, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "MINIPY_CLI_MAIN=1", "HOME="+t.TempDir(), "VIRTUAL_ENV=")
	cmd.Dir = t.TempDir()
	return cmd
}

// terminal is the CLI on a pseudo-terminal.
type terminal struct {
	t    *testing.T
	cmd  *exec.Cmd
	tty  *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	seen int // expect matches after this offset
	done chan struct{}
}

func startTerminal(t *testing.T, args ...string) *terminal {
	term := &terminal{t: t, cmd: command(t, args...), done: make(chan struct{})}
	tty, err := pty.StartWithSize(term.cmd, &pty.Winsize{Rows: 40, Cols: 120})
	require.NoError(t, err)
	term.tty = tty
	go func() {
		defer close(term.done)
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			term.mu.Lock()
			term.out.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		term.cmd.Process.Kill() //nolint:errcheck // it may have exited
		term.cmd.Wait()         //nolint:errcheck
		tty.Close()
	})
	return term
}

// expect waits for s to appear after what earlier expects matched.
func (term *terminal) expect(s string) {
	term.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		term.mu.Lock()
		text := term.out.String()
		term.mu.Unlock()
		if i := strings.Index(text[term.seen:], s); i >= 0 {
			term.seen += i + len(s)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	term.mu.Lock()
	defer term.mu.Unlock()
	term.t.Fatalf("never saw %q; the terminal shows:\n%s", s, term.out.String()[term.seen:])
}

// exit ends the REPL with Ctrl-D, which must make it exit 0.
func (term *terminal) exit() {
	term.t.Helper()
	term.send("\x04")
	select {
	case <-term.done:
	case <-time.After(20 * time.Second):
		term.t.Fatal("Ctrl-D did not end the REPL")
	}
	require.NoError(term.t, term.cmd.Wait())
}

func (term *terminal) send(s string) {
	term.t.Helper()
	_, err := io.WriteString(term.tty, s)
	require.NoError(term.t, err)
}

func testREPL(t *testing.T, args ...string) {
	term := startTerminal(t, args...)
	term.expect("Ctrl-D exits")
	term.expect(">>> ")
	term.send("x = 6\r")
	term.expect(">>> ")
	// A block continues until a blank line; brackets until they close.
	term.send("def f(a):\r")
	term.expect("... ")
	term.send("    return a * 7\r")
	term.expect("... ")
	term.send("\r")
	term.expect(">>> ")
	term.send("f(x)\r")
	term.expect("42\r\n")
	term.send("[1,\r")
	term.expect("... ")
	term.send(" 2]\r")
	term.expect("[1, 2]\r\n")
	term.send("print('out'); 'val'\r")
	term.expect("out\r\n'val'\r\n")
	term.send("1/0\r")
	term.expect("ZeroDivisionError: division by zero")
	term.expect(">>> ")
	// Ctrl-C stops a running cell, not the REPL; the namespace lives on.
	// (The cell says it runs, in words its echo does not have: a Ctrl-C typed before it
	// starts is a byte readline reads, not an interrupt.)
	term.send("import time\rprint('sp' + 'in', flush=True); [time.sleep(0.01) for _ in iter(int, 1)]\r")
	term.expect("spin\r\n")
	term.send("\x03")
	term.expect("KeyboardInterrupt")
	term.expect(">>> ")
	term.send("x\r")
	term.expect("6\r\n")
	// Ctrl-C at the prompt drops the line being typed.
	term.send("y = 1\x03")
	term.expect(">>> ")
	term.send("'y' in globals()\r")
	term.expect("False\r\n")
	term.expect(">>> ") // readline reads again: a Ctrl-D before that could reach the line discipline
	term.exit()
}

func TestREPLInProcess(t *testing.T) { testREPL(t, "--backend", "inprocess") }

func TestREPLIsolated(t *testing.T) { testREPL(t, "--backend", "isolated") }

// Output reaches the terminal as the code prints it, not when the run ends.
func TestCLIStreamsOutput(t *testing.T) {
	for _, backend := range []string{"inprocess", "isolated"} {
		t.Run(backend, func(t *testing.T) {
			cmd := command(t, "--backend", backend, "-c", "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('last')\n7")
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			buf := make([]byte, 64)
			n, err := io.ReadAtLeast(out, buf, len("first\n"))
			require.NoError(t, err)
			firstAt := time.Now()
			assert.Equal(t, "first\n", string(buf[:n]))
			rest, err := io.ReadAll(out)
			require.NoError(t, err)
			require.NoError(t, cmd.Wait())
			assert.Greater(t, time.Since(firstAt), 500*time.Millisecond, "first arrived only at the end")
			assert.Equal(t, "last\n7\n", string(rest))
		})
	}
}

// minipy FILE ARGS runs the file with sys.argv and __file__ set, without a timeout.
func TestCLIRunsFile(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script.py")
	require.NoError(t, os.WriteFile(script, []byte("import sys, os\nprint(sys.argv[1:], os.path.basename(__file__))\nlen(sys.argv)"), 0o644))
	code, out, errOut := cli(t, "", "--backend", "inprocess", script, "a", "b")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "['a', 'b'] script.py\n3\n", out)

	code, _, errOut = cli(t, "", filepath.Join(dir, "missing.py"))
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "no such file")
}

func TestCLIBackendFlag(t *testing.T) {
	code, out, errOut := cli(t, "", "--backend", "isolated", "-c", "import socket; socket.gethostname()")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "'minipy'\n", out)
	code, _, errOut = cli(t, "", "--backend", "nope", "-c", "1")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "the backend must be auto, inprocess or isolated")
	code, _, errOut = cli(t, "", "--backend", "inprocess", "--network", "-c", "1")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--network only applies to --backend isolated")
}

// --save-images in the REPL: each cell's images are saved, numbered on across cells.
func TestREPLSavesImages(t *testing.T) {
	dir := t.TempDir()
	term := startTerminal(t, "--backend", "inprocess", "--save-images", dir)
	term.expect(">>> ")
	term.send(imageCode(t, 4, 3, false) + "\r")
	term.expect("[image 1: PNG 4x3, 1 KB]")
	term.expect("minipy: saved image 1 (PNG 4x3, 1 KB) to " + filepath.Join(dir, "image-1.png"))
	term.expect(">>> ")
	term.send(imageCode(t, 5, 5, true) + "\r")
	term.expect("[image 1: PNG 5x5, 1 KB]")
	term.expect("minipy: saved image 1 (PNG 5x5, 1 KB)")
	term.expect(filepath.Join(dir, "image-2.png"))
	term.expect(">>> ")
	term.exit()
	assert.FileExists(t, filepath.Join(dir, "image-1.png"))
	assert.FileExists(t, filepath.Join(dir, "image-2.png"))
}
