package minipy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/pyrt"
	"github.com/minipy-go/minipy/internal/sandboxfs"
	"github.com/minipy-go/minipy/internal/worker"
)

// Isolated is an engine whose code runs in worker processes: the same Options, Result and
// errors as the in-process engine, plus hard limits. A run that does not yield within a
// grace period after its deadline gets its worker's whole process tree killed; a crashed or
// killed worker is rolled back to its snapshot from before the run (or, without one,
// replaced, and the error says what was lost: ErrStateLost). Sandboxed workers are forked
// from a template process (IsolatedConfig.NoTemplate).
//
// All methods are safe for concurrent use. Runs in namespaces on different workers proceed
// in parallel; runs on one worker take turns.
type Isolated struct {
	cfg      IsolatedConfig
	dir      string           // the engine's private directory: trees and, sandboxed, rootdir
	trees    string           // the trees of the namespaces' working directories (e.work's Path)
	work     *sandboxfs.Trees // the working directories: trees, tmpfs, moves (internal/sandboxfs)
	rootdir  string           // the (empty) mount point of a sandboxed worker's root tmpfs
	sandbox  bool             // local workers get Linux namespaces
	slots    []*workerSlot    // the shared workers; with one worker per namespace, the default's
	perNS    bool             // Workers 0: each namespace gets a slot of its own
	nextNS   atomic.Uint32
	opened   atomic.Int64 // namespaces made and not freed (Stats)
	startRec startRecord  // worker starts (Stats, Ready)
	// opTimeout bounds a namespace operation but a run (defaultOpTimeout; tests shorten it).
	opTimeout time.Duration
	forks     atomic.Uint64 // tokens that pair a Fork's copy with its pipes in the guardian
	spread    atomic.Uint32
	// defaultNS is the namespace of runs that pass no Globals (id 1, on the first worker).
	defaultNS  *nsBinding
	hostReg    hostRegistry
	watch      *sandboxfs.Changes[*nsBinding] // Result.Files
	dirWatches atomic.Int64                   // WatchDir's watches open (watchdir.go)
	terminals  atomic.Int64                   // commands' terminals open (terminal.go)
	portConns  atomic.Int64                   // connections to sandboxes' ports open (ports.go)
	spec       worker.Spec                    // how its workers start, made once
	// cgroups is the engine's cgroup (local workers; nil without one), cgroupErr why it has
	// none when it looked for one.
	cgroups   *worker.Cgroups
	cgroupErr error

	mu        sync.Mutex
	closed    bool
	closeDone chan struct{}            // closed when Close has finished
	own       map[*workerSlot]struct{} // perNS: the slots of the namespaces made, and the spares
	pool      sparePool                // perNS: workers started ahead for the next namespaces

	// The template (sandboxed local workers unless NoTemplate): the process that new
	// workers are forked from. useTemplate turns false if a replacement fails to start.
	tmplMu      sync.Mutex
	tmpl        *worker.Worker
	useTemplate bool

	// egress is IsolatedConfig.Egress, parsed (nil: none; SetEgress replaces it); the counts of its proxies' events.
	egress                                   atomic.Pointer[egressPolicy]
	egressAllowed, egressDenied, egressBytes atomic.Int64

	// Workers that ended between runs (Stats, IsolatedConfig.OnIdleDeath), and of those
	// the ones whose namespaces lost their state.
	idleDeaths, idleLost atomic.Uint64
	deaths               struct{ template, spare, worker, snapshot, sandbox atomic.Uint64 } // Stats' Deaths

}

// nsBinding ties a namespace to the worker slot that holds it. epoch is the worker
// generation holding its variables (0: none yet); it is read and written only while
// holding the slot's token. dirs names the namespace's working directory (its home).
type nsBinding struct {
	slot  *workerSlot
	epoch uint64
	dirs  workDirs
	freed atomic.Bool // counted out of the open namespaces (a free may come twice: Close, then the GC)
}

// NewIsolated starts an isolated engine: it makes its private working directory, starts
// its template (sandboxed workers) and every worker (waiting for the template and the
// first worker, so that a bad configuration is reported here) and returns. Call Close to stop the workers and remove the directory.
func NewIsolated(cfg IsolatedConfig) (*Isolated, error) {
	return newIsolated(cfg, true)
}

// newIsolated is NewIsolated; tests pass sandbox false to act as if the kernel refused
// namespaces, to exercise AllowUnsandboxed on a kernel that allows them.
func newIsolated(cfg IsolatedConfig, sandbox bool) (*Isolated, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	e := &Isolated{cfg: cfg, perNS: cfg.Workers == 0, own: map[*workerSlot]struct{}{}, closeDone: make(chan struct{}),
		opTimeout: defaultOpTimeout}
	e.pool.init(cfg)
	e.watch = e.newFileWatch()
	if cfg.Egress != nil {
		p, err := newEgressPolicy(*cfg.Egress)
		if err != nil {
			return nil, err
		}
		e.egress.Store(p)
	}
	if err := e.chooseSandbox(sandbox); err != nil {
		return nil, err
	}
	if err := e.makeDirs(); err != nil {
		return nil, err
	}
	err = e.openCgroups()
	if err == nil {
		err = e.makeSpec()
	}
	if err == nil && e.sandbox && !cfg.NoTemplate {
		err = e.startTemplate()
	}
	if err == nil {
		err = e.startSlots()
	}
	if err == nil && e.perNS && cfg.Spares > 0 {
		e.mu.Lock()
		e.keepSpares() // asked for by number: ready for the first NewNamespace
		e.mu.Unlock()
	}
	if err != nil {
		e.Close()
		if e.sandbox && cfg.AllowUnsandboxed && errors.Is(err, ErrNoSandbox) {
			return newIsolated(cfg, false) // the kernel refused a mount: no namespaces then
		}
		return nil, err
	}
	return e, nil
}

