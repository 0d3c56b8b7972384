package minipy

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/minipy-go/minipy/internal/worker"
)

// A command's terminal (Command.Terminal) is a pseudo terminal of the host's: the host
// opens its master end and hands the slave end to the sandbox's guardian as the command's
// stdin, stdout and stderr. The sandbox gets one terminal's slave and nothing to make
// more with; the host keeps the master (the Process's Stdin and Stdout).
//
// The host's pseudo terminals are a pool the whole machine shares (kernel.pty.max, 4,096
// by default, of which the host's own logins get what the sandboxes leave): an engine
// holds at most engineTerminals open at once, so that its sandboxes cannot take the host's
// ssh logins away.
const engineTerminals = 256

// ErrTooManyTerminals is matched by Namespace.Start's error for a command on a terminal
// when the engine holds engineTerminals (256) open already: close a terminal command's
// Stdout once done with it.
var ErrTooManyTerminals = errors.New("minipy: the engine has 256 terminals open, its most")

// startTerminal starts spec on w's guardian on a new pseudo terminal of size.
func (e *Isolated) startTerminal(w *worker.Worker, spec worker.CommandSpec, size TerminalSize, timeout time.Duration) (*Process, error) {
	if e.terminals.Add(1) > engineTerminals {
		e.terminals.Add(-1)
		return nil, ErrTooManyTerminals
	}
	opened := false
	defer func() {
		if !opened {
			e.terminals.Add(-1)
		}
	}()
	master, slave, err := openTerminal()
	if err != nil {
		return nil, err
	}
	if err := setTerminalSize(master, size); err != nil {
		master.Close()
		slave.Close()
		return nil, err
	}
	pid, exited, err := w.StartCommand(spec, slave, slave, slave, timeout)
	slave.Close() // (the command's now: the master reads EIO once every copy of it is closed)
	if err != nil {
		master.Close()
		return nil, err
	}
	opened = true
	out := &terminalOut{f: master, count: &e.terminals}
	return &Process{Pid: pid, Stdin: terminalIn{master}, Stdout: out, Stderr: io.NopCloser(eofReader{}),
		w: w, tty: master, exited: exited}, nil
}

// openTerminal opens a new pseudo terminal's master (non-blocking: Go's poller serves it)
// and slave ends, neither of them the host's controlling terminal.
func openTerminal() (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("minipy: opening a pseudo terminal: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0) // (unlockpt)
	}
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("minipy: opening a pseudo terminal: %w", err)
	}
	name := "/dev/pts/" + strconv.Itoa(n)
	sfd, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("minipy: opening a pseudo terminal's %s: %w", name, err)
	}
	return master, os.NewFile(uintptr(sfd), name), nil
}

func setTerminalSize(master *os.File, size TerminalSize) error {
	if size.Rows == 0 || size.Cols == 0 {
		return fmt.Errorf("minipy: a terminal of %d rows and %d columns: both must be at least 1", size.Rows, size.Cols)
	}
	raw, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := raw.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols})
	}); err != nil {
		return err
	}
	if ioErr != nil {
		return fmt.Errorf("minipy: resizing the terminal: %w", ioErr)
	}
	return nil
}

// terminalOut reads what the terminal shows. The master reads EIO once the terminal's
// last slave is closed (the command and what it started have ended) and what they wrote
// is read: that is its end of file.
type terminalOut struct {
	f     *os.File
	count *atomic.Int64 // the engine's terminals open
	once  sync.Once
}

func (t *terminalOut) Read(p []byte) (int, error) {
	n, err := t.f.Read(p)
	if errors.Is(err, syscall.EIO) {
		return n, io.EOF
	}
	return n, err
}

// Close closes the terminal (both directions: Stdin's writes fail after it), and gives
// its place under engineTerminals back.
func (t *terminalOut) Close() error {
	err := t.f.Close()
	t.once.Do(func() { t.count.Add(-1) })
	return err
}

// terminalIn types into the terminal. Its Close sends the terminal's end-of-file character
// (^D, at the start of a line) rather than closing the master, which would hang the
// terminal up and end the command with SIGHUP.
type terminalIn struct{ f *os.File }

func (t terminalIn) Write(p []byte) (int, error) { return t.f.Write(p) }

func (t terminalIn) Close() error {
	_, err := t.f.Write([]byte{4})
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
