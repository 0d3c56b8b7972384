package worker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/procstat"
	"github.com/minipy-go/minipy/internal/pyrt"
	"golang.org/x/sys/unix"
)

// stderrKeep is how much of a worker's own stderr is kept for crash errors.
const stderrKeep = 8 << 10

// Worker is the host's side of one worker process: its pipes, its control socket to the
// guardian (local workers), and what the host knows of its end. Its owner (the engine's
// slot, while it holds the slot's token) calls ReadFrame, NextRun, Answered, KillWorker,
// AwaitDeath, RollBack, Copy and reads and writes Known; Send, Reply, Wake, Kill, Gone,
// Ended, Pid, Stderr and Status are safe from any goroutine.
type Worker struct {
	// Epoch is the owner's generation of the worker (set once, when it is made).
	Epoch uint64
	// Known is the namespaces the worker holds; the owner's.
	Known map[uint32]bool

	cmd   *exec.Cmd  // nil for a worker forked from the template (and the copies of a worker)
	proc  *procGuard // cmd's process's number, until it is reaped (shared with a rollback's worker)
	stdin *os.File
	// kicks is the write end of a local worker's control pipe (pyrt.KickFD there): the
	// host's kicks and host-call replies go there, read by the worker's control thread,
	// so that its main thread reads its requests on stdin itself (no hand-off between two
	// threads in each round trip). nil for a Command worker: one stream carries it all.
	kicks *os.File
	kmu   sync.Mutex // a frame on kicks is written whole
	// sandboxed: a local sandboxed process, which the host kills alone: a sandbox's pid 1
	// (its guardian), whose end ends its pid namespace, or the template, whose forks' sandboxes
	// must outlive it (they are in pid namespaces of their own, children of the host's).
	sandboxed bool
	wmu       sync.Mutex
	sent      uint64        // bytes written to stdin (under wmu)
	reqAt     uint64        // sent when the last request's frame began (under wmu)
	exited    chan struct{} // closed when the process has been waited for
	stderr    tailBuffer

	// The worker's stdout is read by the goroutine holding the slot's token, in the
	// goroutine that waits for the answer: a hop through a reader goroutine and a channel
	// cost about a third of a warm round trip.
	out   *os.File
	outRC syscall.RawConn // out's, for readOut (nil until its first read)
	fast  bool            // the last wait for out's bytes ended within spinMax: readOut spins
	spun  time.Duration   // how long readOut spun since the last request (at most spinMax)
	rbuf  []byte
	woken atomic.Bool // Wake was called: the current wait must return
	limit int         // the payload cap of its answers and host calls (Spec.MaxTransfer)

	// Set from the frames read (b"X": the real worker's wait status, from its init).
	exitFrame  bool
	exitStatus syscall.WaitStatus
	// Set before exited is closed.
	state *os.ProcessState

	killOnce sync.Once

	runSeq uint64 // the owner's
	// gen is the number of the answers read that may have changed the worker's state
	// (pyrt.AnswerChanged): the number of the snapshot that holds the state after the
	// last of them. The owner's.
	gen uint32

	// Local workers: ctl is the control socket to the guardian (fd 3 there, for the first
	// worker of a guardian); line is what the workers of one ctl share (a rollback's worker
	// replaces the one that ended on the same line); snapKnown is Known as of the last
	// answered request, when the worker forked the snapshot that a rollback would wake;
	// died is the guardian's report of the worker's end.
	ctl        *net.UnixConn
	line       *ctlLine
	snapKnown  map[uint32]bool
	stderrDone chan struct{} // closed when the worker's stderr pipe has ended
	died       chan Death
	deathNote  atomic.Pointer[Death]
	ended      chan struct{} // closed with deathNote's store
	endOnce    sync.Once

	cg      *cgroup // the group of its sandbox (Spec.Cgroups), shared with the workers of its guardian; or nil
	oomBase uint64  // the group's OOM kills when this worker took over (a snapshot, a copy)
}

// Death is the guardian's report (pyrt.ControlDied) that the worker process ended.
type Death struct {
	Status syscall.WaitStatus
	// Snapshot: a snapshot of it waits to take over, holding the state after the last
	// answer the owner read. (A worker killed after it answered and before its next
	// snapshot leaves the one before: that is reported as none, since waking it would
	// undo a run the host saw finish.)
	Snapshot bool
	At       time.Time // when the host learned of it
	gen      uint32    // the snapshot's number (Worker.gen)
}

// Changed reports whether w (or a worker it took over from: a rollback's, a Fork's) has
// answered a request that may have changed its state. The owner's.
func (w *Worker) Changed() bool { return w.gen != 0 }

// current is d as the owner of w sees it: a snapshot older than the last answer read is none.
func (w *Worker) current(d Death) Death {
	d.Snapshot = d.Snapshot && d.gen == w.gen
	return d
}

// beatFrame is the frame of a beat.
var beatFrame = append(binary.LittleEndian.AppendUint32(nil, 1), pyrt.FrameBeat)

// beat sends the Command worker w a beat every interval until it exits.
func (w *Worker) beat(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.exited:
			return
		case <-t.C:
			if w.Send(beatFrame) != nil {
				return
			}
		}
	}
}

// ErrNotProtocol is what ReadFrame returns when the worker's stdout is not our protocol.
var ErrNotProtocol = errors.New("minipy: the worker broke the protocol")

