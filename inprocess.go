package minipy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/cpython"
	"github.com/minipy-go/minipy/internal/procstat"
	"github.com/minipy-go/minipy/internal/pyrt"
)

// DefaultKickSignal is the signal the in-process engine uses to interrupt a run unless
// Start says otherwise: a real-time signal (SIGRTMAX-3 on Linux) that Go and common C
// libraries leave alone. minipy installs its own handler for it when the interpreter starts;
// the host program must not use it (os/signal.Notify on it would break timeouts).
const DefaultKickSignal = syscall.Signal(61)

// Config configures the process's embedded interpreter (see Start).
type Config struct {
	// KickSignal is the signal used to interrupt runs; 0 means DefaultKickSignal. It must
	// be a real-time signal from SIGRTMIN+2 (34) to SIGRTMAX (64): glibc keeps 32 and 33,
	// and a standard signal would take a handler away from the Go runtime.
	KickSignal syscall.Signal
}

type inProcessEngine struct {
	interp *cpython.Interpreter
	// token is held while a request is in flight on the interpreter. A run that is
	// abandoned (its code would not yield) hands the token to a goroutine that waits for
	// the interpreter to finish, so later runs queue behind it with their own deadlines.
	token turn

	// abandoned is closed while an abandoned run holds the interpreter (and replaced by a
	// fresh channel when that run ends): namespace operations, which take no deadline,
	// then fail with ErrInterpreterBusy instead of waiting for a C call that may never end.
	mu        sync.Mutex
	abandoned chan struct{}

	hostReg hostRegistry
	// calls is the host calls of the run in progress, if it may make any: the call servers
	// serve them, and a Run or Namespace method from inside one fails with ErrReentrant.
	calls   atomic.Pointer[hostCalls]
	servers atomic.Int32 // goroutines in serveCalls
	waiting atomic.Int32 // of them, those waiting for a call (or starting to)
}

var process struct {
	once   sync.Once
	config Config
	engine *inProcessEngine
	err    error
}

// Start starts the in-process interpreter now with cfg instead of lazily on the first run
// with the defaults. The interpreter lives for the rest of the process; Start returns an
// error if it is already running with another configuration or could not start.
func Start(cfg Config) error {
	if cfg.KickSignal == 0 {
		cfg.KickSignal = DefaultKickSignal
	}
	if cfg.KickSignal < 34 || cfg.KickSignal > 64 {
		return fmt.Errorf("%w: got %d", ErrKickSignal, int(cfg.KickSignal))
	}
	_, err := startInProcess(cfg)
	if err == nil && process.config != cfg {
		return fmt.Errorf("%w with %+v", ErrAlreadyStarted, process.config)
	}
	return err
}

func startInProcess(cfg Config) (*inProcessEngine, error) {
	process.once.Do(func() {
		process.config = cfg
		interp, err := cpython.Start(int(cfg.KickSignal))
		if err != nil {
			process.err = err
			return
		}
		process.engine = &inProcessEngine{interp: interp, token: make(turn, 1), abandoned: make(chan struct{})}
		cpython.SetInlineHandler(process.engine.serveInline)
	})
	return process.engine, process.err
}

func inProcess() (*inProcessEngine, error) {
	return startInProcess(Config{KickSignal: DefaultKickSignal})
}

func (*inProcessEngine) name() string { return "the in-process engine" }

func (e *inProcessEngine) hosts() *hostRegistry { return &e.hostReg }

// inProcessRun adapts a cpython.Request to runHandle, passing the run's events to live.
type inProcessRun struct {
	e     *inProcessEngine
	req   cpython.Request
	live  *liveOutput
	woken atomic.Bool // wake was called: a wait must return even if events kept it going

	lastTake time.Time // when events were last taken
}

// liveBatch is the least time between two takes of a run's events: a run that prints in
// a loop then costs one hand-over per batch, not one per print.
const liveBatch = 2 * time.Millisecond

func (r *inProcessRun) wait(d time.Duration) bool {
	var until time.Time
	if d >= 0 {
		until = time.Now().Add(d)
	}
	for {
		// Right after a take, wait for the end (or a wake) only, for up to liveBatch.
		batch := r.live != nil && !r.lastTake.IsZero() && time.Since(r.lastTake) < liveBatch
		step := d
		if batch && (step < 0 || step > liveBatch) {
			step = liveBatch
		}
		done := r.req.Wait(step, r.live != nil && !batch)
		got := r.takeEvents()
		if done {
			return true
		}
		if r.woken.Swap(false) || (!got && !batch) {
			return false // woken to look at the context, or timed out
		}
		if d >= 0 {
			if d = time.Until(until); d <= 0 {
				return false
			}
		}
	}
}

// takeEvents hands the run's queued events to its live output; it reports whether there
// were any.
func (r *inProcessRun) takeEvents() bool {
	if r.live == nil {
		return false
	}
	frames, dropped := r.req.Events()
	r.live.drop(streamStdout, dropped)
	if len(frames) == 0 && dropped == 0 {
		return false
	}
	r.lastTake = time.Now()
	if len(frames) == 0 {
		return true
	}
	runEvents{live: r.live}.frames(frames, r.req.ID()) //nolint:errcheck // the C side writes well-formed frames
	return true
}

// callServerIdle is how long a call server beyond the first waits for a call before it
// ends; the first stays, asleep in a futex. maxCallServers bounds them: calls beyond that
// many at once wait for a server.
const (
	callServerIdle = 10 * time.Second
	maxCallServers = 256
)

// startCallServer starts a goroutine that serves host calls (serveCalls). It counts as
// waiting from now: a goroutine that blocks in C needs a thread of its own, which may take
// a while to start, and more must not be started meanwhile.
func (e *inProcessEngine) startCallServer() {
	e.servers.Add(1)
	e.waiting.Add(1)
	go e.serveCalls()
}

