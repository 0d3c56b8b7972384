package worker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// Commands: processes a local worker's guardian starts in the worker's sandbox for the
// host (pyrt.ControlStart), beside the worker, under its limits; the guardian reports each
// one's end (pyrt.ControlExited) and signals one on request (pyrt.ControlSignal).

// ErrNoCommands: the worker has no guardian that starts commands (a Command worker).
var ErrNoCommands = errors.New("minipy: this worker's sandbox cannot start commands")

// ErrCommandsLost: the guardian ended (the sandbox is gone): its commands ended with it.
var ErrCommandsLost = errors.New("minipy: the sandbox ended, and its commands with it")

// maxSpec caps a command's spec: it is written whole to a pipe before it is sent.
const maxSpec = 60 << 10

// commands are a control line's commands: the starts waiting for their pid, and the
// commands running, by pid, each with the channel its wait status goes to.
type commands struct {
	mu      sync.Mutex
	token   uint64
	starts  map[uint64]chan startReply
	running map[uint32]chan syscall.WaitStatus
	asks    map[uint64]chan askReply // SandboxRoot's and ConnectPort's, by token
	gone    bool
}

type startReply struct {
	pid    uint32
	why    string
	exited chan syscall.WaitStatus // registered by the reader before it reads on: the end may follow at once
}

// report takes a guardian's message about commands; false if it is not one.
func (c *commands) report(msg []byte) bool {
	switch {
	case len(msg) >= 13 && msg[0] == pyrt.ControlStart:
		token := binary.LittleEndian.Uint64(msg[1:9])
		r := startReply{pid: binary.LittleEndian.Uint32(msg[9:13]), why: string(msg[13:])}
		c.mu.Lock()
		ch := c.starts[token]
		delete(c.starts, token)
		if r.pid != 0 {
			r.exited = make(chan syscall.WaitStatus, 1)
			c.running[r.pid] = r.exited // (a start that timed out: its end still comes, and is dropped)
		}
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
		return true
	case len(msg) == 9 && msg[0] == pyrt.ControlExited:
		pid := binary.LittleEndian.Uint32(msg[1:5])
		c.mu.Lock()
		ch := c.running[pid]
		delete(c.running, pid)
		c.mu.Unlock()
		if ch != nil {
			ch <- syscall.WaitStatus(int32(binary.LittleEndian.Uint32(msg[5:9])))
		}
		return true
	}
	return false
}

// lost ends every start and command waiting: the control socket ended.
func (c *commands) lost() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = true
	for token, ch := range c.starts {
		close(ch)
		delete(c.starts, token)
	}
	for pid, ch := range c.running {
		close(ch)
		delete(c.running, pid)
	}
	for token, ch := range c.asks {
		close(ch)
		delete(c.asks, token)
	}
}

// answered takes the guardian's answer to an ask (SandboxRoot, ConnectPort) token: the fd
// that came with it, or none and errno.
func (c *commands) answered(token uint64, errno uint32, fds []int) {
	c.mu.Lock()
	ch := c.asks[token]
	delete(c.asks, token)
	c.mu.Unlock()
	a := askReply{errno: syscall.Errno(errno)}
	for i, fd := range fds {
		if i == 0 && len(fds) == 1 && ch != nil {
			a.f = os.NewFile(uintptr(fd), "minipy-sandbox-fd")
		} else {
			syscall.Close(fd)
		}
	}
	if ch != nil {
		ch <- a
	} else if a.f != nil {
		a.f.Close()
	}
}

// askReply is the guardian's answer to an ask: an fd, or the errno why not.
type askReply struct {
	f     *os.File
	errno syscall.Errno
}

// ask sends the guardian msg (a kind, then the token ask puts in, then payload) and waits up
// to timeout for its answer's fd.
func (w *Worker) ask(kind byte, payload []byte, timeout time.Duration) (*os.File, error) {
	if w.line == nil || w.ctl == nil {
		return nil, ErrNoCommands
	}
	c := &w.line.cmds
	reply := make(chan askReply, 1)
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return nil, ErrCommandsLost
	}
	c.token++
	token := c.token
	if c.asks == nil {
		c.asks = map[uint64]chan askReply{}
	}
	c.asks[token] = reply
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.asks, token)
		c.mu.Unlock()
	}
	msg := append(binary.LittleEndian.AppendUint64([]byte{kind}, token), payload...)
	if _, err := w.ctl.Write(msg); err != nil {
		forget()
		return nil, fmt.Errorf("%w: %w", ErrCommandsLost, err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case a, ok := <-reply:
		switch {
		case !ok:
			return nil, ErrCommandsLost
		case a.f == nil && a.errno == 0:
			return nil, errors.New("minipy: the sandbox's guardian sent no fd")
		case a.f == nil:
			return nil, a.errno
		}
		return a.f, nil
	case <-timer.C:
		forget()
		select { // (an answer that came meanwhile)
		case a, ok := <-reply:
			if ok && a.f != nil {
				a.f.Close()
			}
		default:
		}
		return nil, fmt.Errorf("minipy: the sandbox's guardian did not answer in %v", timeout)
	}
}

// SandboxRoot asks w's guardian for its root directory, the sandbox's as its code sees it
// (O_PATH; the caller closes it), waiting up to timeout. ErrNoCommands for a worker that
// has no guardian the host talks to (a Command worker), ErrCommandsLost when the sandbox
// ended.
func (w *Worker) SandboxRoot(timeout time.Duration) (*os.File, error) {
	return w.ask(pyrt.ControlRoot, nil, timeout)
}