// chooseSandbox decides whether the engine's local workers get the sandbox (sandbox: try
// it), and refuses a configuration that needs the sandbox when they do not.
func (e *Isolated) chooseSandbox(sandbox bool) error {
	cfg := e.cfg
	if len(cfg.Command) == 0 {
		err := errors.New("namespaces turned off")
		if sandbox {
			err = worker.ProbeNamespaces()
		}
		switch {
		case err == nil:
			e.sandbox = true
		case !cfg.AllowUnsandboxed:
			return fmt.Errorf("%w (%v); set IsolatedConfig.AllowUnsandboxed to run without them", ErrNoSandbox, err)
		}
	}
	if !e.sandbox && cfg.Egress != nil {
		return fmt.Errorf("%w: IsolatedConfig.Egress needs the sandbox's network namespace, which the "+
			"kernel refused", ErrNoSandbox)
	}
	if !e.sandbox {
		for _, m := range cfg.Mounts {
			if m.Target != m.Source {
				return fmt.Errorf("minipy: IsolatedConfig.Mounts: %s cannot appear at %s without the sandbox, "+
					"which the kernel refused", m.Source, m.Target)
			}
		}
	}
	return nil
}

// startTemplate starts the template that sandboxes are forked from, and waits until it is
// ready.
func (e *Isolated) startTemplate() error {
	t, err := e.spec.Launch(worker.Dirs{}, 0)
	if err == nil {
		t, err = e.spec.AwaitReady(t)
	}
	if err != nil {
		return err
	}
	e.tmpl, e.useTemplate = t, true
	go e.watchTemplate(t)
	return nil
}

// startSlots makes the engine's worker slots and starts their first workers, then waits
// for the first: a wrong executable or a refused namespace shows there.
func (e *Isolated) startSlots() error {
	e.nextNS.Store(pyrt.DefaultNamespace)
	e.slots = make([]*workerSlot, max(e.cfg.Workers, 1))
	for i := range e.slots {
		e.slots[i] = &workerSlot{e: e, token: make(turn, 1), dirs: e.newDirs()}
		if err := e.slots[i].dirs.err; err != nil {
			return err
		}
	}
	e.defaultNS = &nsBinding{slot: e.slots[0], dirs: e.slots[0].dirs}
	for _, s := range e.slots {
		s.startNext()
	}
	_, err := e.slots[0].awaitPending(context.Background())
	return err
}

func (e *Isolated) name() string { return fmt.Sprintf("the isolated engine %p", e) }

func (e *Isolated) hosts() *hostRegistry { return &e.hostReg }

// Minipy runs code in the engine with opts (nil: defaults). It is Run with
// context.Background().
func (e *Isolated) Minipy(code string, opts *Options) (*Result, error) {
	return e.Run(context.Background(), code, opts)
}

// Run runs code on the worker that holds opts.Globals (the first worker for the default
// namespace), with the in-process engine's semantics. When the code does not yield to the
// interrupt within a grace period after the deadline, the worker's process tree is killed
// and the error matches ErrTimeout and ErrStateLost; a crashed worker gives a
// *WorkerLostError. Either way the engine starts a replacement worker.
func (e *Isolated) Run(ctx context.Context, code string, opts *Options) (*Result, error) {
	return e.run(ctx, code, opts)
}

// NewNamespace makes a fresh namespace: by default in a worker process of its own, which
// it starts in the background (a start that fails is the error of the namespace's first
// use), else on one of the IsolatedConfig.Workers (spread round-robin). Its variables live
// in that worker; they are lost if the worker is killed or crashes. On a closed engine it
// returns a namespace whose every use fails with ErrEngineClosed.
func (e *Isolated) NewNamespace() *Namespace {
	id := e.nextNS.Add(1)
	if !e.perNS {
		if e.isClosed() {
			return &Namespace{closed: true, ref: ErrEngineClosed}
		}
		// Start after the first slot, which holds the default namespace.
		slot := e.slots[int(e.spread.Add(1))%len(e.slots)]
		dirs, err := e.packedDirs(slot.dirs, id)
		if err != nil {
			return &Namespace{closed: true, ref: err}
		}
		e.opened.Add(1)
		return newNamespace(e, id, &nsBinding{slot: slot, dirs: dirs})
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return &Namespace{closed: true, ref: ErrEngineClosed}
	}
	// The namespace takes a spare, whose worker started ahead (it may still be starting),
	// and the pool's keeper starts another (IsolatedConfig.Spares). Without one, the
	// namespace starts its own worker, which its first use waits for.
	slot := e.pool.take(time.Now())
	e.keepSpares()
	e.mu.Unlock()
	if slot == nil {
		slot = e.ownSlot()
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			e.releaseDirs(slot.dirs) // Close may have removed the engine's directory before they were made
			return &Namespace{closed: true, ref: ErrEngineClosed}
		}
		e.own[slot] = struct{}{}
		e.mu.Unlock()
		slot.startNext()
	}
	slot.ensureDirs() // a spare's: made by its start by now, or waited for
	e.opened.Add(1)
	return newNamespace(e, id, &nsBinding{slot: slot, dirs: slot.dirs})
}

// ownSlot is a slot for the worker of one namespace, with its working directory.
func (e *Isolated) ownSlot() *workerSlot {
	return &workerSlot{e: e, token: make(turn, 1), own: true, dirs: e.newDirs()}
}

// closeOwn ends the worker of a namespace that has one of its own (after the run in
// progress, if any).
func (e *Isolated) closeOwn(slot *workerSlot) {
	if err := slot.token.acquire(context.Background(), deadline{}); err == nil {
		defer slot.token.release()
	}
	e.mu.Lock()
	_, open := e.own[slot]
	delete(e.own, slot)
	e.mu.Unlock()
	slot.shutdown()
	if open { // (once: a tree counts each slot once)
		e.releaseDirs(slot.dirs)
	}
}

// Close kills every worker (and everything they started) and removes the engine's working
// directories. Runs in progress and later calls return an error matching ErrEngineClosed.
// A Close while another is in progress waits for it to finish.
func (e *Isolated) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.closeDone
		return nil
	}
	e.closed = true
	defer close(e.closeDone)
	slots := append([]*workerSlot(nil), e.slots...)
	for s := range e.own {
		slots = append(slots, s)
	}
	e.pool.poke() // its keeper sees the engine closed
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.shutdown()
		}()
	}
	wg.Wait()
	e.pool.keeping.Wait() // (and the closes of spares it trimmed)
	e.tmplMu.Lock()
	t := e.tmpl
	e.tmpl = nil
	e.tmplMu.Unlock()
	if t != nil {
		t.Kill() // (alone: each sandbox forked from it ended with its slot)
		t.AwaitExit()
	}
	e.watch.Close()
	if e.work != nil {
		e.work.Close()
	}
	e.spec.Close()
	var cgErr error
	if e.cgroups != nil {
		cgErr = e.cgroups.Close() // what its sandboxes left (nothing, but for a removal that timed out)
	}
	return errors.Join(os.RemoveAll(e.dir), cgErr)
}

