package minipy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/cpython"
	"github.com/minipy-go/minipy/internal/pyrt"
)

// workerBootstrap is the program a worker's python runs (python -c): it reads worker.py as
// one frame (u32 length, source) from stdin with unbuffered reads, so that no byte of the
// protocol after it is lost in a buffer, and runs it.
const workerBootstrap = `import os
def _read(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            os._exit(70)
        b += c
    return b
exec(compile(_read(int.from_bytes(_read(4), "little")), ` + "\"" + pyrt.RuntimeFile + "\"" + `, "exec"), {"__name__": "_minipy_worker", "_read": _read})
`

// stderrKeep is how much of a worker's own stderr is kept for crash errors.
const stderrKeep = 8 << 10

// workerReply is a worker's answer to one request.
type workerReply struct {
	id     uint64
	kicked bool
	resp   []byte
}

// worker is one worker process.
type worker struct {
	epoch  uint64 // the slot's generation this worker serves
	cmd    *exec.Cmd
	stdin  *os.File
	pidns  bool // the worker is pid 1 of its own pid namespace: killing it kills its tree
	wmu    sync.Mutex
	exited chan struct{} // closed when the process has been waited for
	stderr tailBuffer

	// The worker's stdout is read by the goroutine holding the slot's token, in the
	// goroutine that waits for the answer: a hop through a reader goroutine and a channel
	// cost about a third of a warm round trip.
	out   *os.File
	rbuf  []byte
	woken atomic.Bool // wake was called: the current wait must return

	// Set from the frames read (b"X": the real worker's wait status, from its init).
	exitFrame  bool
	exitStatus syscall.WaitStatus
	// Set before exited is closed.
	state *os.ProcessState

	killOnce sync.Once

	// Guarded by the slot's token.
	known  map[uint32]bool
	runSeq uint64

	// Local workers: ctl is the control socket to the guardian (fd 3 there, for the first
	// worker of a guardian); line is what the workers of one ctl share (a rollback's worker
	// replaces the one that ended on the same line); snapKnown is known as of the last
	// answered request, when the worker forked the snapshot that a rollback would wake;
	// died is the guardian's report of the worker's end.
	ctl        *net.UnixConn
	line       *workerLine
	snapKnown  map[uint32]bool
	stderrDone chan struct{} // closed when the worker's stderr pipe has ended
	died       chan death
	deathNote  atomic.Pointer[death]
}

// death is the guardian's report (b"D") that the worker process ended.
type death struct {
	status   syscall.WaitStatus
	snapshot bool // a snapshot of it waits to take over
}

// A Command worker's host sends it a beat (pyrt.FrameBeat) every commandBeat; the worker
// ends when, idle, it has heard nothing for commandSilence (worker.py's hear_host), so a
// transport that keeps its stdin open after the host is gone (a relay, a half-open
// connection) does not keep it alive for good. An engine copies them (Isolated.beats),
// which its tests may shorten.
const (
	commandBeat    = 10 * time.Second
	commandSilence = 60 * time.Second
)

// beats is a Command worker's beat interval and the silence that ends it.
type beats struct{ every, silence time.Duration }

// testBeats, when set, replaces an engine's beats as it is made (isolated_export_test.go).
var testBeats *beats

// beatFrame is the frame of a beat.
var beatFrame = append(binary.LittleEndian.AppendUint32(nil, 1), pyrt.FrameBeat)

// beat sends the Command worker w a beat every interval until it exits.
func (w *worker) beat(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.exited:
			return
		case <-t.C:
			if w.send(beatFrame) != nil {
				return
			}
		}
	}
}

// startWorker starts a worker for e with dirs and waits until it is ready: forked from e's
// template when it has one, else a process of its own.
func startWorker(e *Isolated, dirs workDirs, epoch uint64) (*worker, error) {
	if dirs.err != nil {
		return nil, dirs.err
	}
	if t := e.liveTemplate(); t != nil {
		err := e.moveMounts(dirs.tree, t)
		var w *worker
		if err == nil {
			w, err = spawnWorker(e, t, dirs, epoch)
		}
		if err == nil {
			w, err = awaitReady(e, w)
		}
		if err == nil || e.isClosed() || e.capped() && !t.gone() {
			// (A live template holds the working directories' tmpfs: a worker started
			// otherwise would not see them.)
			return w, err
		}
		// The template could not fork it (or is gone): a plain start, as without one.
	}
	if err := e.moveMounts(dirs.tree, nil); err != nil {
		return nil, err
	}
	w, err := launchWorker(e, dirs, epoch)
	if err != nil {
		return nil, err
	}
	return awaitReady(e, w)
}