// The host's bounds on what a worker makes it hold (docs/protocol.md, "Frame sizes"). The
// code a worker runs can reach the worker's protocol pipe and write any header there, so
// each kind of frame has a cap of what an honest worker sends in it, and ReadFrame takes no
// more: the worker's answers and host calls Spec.MaxTransfer, which the worker itself keeps
// under; its output events one chunk of pyrt.OutputChunk; its ready frame readyCap.
const (
	// readyCap caps a ready frame: a codec list that holds the runtime as the worker compiled
	// it (marshal, about 200 KB).
	readyCap = 16 << 20
	// frameHead is the most that a frame of an answer or a host call holds besides its
	// payload: kind, run id, call id or kicked byte.
	frameHead = 1 + 8 + 8
	// keepBuf is the read buffer's capacity between frames: a larger frame gets a buffer of
	// its own as its bytes arrive, which goes to the caller with the frame.
	keepBuf = 64 << 10
)

// FrameError is ReadFrame's error for a frame no worker sends: a kind the host never reads
// from a worker, or a length past the cap of its kind. The worker broke the protocol (the
// code it runs wrote to its pipe), and ReadFrame read nothing of the frame's payload. It
// matches ErrNotProtocol.
type FrameError struct {
	Kind byte
	Size int // the length the header claims: the kind byte and the payload
	Cap  int // the most the host takes in a frame of that kind; 0 for a kind it never takes
}

func (e *FrameError) Error() string {
	if e.Cap == 0 {
		return fmt.Sprintf("minipy: the worker broke the protocol: a frame of kind %q, which no worker sends", e.Kind)
	}
	return fmt.Sprintf("minipy: the worker broke the protocol: a frame of %d bytes (kind %q) past the cap of %d",
		e.Size, e.Kind, e.Cap)
}

// Is makes errors.Is(err, ErrNotProtocol) hold.
func (e *FrameError) Is(target error) bool { return target == ErrNotProtocol }

// frameCap is the most a frame of kind may claim (its kind byte and payload); 0 for a kind
// that workers never send.
func (w *Worker) frameCap(kind byte) int {
	switch kind {
	case pyrt.FrameAnswer, pyrt.FrameCall:
		return frameHead + w.limit
	case pyrt.FrameOutput:
		return 1 + 8 + 1 + pyrt.OutputChunk
	case pyrt.FrameReady:
		return readyCap
	case pyrt.FrameExit:
		return 1 + 4
	}
	return 0
}

// ReadFrame returns the next frame from the worker (kind byte, payload), waiting until
// deadline at most (zero: no limit; os.ErrDeadlineExceeded when it passes or Wake is
// called). A frame past its kind's cap is a *FrameError, refused at its header; any other
// error means the worker is gone. A frame cut by a deadline stays in the buffer for the
// next call. Only the owner calls it.
func (w *Worker) ReadFrame(deadline time.Time) ([]byte, error) {
	for {
		need := 5 // the length and the kind
		if len(w.rbuf) >= 4 && binary.LittleEndian.Uint32(w.rbuf) == 0 {
			return nil, ErrNotProtocol
		}
		if len(w.rbuf) >= 5 {
			n := int(binary.LittleEndian.Uint32(w.rbuf))
			if c := w.frameCap(w.rbuf[4]); n > c {
				return nil, &FrameError{Kind: w.rbuf[4], Size: n, Cap: c}
			}
			if need = 4 + n; len(w.rbuf) >= need {
				if body := w.takeFrame(n); body != nil {
					return body, nil
				}
				continue
			}
		}
		if len(w.rbuf) == cap(w.rbuf) { // full, and the frame needs more
			// Grow as bytes arrive, never past the frame: the host holds eight times what was
			// sent at most, whatever the header claims. (Doubling took 2-4 times longer to read
			// 1 MiB output frames under -race: more and larger allocations.)
			c := min(max(8*cap(w.rbuf), keepBuf), max(need, keepBuf))
			w.rbuf = append(make([]byte, 0, c), w.rbuf...)
		}
		if err := w.out.SetReadDeadline(deadline); err != nil {
			return nil, err
		}
		if w.woken.Swap(false) {
			return nil, os.ErrDeadlineExceeded
		}
		m, err := w.readOut(w.rbuf[len(w.rbuf):cap(w.rbuf)], deadline)
		w.rbuf = w.rbuf[:len(w.rbuf)+m]
		if err != nil && m == 0 {
			return nil, err
		}
	}
}

// How the owner waits for the worker's bytes (readOut). On a virtual machine a round
// trip's cost is mostly waking: a thread that sleeps lets its virtual CPU halt, and waking
// it takes an interrupt through the hypervisor, tens of microseconds of the waker's CPU,
// more than a short run itself (the worker's CPU for a `1+1` was 93-114 us answering a
// host asleep, 76-92 answering one that spins; the round trip fell from 148-179 us to
// 101-114: BenchmarkCounts/round-trip). So a wait first spins for at most spinMax, while
// the worker's answers come that fast; then it waits in a poll on the reading goroutine's
// own thread for at most onThreadWait (a frame then wakes that thread alone, where through
// the runtime's poller it woke the poller's thread, which woke another to run the reader);
// then it parks in the runtime's poller, so a host with thousands of runs in flight holds
// no thread for each. A Wake during a spin or poll is seen at its end.
const (
	spinStep     = 4 * time.Microsecond // between two reads of a spin
	onThreadWait = time.Millisecond
)

