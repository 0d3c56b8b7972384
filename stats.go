package minipy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minipy-go/minipy/internal/procstat"
	"github.com/minipy-go/minipy/internal/worker"
)

// IsolatedStats is an account of an isolated engine at one moment (Isolated.Stats), for
// health checks and metrics: minipy itself depends on no metrics library.
type IsolatedStats struct {
	// Namespaces is the number of open namespaces made with NewNamespace and Fork.
	Namespaces int
	// Workers is the number of workers serving namespaces or waiting for one (the spares),
	// those still starting included; Fork copies count as workers of their own.
	Workers int
	// Processes is the number of this machine's processes that belong to the engine: its
	// template, each sandbox's guardian, the workers, their rollback snapshots and what the
	// code started. A Command worker counts as its local command.
	Processes int
	// MemoryBytes is the memory of those processes: the sum of their proportional set sizes
	// (PSS: a page that n processes share counts 1/n in each), as /proc/PID/smaps_rollup
	// reports them.
	MemoryBytes int64
	// Spares is the number of workers started ahead for the next namespaces (ready or
	// still starting; IsolatedConfig.Spares). SpareHits counts the NewNamespace calls that
	// took one whose start had ended, SpareMisses those that found none, or one still
	// starting (whose first run waited for the rest of its start).
	Spares                 int
	SpareHits, SpareMisses uint64
	// Starts and StartFailures count the worker starts since NewIsolated, and the failed.
	Starts, StartFailures uint64
	// StartError is the error of the latest worker start if it failed (nil once one
	// succeeds): while it is set, a new namespace may find no worker (see Ready).
	StartError error
	// Limits says what enforces MemoryLimit and Processes: LimitsCgroupV2 or
	// LimitsCgroupV1 (a cgroup per sandbox: memory.max or memory.limit_in_bytes, which
	// count shared memory and tmpfs files too, and pids.max), or LimitsRlimits (RLIMIT_AS
	// and RLIMIT_NPROC alone, with memfd_create and shmget refused under a MemoryLimit;
	// Command workers, whose rlimits are set on the far side, always).
	Limits string
	// Cgroup is the engine's cgroup, as /proc/self/cgroup names cgroups ("" without one);
	// CgroupError says why the engine has none when it looked for one (ErrNoCgroup).
	Cgroup      string
	CgroupError error
	// MemoryBudget is the memory limit of the engine's cgroup, which all its sandboxes share
	// (IsolatedConfig.MemoryBudget); 0 without a cgroup, or with Unlimited.
	MemoryBudget int64
	// CgroupsMade counts the sandboxes' groups the engine made (with its cgroup), and
	// CgroupsReused the sandboxes that started in a group an earlier sandbox had left,
	// kept empty with its limits (docs/protocol.md, "Cgroups").
	CgroupsMade, CgroupsReused uint64
	// IdleDeaths counts the workers that ended between runs (spares included), and
	// IdleStateLost those of them whose namespaces lost their variables: no snapshot held
	// the state of their last run (NoRollback, Command workers, a snapshot killed too). See
	// IsolatedConfig.OnIdleDeath.
	IdleDeaths, IdleStateLost uint64
	// Deaths counts, by kind, the processes of the engine that ended while it still needed
	// them (killed from outside, by the OOM killer, a crash), between runs: what each costs
	// is in docs/isolated.md, "Who may die".
	Deaths ProcessDeaths
	// EgressAllowed and EgressRefused count the connections and requests through the
	// sandboxes' egress proxies (IsolatedConfig.Egress) that were let through and refused
	// (or cut by a cap); EgressBytes the bytes they moved, both ways.
	EgressAllowed, EgressRefused, EgressBytes int64
}

// ProcessDeaths counts the engine's processes that ended between runs, by kind
// (IsolatedStats.Deaths).
type ProcessDeaths struct {
	// Template: the process sandboxes are forked from. Nothing is lost: each sandbox is in
	// a pid namespace of its own, and a new template starts at once.
	Template uint64
	// Spare: a sandbox started ahead for the next NewNamespace (its worker or its pid 1).
	// Nothing is lost: it is replaced at once.
	Spare uint64
	// Worker: a namespace's worker, whose guardian reported its end. Its snapshot takes
	// over, and nothing is lost, unless it had none (IdleStateLost).
	Worker uint64
	// Snapshot: a worker's rollback snapshot, while it waited. Nothing is lost; the worker's
	// next answer makes another (counted then).
	Snapshot uint64
	// Sandbox: a sandbox's pid 1 (its guardian), whose end ends its pid namespace: its
	// worker and snapshot with it, and its namespaces' variables (IdleStateLost).
	Sandbox uint64
}