// awaitReady waits for the ready frame of a worker that is starting.
func awaitReady(e *Isolated, w *worker) (*worker, error) {
	until := time.Now().Add(e.cfg.StartTimeout)
	for {
		body, err := w.readFrame(until)
		if err != nil {
			break
		}
		if body[0] == pyrt.FrameReady {
			if err := checkWorkerVersion(body[1:]); err != nil {
				w.kill()
				w.awaitExit()
				return nil, err
			}
			e.keepCompiledRuntime(body[1:])
			return w, nil
		}
	}
	w.kill()
	w.awaitExit()
	msg := strings.TrimSpace(w.stderr.String())
	if msg == "" {
		msg = "no output"
	}
	how := "forked from the template"
	select {
	case <-w.exited:
		if w.state != nil && !w.exitFrame && w.pidns {
			switch w.state.ExitCode() {
			case sandboxRefusedExit:
				return nil, fmt.Errorf("%w: %s", ErrNoSandbox, msg)
			case sandboxAccessExit:
				// The worker could not open a path to bind (its stderr names it): the host's
				// permissions, not the kernel, are in the way.
				return nil, fmt.Errorf("%w (%w): %s", ErrSandboxAccess, fs.ErrPermission, msg)
			}
		}
		if w.state != nil {
			msg = fmt.Sprintf("%v (worker status %v, exit frame %v): %s", w.state, w.exitStatus.ExitStatus(), w.exitFrame, msg)
		}
	default:
		msg = "no ready frame within " + e.cfg.StartTimeout.String() + ": " + msg
	}
	if w.cmd != nil {
		how = strings.Join(w.cmd.Args[:len(w.cmd.Args)-2], " ")
	}
	return nil, fmt.Errorf("minipy: starting a worker (%s) failed: %s", how, msg)
}

// launchWorker starts a worker process with dirs (or, when dirs.tree is nil, e's template
// process).
func launchWorker(e *Isolated, dirs workDirs, epoch uint64) (*worker, error) {
	cmd, err := workerCommand(e, dirs)
	if err != nil {
		return nil, err
	}
	local := len(e.cfg.Command) == 0
	p, err := newWorkerPipes()
	if err != nil {
		return nil, err
	}
	inR, inW, outR, outW, errR, errW := p[0], p[1], p[2], p[3], p[4], p[5]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	var ctl *net.UnixConn
	var ctlChild *os.File
	if local {
		if ctl, ctlChild, err = controlSocket(); err != nil {
			closeFiles(p[:]...)
			return nil, err
		}
		cmd.ExtraFiles = []*os.File{ctlChild} // fd 3
	}
	err = cmd.Start()
	closeFiles(inR, outW, errW)
	if ctlChild != nil {
		ctlChild.Close()
	}
	if err != nil {
		if ctl != nil {
			ctl.Close()
		}
		closeFiles(inW, outR, errR)
		return nil, startError(e, cmd.Path, err)
	}
	w := &worker{
		epoch:  epoch,
		cmd:    cmd,
		stdin:  inW,
		pidns:  local && e.sandbox,
		exited: make(chan struct{}),
		out:    outR,
		known:  map[uint32]bool{pyrt.DefaultNamespace: true},
		ctl:    ctl,
	}
	if ctl != nil && dirs.tree != nil {
		// (The template's control socket carries no reports: it answers mounts, askMount.)
		w.line = newLine()
	}
	w.keepStderr(errR)
	go func() {
		cmd.Wait() //nolint:errcheck // the status is read from ProcessState
		w.state = cmd.ProcessState
		close(w.exited)
	}()
	if w.line != nil {
		w.line.watch(w)
	}
	if !local {
		go w.beat(e.beats.every)
	}
	cfgFrame, err := workerConfigFrame(e, dirs)
	if err != nil {
		w.kill()
		return nil, err
	}
	// The bootstrap and config may exceed the pipe's buffer: write them while the caller
	// waits for the worker's ready frame (or its death, or the start timeout).
	go func() {
		boot := binary.LittleEndian.AppendUint32(nil, uint32(len(pyrt.WorkerSource)))
		boot = append(boot, pyrt.WorkerSource...)
		w.send(append(boot, cfgFrame...)) //nolint:errcheck // a worker that dies is noticed by the starter
	}()
	return w, nil
}