// ConnectPort asks w's guardian for a TCP socket connected to 127.0.0.1:port in the
// sandbox's network namespace (or still connecting: its first read or write says how that
// ended), waiting up to timeout; the errno (ECONNREFUSED: nothing listens there) when it
// could not; otherwise as SandboxRoot.
func (w *Worker) ConnectPort(port uint16, timeout time.Duration) (*os.File, error) {
	return w.ask(pyrt.ControlConnect, binary.LittleEndian.AppendUint16(nil, port), timeout)
}

// CommandSpec is a command to start: Args[0] looked up in the sandbox's PATH, Dir its
// working directory in the sandbox ("": the guardian's), Env added to the sandbox's.
// Terminal: its stdin, stdout and stderr are a pseudo terminal's slave end, which it takes
// as its controlling terminal in a session of its own (pyrt.StartTerminal). Root: it runs
// as the sandbox's root (a sandbox with a root user: Spec.RootUser), not its user.
type CommandSpec struct {
	Args     []string
	Dir      string
	Env      []string
	Terminal bool
	Root     bool
}

func (spec CommandSpec) encode() ([]byte, error) {
	user := ""
	if spec.Root {
		user = "root"
	}
	fields := append([]string{spec.Dir, user, strconv.Itoa(len(spec.Args))}, spec.Args...)
	fields = append(fields, spec.Env...)
	for _, f := range fields {
		if strings.ContainsRune(f, 0) {
			return nil, fmt.Errorf("minipy: a command's arguments, directory and environment may not hold NUL")
		}
	}
	b := []byte(strings.Join(fields, "\x00"))
	if len(b) > maxSpec {
		return nil, fmt.Errorf("minipy: a command of %d bytes (arguments and environment): %d at most", len(b), maxSpec)
	}
	return b, nil
}

// StartCommand has w's guardian start spec with stdin, stdout and stderr (the child's
// ends; the caller closes its copies), and returns its pid and the channel its wait
// status comes on (closed, with none, if the sandbox ends first).
func (w *Worker) StartCommand(spec CommandSpec, stdin, stdout, stderr *os.File, timeout time.Duration) (int, <-chan syscall.WaitStatus, error) {
	if w.line == nil || w.ctl == nil {
		return 0, nil, ErrNoCommands
	}
	b, err := spec.encode()
	if err != nil {
		return 0, nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer pr.Close()
	_, err = pw.Write(b) // (at most maxSpec: the pipe holds it)
	pw.Close()
	if err != nil {
		return 0, nil, err
	}
	c := &w.line.cmds
	reply := make(chan startReply, 1)
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return 0, nil, ErrCommandsLost
	}
	c.token++
	token := c.token
	if c.starts == nil {
		c.starts, c.running = map[uint64]chan startReply{}, map[uint32]chan syscall.WaitStatus{}
	}
	c.starts[token] = reply
	c.mu.Unlock()
	msg := binary.LittleEndian.AppendUint64([]byte{pyrt.ControlStart}, token)
	var flags byte
	if spec.Terminal {
		flags |= pyrt.StartTerminal
	}
	msg = append(msg, flags)
	fds := []int{int(stdin.Fd()), int(stdout.Fd()), int(stderr.Fd()), int(pr.Fd())}
	// The guardian's child joins the sandbox's work group first (it would be in the
	// guardian's, with the rollback's reserve: cgroup.TakeOverReserve).
	work, err := w.cg.workProcs()
	if err != nil {
		c.mu.Lock()
		delete(c.starts, token)
		c.mu.Unlock()
		return 0, nil, err
	}
	if work != nil {
		defer work.Close()
		fds = append(fds, int(work.Fd()))
	}
	rights := syscall.UnixRights(fds...)
	if _, _, err := w.ctl.WriteMsgUnix(msg, rights, nil); err != nil {
		c.mu.Lock()
		delete(c.starts, token)
		c.mu.Unlock()
		return 0, nil, fmt.Errorf("%w: %w", ErrCommandsLost, err)
	}
	return c.await(token, reply, timeout)
}

// await waits for the guardian's answer to start token.
func (c *commands) await(token uint64, reply chan startReply, timeout time.Duration) (int, <-chan syscall.WaitStatus, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r, ok := <-reply:
		if !ok {
			return 0, nil, ErrCommandsLost
		}
		if r.pid == 0 {
			return 0, nil, fmt.Errorf("minipy: the command did not start: %s", r.why)
		}
		return int(r.pid), r.exited, nil
	case <-timer.C:
		c.mu.Lock()
		delete(c.starts, token)
		c.mu.Unlock()
		return 0, nil, fmt.Errorf("minipy: the guardian did not answer a command's start in %v", timeout)
	}
}

// SignalCommand has w's guardian send sig to the process group of its command pid.
func (w *Worker) SignalCommand(pid int, sig syscall.Signal) error {
	if w.line == nil || w.ctl == nil {
		return ErrNoCommands
	}
	msg := binary.LittleEndian.AppendUint32([]byte{pyrt.ControlSignal}, uint32(pid))
	if _, err := w.ctl.Write(append(msg, byte(sig))); err != nil {
		return fmt.Errorf("%w: %w", ErrCommandsLost, err)
	}
	return nil
}