// testCgroupBare, when set, lets an engine made meanwhile take a cgroup2 hierarchy without
// the memory and pids controllers (isolated_export_test.go).
var testCgroupBare bool

// openCgroups gives a local engine its cgroup (IsolatedConfig.Cgroup); an error only when
// the one named cannot be used: without a name, an engine that finds none runs on rlimits
// and keeps the reason for Stats.
func (e *Isolated) openCgroups() error {
	if len(e.cfg.Command) > 0 || e.cfg.NoCgroup {
		return nil
	}
	// (The limits as the workers' rlimits get them: Unlimited is none, Processes' default.)
	c, err := worker.OpenCgroups(worker.CgroupOptions{Parent: e.cfg.Cgroup, MemoryLimit: e.cfg.residentCap(),
		Budget: max(e.cfg.MemoryBudget, 0), Processes: e.cfg.processCap(e.sandbox), Bare: testCgroupBare})
	if err != nil && e.cfg.Cgroup != "" {
		return fmt.Errorf("minipy: IsolatedConfig.Cgroup: %w", err)
	}
	e.cgroups, e.cgroupErr = c, err
	return nil
}

// liveTemplate returns the template that new workers are forked from, starting another if
// it has ended (an engine closed meanwhile gets none); nil when the engine has none.
func (e *Isolated) liveTemplate() *worker.Worker {
	e.tmplMu.Lock()
	defer e.tmplMu.Unlock()
	if !e.useTemplate || e.isClosed() {
		return nil
	}
	if e.tmpl != nil && !e.tmpl.Gone() {
		return e.tmpl
	}
	if e.tmpl != nil {
		e.tmpl.Kill()
		e.tmpl = nil
	}
	var t *worker.Worker
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if t, err = e.spec.Launch(worker.Dirs{}, 0); err == nil {
			t, err = e.spec.AwaitReady(t)
		}
		if !errors.Is(err, worker.ErrStartKilled) || e.isClosed() {
			break // (killed as it started: once more)
		}
	}
	if err != nil {
		e.useTemplate = false // plain starts from now on
		return nil
	}
	if e.isClosed() { // Close has run: it did not see this one
		t.Kill()
		return nil
	}
	e.tmpl = t
	go e.watchTemplate(t)
	return t
}

// watchTemplate counts t's death if it ends while the engine still uses it (Stats' Deaths),
// and starts its successor at once, so that the next start does not wait for it. Nothing
// else notices: the sandboxes forked from it are not in its pid namespace.
func (e *Isolated) watchTemplate(t *worker.Worker) {
	<-t.Exited()
	if e.isClosed() {
		return // (Close ended it)
	}
	e.deaths.template.Add(1) // (dropTemplate kills only one that stopped answering)
	e.liveTemplate()
}

// dropTemplate kills t, a template that failed to answer, so that the next liveTemplate
// starts another rather than wait for the host to see it exit.
func (e *Isolated) dropTemplate(t *worker.Worker) {
	e.tmplMu.Lock()
	defer e.tmplMu.Unlock()
	if e.tmpl == t {
		t.Kill()
		e.tmpl = nil
	}
}

// WorkDir is the host directory that is the working directory (and HOME) of the engine's
// default namespace, the one of runs without Options.Globals; every namespace has one of
// its own (Namespace.WorkDir, which says what the path is with WorkSize). Sandboxed workers
// see it as /work, others at this path. "" for Command workers, whose files are on the far
// side.
func (e *Isolated) WorkDir() string {
	if !e.local() {
		return ""
	}
	return e.dirOf(e.defaultNS)
}

// workDir is Namespace.WorkDir.
func (e *Isolated) workDir(ns *Namespace) string {
	b := bindingOf(ns)
	if b == nil || !e.local() {
		return ""
	}
	return e.dirOf(b)
}

func (e *Isolated) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func bindingOf(ns *Namespace) *nsBinding {
	b, _ := ns.ref.(*nsBinding)
	return b
}

func (e *Isolated) run(ctx context.Context, code string, opts *Options) (res *Result, err error) {
	started := time.Now()
	if e.isClosed() {
		return nil, ErrEngineClosed
	}
	gid, lid, err := namespaceIDs(e, opts)
	if err != nil {
		return nil, err
	}
	bindings, ids, err := e.runBindings(opts, gid, lid)
	if err != nil {
		return nil, err
	}
	slot := bindings[0].slot
	dl, err := admit(ctx, slot.token, slot.calls.Load().inCall(ctx), started, opts)
	if err != nil {
		return nil, err
	}
	defer slot.token.release()
	track := e.beginFiles(bindings[0])
	defer func() {
		files, more := e.endFiles(track)
		if res != nil {
			res.Files, res.MoreFiles = files, more
		}
	}()
	for attempt := 0; ; attempt++ {
		res, err, again := e.attempt(ctx, slot, bindings, ids, opts, dl, code, started, attempt == 0)
		if !again {
			return res, err
		}
	}
}