// workerCommand is the command of a worker with dirs (the template: no tree): e's python
// (or Command) running the bootstrap, in its directory, with its environment and, local and
// sandboxed, the namespaces of sandboxAttr.
func workerCommand(e *Isolated, dirs workDirs) (*exec.Cmd, error) {
	args := append([]string(nil), e.cfg.Command...)
	if len(args) == 0 {
		args = []string{e.cfg.Python}
		if e.sandbox {
			// No site before the sandbox exists: worker.py's _site_dirs says why, and runs it
			// inside.
			args = append(args, "-S")
		}
	}
	if e.cfg.CommandShell {
		args = append(args, "-c", shellQuote(workerBootstrap))
	} else {
		args = append(args, "-c", workerBootstrap)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return nil, fmt.Errorf("minipy: the worker executable: %w", err)
	}
	cmd := &exec.Cmd{Path: path, Args: args, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if len(e.cfg.Command) > 0 {
		return cmd, nil // (its environment is the command's)
	}
	cmd.Dir = dirs.homePath()
	if e.sandbox { // the template too
		// Python imports from its working directory ("" on sys.path with -c) as it
		// starts, before the sandbox is built, with the access it starts with (root's on
		// a root host): never from the namespace's directory, where earlier code may have
		// left a signal.py. The trees' directory is the host's, and nobody else may write
		// there; the worker moves to its working directory (/work) in its sandbox.
		cmd.Dir = e.trees
	}
	cmd.Env = e.workerEnv(cmd.Dir)
	if e.sandbox {
		// Python imports from PYTHONPATH as it starts, before the sandbox exists and with
		// the access it starts with: the worker puts it on sys.path in its sandbox
		// instead (the config's pythonpath), where it may be a directory the code can
		// write to.
		cmd.Env = slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "PYTHONPATH=") })
		cmd.SysProcAttr = sandboxAttr(e.cfg.Network)
	}
	return cmd, nil
}

// startError says why a worker's process did not start.
func startError(e *Isolated, path string, err error) error {
	if len(e.cfg.Command) == 0 && e.sandbox && errors.Is(err, syscall.EACCES) {
		// The exec was refused (EPERM could be the clone's: the kernel's refusal).
		who := "the host's user"
		if os.Geteuid() == 0 {
			who = "root in a user namespace of their own, which passes root's private directories but not " +
				"another user's"
		}
		return fmt.Errorf("%w: the python %s: %w (sandboxed workers start it as %s)", ErrSandboxAccess, path, err, who)
	}
	return fmt.Errorf("minipy: starting a worker: %w", err)
}

// closeFiles closes fs.
func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// workerConfigFrame is what a worker with dirs (the template: no tree) reads after
// worker.py: a frame of "key=value" lines (the limits, the kick signal, the working
// directories), then a frame with the runtime.
func workerConfigFrame(e *Isolated, dirs workDirs) ([]byte, error) {
	var b strings.Builder
	template := dirs.tree == nil
	workdir, tree := dirs.homePath(), ""
	if !template {
		tree = dirs.tree.path
	}
	if e.sandbox {
		network := 0
		if e.cfg.Network {
			network = 1
		}
		fmt.Fprintf(&b, "root=%s\nsandbox_id=%d\nsandbox_refused=%d\nsandbox_access=%d\ntmp_size=%d\nnetwork=%d\n",
			e.rootdir, sandboxID, sandboxRefusedExit, sandboxAccessExit, e.cfg.TmpSize, network)
		if template {
			fmt.Fprintf(&b, "host_tree=%s\n", e.trees) // every tree: a fork binds its own (spawnWorker)
		} else {
			fmt.Fprintf(&b, "host_workdir=%s\nhost_tree=%s\n", workdir, tree)
		}
		workdir, tree = sandboxWorkdir, sandboxTree
		for _, kv := range e.cfg.Env {
			if pp, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
				fmt.Fprintf(&b, "pythonpath=%s\n", pp) // (the last one is what Python would read)
			}
		}
		for _, m := range e.cfg.Mounts {
			mode := "ro"
			if m.Writable {
				mode = "rw"
			}
			fmt.Fprintf(&b, "mount=%s %s\t%s\n", mode, m.Source, m.Target)
		}
	}
	if len(e.cfg.Command) > 0 {
		for _, kv := range e.cfg.Env {
			fmt.Fprintf(&b, "env=%s\n", kv)
		}
		fmt.Fprintf(&b, "silence_ms=%d\n", e.beats.silence.Milliseconds())
	}
	fmt.Fprintf(&b, "kick_signal=%d\nworkdir=%s\nmemory=%d\nfile_size=%d\nopen_files=%d\nprocesses=%d\ncpu_seconds=%d\n",
		int(e.cfg.KickSignal), workdir, e.cfg.MemoryLimit, e.cfg.FileSizeLimit, e.cfg.OpenFiles, e.cfg.Processes,
		int64((e.cfg.CPULimit+time.Second-1)/time.Second))
	if tree != "" {
		fmt.Fprintf(&b, "tree=%s\n", tree)
	}
	if !e.perNS {
		b.WriteString("packed=1\n")
	}
	if len(e.cfg.Command) == 0 {
		b.WriteString("control=1\n")
		if !e.cfg.NoRollback {
			b.WriteString("rollback=1\n")
		}
	}
	if len(e.cfg.Preload) > 0 {
		fmt.Fprintf(&b, "preload=%s\n", strings.Join(e.cfg.Preload, ","))
	}
	if template {
		b.WriteString("template=1\n")
	}
	var tag string
	var code []byte
	if c, ok := compiledRuntimes.Load(e.runtimeKey()); ok {
		tag, code = c.(compiledRuntime).tag, c.(compiledRuntime).code
	}
	if tag != "" && !strings.ContainsAny(tag, "\n\r") {
		fmt.Fprintf(&b, "code_tag=%s\n", tag)
	}
	f := binary.LittleEndian.AppendUint32(nil, uint32(b.Len()))
	f = append(f, b.String()...)
	f = binary.LittleEndian.AppendUint32(f, uint32(len(pyrt.Source)))
	f = append(f, pyrt.Source...)
	f = binary.LittleEndian.AppendUint32(f, uint32(len(code)))
	return append(f, code...), nil
}

