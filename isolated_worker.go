package minipy

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/minipy-go/minipy/internal/cpython"
	"github.com/minipy-go/minipy/internal/worker"
)

// The engine's side of its workers: internal/worker starts them and speaks their protocol;
// here is what the engine makes of them (which namespaces they hold, how a loss is told).

// workerReply is a worker's answer to one request.
type workerReply struct {
	id     uint64
	kicked bool
	resp   []byte
}

// errNotProtocol is matched by the errors of a worker that broke the protocol.
var errNotProtocol = ErrProtocol

// testBeats, when set, replaces an engine's Command worker beats as it is made
// (isolated_export_test.go).
var testBeats *worker.Beats

// makeSpec says how e's workers start (worker.Spec), once, as e starts; a Mount that the
// sandboxed workers could not use, even through an idmapped mount, is its error
// (worker.Spec.PrepareMounts).
func (e *Isolated) makeSpec() error {
	cfg := e.cfg
	e.spec = worker.Spec{
		Python: cfg.Python, Command: cfg.Command, CommandShell: cfg.CommandShell,
		Sandbox: e.sandbox, Network: cfg.Network, Env: cfg.Env, Trees: e.trees, RootDir: e.rootdir,
		Workdir: cfg.WorkDirPath,
		// (Unlimited, negative, is the Spec's 0: none.)
		TmpSize: cfg.TmpSize, MemoryLimit: max(cfg.MemoryLimit, 0), FileSizeLimit: max(cfg.FileSizeLimit, 0),
		OpenFiles: max(cfg.OpenFiles, 0), Processes: cfg.processCap(e.sandbox), CPULimit: max(cfg.CPULimit, 0),
		KickSignal: cfg.KickSignal, StartTimeout: cfg.StartTimeout,
		Packed: !e.perNS, Rollback: !cfg.NoRollback, Preload: cfg.Preload, Startup: cfg.Startup, ForkCode: forkCode(cfg),
		Beats: worker.DefaultBeats, Ready: readyFrame, MaxTransfer: int(cfg.MaxTransfer), Cgroups: e.cgroups,
		Egress: e.egress.Load() != nil, OnSnapshotDied: func() { e.deaths.snapshot.Add(1) },
		RootUser: cfg.RootUser,
	}
	if err := e.spec.CheckRootUser(e.sandbox && !cfg.NoTemplate); err != nil {
		return err
	}
	if testBeats != nil {
		e.spec.Beats = *testBeats
	}
	for _, m := range cfg.Mounts {
		e.spec.Mounts = append(e.spec.Mounts, worker.Mount{Source: m.Source, Target: m.Target, Writable: m.Writable})
	}
	return e.spec.PrepareMounts()
}

// testOSFork, when set, makes the workers of an engine made then fork their snapshots,
// and its template its sandboxes, with os.fork (isolated_export_test.go).
var testOSFork bool

// forkCode is the machine code that local workers fork their snapshots, and a template its
// sandboxes, with (cpython.ForkCode); nil for Command workers, which may run on another
// machine.
func forkCode(cfg IsolatedConfig) []byte {
	if len(cfg.Command) > 0 || testOSFork {
		return nil
	}
	return cpython.ForkCode()
}

// dirsOf names d for internal/worker (the template: no tree).
func dirsOf(d workDirs) worker.Dirs {
	if d.tree == nil {
		return worker.Dirs{}
	}
	return worker.Dirs{Tree: d.tree.Name, Home: d.home}
}

// startAttempts is how many times a worker start is tried when something from outside
// ended it (worker.ErrStartKilled, worker.ErrTemplateGone): a process killed as it starts
// is no reason to fail a run.
const startAttempts = 3

// startWorker starts a worker for e with dirs and waits until it is ready (startOnce),
// again when a kill from outside ended the start, up to startAttempts.
func startWorker(e *Isolated, dirs workDirs, epoch uint64) (*worker.Worker, error) {
	for attempt := 1; ; attempt++ {
		w, err := startOnce(e, dirs, epoch)
		if err == nil && e.egress.Load() != nil {
			err = e.serveEgress(w, treeRules(dirs))
		}
		if err == nil || attempt == startAttempts || e.isClosed() ||
			!errors.Is(err, worker.ErrStartKilled) && !errors.Is(err, worker.ErrTemplateGone) {
			return w, err
		}
	}
}