// attempt is one try of run, on the slot's live worker. When the worker turns out to have
// ended before it read the request (between runs: killed while idle, and the host had not
// heard yet), the request had no effect: if first, attempt settles the worker as an idle
// death (its snapshot takes over, or the namespaces learn of their loss) and reports again,
// and run tries once more on its successor.
func (e *Isolated) attempt(ctx context.Context, slot *workerSlot, bindings []*nsBinding, ids []uint32, opts *Options,
	dl deadline, code string, started time.Time, first bool) (res *Result, err error, again bool) {
	gid, lid := ids[0], uint32(0)
	if len(ids) > 1 {
		lid = ids[1]
	}
	w, err := slot.live(ctx)
	if err != nil {
		return nil, err, false
	}
	create, lost := prepare(slot, w, bindings, ids)
	if lost != nil {
		return nil, lost, false
	}
	if p, ok := w.Attached().(*egressProxy); ok {
		p.newRun() // (Egress.MaxBytes counts per run)
	}
	res = &Result{}
	if create, err = e.registerAgain(w, bindings, ids, create); err != nil {
		res, err = e.lost(slot, w, bindings, nil, res, started)
		return res, err, false
	}
	rid := w.NextRun()
	live := newLiveOutput(opts)
	var calls *hostCalls
	if e.hostReg.has(gid, lid) {
		calls = newHostCalls(ctx, dl, &e.hostReg, gid, lid, w.Reply)
		calls.limit = hostCallLimit(e.cfg.processCap(e.sandbox))
		slot.calls.Store(calls)
		defer func() {
			slot.calls.CompareAndSwap(calls, nil)
			calls.end()
		}()
	}
	h := &isolatedRun{w: w, id: rid, live: live, calls: calls}
	req := runRequest(gid, lid, maxOutput(opts), live != nil, calls != nil, imageLimitsOf(opts), code)
	if err := w.Request(rid, e.deadmanAfter(dl), create, req); err != nil {
		if first && w.Controlled() { // (nothing reads the pipe: the worker has ended)
			slot.settle(w, time.Second)
			return nil, nil, true
		}
		res, err = e.lost(slot, w, bindings, nil, res, started)
		return res, err, false
	}
	stopPump := pumpLive(w, rid, live)
	s := supervise(ctx, h, dl)
	stopPump()
	calls.end()
	live.finish()
	if s.abandoned {
		res, err = e.abandoned(slot, w, bindings, s, res, started)
		return res, err, false
	}
	if h.broke != nil {
		res, err = e.broken(slot, w, bindings, h.broke, res, started)
		return res, err, false
	}
	if h.reply == nil {
		if first && s.cause == nil && w.Unstarted() {
			slot.settle(w, time.Second)
			return nil, nil, true
		}
		res, err = e.ended(slot, w, bindings, s, res, started)
		return res, err, false
	}
	created(w, bindings, ids)
	w.Answered()
	res, err = finish(res, h.reply.resp, h.reply.kicked, s, started)
	if py, ok := err.(*PythonError); ok && py.Type == "MemoryError" && e.cfg.MemoryLimit > 0 {
		return res, &LimitError{Limit: "memory", Python: py}, false
	}
	return res, err, false
}

// runBindings are the namespaces of a run (Globals's, then Locals's if it has one) and
// their ids, which must be in one worker.
func (e *Isolated) runBindings(opts *Options, gid, lid uint32) ([]*nsBinding, []uint32, error) {
	bindings := []*nsBinding{e.defaultNS}
	ids := []uint32{gid}
	if opts != nil && opts.Globals != nil {
		bindings[0] = bindingOf(opts.Globals)
	}
	if lid == 0 {
		return bindings, ids, nil
	}
	lb := bindingOf(opts.Locals)
	if lb.slot != bindings[0].slot {
		if e.perNS {
			return nil, nil, errors.New("minipy: Options.Locals is another process than Options.Globals: each " +
				"namespace of this isolated engine has a worker of its own (set IsolatedConfig.Workers to pack " +
				"namespaces into shared workers, which can run one with another's as Locals)")
		}
		return nil, nil, errors.New("minipy: Options.Locals lives on another worker than Options.Globals; " +
			"an isolated run needs both in one worker (make Locals with the same engine and run it there first)")
	}
	return append(bindings, lb), append(ids, lid), nil
}

// deathReportWait bounds the wait for a guardian's report that its worker ended, which
// says whether a snapshot can take over. The guardian reports at once, but on a loaded
// machine it may wait seconds for a CPU (1 s lost a namespace that had a snapshot, with two
// test suites and -race on 2 cores); a guardian that died ends the wait at once (its exit,
// its line). Past it the namespace is lost, so the bound is generous.
const deathReportWait = 10 * time.Second

// ended handles a run whose worker ended before it answered: rolled back to its snapshot
// when it has one, else lost. A SIGKILL after the run was kicked is the worker's deadman
// timer enforcing the deadline (the host's own kill comes as an abandoned run): the
// error says the run was killed for it.
func (e *Isolated) ended(slot *workerSlot, w *worker.Worker, bindings []*nsBinding, s stop, res *Result,
	started time.Time) (*Result, error) {
	var err error
	if d, ok := w.AwaitDeath(deathReportWait); ok && d.Snapshot {
		res, err = e.rolledBack(slot, w, bindings, nil, res, started)
	} else {
		res, err = e.lost(slot, w, bindings, nil, res, started)
	}
	var lost *WorkerLostError
	if s.cause != nil && errors.As(err, &lost) && lost.Signal == syscall.SIGKILL {
		lost.Killed = true
		lost.Interrupted, _ = s.interrupted(started, nil).(*InterruptedError)
	}
	return res, err
}

// broken handles a request whose worker broke the protocol (why): it is killed, and its
// snapshot, which predates the request, takes over when it has one.
func (e *Isolated) broken(slot *workerSlot, w *worker.Worker, bindings []*nsBinding, why error, res *Result,
	started time.Time) (*Result, error) {
	var err error
	if d, ok := w.KillWorker(deathReportWait); ok && d.Snapshot {
		res, err = e.rolledBack(slot, w, bindings, nil, res, started)
	} else {
		w.Kill()
		res, err = e.lost(slot, w, bindings, nil, res, started)
	}
	var lost *WorkerLostError
	if errors.As(err, &lost) {
		lost.Protocol = why
	}
	return res, err
}

// lost handles a run whose worker ended: wait for its exit status, start a replacement,
// and say what happened.
func (e *Isolated) lost(slot *workerSlot, w *worker.Worker, bindings []*nsBinding, intr *InterruptedError,
	res *Result, started time.Time) (*Result, error) {
	w.Kill() // whatever is left of its process tree
	w.AwaitExit()
	slot.replace(w)
	for _, b := range bindings {
		b.epoch = 0 // this run reports the loss; the namespace starts fresh on the next worker
	}
	res.Duration = time.Since(started)
	if e.isClosed() && intr == nil {
		return res, fmt.Errorf("%w (%w)", ErrEngineClosed, ErrStateLost)
	}
	err := lostError(w, intr)
	if le, ok := err.(*WorkerLostError); ok && e.spec.Rollback && e.local() && !w.Changed() {
		// The worker had answered nothing that changed its state (a new worker makes no
		// snapshot before that: worker.py's serve): its namespaces start on the next worker
		// as they were before this run, which is the rollback. (Without rollback, the loss
		// is reported as one, whatever the worker held.)
		le.RolledBack = true
	}
	return res, err
}