// checkWorkerVersion checks the version in a worker's ready frame ([version, executable,
// pid, ...]) against the oldest Python minipy supports.
func checkWorkerVersion(ready []byte) error {
	d := decoder{buf: ready}
	v, err := d.value()
	items, _ := v.([]any)
	if err != nil || len(items) < 2 {
		return fmt.Errorf("minipy: a worker's ready frame is malformed: %w", errNotProtocol)
	}
	version, _ := items[0].(string)
	exe, _ := items[1].(string)
	var major, minor int
	fmt.Sscanf(version, "%d.%d", &major, &minor) //nolint:errcheck // zeros fail the check below
	if major < minPythonMajor || major == minPythonMajor && minor < minPythonMinor {
		return fmt.Errorf("%w: %s is Python %s; minipy needs %d.%d or later", ErrPythonVersion, exe, version,
			minPythonMajor, minPythonMinor)
	}
	return nil
}

// compiledRuntimes holds, per worker command, the runtime as the first worker of that
// command compiled it (marshal, made before it ran any code), which later workers of the
// command, in any engine of this process, load instead of compiling it again (~5 ms of a
// start); the worker checks the interpreter's tag before using it.
var compiledRuntimes sync.Map // runtimeKey -> compiledRuntime

type compiledRuntime struct {
	tag  string
	code []byte
}

func (e *Isolated) runtimeKey() string {
	return strings.Join(append([]string{e.cfg.Python}, e.cfg.Command...), "\x00")
}

// keepCompiledRuntime keeps the compiled runtime a worker offers in its ready frame
// ([version, executable, pid, tag, marshal]) for later workers of its command.
func (e *Isolated) keepCompiledRuntime(ready []byte) {
	d := decoder{buf: ready}
	v, err := d.value()
	items, _ := v.([]any)
	if err != nil || len(items) != 5 {
		return
	}
	tag, _ := items[3].(string)
	code, _ := items[4].([]byte)
	if tag != "" && len(code) > 0 {
		compiledRuntimes.LoadOrStore(e.runtimeKey(), compiledRuntime{tag: tag, code: code})
	}
}

// errNotProtocol is what readFrame returns when the worker's stdout is not our protocol.
var errNotProtocol = errors.New("minipy: the worker broke the protocol")

// readFrame returns the next frame from the worker (kind byte, payload), waiting until
// deadline at most (zero: no limit; os.ErrDeadlineExceeded when it passes or wake is
// called). Any other error means the worker is gone. A frame cut by a deadline stays in the
// buffer for the next call. Only the token holder calls it.
func (w *worker) readFrame(deadline time.Time) ([]byte, error) {
	for {
		if len(w.rbuf) >= 4 {
			n := int(binary.LittleEndian.Uint32(w.rbuf))
			if n == 0 || n > 1<<30 {
				return nil, errNotProtocol
			}
			if len(w.rbuf) >= 4+n {
				body := append([]byte(nil), w.rbuf[4:4+n]...)
				w.rbuf = w.rbuf[:copy(w.rbuf, w.rbuf[4+n:])]
				if body[0] == pyrt.FrameExit && len(body) == 5 {
					w.exitFrame = true
					w.exitStatus = syscall.WaitStatus(int32(binary.LittleEndian.Uint32(body[1:])))
					continue
				}
				return body, nil
			}
		}
		if cap(w.rbuf)-len(w.rbuf) < 4096 {
			// Grow as bytes arrive, not by the length a frame claims: code in the worker
			// can reach the protocol descriptor and claim anything.
			w.rbuf = append(make([]byte, 0, 2*cap(w.rbuf)+64<<10), w.rbuf...)
		}
		if err := w.out.SetReadDeadline(deadline); err != nil {
			return nil, err
		}
		if w.woken.Swap(false) {
			return nil, os.ErrDeadlineExceeded
		}
		m, err := w.out.Read(w.rbuf[len(w.rbuf):cap(w.rbuf)])
		w.rbuf = w.rbuf[:len(w.rbuf)+m]
		if err != nil && m == 0 {
			return nil, err
		}
	}
}

