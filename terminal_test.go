package minipy_test

import (
	"bufio"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// expect reads the terminal's output until it holds want (a terminal echoes what is
// typed, so a marker is made of two halves the shell puts together), and returns it.
func expect(t *testing.T, out *bufio.Reader, want string) string {
	t.Helper()
	var seen strings.Builder
	for !strings.Contains(seen.String(), want) {
		b, err := out.ReadByte()
		require.NoError(t, err, "waiting for %q in %q", want, seen.String())
		seen.WriteByte(b)
	}
	return seen.String()
}

// A command on a terminal (Command.Terminal): its stdin, stdout and stderr are a pseudo
// terminal of the given size, its controlling terminal, in a session of its own; what is
// typed is echoed and read; Resize reaches it (stty size, SIGWINCH); a shell that exits
// ends the output. The sandbox makes no terminal of its own, and the terminal ioctls
// that reach risky kernel code or fake input are refused.
func TestCommandTerminal(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	p, err := ns.Start(minipy.Command{Args: []string{"/bin/sh"}, Env: []string{"PS1=$ "},
		Terminal: &minipy.TerminalSize{Rows: 24, Cols: 80}})
	require.NoError(t, err)
	out := bufio.NewReader(p.Stdout)
	_, err = io.WriteString(p.Stdin, "stty size; echo MA''RK1\n")
	require.NoError(t, err)
	assert.Contains(t, expect(t, out, "MARK1"), "24 80", "the size it was made with")

	require.NoError(t, p.Resize(minipy.TerminalSize{Rows: 30, Cols: 100}))
	_, err = io.WriteString(p.Stdin, "stty size; echo MA''RK2\n")
	require.NoError(t, err)
	assert.Contains(t, expect(t, out, "MARK2"), "30 100", "resized")

	probe := `import ctypes, errno, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
def ioctl(req, arg):
    r = libc.syscall(16 if os.uname().machine == "x86_64" else 29, 0, ctypes.c_ulong(req), arg)
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
c = ctypes.c_char(b"x")
n = ctypes.c_int(2)
print("tty", os.isatty(0), os.getsid(0) == os.getpid() or os.getsid(0) == os.getppid(), os.tcgetpgrp(0) > 0)
print("sti", ioctl(termios.TIOCSTI, ctypes.byref(c)), ioctl(termios.TIOCSTI | (1 << 32), ctypes.byref(c)))
print("setd", ioctl(termios.TIOCSETD, ctypes.byref(n)))
print("ptmx", os.path.exists("/dev/ptmx"), os.path.exists("/dev/pts"))
print("ENDPROBE".lower())`
	_, err = io.WriteString(p.Stdin, "python3 -c '"+probe+"'\n")
	require.NoError(t, err)
	got := expect(t, out, "endprobe")
	assert.Contains(t, got, "tty True True True", "its controlling terminal, in a session of its own")
	assert.Contains(t, got, "sti EPERM EPERM", "no faked input, whatever the request's high bits")
	assert.Contains(t, got, "setd EPERM", "no other line discipline")
	assert.Contains(t, got, "ptmx False False", "no terminal of the sandbox's making")

	_, err = io.WriteString(p.Stdin, "exit 7\n")
	require.NoError(t, err)
	rest, err := io.ReadAll(out)
	require.NoError(t, err, "the output ends when the shell does: %q", rest)
	st, err := p.Wait()
	require.NoError(t, err)
	assert.Equal(t, 7, st.ExitStatus())
	require.NoError(t, p.Stdout.Close())

	// A pipe's process has no terminal to resize; a terminal must have a size.
	cat, err := ns.Start(minipy.Command{Args: []string{"cat"}})
	require.NoError(t, err)
	assert.ErrorIs(t, cat.Resize(minipy.TerminalSize{Rows: 1, Cols: 1}), minipy.ErrNoTerminal)
	require.NoError(t, cat.Stdin.Close())
	output(t, cat)
	_, err = ns.Start(minipy.Command{Args: []string{"true"}, Terminal: &minipy.TerminalSize{}})
	assert.Error(t, err)

	// A signal reaches the terminal's session (its group); Stdin's Close is the terminal's ^D.
	sleeper, err := ns.Start(minipy.Command{Args: []string{"sh", "-c", "sleep 60 & sleep 60"},
		Terminal: &minipy.TerminalSize{Rows: 24, Cols: 80}})
	require.NoError(t, err)
	require.NoError(t, sleeper.Signal(syscall.SIGTERM))
	st, err = sleeper.Wait()
	require.NoError(t, err)
	assert.True(t, st.Signaled(), "%v", st)
	catTTY, err := ns.Start(minipy.Command{Args: []string{"cat"}, Terminal: &minipy.TerminalSize{Rows: 24, Cols: 80}})
	require.NoError(t, err)
	require.NoError(t, catTTY.Stdin.Close())
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, catTTY.Stdout) //nolint:errcheck // (to its end)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("cat did not end at the terminal's end of file")
	}
	st, err = catTTY.Wait()
	require.NoError(t, err)
	assert.Equal(t, 0, st.ExitStatus())
}