// rolledBack handles a run whose worker ended while its snapshot waits: the snapshot takes
// over, so the namespaces are as they were before the run; if it cannot, the run is lost.
func (e *Isolated) rolledBack(slot *workerSlot, w *worker.Worker, bindings []*nsBinding, intr *InterruptedError,
	res *Result, started time.Time) (*Result, error) {
	select { // the end of what it wrote (a segfault's traceback): its stderr pipe ends with it
	case <-w.StderrDone():
	case <-time.After(time.Second):
	}
	lostErr := lostError(w, intr)
	nw, err := w.RollBack(e.cfg.StartTimeout)
	if err != nil {
		w.Kill()
		return e.lost(slot, w, bindings, intr, res, started)
	}
	slot.mu.Lock()
	if slot.cur == w {
		slot.cur = nw
	}
	slot.mu.Unlock()
	go slot.watch(nw)
	res.Duration = time.Since(started)
	if le, ok := lostErr.(*WorkerLostError); ok {
		le.RolledBack = true
	}
	return res, lostErr
}

// do runs one namespace request on the namespace's worker. Namespace operations wait for
// the worker without a deadline (a run ahead of them ends by its deadline plus the grace).
func (e *Isolated) do(ns *Namespace, op byte, args ...any) (any, error) {
	if e.isClosed() {
		return nil, ErrEngineClosed
	}
	b := bindingOf(ns)
	if b == nil {
		return nil, errors.New("minipy: namespace request without a namespace")
	}
	if b.slot.calls.Load().inCall(nil) {
		return nil, ErrReentrant
	}
	req, err := opRequest(op, args)
	if err != nil {
		return nil, err
	}
	slot := b.slot
	if op == pyrt.OpFree && b != e.defaultNS && b.freed.CompareAndSwap(false, true) {
		e.opened.Add(-1)
		e.watch.Forget(b)
		if !slot.own && e.local() {
			defer e.removeWorkDir(b.dirs) // a packed namespace's, after the worker let go of it
		}
	}
	if op == pyrt.OpFree && slot.own {
		e.closeOwn(slot)
		return nil, nil
	}
	w, err := slot.hold()
	if err != nil {
		return nil, err
	}
	defer slot.token.release()
	for first := true; ; first = false {
		if op == pyrt.OpFree {
			if b.epoch != w.Epoch || !w.Known[ns.id] {
				return nil, nil // nothing of it lives in this worker
			}
			delete(w.Known, ns.id)
		}
		create, lost := prepare(slot, w, []*nsBinding{b}, []uint32{ns.id})
		if lost != nil {
			return nil, lost
		}
		if op != pyrt.OpFree {
			if create, err = e.registerAgain(w, []*nsBinding{b}, []uint32{ns.id}, create); err != nil {
				_, err := e.lost(slot, w, []*nsBinding{b}, nil, &Result{}, time.Now())
				return nil, err
			}
		}
		rid := w.NextRun()
		h := &isolatedRun{w: w, id: rid}
		reqErr, stopped := e.sendOp(slot, h, b, create, req)
		if stopped != nil {
			return nil, stopped
		}
		if h.broke != nil {
			_, err := e.broken(slot, w, []*nsBinding{b}, h.broke, &Result{}, time.Now())
			return nil, err
		}
		if h.reply == nil {
			if first && w.Controlled() && (reqErr != nil || w.Unstarted()) {
				// It ended between requests, before it read this one: as in attempt.
				slot.settle(w, time.Second)
				if w, err = slot.live(context.Background()); err != nil {
					return nil, err
				}
				continue
			}
			_, err := e.ended(slot, w, []*nsBinding{b}, stop{}, &Result{}, time.Now())
			return nil, err
		}
		if op != pyrt.OpFree {
			created(w, []*nsBinding{b}, []uint32{ns.id})
		}
		w.Answered()
		return opReply(h.reply.resp)
	}
}

// defaultOpTimeout bounds a namespace operation other than a run (Save, Restore, Get, Set, Names:
// each goes through do): those run the values' own code (pickling's __reduce__, a conversion's __len__),
// which hostile code can make loop forever, and a host that saves idle sandboxes must not
// wait on it for ever. Past it the operation is stopped as a run's timeout stops a run: a
// kick, then the worker killed and rolled back to its last snapshot (or its state lost),
// and the operation returns an *InterruptedError matching ErrTimeout.
const defaultOpTimeout = 2 * time.Minute

// sendOp sends operation request req as h (creating the namespaces of create first) and
// waits for its answer within e.opTimeout: the request's error, or (stopped) the error of
// an operation that its kicks did not stop (abandoned).
func (e *Isolated) sendOp(slot *workerSlot, h *isolatedRun, b *nsBinding, create []uint32, req []byte) (reqErr, stopped error) {
	started := time.Now()
	dl := deadline{at: started.Add(e.opTimeout)}
	if reqErr = h.w.Request(h.id, e.deadmanAfter(dl), create, req); reqErr != nil {
		return reqErr, nil
	}
	if s := supervise(context.Background(), h, dl); s.abandoned {
		_, stopped = e.abandoned(slot, h.w, []*nsBinding{b}, s, &Result{}, started)
	}
	return nil, stopped
}

// abandoned ends a run or an operation that its kicks did not stop: the isolated engine
// does not leave the code running, its worker is killed and rolled back to its last
// snapshot, or its state lost.
func (e *Isolated) abandoned(slot *workerSlot, w *worker.Worker, bindings []*nsBinding, s stop, res *Result,
	started time.Time) (*Result, error) {
	s.abandoned = false // (its InterruptedError: the worker is dealt with here)
	intr, _ := s.interrupted(started, nil).(*InterruptedError)
	if d, ok := w.KillWorker(deathReportWait); ok && d.Snapshot {
		return e.rolledBack(slot, w, bindings, intr, res, started)
	}
	w.Kill()
	return e.lost(slot, w, bindings, intr, res, started)
}