// wake makes a pending readFrame return os.ErrDeadlineExceeded. Safe from any goroutine.
func (w *worker) wake() {
	w.woken.Store(true)
	w.out.SetReadDeadline(time.Now()) //nolint:errcheck // a closed pipe needs no waking
}

// send writes one frame to the worker.
func (w *worker) send(frame []byte) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	_, err := w.stdin.Write(frame)
	return err
}

func (w *worker) nextRun() uint64 {
	w.runSeq++
	return w.runSeq
}

// prepare returns the namespaces (of ids) this worker must create before the request, or
// a *WorkerLostError if one of them held variables in a worker that has since ended (the
// caller learns of the loss once; the namespace then starts fresh).
func (w *worker) prepare(bindings []*nsBinding, ids []uint32) ([]uint32, error) {
	var create []uint32
	var lost error
	for i, b := range bindings {
		if b.epoch != 0 && b.epoch != w.epoch {
			b.epoch = 0
			lost = &WorkerLostError{Earlier: true, ExitCode: -1}
		}
		if !w.known[ids[i]] {
			create = append(create, ids[i])
		}
	}
	if lost != nil {
		return nil, lost
	}
	return create, nil
}

// created records that the namespaces now live in this worker.
func (w *worker) created(bindings []*nsBinding, ids []uint32) {
	for i, b := range bindings {
		w.known[ids[i]] = true
		b.epoch = w.epoch
	}
}

// answered records that the worker answered a request: it snapshots itself before the
// next one, holding the namespaces it knows now.
func (w *worker) answered() {
	if w.ctl != nil {
		w.snapKnown = maps.Clone(w.known)
	}
}

// kill kills the worker's whole process tree: in its pid namespace, killing its init
// (the worker's pid 1) makes the kernel kill every process in it, however detached;
// otherwise the process group and every descendant found in /proc are killed.
func (w *worker) kill() {
	w.killOnce.Do(func() {
		if others := w.line != nil && w.line.release(); others || w.cmd == nil {
			// Other workers (Fork copies) share the guardian: it ends this one's line. Or
			// the worker was forked from the template: its guardian, pid 1 of its
			// sandbox, ends everything in it when its last control socket closes.
			w.ctl.CloseWrite() //nolint:errcheck // a closed socket: the line has ended
			w.stdin.Close()
			return
		}
		pid := w.cmd.Process.Pid
		if !w.pidns {
			killDescendants(pid)
			syscall.Kill(-pid, syscall.SIGKILL) //nolint:errcheck // may be gone already
		}
		syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone already
		w.stdin.Close()
	})
}

// awaitExit waits (a bounded time) for the process to be reaped and its stdout to end.
func (w *worker) awaitExit() {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	if w.line != nil && w.line.detached.Load() {
		select { // the guardian closes the line's socket once it has killed the line
		case <-w.line.done:
		case <-w.exited:
		case <-t.C:
		}
		return
	}
	select {
	case <-w.exited:
	case <-t.C:
	}
}

// gone reports whether w's process has ended for the host: its guardian exited, or (a
// line of a shared guardian) the guardian ended its line.
func (w *worker) gone() bool {
	select {
	case <-w.exited:
		return true
	default:
	}
	if w.line == nil {
		return false
	}
	select {
	case <-w.line.done:
		return true
	default:
		return false
	}
}

// lostError describes how the worker ended; intr is set when minipy killed it after the
// run's deadline.
func (w *worker) lostError(intr *InterruptedError) error {
	e := &WorkerLostError{Killed: intr != nil, Interrupted: intr, ExitCode: -1, Stderr: w.stderr.String()}
	if intr != nil {
		return e
	}
	var ws syscall.WaitStatus
	if d := w.deathNote.Load(); d != nil {
		ws = d.status // the guardian's report
	} else if w.exitFrame {
		ws = w.exitStatus // the real worker's status, from its pid-namespace init
	} else {
		select {
		case <-w.exited:
			if w.state != nil {
				ws, _ = w.state.Sys().(syscall.WaitStatus)
			}
		default: // not reaped within awaitExit's bound: the status is unknown
		}
	}
	if ws.Signaled() {
		e.Signal = ws.Signal()
	} else {
		e.ExitCode = ws.ExitStatus()
	}
	switch e.Signal {
	case syscall.SIGXCPU:
		e.Limit = "cpu"
	case syscall.SIGXFSZ:
		e.Limit = "file size"
	}
	return e
}