// serveCalls serves the host calls of the interpreter's code, one at a time, each on this
// goroutine (see mp_call in cpython.c). Before it starts a call it makes sure another
// server waits: a function may take long, and other threads' calls must not wait for it.
func (e *inProcessEngine) serveCalls() {
	for {
		frame := cpython.NextCall(callServerIdle)
		if frame == nil {
			if n := e.servers.Load(); n > 1 && e.servers.CompareAndSwap(n, n-1) {
				e.waiting.Add(-1)
				return
			}
			continue
		}
		if e.waiting.Add(-1) == 0 && e.servers.Load() < maxCallServers {
			e.startCallServer()
		}
		e.serveCall(frame)
		e.waiting.Add(1)
	}
}

// serveCall serves one call event (u32 length, kind, u64 generation, u64 call id, payload).
func (e *inProcessEngine) serveCall(frame []byte) {
	h, id, v, refused := e.callOf(frame)
	if refused {
		cpython.Reply(id, pyrt.CallRefused, []byte(notInRun))
		return
	}
	h.serve(id, v)
}

// serveInline serves a call event of a Function.Inline function on the interpreter's own
// thread (the calling Python code waits in C, without the GIL) and returns the reply.
func (e *inProcessEngine) serveInline(frame []byte) (byte, []byte) {
	h, _, v, refused := e.callOf(frame)
	if refused {
		return pyrt.CallRefused, []byte(notInRun)
	}
	if hf := h.function(v); hf != nil && !hf.fn.Inline {
		// Code that calls the runtime's hook itself: only Inline functions run here.
		return pyrt.CallRefused, fmt.Appendf(nil, "%s() is not an inline function", hf.fn.Name)
	}
	h.inflight.Add(1)
	defer h.inflight.Add(-1)
	return h.run(v)
}

const notInRun = "host functions can be called only while a run of their namespace is in progress"

// callOf decodes a call event and finds the run it belongs to; refused: it belongs to none
// (a run that ended, or a frame that is not a call).
func (e *inProcessEngine) callOf(frame []byte) (h *hostCalls, id uint64, v any, refused bool) {
	if len(frame) < 4+1+8+8 {
		return nil, 0, nil, true // never: the C side makes these frames
	}
	gen := binary.LittleEndian.Uint64(frame[5:])
	id, v, err := decodeCall(frame[13:])
	h = e.calls.Load()
	for h != nil && h.gen.Load() == 0 { // the run is being submitted: its generation comes next
		runtime.Gosched()
		h = e.calls.Load()
	}
	if err != nil || h == nil || h.gen.Load() != gen {
		return nil, id, nil, true
	}
	return h, id, v, false
}

func (r *inProcessRun) kick(stage int) { r.req.Kick(stage) }

func (r *inProcessRun) runQueueWaits() map[int]time.Duration {
	tid := r.e.interp.ThreadID()
	if d, ok := procstat.TaskWait(os.Getpid(), tid); ok {
		return map[int]time.Duration{tid: d}
	}
	return nil
}

func (r *inProcessRun) wake() {
	r.woken.Store(true)
	r.e.interp.Wake()
}

func (e *inProcessEngine) run(ctx context.Context, code string, opts *Options) (*Result, error) {
	started := time.Now()
	gid, lid, err := namespaceIDs(e, opts)
	if err != nil {
		return nil, err
	}
	dl, err := admit(ctx, e.token, e.calls.Load().inCall(ctx), started, opts)
	if err != nil {
		return nil, err
	}
	live := newLiveOutput(opts)
	var calls *hostCalls
	if e.hostReg.has(gid, lid) {
		calls = newHostCalls(ctx, dl, &e.hostReg, gid, lid, cpython.Reply)
		e.calls.Store(calls)
		if e.servers.Load() == 0 {
			e.startCallServer()
		}
	}
	h := &inProcessRun{e: e, live: live}
	h.req = e.interp.Submit(runRequest(gid, lid, maxOutput(opts), live != nil, calls != nil, imageLimitsOf(opts), code), calls != nil)
	if calls != nil {
		calls.gen.Store(h.req.ID())
	}
	s := supervise(ctx, h, dl)
	if calls != nil {
		e.calls.CompareAndSwap(calls, nil)
		calls.end()
	}
	live.finish()
	res := &Result{}
	if s.abandoned {
		e.mu.Lock()
		close(e.abandoned)
		e.mu.Unlock()
		go func() {
			h.req.WaitDone()
			h.req.Take()
			e.mu.Lock()
			e.abandoned = make(chan struct{})
			e.mu.Unlock()
			e.token.release()
		}()
		res.Duration = time.Since(started)
		return res, s.interrupted(started, nil)
	}
	resp, kicked := h.req.Take()
	e.token.release()
	return finish(res, resp, kicked, s, started)
}

// waitCause is the InterruptedError cause for a run that never got the interpreter.
func waitCause(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return context.DeadlineExceeded
	}
	return err
}

// do runs one namespace request. Namespace operations are quick, so they wait for the
// interpreter without a deadline, except behind an abandoned run.
func (e *inProcessEngine) do(ns *Namespace, op byte, args ...any) (any, error) {
	req, err := opRequest(op, args)
	if err != nil {
		return nil, err
	}
	if e.calls.Load().inCall(nil) {
		return nil, ErrReentrant
	}
	e.mu.Lock()
	abandoned := e.abandoned
	e.mu.Unlock()
	select {
	case e.token <- struct{}{}:
	case <-abandoned:
		return nil, ErrInterpreterBusy
	}
	r := e.interp.Submit(req, false)
	r.WaitDone()
	resp, _ := r.Take()
	e.token.release()
	return opReply(resp)
}