// fork is Namespace.Fork: the namespace's worker forks a copy of itself, which its
// guardian hands pipes and a control socket of its own (docs/protocol.md, "Fork"); the copy
// becomes the worker of a new slot, holding the namespace's variables under a new id.
func (e *Isolated) fork(ns *Namespace) (*Namespace, error) {
	b, err := e.forkable(ns)
	if err != nil {
		return nil, err
	}
	slot := b.slot
	w, err := slot.hold()
	if err != nil {
		return nil, err
	}
	defer slot.token.release()
	if !w.Controlled() {
		return nil, fmt.Errorf("%w: its worker has no control socket", ErrNoFork)
	}
	ids := []uint32{ns.id}
	create, lost := prepare(slot, w, []*nsBinding{b}, ids)
	if lost != nil {
		return nil, lost
	}
	if create, err = e.registerAgain(w, []*nsBinding{b}, ids, create); err != nil {
		_, err := e.lost(slot, w, []*nsBinding{b}, nil, &Result{}, time.Now())
		return nil, err
	}
	id := e.nextNS.Add(1)
	dirs, err := e.shareDirs(slot.dirs, id) // the copy moves its files there (worker.py)
	if err != nil {
		return nil, err
	}
	copied := false
	defer func() {
		if !copied {
			e.releaseDirs(dirs)
		}
	}()
	token := e.forks.Add(1)
	req := []byte{pyrt.OpFork}
	req = binary.LittleEndian.AppendUint64(req, token)
	req = binary.LittleEndian.AppendUint32(req, ns.id)
	req = binary.LittleEndian.AppendUint32(req, id)
	h := &isolatedRun{w: w, id: w.NextRun()}
	if err := w.Request(h.id, 0, create, req); err == nil {
		for !h.wait(-1) {
		}
	}
	if h.reply == nil {
		_, err := e.lost(slot, w, []*nsBinding{b}, nil, &Result{}, time.Now())
		return nil, err
	}
	created(w, []*nsBinding{b}, ids)
	if _, err := opReply(h.reply.resp); err != nil {
		return nil, err
	}
	cw, err := w.Copy(token, id, e.cfg.StartTimeout)
	if err != nil {
		return nil, fmt.Errorf("%w: the copy did not start: %w", ErrNoFork, err)
	}
	copySlot := &workerSlot{e: e, token: make(turn, 1), own: true, cur: cw, epoch: 1, dirs: dirs}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		cw.Kill()
		return nil, ErrEngineClosed
	}
	e.own[copySlot] = struct{}{}
	e.mu.Unlock()
	go copySlot.watch(cw)
	copied = true
	e.hostReg.fork(ns.id, id)
	e.opened.Add(1)
	return newNamespace(e, id, &nsBinding{slot: copySlot, epoch: 1, dirs: dirs}), nil
}

// forkable is ns's binding, or why ns cannot be forked: a copy of its worker's process
// must hold ns alone, be a local worker's (with a guardian minipy controls), and not be
// asked for from inside one of ns's own host calls.
func (e *Isolated) forkable(ns *Namespace) (*nsBinding, error) {
	if e.isClosed() {
		return nil, ErrEngineClosed
	}
	b := bindingOf(ns)
	if b == nil || !b.slot.own {
		return nil, fmt.Errorf("%w: its worker holds other namespaces too (IsolatedConfig.Workers packs them, "+
			"or it is the engine's default namespace): a copy of the process would copy theirs", ErrNoFork)
	}
	if len(e.cfg.Command) > 0 {
		return nil, fmt.Errorf("%w: Command workers run elsewhere, without a guardian that minipy controls", ErrNoFork)
	}
	if b.slot.calls.Load().inCall(nil) {
		return nil, ErrReentrant
	}
	return b, nil
}

// registerAgain binds the host functions of the namespaces that w is about to create
// (create, from prepare) in w, when they have any: a worker that replaced a lost one
// starts them empty, but their functions are the host's to keep. It returns what is left
// to create.
func (e *Isolated) registerAgain(w *worker.Worker, bindings []*nsBinding, ids, create []uint32) ([]uint32, error) {
	for _, id := range create {
		specs := e.hostReg.specs(id)
		if specs == nil {
			continue
		}
		req, err := opRequest(pyrt.OpRegister, []any{int64(id), specs})
		if err != nil {
			return create, err
		}
		h := &isolatedRun{w: w, id: w.NextRun()}
		if err := w.Request(h.id, 0, create, req); err == nil {
			for !h.wait(-1) {
			}
		}
		if h.reply == nil {
			return create, ErrStateLost
		}
		if _, err := opReply(h.reply.resp); err != nil {
			return create, err
		}
		created(w, bindings, ids)
		w.Answered()
		create = nil // the request above created them all
	}
	return create, nil
}

// deadmanSlack is how long after the host's own hard kill (deadline + abandonAfter) a
// worker kills itself if the run is still going: late enough that the host's kill, which
// says what happened, comes first when it can; early enough that a worker the host can no
// longer reach (a dead ssh connection) is gone within a second of its kill.
const deadmanSlack = 200 * time.Millisecond

// deadmanAfter is the worker's self-kill delay for a run with deadline dl (0: none). Only
// Command workers get one: the host kills a local worker's guardian itself, reliably.
func (e *Isolated) deadmanAfter(dl deadline) uint32 {
	if dl.at.IsZero() || len(e.cfg.Command) == 0 {
		return 0
	}
	ms := (time.Until(dl.at) + abandonAfter + deadmanSlack + time.Millisecond - 1) / time.Millisecond
	return uint32(min(max(ms, 1), 1<<31))
}

// isolatedRun adapts a request in flight on a worker to runHandle.
type isolatedRun struct {
	w     *worker.Worker
	id    uint64
	live  *liveOutput  // the run's live output, or nil
	calls *hostCalls   // the run's host calls, or nil
	reply *workerReply // set once wait reports the run finished with an answer
	ended bool         // the worker ended (or broke the protocol) before answering
	broke error        // what the worker sent that no worker sends (it must be killed), or nil
}