// killDescendants kills every descendant of pid found in /proc, children that started
// sessions of their own included (the worker is their subreaper, so orphans stay in its
// tree while it lives), by the rule of proctree.py, which kills trees in Python (the
// in-process runtime, a worker's guardian): stopped round after round until a scan finds
// none it has not stopped, then killed; each held by a pidfd opened after the scan and
// kept only while its start time is the scanned one, so a pid reused meanwhile is never
// signalled. It must run before pid itself is killed.
func killDescendants(pid int) {
	held := map[int]heldProcess{}
	gone := map[int]bool{}
	defer func() {
		for _, h := range held {
			h.release()
		}
	}()
	for round := 0; round < 20; round++ {
		tree := processTree()
		fresh := 0
		for _, p := range tree.below(pid) {
			if _, ok := held[p]; ok || gone[p] {
				continue
			}
			h, ok := holdProcess(p, tree.start[p])
			if !ok {
				gone[p] = true
				continue
			}
			held[p] = h
			h.signal(syscall.SIGSTOP)
			fresh++
		}
		if fresh == 0 {
			break
		}
	}
	for _, h := range held {
		h.signal(syscall.SIGKILL)
	}
}

// heldProcess is a process held for signals: by a pidfd, or (a kernel before 5.3) by its
// pid and start time, checked before each signal.
type heldProcess struct {
	pid, fd int
	start   uint64
}

// pidfd_open and pidfd_send_signal, the same numbers on every architecture.
const (
	sysPidfdOpen       = 434
	sysPidfdSendSignal = 424
)

// holdProcess holds pid if it is still the process that started at start.
func holdProcess(pid int, start uint64) (heldProcess, bool) {
	h := heldProcess{pid: pid, fd: -1, start: start}
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	switch {
	case errno == 0:
		h.fd = int(fd)
		syscall.CloseOnExec(h.fd)
	case errno != syscall.ENOSYS:
		return h, false // gone
	}
	if now, ok := procStart(pid); !ok || now != start {
		h.release()
		return h, false // gone, or another process has its pid
	}
	return h, true
}

func (h heldProcess) signal(sig syscall.Signal) {
	if h.fd >= 0 {
		syscall.Syscall6(sysPidfdSendSignal, uintptr(h.fd), uintptr(sig), 0, 0, 0, 0) //nolint:errcheck // may have ended
	} else if now, ok := procStart(h.pid); ok && now == h.start {
		syscall.Kill(h.pid, sig) //nolint:errcheck // may have ended
	}
}

func (h heldProcess) release() {
	if h.fd >= 0 {
		syscall.Close(h.fd)
	}
}

// procTree is the machine's processes by parent, with their start times, as /proc showed
// them at one moment.
type procTree struct {
	children map[int][]int
	start    map[int]uint64 // clock ticks since boot (/proc/PID/stat field 22)
}

// procStat is the parent and start time of pid from /proc/PID/stat.
func procStat(pid int) (ppid int, start uint64, ok bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The fields after the command (which may hold spaces) start after the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(fields[1])
	start, err2 := strconv.ParseUint(fields[19], 10, 64)
	return ppid, start, err1 == nil && err2 == nil
}

func procStart(pid int) (uint64, bool) {
	_, start, ok := procStat(pid)
	return start, ok
}

// processTree reads /proc's parent links.
func processTree() procTree {
	tree := procTree{children: map[int][]int{}, start: map[int]uint64{}}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return tree
	}
	for _, ent := range entries {
		p, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if ppid, start, ok := procStat(p); ok {
			tree.children[ppid] = append(tree.children[ppid], p)
			tree.start[p] = start
		}
	}
	return tree
}

// below lists pid's descendants.
func (t procTree) below(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, t.children[p]...)
		queue = append(queue, t.children[p]...)
	}
	return out
}

// defaultWorkerPython is the interpreter of the libpython minipy is built against, found from
// the library's file (a python3 first on PATH may be another build, or a pyenv shim), else
// "python3" (a build without cgo links no libpython).
func defaultWorkerPython() string {
	if p := cpython.LinkedPython(); p != "" {
		return p
	}
	return "python3"
}

// shellQuote quotes s as one POSIX shell word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// reply sends the answer to host call id of the worker's run in progress (a FrameReply).
func (w *worker) reply(id uint64, status byte, payload []byte) {
	f := make([]byte, 0, 4+1+8+1+len(payload))
	f = binary.LittleEndian.AppendUint32(f, uint32(1+8+1+len(payload)))
	f = append(f, pyrt.FrameReply)
	f = binary.LittleEndian.AppendUint64(f, id)
	f = append(f, status)
	f = append(f, payload...)
	w.send(f) //nolint:errcheck // a dead worker is noticed by the run's wait
}

