package minipy

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/worker"
)

// ErrNoCommands is matched by Namespace.Start's error for a namespace whose sandbox does not
// start commands: in-process namespaces, packed workers (IsolatedConfig.Workers, whose
// sandbox other namespaces share) and Command workers.
var ErrNoCommands = errors.New("minipy: this namespace's sandbox does not start commands")

// ErrCommandLost is matched by Process.Wait's error when the namespace's sandbox ended
// before the process did (the namespace closed, its worker lost), and took the process
// with it.
var ErrCommandLost = worker.ErrCommandsLost

// Command is a process for Namespace.Start to run beside the namespace's code.
type Command struct {
	// Args are the program and its arguments: Args[0] is looked up in the sandbox's PATH
	// unless it holds a slash ("/bin/bash", "-c", "ls -l").
	Args []string
	// Dir is its working directory: relative to the namespace's working directory ("" is
	// the working directory), or an absolute path as the sandbox sees it.
	Dir string
	// Env is added to the sandbox's environment (IsolatedConfig.Env and its own: PATH,
	// HOME...), KEY=VALUE each.
	Env []string
	// Terminal, if set, runs the command on a pseudo terminal of that size instead of
	// pipes (an interactive shell, a program that asks isatty): its stdin, stdout and
	// stderr are the terminal, its controlling terminal, in a session of its own. The
	// Process's Stdin then types into the terminal, its Stdout reads what the terminal
	// shows (stdout and stderr together, as a terminal does), its Stderr is empty, and
	// Resize changes its size. The terminal's other end is the host's: the sandbox makes
	// no terminal of its own (it has no /dev/ptmx), and a terminal's rarely needed, riskier
	// ioctls (line disciplines, faked input) are refused to it (docs/isolated.md).
	Terminal *TerminalSize
	// User is who runs it: "" or "user", the sandbox's user; "root", its root, in a sandbox
	// with a root user (IsolatedConfig.RootUser; ErrNoRootUser otherwise), whose HOME is
	// /root.
	User string
}

// TerminalSize is a terminal's size in characters.
type TerminalSize struct {
	Rows, Cols uint16
}

// ErrNoTerminal is matched by Process.Resize's error for a process that runs on pipes,
// not a terminal (Command.Terminal).
var ErrNoTerminal = errors.New("minipy: the process has no terminal (Command.Terminal)")

// Process is a command that Namespace.Start started. Read Stdout and Stderr to their ends
// (both: a full pipe stops the process), then Wait. Its methods are safe from any
// goroutine.
type Process struct {
	// Pid is its process id in the sandbox's pid namespace.
	Pid int
	// Stdin is what the process reads: close it to give it an end of file.
	Stdin io.WriteCloser
	// Stdout and Stderr are what it writes.
	Stdout, Stderr io.ReadCloser

	w      *worker.Worker
	tty    *os.File // the terminal's master end (Command.Terminal), else nil
	exited <-chan syscall.WaitStatus
	once   sync.Once
	status syscall.WaitStatus
	err    error
}

// Wait waits for the process to end and returns its wait status (ExitStatus, Signaled...),
// or an error matching ErrCommandLost when the sandbox ended first.
func (p *Process) Wait() (syscall.WaitStatus, error) {
	p.once.Do(func() {
		st, ok := <-p.exited
		if !ok {
			p.status, p.err = syscall.WaitStatus(0), ErrCommandLost
			return
		}
		p.status = st
	})
	return p.status, p.err
}

// Signal sends sig to the process and the processes it started (its process group).
func (p *Process) Signal(sig syscall.Signal) error { return p.w.SignalCommand(p.Pid, sig) }

// Resize sets the size of the process's terminal (its foreground programs get SIGWINCH);
// ErrNoTerminal for a process on pipes.
func (p *Process) Resize(size TerminalSize) error {
	if p.tty == nil {
		return ErrNoTerminal
	}
	return setTerminalSize(p.tty, size)
}