// IdleDeath is a worker that ended between runs (IsolatedConfig.OnIdleDeath).
type IdleDeath struct {
	// At is when the engine learned of it.
	At time.Time
	// How is how it ended (Signal, ExitCode, Limit; Earlier and Idle set). RolledBack
	// means its snapshot took over and its namespaces lost nothing; otherwise this is the
	// error their next use returns.
	How *WorkerLostError
	// Namespaces is the number of namespaces it held; 0 for a spare or a worker that had
	// not answered a run yet (nothing was lost whatever happened).
	Namespaces int
}

// What enforces an engine's MemoryLimit and Processes (IsolatedStats.Limits).
const (
	LimitsCgroupV2 = "cgroup v2"
	LimitsCgroupV1 = "cgroup v1"
	LimitsRlimits  = "rlimits"
)

// startRecord counts an engine's worker starts.
type startRecord struct {
	starts, failures atomic.Uint64
	mu               sync.Mutex
	last             error // the latest start's error
}

func (r *startRecord) note(err error) {
	r.starts.Add(1)
	if err != nil {
		r.failures.Add(1)
	}
	r.mu.Lock()
	r.last = err
	r.mu.Unlock()
}

func (r *startRecord) lastErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Stats returns an account of the engine's namespaces, workers and processes. It reads
// /proc, each process's smaps_rollup among it: about 0.2 ms a process on a 2-core VM, so
// some 80 ms with a hundred namespaces, about 390 processes (BenchmarkIsolatedStats).
// Call it at a metrics scrape's pace, not for every run. Safe from any goroutine.
func (e *Isolated) Stats() IsolatedStats {
	st := IsolatedStats{
		Namespaces:    int(e.opened.Load()),
		Starts:        e.startRec.starts.Load(),
		StartFailures: e.startRec.failures.Load(),
		StartError:    e.startRec.lastErr(),
		Limits:        LimitsRlimits,
		CgroupError:   e.cgroupErr,
		IdleDeaths:    e.idleDeaths.Load(),
		IdleStateLost: e.idleLost.Load(),
		Deaths: ProcessDeaths{Template: e.deaths.template.Load(), Spare: e.deaths.spare.Load(),
			Worker: e.deaths.worker.Load(), Snapshot: e.deaths.snapshot.Load(), Sandbox: e.deaths.sandbox.Load()},
		EgressAllowed: e.egressAllowed.Load(),
		EgressRefused: e.egressDenied.Load(),
		EgressBytes:   e.egressBytes.Load(),
	}
	if c := e.cgroups; c != nil {
		st.Limits, st.Cgroup, st.MemoryBudget = LimitsCgroupV1, c.Path, c.Budget
		st.CgroupsMade, st.CgroupsReused = c.Made(), c.Reused()
		if c.Version == 2 {
			st.Limits = LimitsCgroupV2
		}
	}
	e.mu.Lock()
	st.Spares, st.SpareHits, st.SpareMisses = len(e.pool.spares), e.pool.hits, e.pool.misses
	slots := append([]*workerSlot(nil), e.slots...)
	for s := range e.own {
		slots = append(slots, s)
	}
	e.mu.Unlock()
	roots := map[int]bool{}
	for _, s := range slots {
		s.mu.Lock()
		cur, started, pending := s.cur, s.started, s.pending != nil
		s.mu.Unlock()
		if cur != nil && !cur.Gone() || started != nil || pending {
			st.Workers++
		}
		for _, w := range []*worker.Worker{cur, started} {
			if w != nil && w.Pid() != 0 && !w.Gone() {
				roots[w.Pid()] = true // a worker forked from the template is the template's descendant
			}
		}
	}
	if pid := e.templatePID(); pid != 0 {
		roots[pid] = true
	}
	if len(roots) == 0 {
		return st
	}
	tree := worker.ReadTree()
	seen := map[int]bool{}
	for root := range roots {
		for _, p := range append([]int{root}, tree.Below(root)...) {
			if !seen[p] {
				seen[p] = true
				st.MemoryBytes += procstat.PSS(p)
			}
		}
	}
	st.Processes = len(seen)
	return st
}

// templatePID is the pid of the engine's template process, 0 when it has none.
func (e *Isolated) templatePID() int {
	e.tmplMu.Lock()
	defer e.tmplMu.Unlock()
	if e.tmpl == nil || e.tmpl.Gone() {
		return 0
	}
	return e.tmpl.Pid()
}

// Ready reports whether a new namespace would get a worker now: nil when the engine is
// open and its latest worker start succeeded. After a failed start it tries one more, a
// worker started and ended for the purpose, so that a readiness check sees the engine
// recover even when nothing else starts workers; ctx bounds the wait for it (the start
// goes on, and counts, after ctx ends). Safe from any goroutine.
func (e *Isolated) Ready(ctx context.Context) error {
	if e.isClosed() {
		return ErrEngineClosed
	}
	if e.startRec.lastErr() == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() {
		d := e.newDirs()
		w, err := startWorker(e, d, 0)
		if w != nil {
			w.Kill()
			w.AwaitExit()
		}
		e.releaseDirs(d)
		e.startRec.note(err)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