// newWorkerPipes makes a worker's stdin, stdout and stderr pipes: read and write end of
// each, in that order.
func newWorkerPipes() ([6]*os.File, error) {
	var p [6]*os.File
	for i := 0; i < 6; i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range p[:i] {
				f.Close()
			}
			return p, err
		}
		p[i], p[i+1] = r, w
	}
	return p, nil
}

// controlSocket makes the rollback control socket: the host's end, and the guardian's (fd
// 3 of the worker process), a SOCK_SEQPACKET pair so that each message arrives whole.
func controlSocket() (*net.UnixConn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("minipy: the worker's control socket: %w", err)
	}
	host := os.NewFile(uintptr(fds[0]), "minipy-control")
	defer host.Close()
	c, err := net.FileConn(host)
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("minipy: the worker's control socket: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "minipy-control-child"), nil
}

// keepStderr keeps the end of what the worker writes on its stderr pipe (read end r) for
// crash errors; stderrDone closes when the pipe ends.
func (w *worker) keepStderr(r *os.File) {
	w.stderr.max = stderrKeep
	w.stderrDone = make(chan struct{})
	go func() {
		io.Copy(&w.stderr, r) //nolint:errcheck // ends with the worker
		r.Close()
		close(w.stderrDone)
	}()
}

// newLine is the line of a guardian's first worker.
func newLine() *workerLine {
	l := &workerLine{guardian: &guardianLines{}, done: make(chan struct{})}
	l.guardian.n.Store(1)
	return l
}

// guardianLines counts the lines (workers with a control socket each) of one guardian
// process: the first worker and the copies Namespace.Fork made from it.
type guardianLines struct{ n atomic.Int32 }

// workerLine is one control socket to a guardian and the succession of workers on it (a
// rollback's snapshot takes over from the worker that ended).
type workerLine struct {
	guardian *guardianLines
	cur      atomic.Pointer[worker] // the worker the guardian's next report is about
	released atomic.Bool
	detached atomic.Bool   // released while other lines lived: the guardian ends it
	done     chan struct{} // closed when the control socket has ended
}

// release gives up the line; it reports whether other lines of its guardian live on (then
// the guardian must end this one alone, rather than be killed).
func (l *workerLine) release() (others bool) {
	if !l.released.CompareAndSwap(false, true) {
		return l.detached.Load()
	}
	others = l.guardian.n.Add(-1) > 0
	l.detached.Store(others)
	return others
}

// follow makes w the worker that the line's next report is about.
func (l *workerLine) follow(w *worker) {
	w.line = l
	w.died = make(chan death, 1)
	l.cur.Store(w)
}

// watch makes w the line's current worker and reads the guardian's reports until the
// socket ends: a b"D" (the worker ended) is kept for the run that waits, which it wakes.
func (l *workerLine) watch(w *worker) {
	l.follow(w)
	ctl := w.ctl
	go func() {
		defer close(l.done)
		buf := make([]byte, 16)
		for {
			n, err := ctl.Read(buf)
			if err != nil {
				return
			}
			if n == 6 && buf[0] == pyrt.ControlDied {
				d := death{status: syscall.WaitStatus(int32(binary.LittleEndian.Uint32(buf[1:5]))), snapshot: buf[5] == 1}
				cur := l.cur.Load()
				cur.deathNote.Store(&d)
				select {
				case cur.died <- d:
				default:
				}
				cur.wake()
			}
		}
	}()
}

// ended reports whether the guardian said the worker process ended.
func (w *worker) ended() bool { return w.deathNote.Load() != nil }

// killWorker asks the guardian to kill the worker process but not its snapshot (the hard
// stop at a deadline), and waits up to wait for its report; false when there is no report
// (no control socket, or no answer): the caller then kills the whole guardian.
func (w *worker) killWorker(wait time.Duration) (death, bool) {
	if w.line == nil {
		return death{}, false
	}
	if d := w.deathNote.Load(); d != nil {
		return *d, true
	}
	if _, err := w.ctl.Write([]byte{pyrt.ControlKill}); err != nil {
		return death{}, false
	}
	return w.awaitDeath(wait)
}

// awaitDeath waits up to wait for the guardian's report that the worker ended.
func (w *worker) awaitDeath(wait time.Duration) (death, bool) {
	if w.line == nil {
		return death{}, false
	}
	if d := w.deathNote.Load(); d != nil {
		return *d, true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case d := <-w.died:
		return d, true
	case <-w.exited:
	case <-w.line.done:
	case <-t.C:
	}
	if d := w.deathNote.Load(); d != nil {
		return *d, true
	}
	return death{}, false
}