func (r *isolatedRun) wait(d time.Duration) bool {
	if r.reply != nil || r.ended {
		return true
	}
	var until time.Time
	if d >= 0 {
		until = time.Now().Add(d)
	}
	for {
		body, err := r.w.ReadFrame(until)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if r.w.Ended() { // the guardian reported the worker's end (its snapshot holds the pipe)
				r.ended = true
				return true
			}
			return false
		case err != nil:
			if errors.Is(err, errNotProtocol) {
				r.broke = err
			}
			r.ended = true
			return true
		case body[0] == pyrt.FrameOutput || body[0] == pyrt.FrameCall:
			if err := (runEvents{live: r.live, calls: r.calls}).event(body, r.id); err != nil {
				r.broke = err
				r.ended = true
				return true
			}
			continue
		}
		// This run's answer ends the wait; anything else (a late ready frame, say) is skipped.
		if rid, kicked, resp, ok := worker.Answer(body); ok && rid == r.id {
			r.reply = &workerReply{id: rid, kicked: kicked, resp: resp}
			return true
		}
	}
}

func (r *isolatedRun) kick(stage int) { r.w.Kick(r.id, stage) }

func (r *isolatedRun) runQueueWaits() map[int]time.Duration { return r.w.RunQueueWaits() }

func (r *isolatedRun) wake() { r.w.Wake() }

// workerSlot is one of the engine's worker positions: the live worker, its replacement
// being started, and the token a request holds while in flight.
type workerSlot struct {
	e     *Isolated
	token turn
	own   bool     // the worker of one namespace (IsolatedConfig.Workers 0)
	dirs  workDirs // the working directory and tree its workers bind
	// lazyDirs: dirs is made by ensureDirs, which whoever reads dirs calls first (a spare
	// makes them in its start, in the background).
	lazyDirs bool
	dirsOnce sync.Once
	// calls is the host calls of the run in progress, if it may make any: a Run or
	// Namespace method on this slot from inside one of them fails with ErrReentrant.
	calls atomic.Pointer[hostCalls]

	mu      sync.Mutex
	cur     *worker.Worker
	pending chan struct{} // closed when the start in progress ends
	started *worker.Worker
	err     error
	epoch   uint64
	closed  bool
	stop    chan struct{} // closed by shutdown: the watches of its workers end (stopped)
	// idle is the last of its workers that ended between runs with no snapshot to take
	// over: the namespaces it held learn of it at their next use (prepare).
	idle *idleLoss
}

// idleLoss is a worker (of epoch) that ended between runs, and the error of its namespaces.
type idleLoss struct {
	epoch uint64
	err   WorkerLostError
}

// stopped is closed when the slot shuts down.
func (s *workerSlot) stopped() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop == nil {
		s.stop = make(chan struct{})
		if s.closed {
			close(s.stop)
		}
	}
	return s.stop
}

// watch waits for w, a worker of the slot, to end. One that ends between runs is settled
// at once, so that the namespace's next run finds its successor (or its snapshot) ready,
// and a NewNamespace never takes a dead spare: a run or request that holds the slot's
// token meanwhile deals with the death itself (live, or its own failure).
func (s *workerSlot) watch(w *worker.Worker) {
	stop := s.stopped()
	if !w.WaitEnd(stop) {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if s.token.acquire(ctx, deadline{}) != nil {
		return
	}
	defer s.token.release()
	s.mu.Lock()
	mine := s.cur == w || s.started == w && s.pending != nil
	s.mu.Unlock()
	if mine {
		s.live(ctx) //nolint:errcheck // a failed replacement is the next run's error
	}
}

// settle deals with w, the slot's current worker, which ended while no request was in
// flight: its snapshot takes over when it holds the state of the last answer (the
// namespaces lose nothing); else w is replaced, and the namespaces it held learn at their
// next use that their variables are gone (idleLoss). It returns the worker that took
// over, or nil. wait bounds the wait for the guardian's report of the death (a request
// that found the worker gone may be ahead of it). The caller holds the token.
func (s *workerSlot) settle(w *worker.Worker, wait time.Duration) *worker.Worker {
	at := time.Now()
	d, reported := w.AwaitDeath(wait)
	if reported {
		at = d.At
	}
	held := s.held(w)
	s.e.countDeath(s, reported)
	if reported && d.Snapshot && !w.Gone() {
		how := lostError(w, nil).(*WorkerLostError)
		if nw, err := w.RollBack(s.e.cfg.StartTimeout); err == nil {
			s.mu.Lock()
			if s.cur == w {
				s.cur = nw
			}
			s.mu.Unlock()
			go s.watch(nw)
			how.Earlier, how.Idle, how.At, how.RolledBack = true, true, at, true
			s.e.idleDeath(IdleDeath{At: at, How: how, Namespaces: held})
			return nw
		}
	}
	w.Kill() // whatever is left of its process tree
	w.AwaitExit()
	if !reported {
		// Its last frames: a guardian without a control socket (a Command worker's) says
		// how the worker ended in its exit frame.
		until := time.Now().Add(time.Second)
		for {
			if _, err := w.ReadFrame(until); err != nil {
				break
			}
		}
	}
	how := lostError(w, nil).(*WorkerLostError)
	how.Earlier, how.Idle, how.At = true, true, at
	if held > 0 {
		s.mu.Lock()
		s.idle = &idleLoss{epoch: w.Epoch, err: *how}
		s.mu.Unlock()
	}
	s.replace(w)
	s.e.idleDeath(IdleDeath{At: at, How: how, Namespaces: held})
	return nil
}

// held is the number of namespaces whose state w holds (IdleDeath.Namespaces).
func (s *workerSlot) held(w *worker.Worker) int {
	if !w.Changed() {
		return 0
	}
	n := len(w.Known)
	if s.e.defaultNS == nil || s.e.defaultNS.slot != s {
		n-- // (every worker holds the default namespace's id; only the first slot serves it)
	}
	return max(n, 0)
}

// countDeath counts the death between runs of the worker of slot s (Stats' Deaths): a spare's,
// a worker whose guardian reported its end, or a sandbox's pid 1 (the guardian) that ended
// without a report, and everything in its pid namespace with it.
func (e *Isolated) countDeath(s *workerSlot, reported bool) {
	e.mu.Lock()
	spare := e.pool.has(s)
	e.mu.Unlock()
	switch {
	case spare:
		e.deaths.spare.Add(1)
	case reported || !e.sandbox || !e.local():
		e.deaths.worker.Add(1) // (a Command worker's or an unsandboxed one's end is its worker's)
	default:
		e.deaths.sandbox.Add(1)
	}
}

// idleDeath counts a worker that ended between runs and tells the engine's observer.
func (e *Isolated) idleDeath(d IdleDeath) {
	e.idleDeaths.Add(1)
	if !d.How.RolledBack && d.Namespaces > 0 {
		e.idleLost.Add(1)
	}
	if f := e.cfg.OnIdleDeath; f != nil {
		go f(d)
	}
}

// startNext starts the slot's next worker in the background (workers are started ahead of
// need: at NewIsolated, at NewNamespace for a namespace's own, and as soon as one is lost).
func (s *workerSlot) startNext() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.pending != nil {
		return
	}
	s.epoch++
	epoch := s.epoch
	done := make(chan struct{})
	s.pending = done
	go func() {
		s.ensureDirs()
		w, err := startWorker(s.e, s.dirs, epoch)
		if !errors.Is(err, ErrEngineClosed) {
			s.e.startRec.note(err)
		}
		s.mu.Lock()
		if s.closed && w != nil {
			w.Kill()
			w, err = nil, ErrEngineClosed
		}
		s.started, s.err = w, err
		close(done)
		s.mu.Unlock()
		if w != nil {
			s.watch(w)
		}
	}()
}