var spinMax = 250 * time.Microsecond // (a variable for tests)

// spinners counts the goroutines spinning in readOut: at most half the Ps spin, so the
// rest run the host's other goroutines (and there is a CPU for the workers). A host with
// one P or one CPU never spins: its spin would take the CPU the worker needs.
var spinners atomic.Int32

// spinsBegun counts the spins readOut began (its tests see which waits spun).
var spinsBegun atomic.Int64

// spinTurn takes a turn to spin, if there is one (release it with spinners.Add(-1)).
func spinTurn() bool {
	most := int32(min(runtime.GOMAXPROCS(0), runtime.NumCPU()) / 2)
	if spinners.Add(1) > most {
		spinners.Add(-1)
		return false
	}
	spinsBegun.Add(1)
	return true
}

// readOut reads what the worker wrote to its stdout, as w.out.Read does (deadline is the
// one set on w.out), first spinning and waiting on this thread as the constants above say
// (within the deadline). It spins only after a wait that ended within spinMax (none before
// the first: a worker's start takes milliseconds), and a spin that ends with nothing stops
// the next ones until a wait ends within spinMax again: a worker busy for longer costs one
// spin a run at most. All a request's spins together last spinMax at most: code that
// drips its output a byte at a time, each within spinMax, cannot keep the host spinning.
func (w *Worker) readOut(p []byte, deadline time.Time) (int, error) {
	if w.outRC == nil {
		rc, err := w.out.SyscallConn()
		if err != nil {
			return w.out.Read(p)
		}
		w.outRC = rc
	}
	start := time.Now()
	wait, spinning := onThreadWait, spinMax
	if !deadline.IsZero() {
		wait, spinning = min(wait, deadline.Sub(start)), min(spinning, deadline.Sub(start))
	}
	var n int
	var rerr error
	waited := wait <= 0
	// (syscall.Read, not unix.Read: its race annotations order this read after the writes
	// that caused it, as os.File's reads did: a host call's reply, then the answer.)
	err := w.outRC.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), p)
			if rerr == unix.EINTR {
				continue
			}
			if rerr != unix.EAGAIN {
				if waited {
					w.fast = time.Since(start) <= spinMax
				}
				return true
			}
			if waited {
				return false
			}
			waited = true
			if left := min(spinning, spinMax-w.spun); w.fast && left > 0 && spinTurn() {
				began := time.Now()
				got := w.spin(fd, p, &n, &rerr, began.Add(left))
				w.spun += time.Since(began)
				spinners.Add(-1)
				if got {
					return true
				}
			}
			if left := wait - time.Since(start); left > 0 {
				ts := unix.NsecToTimespec(int64(left))
				unix.Ppoll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, &ts, nil) //nolint:errcheck // the read says
			}
		}
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, &os.PathError{Op: "read", Path: w.out.Name(), Err: rerr}
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// spin reads fd into p until it has bytes (true: *n and *rerr are the read's) or until
// passes (false, and w.fast is cleared).
func (w *Worker) spin(fd uintptr, p []byte, n *int, rerr *error, until time.Time) bool {
	for {
		next := time.Now().Add(spinStep)
		for time.Now().Before(next) {
		}
		*n, *rerr = syscall.Read(int(fd), p)
		if *rerr != unix.EAGAIN && *rerr != unix.EINTR {
			return true
		}
		if time.Now().After(until) {
			w.fast = false
			return false
		}
	}
}

// takeFrame takes the whole frame of length n at the start of the buffer and returns its
// body; nil for a guardian's exit frame, which it notes. A frame in a buffer grown past
// keepBuf keeps that buffer, and the bytes after it move to a small one: the buffer shrinks
// after each large frame, and a large frame is not copied.
func (w *Worker) takeFrame(n int) []byte {
	var body []byte
	if cap(w.rbuf) > keepBuf {
		body = w.rbuf[4 : 4+n : 4+n]
		w.rbuf = append(make([]byte, 0, keepBuf), w.rbuf[4+n:]...)
	} else {
		body = append([]byte(nil), w.rbuf[4:4+n]...)
		w.rbuf = w.rbuf[:copy(w.rbuf, w.rbuf[4+n:])]
	}
	if body[0] == pyrt.FrameAnswer && len(body) >= 10 && body[9]&pyrt.AnswerChanged != 0 {
		w.gen++ // the worker's snapshot after this answer has this number (Death)
	}
	if body[0] == pyrt.FrameExit && len(body) == 5 {
		w.exitFrame = true
		w.exitStatus = syscall.WaitStatus(int32(binary.LittleEndian.Uint32(body[1:])))
		return nil
	}
	return body
}

// BufferCap is the capacity of the worker's read buffer, for tests: it shrinks back to
// keepBuf after a large frame.
func (w *Worker) BufferCap() int { return cap(w.rbuf) }

// Wake makes a pending ReadFrame return os.ErrDeadlineExceeded. Safe from any goroutine.
func (w *Worker) Wake() {
	w.woken.Store(true)
	w.out.SetReadDeadline(time.Now()) //nolint:errcheck // a closed pipe needs no waking
}