// rollBack wakes the snapshot of w (which ended) as the worker: new pipes go to it through
// the guardian, and it answers with a ready frame on them. The returned worker shares w's
// process (the guardian), line and epoch, and knows the namespaces the snapshot holds.
func (w *worker) rollBack(timeout time.Duration) (*worker, error) {
	nw, err := w.handOver(w.ctl, w.line, []byte{pyrt.ControlTakeOver}, nil, w.epoch, w.snapKnown, timeout)
	if err != nil {
		return nil, fmt.Errorf("minipy: the rollback snapshot did not take over: %w", err)
	}
	w.stdin.Close()
	w.out.Close()
	return nw, nil
}

// handOver makes the host's side of a worker that w's guardian wakes on fresh pipes (a
// rollback's snapshot, a Fork's copy): it sends msg over w's control socket with the
// pipes' worker ends (and extra after them), and waits for the ready frame on them. The
// new worker reports over ctl, on line.
func (w *worker) handOver(ctl *net.UnixConn, line *workerLine, msg []byte, extra []*os.File, epoch uint64,
	known map[uint32]bool, timeout time.Duration) (*worker, error) {
	p, err := newWorkerPipes()
	if err != nil {
		return nil, err
	}
	inR, inW, outR, outW, errR, errW := p[0], p[1], p[2], p[3], p[4], p[5]
	nw := &worker{
		epoch:  epoch,
		cmd:    w.cmd,
		stdin:  inW,
		pidns:  w.pidns,
		exited: w.exited,
		out:    outR,
		known:  maps.Clone(known),
		ctl:    ctl,
	}
	if nw.known == nil {
		nw.known = map[uint32]bool{pyrt.DefaultNamespace: true}
	}
	nw.snapKnown = maps.Clone(nw.known)
	line.follow(nw) // before the guardian can report on it
	fds := []int{int(inR.Fd()), int(outW.Fd()), int(errW.Fd())}
	for _, f := range extra {
		fds = append(fds, int(f.Fd()))
	}
	_, _, err = w.ctl.WriteMsgUnix(msg, syscall.UnixRights(fds...), nil)
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, err
	}
	nw.keepStderr(errR)
	until := time.Now().Add(timeout)
	for {
		body, err := nw.readFrame(until)
		if err != nil {
			nw.stdin.Close()
			nw.out.Close()
			select { // what it said before it ended
			case <-nw.stderrDone:
			case <-time.After(100 * time.Millisecond):
			}
			if msg := strings.TrimSpace(nw.stderr.String()); msg != "" {
				err = fmt.Errorf("%w: %s", err, msg)
			}
			return nil, err
		}
		if body[0] == pyrt.FrameReady {
			return nw, nil
		}
	}
}

// spawnWorker has template t fork a worker sandbox with dirs (docs/protocol.md,
// "Template"): it sends the names of its tree and working directory, the new worker's
// pipes, its control socket and its life pipe (whose end the guardian holds until it
// exits) over t's control socket.
func spawnWorker(e *Isolated, t *worker, dirs workDirs, epoch uint64) (*worker, error) {
	p, err := newWorkerPipes()
	if err != nil {
		return nil, err
	}
	inR, inW, outR, outW, errR, errW := p[0], p[1], p[2], p[3], p[4], p[5]
	closeAll := func(fs ...io.Closer) {
		for _, f := range fs {
			f.Close()
		}
	}
	ctl, ctlChild, err := controlSocket()
	if err != nil {
		closeAll(inR, inW, outR, outW, errR, errW)
		return nil, err
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		closeAll(inR, inW, outR, outW, errR, errW, ctl, ctlChild)
		return nil, err
	}
	rights := syscall.UnixRights(int(inR.Fd()), int(outW.Fd()), int(errW.Fd()), int(ctlChild.Fd()), int(lifeW.Fd()))
	_, _, err = t.ctl.WriteMsgUnix(append([]byte{pyrt.ControlNew}, dirs.tree.name+"\x00"+dirs.home...), rights, nil)
	closeAll(inR, outW, errW, ctlChild, lifeW)
	if err != nil {
		closeAll(inW, outR, errR, ctl, lifeR)
		return nil, fmt.Errorf("minipy: the template is gone: %w", err)
	}
	w := &worker{
		epoch:  epoch,
		stdin:  inW,
		pidns:  true,
		exited: make(chan struct{}),
		out:    outR,
		known:  map[uint32]bool{pyrt.DefaultNamespace: true},
		ctl:    ctl,
		line:   newLine(),
	}
	w.keepStderr(errR)
	go func() {
		io.Copy(io.Discard, lifeR) //nolint:errcheck // nothing is written: it ends when the guardian exits
		lifeR.Close()
		close(w.exited)
	}()
	w.line.watch(w)
	return w, nil
}