// startDone is closed when the slot's start in progress ends (at once without one).
func (s *workerSlot) startDone() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != nil {
		return s.pending
	}
	done := make(chan struct{})
	close(done)
	return done
}

// ensureDirs makes a lazyDirs slot's directories, once; a second caller waits for the
// first. An engine closed meanwhile may have removed their parent: they are released, and
// the slot's starts fail with ErrEngineClosed.
func (s *workerSlot) ensureDirs() {
	if !s.lazyDirs {
		return
	}
	s.dirsOnce.Do(func() {
		d := s.e.newDirs()
		if d.err == nil && s.e.isClosed() {
			s.e.releaseDirs(d)
			d = workDirs{err: ErrEngineClosed}
		}
		s.dirs = d
	})
}

// awaitPending waits for the start in progress and makes its worker current.
func (s *workerSlot) awaitPending(ctx context.Context) (*worker.Worker, error) {
	s.mu.Lock()
	done := s.pending
	s.mu.Unlock()
	if done == nil {
		return nil, ErrEngineClosed
	}
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != done {
		return s.cur, nil // someone else took it
	}
	s.pending = nil
	if s.err != nil {
		err := s.err
		s.err = nil
		return nil, err
	}
	s.cur, s.started = s.started, nil
	return s.cur, nil
}

// live returns the slot's worker, replacing one that ended while idle. The caller holds
// the token.
func (s *workerSlot) live(ctx context.Context) (*worker.Worker, error) {
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		w, closed := s.cur, s.closed
		s.mu.Unlock()
		if closed {
			return nil, ErrEngineClosed
		}
		if w != nil {
			if w.Gone() || w.Ended() { // between runs
				if nw := s.settle(w, 0); nw != nil {
					return nw, nil
				}
				continue
			}
			return w, nil
		}
		s.startNext() // no-op when a start is in progress
		w, err := s.awaitPending(ctx)
		if err != nil {
			if attempt < 1 && !errors.Is(err, ErrEngineClosed) && ctx.Err() == nil {
				continue // one retry: a replacement can fail while the machine is busy
			}
			return nil, err
		}
		if w != nil && (w.Gone() || w.Ended()) && attempt < 1 {
			// Ended while it waited (a spare, a template's death): once more.
			if nw := s.settle(w, 0); nw != nil {
				return nw, nil
			}
			continue
		}
		if w != nil {
			return w, nil
		}
	}
}

// hold takes the slot's token, waiting without a deadline, and returns its live worker;
// the caller releases the token (unless hold failed).
func (s *workerSlot) hold() (*worker.Worker, error) {
	if err := s.token.acquire(context.Background(), deadline{}); err != nil {
		return nil, err
	}
	w, err := s.live(context.Background())
	if err != nil {
		s.token.release()
		return nil, err
	}
	return w, nil
}

// replace drops w (which has ended) and starts its successor.
func (s *workerSlot) replace(w *worker.Worker) {
	s.mu.Lock()
	if s.cur == w {
		s.cur = nil
	}
	s.mu.Unlock()
	s.startNext()
}

func (s *workerSlot) shutdown() {
	s.mu.Lock()
	if !s.closed && s.stop != nil {
		close(s.stop)
	}
	s.closed = true
	cur, started, pending := s.cur, s.started, s.pending
	s.mu.Unlock()
	for _, w := range []*worker.Worker{cur, started} {
		if w != nil {
			w.Kill()
			w.AwaitExit()
		}
	}
	if pending != nil {
		<-pending
		s.mu.Lock()
		w := s.started
		s.mu.Unlock()
		if w != nil {
			w.Kill()
			w.AwaitExit()
		}
	}
}

// ToolSchemaFor describes the tool that e.CallTool serves, as ToolSchemaFor does for the
// in-process engine: opts' limits, and the Python version and importable libraries of this
// engine's workers (its Python may be another one, a project's venv say).
func (e *Isolated) ToolSchemaFor(opts *Options) *Tool {
	var info pythonInfo
	if ns := e.NewNamespace(); ns != nil {
		info, _ = engineInfo(e, ns) // a worker that cannot start: the description omits it
		ns.Close()
	}
	return toolSchema(info, opts)
}

// CallTool is CallTool with the code run in this engine's workers: the engine to offer a
// model whose code should not share the host process. opts.Globals, if set, must be a
// namespace of e.
func (e *Isolated) CallTool(ctx context.Context, input json.RawMessage, opts *Options) (text string, isError bool) {
	r := callTool(ctx, e, input, opts)
	return r.Text, r.IsError
}

// CallToolResult is CallTool that also returns the images the code showed (see
// ToolResult).
func (e *Isolated) CallToolResult(ctx context.Context, input json.RawMessage, opts *Options) ToolResult {
	return callTool(ctx, e, input, opts)
}