// startOnce starts a worker for e with dirs and waits until it is ready: forked from e's
// template when it has one, else a process of its own.
func startOnce(e *Isolated, dirs workDirs, epoch uint64) (*worker.Worker, error) {
	if dirs.err != nil {
		return nil, dirs.err
	}
	if t := e.liveTemplate(); t != nil {
		err := e.moveMounts(dirs.tree, t)
		var w *worker.Worker
		if err == nil {
			w, err = e.spec.Spawn(t, dirsOf(dirs), epoch)
		}
		if err == nil {
			w, err = e.spec.AwaitReady(w)
		}
		gone := errors.Is(err, worker.ErrTemplateGone)
		if gone {
			e.dropTemplate(t) // (it died, and the host may not have seen it exit yet)
		}
		if err == nil || e.isClosed() || gone || errors.Is(err, worker.ErrStartKilled) || e.capped() && !t.Gone() {
			// (A live template holds the working directories' tmpfs: a worker started
			// otherwise would not see them. One that died, or a fork killed as it started,
			// is startWorker's to try again, with the template that replaces it: a plain
			// start would leave the namespace's files on the host's disk, uncapped.)
			return w, err
		}
		// The template could not fork it: a plain start, as without one.
	}
	if err := e.moveMounts(dirs.tree, nil); err != nil {
		return nil, err
	}
	w, err := e.spec.Launch(dirsOf(dirs), epoch)
	if err != nil {
		return nil, err
	}
	return e.spec.AwaitReady(w)
}

// readyFrame reads a worker's ready frame ([version, executable, pid, tag, marshal]): it
// checks the version against the oldest Python minipy supports, and returns the runtime as
// the worker compiled it, if it offers it (worker.Spec.Ready).
func readyFrame(ready []byte) (tag string, code []byte, err error) {
	d := decoder{buf: ready}
	v, err := d.value()
	items, _ := v.([]any)
	if err != nil || len(items) < 2 {
		return "", nil, fmt.Errorf("minipy: a worker's ready frame is malformed: %w", worker.ErrNotProtocol)
	}
	version, _ := items[0].(string)
	exe, _ := items[1].(string)
	var major, minor int
	fmt.Sscanf(version, "%d.%d", &major, &minor) //nolint:errcheck // zeros fail the check below
	if major < minPythonMajor || major == minPythonMajor && minor < minPythonMinor {
		return "", nil, fmt.Errorf("%w: %s is Python %s; minipy needs %d.%d or later", ErrPythonVersion, exe, version,
			minPythonMajor, minPythonMinor)
	}
	if len(items) == 5 {
		tag, _ = items[3].(string)
		code, _ = items[4].([]byte)
	}
	return tag, code, nil
}

// prepare returns the namespaces (of ids) worker w, slot's, must create before the
// request, or a *WorkerLostError if one of them held variables in a worker that has since
// ended (the caller learns of the loss once; the namespace then starts fresh): the slot's
// idle loss when that worker ended between runs. The caller holds the slot's token.
func prepare(slot *workerSlot, w *worker.Worker, bindings []*nsBinding, ids []uint32) ([]uint32, error) {
	var create []uint32
	var lost error
	for i, b := range bindings {
		if b.epoch != 0 && b.epoch != w.Epoch {
			slot.mu.Lock()
			idle := slot.idle
			slot.mu.Unlock()
			if idle != nil && idle.epoch == b.epoch {
				err := idle.err // (a copy: each namespace learns of it once)
				lost = &err
			} else {
				lost = &WorkerLostError{Earlier: true, ExitCode: -1}
			}
			b.epoch = 0
		}
		if !w.Known[ids[i]] {
			create = append(create, ids[i])
		}
	}
	if lost != nil {
		return nil, lost
	}
	return create, nil
}

// created records that the namespaces now live in worker w.
func created(w *worker.Worker, bindings []*nsBinding, ids []uint32) {
	for i, b := range bindings {
		w.Known[ids[i]] = true
		b.epoch = w.Epoch
	}
}

// lostError describes how worker w ended; intr is set when minipy killed it after the run's
// deadline.
func lostError(w *worker.Worker, intr *InterruptedError) error {
	e := &WorkerLostError{Killed: intr != nil, Interrupted: intr, ExitCode: -1, Stderr: w.Stderr()}
	if intr != nil {
		return e
	}
	ws, _ := w.Status() // (unknown: not reaped within AwaitExit's bound)
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
	case syscall.SIGKILL:
		// The OOM killer of the sandbox's cgroup (MemoryLimit) kills with SIGKILL, and
		// counts it: a kill counted since this worker started was this one.
		if w.OOMKilled() {
			e.Limit = "memory"
		}
	}
	return e
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

// serveEgress starts the egress proxy of w's sandbox on the socket it listens on, which
// it hands over as it starts (IsolatedConfig.Egress); the proxy ends with the sandbox.
func (e *Isolated) serveEgress(w *worker.Worker, rules *atomic.Pointer[egressRules]) error {
	f := w.EgressListener(e.cfg.StartTimeout)
	if f == nil {
		w.Kill()
		w.AwaitExit()
		return fmt.Errorf("%w: the worker's sandbox did not hand over its egress listener", worker.ErrStartKilled)
	}
	p, err := e.startEgressProxy(f, rules)
	if err != nil {
		w.Kill()
		w.AwaitExit()
		return err
	}
	w.Attach(p)
	go func() {
		<-w.Exited()
		p.close()
	}()
	return nil
}