// Send writes one frame to the worker.
func (w *Worker) Send(frame []byte) error { return w.send(false, frame) }

// sendControl writes a kick or a host call's reply: on the control pipe of a local
// worker, on stdin for a Command worker.
func (w *Worker) sendControl(frame []byte) error {
	if w.kicks == nil {
		return w.Send(frame)
	}
	w.kmu.Lock()
	defer w.kmu.Unlock()
	_, err := w.kicks.Write(frame)
	return err
}

// closeInput closes the pipes the worker reads.
func (w *Worker) closeInput() {
	w.stdin.Close()
	if w.kicks != nil {
		w.kicks.Close()
	}
}

// send writes one frame, in parts written in a row (a large request's payload is not
// copied behind its header); request marks the start of a request (Unstarted).
func (w *Worker) send(request bool, parts ...[]byte) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if request {
		w.reqAt = w.sent
	}
	for _, p := range parts {
		n, err := w.stdin.Write(p)
		w.sent += uint64(n)
		if err != nil {
			return err
		}
	}
	return nil
}

// Unstarted reports whether w, which has ended, never read any byte of its last request
// (Request): the request is whole in its stdin pipe, so it had no effect, and the worker
// ended before it (between runs). False when unknown: a worker without a guardian (a
// Command worker's stdin may be a transport's), or a pipe the host cannot query.
func (w *Worker) Unstarted() bool {
	if w.line == nil {
		return false
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	raw, err := w.stdin.SyscallConn()
	if err != nil {
		return false
	}
	unread, ioErr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) {
		// FIONREAD on either end of a pipe: the bytes in it not yet read.
		unread, ioErr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // (FIONREAD)
	}); err != nil || ioErr != nil {
		return false
	}
	return w.sent > w.reqAt && uint64(unread) >= w.sent-w.reqAt
}

// NextRun is the id of the owner's next request to the worker.
func (w *Worker) NextRun() uint64 {
	w.runSeq++
	return w.runSeq
}

// Answered records that the worker answered a request: it snapshots itself before the
// next one, holding the namespaces it knows now.
func (w *Worker) Answered() {
	if w.ctl != nil {
		w.snapKnown = maps.Clone(w.Known)
	}
}

// Kill kills the worker's whole process tree: in its pid namespace, killing its init
// (the worker's pid 1) makes the kernel kill every process in it, however detached;
// otherwise the process group and every descendant found in /proc are killed. Once the
// worker process has been reaped, its number may be another process's: nothing is sent
// by number then (procGuard).
func (w *Worker) Kill() {
	w.killOnce.Do(func() {
		if others := w.line != nil && w.line.release(); others || w.cmd == nil {
			// Other workers (Fork copies) share the guardian: it ends this one's line. Or
			// the worker was forked from the template: its guardian, pid 1 of its
			// sandbox, ends everything in it when its last control socket closes; its
			// cgroup's kill ends everything even if the guardian does not (stopped,
			// or tampered with by the code).
			w.ctl.CloseWrite() //nolint:errcheck // a closed socket: the line has ended
			w.closeInput()
			if !others {
				w.cg.kill()
			}
			return
		}
		w.proc.kill(w.cmd.Process.Pid, !w.sandboxed)
		w.cg.kill()
		w.closeInput()
	})
}

// OOMKilled reports whether the kernel's OOM killer has killed a process in the worker's
// sandbox (its cgroup: Spec.Cgroups) since this worker started or took over; false without
// a cgroup.
func (w *Worker) OOMKilled() bool { return w.cg.oomCount() > w.oomBase }

// CgroupDirs are the directories of the worker's sandbox's cgroup (v2: one; v1: memory's,
// then pids'), none without one. Once the sandbox has ended they may be another's: an
// emptied group is kept for a next sandbox (Cgroups.spare).
func (w *Worker) CgroupDirs() []string {
	if w.cg == nil {
		return nil
	}
	return slices.Clone(w.cg.dirs)
}