// Start starts cmd in the namespace's sandbox, beside its code: a process in the same
// sandbox (its files, its network and egress policy, its cgroup), under the worker's limits
// (IsolatedConfig's MemoryLimit, FileSizeLimit, OpenFiles, Processes; CPULimit for its
// whole life), started by the sandbox's guardian, not by the code, so a run in progress
// does not hold it back and a rollback does not end it. The namespace's Close, or the loss
// of its sandbox, kills it. Only an isolated namespace with a worker of its own (Workers 0)
// and a local worker starts commands; others give ErrNoCommands.
func (ns *Namespace) Start(cmd Command) (*Process, error) {
	if len(cmd.Args) == 0 {
		return nil, errors.New("minipy: Start needs a command (Command.Args)")
	}
	e, err := ns.isolated(ErrNoCommands, "use os/exec")
	if err != nil {
		return nil, err
	}
	return e.start(ns, cmd)
}

// isolated is the isolated engine of a usable namespace, for a method that only it serves;
// otherwise the namespace's error, or refused wrapped with what to do instead (hint).
func (ns *Namespace) isolated(refused error, hint string) (*Isolated, error) {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return nil, err
	}
	e, ok := ns.engine.(*Isolated)
	if !ok {
		return nil, fmt.Errorf("%w: %s runs code in the host process (%s)", refused, ns.engine.name(), hint)
	}
	return e, nil
}

func (e *Isolated) start(ns *Namespace, cmd Command) (*Process, error) {
	b := bindingOf(ns)
	if b == nil || !b.slot.own || len(e.cfg.Command) > 0 {
		return nil, fmt.Errorf("%w: its worker is shared (Workers) or runs elsewhere (Command)", ErrNoCommands)
	}
	w, err := b.slot.current()
	if err != nil {
		return nil, err
	}
	spec := worker.CommandSpec{Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Terminal: cmd.Terminal != nil,
		Root: cmd.User == "root"}
	switch {
	case cmd.User != "" && cmd.User != "user" && cmd.User != "root":
		return nil, fmt.Errorf("minipy: Command.User %q: a sandbox has \"user\" and (IsolatedConfig.RootUser) \"root\"", cmd.User)
	case spec.Root && !e.cfg.RootUser:
		return nil, fmt.Errorf("%w: a command as root needs IsolatedConfig.RootUser", ErrNoRootUser)
	}
	if !path.IsAbs(cmd.Dir) {
		base := e.cfg.WorkDirPath // what the sandbox sees
		if !e.sandbox {
			base = e.workDir(ns)
		}
		spec.Dir = path.Join(base, cmd.Dir)
	}
	timeout := max(e.cfg.StartTimeout, commandStartTimeout)
	if cmd.Terminal != nil {
		return e.startTerminal(w, spec, *cmd.Terminal, timeout)
	}
	return startProcess(w, spec, timeout)
}

// commandStartTimeout bounds the guardian's answer to a command's start (a fork).
const commandStartTimeout = 30 * time.Second

// current is the slot's live worker, without waiting for a run in progress (whose worker
// it is): commands start beside runs.
func (s *workerSlot) current() (*worker.Worker, error) {
	s.mu.Lock()
	w, closed := s.cur, s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrEngineClosed
	}
	if w != nil && !w.Gone() && !w.Ended() {
		return w, nil
	}
	w, err := s.hold()
	if err != nil {
		return nil, err
	}
	s.token.release()
	return w, nil
}

// startProcess starts spec on w's guardian with three pipes.
func startProcess(w *worker.Worker, spec worker.CommandSpec, timeout time.Duration) (*Process, error) {
	var ends [6]*os.File // the child's stdin, our stdin; our stdout, the child's; our stderr, the child's
	for i := 0; i < 6; i += 2 {
		r, wr, err := os.Pipe()
		if err != nil {
			closeFiles(ends[:i])
			return nil, err
		}
		ends[i], ends[i+1] = r, wr
	}
	pid, exited, err := w.StartCommand(spec, ends[0], ends[3], ends[5], timeout)
	closeFiles([]*os.File{ends[0], ends[3], ends[5]})
	if err != nil {
		closeFiles([]*os.File{ends[1], ends[2], ends[4]})
		return nil, err
	}
	return &Process{Pid: pid, Stdin: ends[1], Stdout: ends[2], Stderr: ends[4], w: w, exited: exited}, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}