// AwaitExit waits (a bounded time) for the process to be reaped and its stdout to end.
func (w *Worker) AwaitExit() {
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

// Gone reports whether w's process has ended for the host: its guardian exited, or (a
// line of a shared guardian) the guardian ended its line.
func (w *Worker) Gone() bool {
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

// Reply sends the answer to host call id of the worker's run in progress (a FrameReply).
func (w *Worker) Reply(id uint64, status byte, payload []byte) {
	f := make([]byte, 0, 4+1+8+1+len(payload))
	f = binary.LittleEndian.AppendUint32(f, uint32(1+8+1+len(payload)))
	f = append(f, pyrt.FrameReply)
	f = binary.LittleEndian.AppendUint64(f, id)
	f = append(f, status)
	f = append(f, payload...)
	w.sendControl(f) //nolint:errcheck // a dead worker is noticed by the run's wait
}

// newPipes makes a worker's stdin, stdout and stderr pipes: read and write end of
// each, in that order.
func newPipes() ([6]*os.File, error) {
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
func (w *Worker) keepStderr(r *os.File) {
	w.stderr.max = stderrKeep
	w.stderrDone = make(chan struct{})
	go func() {
		io.Copy(&w.stderr, r) //nolint:errcheck // ends with the worker
		r.Close()
		close(w.stderrDone)
	}()
}

// newLine is the line of a guardian's first worker.
func newLine(onSnapshotDied func()) *ctlLine {
	l := &ctlLine{guardian: &guardianLines{listened: make(chan struct{}), onSnapshotDied: onSnapshotDied},
		done: make(chan struct{})}
	l.guardian.n.Store(1)
	return l
}

// guardianLines counts the lines (workers with a control socket each) of one guardian
// process: the first worker and the copies Namespace.Fork made from it.
type guardianLines struct {
	n atomic.Int32
	// The socket its sandbox listens on for the egress proxy (pyrt.ControlListen), set
	// once before listened is closed; and what the owner attached to the sandbox.
	listener *os.File
	listened chan struct{}
	listenMu sync.Mutex
	attached any
	// onSnapshotDied is Spec.OnSnapshotDied (pyrt.ControlSnapshotDied), or nil.
	onSnapshotDied func()
}

// EgressListener waits up to wait for the socket that w's sandbox listens on for its
// egress proxy (Spec.Egress: 127.0.0.1:pyrt.EgressPort in the sandbox's network
// namespace), and returns it; the workers of one sandbox (a rollback's, a Fork's copies)
// share it, and the caller owns it. Nil when it did not come (the sandbox ended first).
func (w *Worker) EgressListener(wait time.Duration) *os.File {
	if w.line == nil {
		return nil
	}
	g := w.line.guardian
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-g.listened:
	case <-w.exited:
	case <-t.C:
	}
	g.listenMu.Lock()
	defer g.listenMu.Unlock()
	return g.listener
}

// Attach keeps v with w's sandbox (shared by its rollbacks and Fork copies: the owner's
// egress proxy); Attached returns it. Safe from any goroutine.
func (w *Worker) Attach(v any) {
	if w.line != nil {
		w.line.guardian.listenMu.Lock()
		w.line.guardian.attached = v
		w.line.guardian.listenMu.Unlock()
	}
}

// Attached is what Attach kept with w's sandbox, or nil.
func (w *Worker) Attached() any {
	if w.line == nil {
		return nil
	}
	w.line.guardian.listenMu.Lock()
	defer w.line.guardian.listenMu.Unlock()
	return w.line.guardian.attached
}

// ctlLine is one control socket to a guardian and the succession of workers on it (a
// rollback's snapshot takes over from the worker that ended).
type ctlLine struct {
	guardian *guardianLines
	cur      atomic.Pointer[Worker] // the worker the guardian's next report is about
	released atomic.Bool
	detached atomic.Bool   // released while other lines lived: the guardian ends it
	done     chan struct{} // closed when the control socket has ended
	cmds     commands      // the commands started on it (commands.go)
}

// release gives up the line; it reports whether other lines of its guardian live on (then
// the guardian must end this one alone, rather than be killed).
func (l *ctlLine) release() (others bool) {
	if !l.released.CompareAndSwap(false, true) {
		return l.detached.Load()
	}
	others = l.guardian.n.Add(-1) > 0
	l.detached.Store(others)
	return others
}

// follow makes w the worker that the line's next report is about.
func (l *ctlLine) follow(w *Worker) {
	w.line = l
	w.died = make(chan Death, 1)
	w.ended = make(chan struct{})
	l.cur.Store(w)
}

// watch makes w the line's current worker and reads the guardian's reports until the
// socket ends: a b"D" (the worker ended) is kept for the run that waits, which it wakes.
func (l *ctlLine) watch(w *Worker) {
	l.follow(w)
	ctl := w.ctl
	go func() {
		defer close(l.done)
		defer l.cmds.lost()
		buf := make([]byte, 256)
		oob := make([]byte, syscall.CmsgSpace(4))
		for {
			n, oobn, _, _, err := ctl.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			fds := socketFDs(oob[:oobn])
			if n == 9 && buf[0] == pyrt.ControlRoot || n == 13 && buf[0] == pyrt.ControlConnect {
				var errno uint32
				if n == 13 {
					errno = binary.LittleEndian.Uint32(buf[9:13])
				}
				l.cmds.answered(binary.LittleEndian.Uint64(buf[1:9]), errno, fds)
				continue
			}
			if l.cmds.report(buf[:n]) {
				continue
			}
			if n == 1 && buf[0] == pyrt.ControlListen && len(fds) == 1 {
				g := l.guardian
				g.listenMu.Lock()
				if g.listener == nil {
					g.listener = os.NewFile(uintptr(fds[0]), "minipy-egress")
					close(g.listened)
				} else {
					syscall.Close(fds[0])
				}
				g.listenMu.Unlock()
				continue
			} else {
				for _, fd := range fds {
					syscall.Close(fd) // none other carries any
				}
			}
			if n == 1 && buf[0] == pyrt.ControlSnapshotDied {
				if f := l.guardian.onSnapshotDied; f != nil {
					f()
				}
				continue
			}
			if n == 10 && buf[0] == pyrt.ControlDied {
				d := Death{Status: syscall.WaitStatus(int32(binary.LittleEndian.Uint32(buf[1:5]))), Snapshot: buf[5] == 1,
					At: time.Now(), gen: binary.LittleEndian.Uint32(buf[6:10])}
				cur := l.cur.Load()
				cur.deathNote.Store(&d)
				select {
				case cur.died <- d:
				default:
				}
				cur.endOnce.Do(func() { close(cur.ended) })
				cur.Wake()
			}
		}
	}()
}

// WaitEnd waits until w has ended, as Gone or Ended would report it, and returns true; or
// until stop is closed, and returns false. Safe from any goroutine.
func (w *Worker) WaitEnd(stop <-chan struct{}) bool {
	var ended, lineDone <-chan struct{} // (nil without a line: never ready)
	if w.line != nil {
		ended, lineDone = w.ended, w.line.done
	}
	select {
	case <-ended:
	case <-lineDone:
	case <-w.exited:
	case <-stop:
		return false
	}
	return true
}

// Exited is closed when w's process (a local worker's guardian, its sandbox's pid 1) has
// ended.
func (w *Worker) Exited() <-chan struct{} { return w.exited }

// Ended reports whether the guardian said the worker process ended.
func (w *Worker) Ended() bool { return w.deathNote.Load() != nil }

// KillWorker asks the guardian to kill the worker process but not its snapshot (the hard
// stop at a deadline), and waits up to wait for its report; false when there is no report
// (no control socket, or no answer): the caller then kills the whole guardian.
func (w *Worker) KillWorker(wait time.Duration) (Death, bool) {
	if w.line == nil {
		return Death{}, false
	}
	if d := w.deathNote.Load(); d != nil {
		return w.current(*d), true
	}
	if _, err := w.ctl.Write([]byte{pyrt.ControlKill}); err != nil {
		return Death{}, false
	}
	return w.AwaitDeath(wait)
}

// AwaitDeath waits up to wait for the guardian's report that the worker ended.
func (w *Worker) AwaitDeath(wait time.Duration) (Death, bool) {
	if w.line == nil {
		return Death{}, false
	}
	if d := w.deathNote.Load(); d != nil {
		return w.current(*d), true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case d := <-w.died:
		return w.current(d), true
	case <-w.exited:
	case <-w.line.done:
	case <-t.C:
	}
	if d := w.deathNote.Load(); d != nil {
		return w.current(*d), true
	}
	return Death{}, false
}

// RollBack wakes the snapshot of w (which ended) as the worker: new pipes go to it through
// the guardian, and it answers with a ready frame on them. The returned worker shares w's
// process (the guardian), line and epoch, and knows the namespaces the snapshot holds.
func (w *Worker) RollBack(timeout time.Duration) (*Worker, error) {
	// The snapshot takes over with the group's reserve (cgroup.TakeOverReserve), then goes
	// back where the code runs, before it is sent anything.
	w.cg.lendReserve()
	nw, err := w.handOver(w.ctl, w.line, []byte{pyrt.ControlTakeOver}, nil, w.Epoch, w.snapKnown, timeout)
	w.cg.takeBack()
	if err != nil {
		return nil, fmt.Errorf("minipy: the rollback snapshot did not take over: %w", err)
	}
	w.closeInput()
	w.out.Close()
	return nw, nil
}

// handOver makes the host's side of a worker that w's guardian wakes on fresh pipes (a
// rollback's snapshot, a Fork's copy): it sends msg over w's control socket with the
// pipes' worker ends (and extra after them), and waits for the ready frame on them. The
// new worker reports over ctl, on line.
func (w *Worker) handOver(ctl *net.UnixConn, line *ctlLine, msg []byte, extra []*os.File, epoch uint64,
	known map[uint32]bool, timeout time.Duration) (*Worker, error) {
	p, err := newPipes()
	if err != nil {
		return nil, err
	}
	inR, inW, outR, outW, errR, errW := p[0], p[1], p[2], p[3], p[4], p[5]
	kickR, kickW, err := os.Pipe()
	if err != nil {
		closeFiles(p[:]...)
		return nil, err
	}
	nw := &Worker{
		Epoch:     epoch,
		cmd:       w.cmd,
		proc:      w.proc,
		stdin:     inW,
		kicks:     kickW,
		sandboxed: w.sandboxed,
		exited:    w.exited,
		out:       outR,
		Known:     maps.Clone(known),
		ctl:       ctl,
		limit:     w.limit,
		cg:        w.cg,
		oomBase:   w.cg.oomCount(),
		gen:       w.gen, // a rollback's snapshot holds the state of w's last answer; a copy, of the Fork's
	}
	if nw.Known == nil {
		nw.Known = map[uint32]bool{pyrt.DefaultNamespace: true}
	}
	nw.snapKnown = maps.Clone(nw.Known)
	line.follow(nw) // before the guardian can report on it
	fds := []int{int(inR.Fd()), int(outW.Fd()), int(errW.Fd()), int(kickR.Fd())}
	for _, f := range extra {
		fds = append(fds, int(f.Fd()))
	}
	_, _, err = w.ctl.WriteMsgUnix(msg, syscall.UnixRights(fds...), nil)
	closeFiles(inR, outW, errW, kickR)
	if err != nil {
		closeFiles(inW, outR, errR, kickW)
		return nil, err
	}
	nw.keepStderr(errR)
	until := time.Now().Add(timeout)
	for {
		body, err := nw.ReadFrame(until)
		if err != nil {
			nw.closeInput()
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

// Pid is the pid of the worker's own process on this host: the guardian (pid 1 of its
// sandbox) of a local worker, the command of a Command worker; 0 for a worker forked from
// the template (the template's descendant) and for the copies a guardian woke.
func (w *Worker) Pid() int {
	if w.cmd == nil || w.cmd.Process == nil {
		return 0
	}
	return w.cmd.Process.Pid
}

// RunQueueWaits is how long the main thread of each process of w's sandbox (its cgroup's
// members, else its process and their descendants) has waited for a CPU while runnable
// (procstat.Waits); nil when the host cannot tell (a worker forked from the template
// without a cgroup, a Command worker). Safe from any goroutine.
func (w *Worker) RunQueueWaits() map[int]time.Duration {
	pids := w.Processes()
	if len(pids) == 0 {
		return nil
	}
	return procstat.Waits(pids...)
}

// Processes are the pids on this host of w's sandbox's processes: its cgroup's members,
// else its process and their descendants; none when the host cannot tell (a worker forked
// from the template without a cgroup, a Command worker). Safe from any goroutine.
func (w *Worker) Processes() []int {
	if w.cg != nil {
		return w.cg.members()
	}
	if p := w.Pid(); p != 0 && w.line != nil {
		return procstat.Tree(p)
	}
	return nil
}

// Stderr is the end of what the worker wrote on its stderr (stderrKeep bytes at most).
func (w *Worker) Stderr() string { return w.stderr.String() }

// StderrDone is closed when the worker's stderr pipe has ended.
func (w *Worker) StderrDone() <-chan struct{} { return w.stderrDone }

// Status is how the worker process ended, as far as the host knows: the guardian's report,
// else the real worker's status from its pid namespace's init (an exit frame), else the
// reaped process's; false when none is known (it has not been reaped yet).
func (w *Worker) Status() (syscall.WaitStatus, bool) {
	if d := w.deathNote.Load(); d != nil {
		return d.Status, true
	}
	if w.exitFrame {
		return w.exitStatus, true
	}
	select {
	case <-w.exited:
		if w.state != nil {
			ws, ok := w.state.Sys().(syscall.WaitStatus)
			return ws, ok
		}
	default:
	}
	return 0, false
}

// Controlled reports whether the worker has a guardian that reports on it (a local
// worker): only such a worker can be rolled back or copied.
func (w *Worker) Controlled() bool { return w.line != nil }

// Copy takes the copy of the worker that its process forked under token (a Fork, as
// namespace id; docs/protocol.md, "Fork"): it gives it pipes and a control socket of its
// own, which the guardian pairs with it by the token, and returns it as a worker of its own
// line, holding the default namespace and id, with epoch 1.
func (w *Worker) Copy(token uint64, id uint32, timeout time.Duration) (*Worker, error) {
	ctl, ctlChild, err := controlSocket()
	if err != nil {
		return nil, err
	}
	defer ctlChild.Close()
	line := &ctlLine{guardian: w.line.guardian, done: make(chan struct{})}
	line.guardian.n.Add(1)
	msg := binary.LittleEndian.AppendUint64([]byte{pyrt.ControlFork}, token)
	known := map[uint32]bool{pyrt.DefaultNamespace: true, id: true}
	cw, err := w.handOver(ctl, line, msg, []*os.File{ctlChild}, 1, known, timeout)
	if err != nil {
		line.release()
		ctl.Close()
		return nil, err
	}
	line.watch(cw)
	return cw, nil
}

// ErrTemplateGone: the template did not answer (it died, or the engine closed it).
var ErrTemplateGone = errors.New("minipy: the template is gone")

// ErrStartKilled: a worker was killed by a signal before it was ready (from outside: an
// operator, the OOM killer), or, forked from the template, ended without a word. Not the
// configuration's fault: another start may well succeed.
var ErrStartKilled = errors.New("minipy: the worker was killed while it started")

// AskMount has template t mount a tmpfs of size bytes (pyrt.ControlMount) in its mount
// namespace: over the tree tree, the first time ("" name), or over the working directory
// name that the host made in the tree's; it returns an O_PATH fd of the tmpfs's root. The
// caller sends one request at a time, so that an answer is the last request's; a template
// that does not answer within timeout is stuck, and is killed.
func (t *Worker) AskMount(tree, name string, size int64, timeout time.Duration) (int, error) {
	msg := fmt.Sprintf("%c%s\x00%s\x00%d", pyrt.ControlMount, tree, name, size)
	if _, _, err := t.ctl.WriteMsgUnix([]byte(msg), nil, nil); err != nil {
		return -1, fmt.Errorf("%w: %w", ErrTemplateGone, err)
	}
	t.ctl.SetReadDeadline(time.Now().Add(timeout)) //nolint:errcheck // a closed socket fails the read
	defer t.ctl.SetReadDeadline(time.Time{})       //nolint:errcheck
	buf := make([]byte, 1024)
	oob := make([]byte, syscall.CmsgSpace(4))
	n, oobn, _, _, err := t.ctl.ReadMsgUnix(buf, oob) // (Go receives fds close-on-exec)
	var fds []int
	if msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if got, err := syscall.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if err == nil && n == 1 && buf[0] == pyrt.ControlMount && len(fds) == 1 {
		return fds[0], nil
	}
	for _, fd := range fds {
		syscall.Close(fd)
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Its answer must not be taken for the next request's.
		t.Kill()
		return -1, fmt.Errorf("%w: no answer to a mount within %v", ErrTemplateGone, timeout)
	case err != nil || n == 0:
		return -1, fmt.Errorf("%w: %v", ErrTemplateGone, err)
	}
	return -1, fmt.Errorf("minipy: mounting the tmpfs of a namespace's working directory (IsolatedConfig.WorkSize): %s",
		bytes.TrimPrefix(buf[:n], []byte{pyrt.ControlRefused}))
}

// closeFiles closes fs.
func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// Reading is a Worker with no process whose frames come from out, taking answers of
// maxTransfer bytes at most, for tests that feed ReadFrame a stream of their own (the root
// package's fuzz test).
func Reading(out *os.File, maxTransfer int) *Worker {
	return &Worker{out: out, exited: make(chan struct{}), limit: maxTransfer}
}

// Request sends a request (pyrt.FrameRequest): run id rid, the worker's deadman delay in
// ms (0: none), the namespaces to create first, and the request itself (an op and its
// arguments).
func (w *Worker) Request(rid uint64, deadman uint32, create []uint32, req []byte) error {
	w.spun = 0 // (its answer's wait may spin again)
	f := make([]byte, 0, 4+1+8+4+2+4*len(create)+min(len(req), requestJoinBelow))
	f = binary.LittleEndian.AppendUint32(f, uint32(1+8+4+2+4*len(create)+len(req)))
	f = append(f, pyrt.FrameRequest)
	f = binary.LittleEndian.AppendUint64(f, rid)
	f = binary.LittleEndian.AppendUint32(f, deadman)
	f = binary.LittleEndian.AppendUint16(f, uint16(len(create)))
	for _, id := range create {
		f = binary.LittleEndian.AppendUint32(f, id)
	}
	if len(req) >= requestJoinBelow {
		// (A Restore's megabytes: each copy into fresh memory costs a page fault a page.)
		return w.send(true, f, req)
	}
	return w.send(true, append(f, req...))
}

// requestJoinBelow is the size under which a request is joined to its header and written
// at once: one write, where two would wake the worker twice.
const requestJoinBelow = 64 << 10

// Kick asks the worker to interrupt run rid (pyrt.FrameKick) at stage (1, then 2 once the
// run has ignored the kicks for a while: the root package's timeout.go). A dead worker is
// noticed by the owner's wait.
//
// It never waits on the worker: the watchdog calls it, and code that stops reading its
// control pipe (keeping it open) while forging host calls leaves a reply's write blocked
// there. Then the kick is not sent (the frame could not be written whole), nor when the
// pipe has no room for it, within kickWait; the watchdog's hard stage kills the worker all
// the same.
func (w *Worker) Kick(rid uint64, stage int) {
	f := make([]byte, 0, 14)
	f = binary.LittleEndian.AppendUint32(f, 10)
	f = append(f, pyrt.FrameKick)
	f = binary.LittleEndian.AppendUint64(f, rid)
	w.control(append(f, byte(stage)), kickWait)
}

// Pump asks the worker for run rid's pending live output (pyrt.FramePump: what the code's
// fds 1 and 2 got since the last time, which C code and child processes write there), as
// the host does every liveInterval of a run with live output. Like Kick it never waits on
// the worker: a pump that finds the control pipe busy or full is not sent (the next one
// is).
func (w *Worker) Pump(rid uint64) {
	f := make([]byte, 0, 13)
	f = binary.LittleEndian.AppendUint32(f, 9)
	f = append(f, pyrt.FramePump)
	w.control(binary.LittleEndian.AppendUint64(f, rid), 0)
}

// control writes frame f (a kick, a pump) to the worker's control pipe, trying for at most
// wait to get its turn and room there, else dropping it.
func (w *Worker) control(f []byte, wait time.Duration) {
	if w.kicks == nil {
		w.Send(f) //nolint:errcheck // a dead worker is noticed by the owner's wait
		return
	}
	until := time.Now().Add(wait)
	for !w.kmu.TryLock() { // (an honest reply's write ends in a moment)
		if !time.Now().Before(until) {
			return
		}
		time.Sleep(time.Millisecond)
	}
	defer w.kmu.Unlock()
	// (Under PIPE_BUF: the kernel writes the frame whole or not at all.)
	w.kicks.SetWriteDeadline(until.Add(time.Millisecond)) //nolint:errcheck // a pipe without deadlines blocks, as before
	w.kicks.Write(f)                                      //nolint:errcheck // not sent: a kick's hard stage follows, the next pump
	w.kicks.SetWriteDeadline(time.Time{})                 //nolint:errcheck // (likewise)
}

// kickWait is how long a kick may wait for the control pipe (a reply being written) and
// for room in it.
const kickWait = 50 * time.Millisecond

// Answer reads an answer frame's body (pyrt.FrameAnswer): the run id, whether the run was
// kicked, and the response; false if body is no answer.
func Answer(body []byte) (rid uint64, kicked bool, resp []byte, ok bool) {
	if len(body) < 10 || body[0] != pyrt.FrameAnswer {
		return 0, false, nil, false
	}
	return binary.LittleEndian.Uint64(body[1:]), body[9]&pyrt.AnswerKicked != 0, body[10:], true
}

// socketFDs are the descriptors (SCM_RIGHTS) in a message's control data.
func socketFDs(oob []byte) []int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}
