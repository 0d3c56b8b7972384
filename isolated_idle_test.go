package minipy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 39: a worker that ends between runs (killed from outside, or by a thread the code
// left running) never fails the next run when a snapshot holds its state, and a spare that
// died is never handed out.

// whereAmI is code whose value is the worker's pid namespace (as the host names it too)
// and its pid there.
const whereAmI = `import os; (os.readlink("/proc/self/ns/pid"), os.getpid())`

// nsProcs is the host pids of the processes in pid namespace pidNS (a /proc/PID/ns/pid
// link), each with its pid inside it (the last of NSpid).
func nsProcs(t *testing.T, pidNS string) map[int]int {
	t.Helper()
	procs := map[int]int{}
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink(filepath.Join("/proc", d.Name(), "ns/pid")); err != nil || link != pidNS {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", d.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" {
				inner, _ := strconv.Atoi(f[len(f)-1])
				procs[pid] = inner
			}
		}
	}
	return procs
}

// killInside SIGKILLs the process of pid namespace pidNS whose pid there is inner, from
// the host, and waits until it is dead (gone, or a zombie its parent has not reaped).
func killInside(t *testing.T, pidNS string, inner int) {
	t.Helper()
	for pid, in := range nsProcs(t, pidNS) {
		if in == inner {
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			// Dead means every thread gone, not the leader a zombie: a thread that is still
			// exiting holds the process's fds, and one blocked in read() takes a request that
			// arrives before it notices the kill (a kill in flight, which fails that run).
			require.Eventually(t, func() bool {
				stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				if err != nil {
					return true
				}
				tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
				return err != nil || len(tasks) == 1 &&
					strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[0] == "Z"
			}, 10*time.Second, 5*time.Millisecond, "pid %d dead", pid)
			return
		}
	}
	t.Fatalf("no process %d in %s", inner, pidNS)
}

func idleDeaths(cfg minipy.IsolatedConfig) (minipy.IsolatedConfig, chan minipy.IdleDeath) {
	ch := make(chan minipy.IdleDeath, 16)
	cfg.OnIdleDeath = func(d minipy.IdleDeath) { ch <- d }
	return cfg, ch
}

func awaitIdleDeath(t *testing.T, ch chan minipy.IdleDeath) minipy.IdleDeath {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(30 * time.Second):
		t.Fatal("no idle death reported")
		return minipy.IdleDeath{}
	}
}

// A worker killed between runs: its snapshot takes over at once, and the next run finds
// the namespace as the last run left it, without an error.
func TestIsolatedIdleDeathRollsBack(t *testing.T) {
	cfg, deaths := idleDeaths(minipy.IsolatedConfig{})
	e := newIsolated(t, cfg)
	ns := e.NewNamespace()
	defer ns.Close()
	where := valueIn(t, e, ns, "x = 41\n"+whereAmI).([]any)
	// A request that changes nothing: its answer comes after the worker made the snapshot
	// of the run's state (which it does right after answering the run).
	_, err := ns.Get("x")
	require.NoError(t, err)
	// Killed from outside, as an operator's bad day would.
	before := time.Now()
	killInside(t, where[0].(string), int(where[1].(int64)))
	d := awaitIdleDeath(t, deaths)
	assert.True(t, d.How.RolledBack, "%v", d.How)
	assert.True(t, d.How.Idle)
	assert.Equal(t, syscall.SIGKILL, d.How.Signal)
	assert.Equal(t, 1, d.Namespaces)
	assert.False(t, d.At.Before(before))
	assert.Equal(t, int64(42), valueIn(t, e, ns, "x + 1"), "the state of the last run, no error")

	// Killed by a thread the code left running: the snapshot (which has no threads) takes over.
	// The thread kills once the file "go" is there, which the test writes once the run's
	// snapshot is made (a timer's 0.2 s was too short for a loaded machine).
	valueIn(t, e, ns, killWhenGo+"y = 2\n")
	_, err = ns.Get("y")
	require.NoError(t, err)
	require.NoError(t, ns.WriteFile("go", nil))
	d = awaitIdleDeath(t, deaths)
	assert.True(t, d.How.RolledBack)
	assert.Equal(t, []any{int64(41), int64(2)}, valueIn(t, e, ns, "[x, y]"))

	st := e.Stats()
	assert.Equal(t, uint64(2), st.IdleDeaths)
	assert.Zero(t, st.IdleStateLost)
}

// killWhenGo is code that leaves a thread running which SIGKILLs the worker once the file
// "go" is in its working directory: the test says when, after the answers it needs.
const killWhenGo = `import os, signal, threading, time
def _kill_when_go():
    while not os.path.exists("go"):
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGKILL)
threading.Thread(target=_kill_when_go, daemon=True).start()
`

// Without a snapshot, the namespace learns of the loss at its next use, once, with when and
// how the worker ended; then it starts fresh.
func TestIsolatedIdleDeathWithoutSnapshot(t *testing.T) {
	for _, cfg := range []minipy.IsolatedConfig{{NoRollback: true}, {Workers: 2, NoRollback: true}} {
		t.Run(fmt.Sprintf("Workers=%d", cfg.Workers), func(t *testing.T) {
			cfg, deaths := idleDeaths(cfg)
			e := newIsolated(t, cfg)
			ns := e.NewNamespace()
			defer ns.Close()
			where := valueIn(t, e, ns, "x = 41\n"+whereAmI).([]any)
			killInside(t, where[0].(string), 1) // the guardian: everything in the sandbox goes
			d := awaitIdleDeath(t, deaths)
			assert.False(t, d.How.RolledBack)
			assert.Equal(t, 1, d.Namespaces)

			_, err := runIn(t, e, ns, "x")
			var lost *minipy.WorkerLostError
			require.ErrorAs(t, err, &lost)
			assert.ErrorIs(t, err, minipy.ErrStateLost)
			assert.True(t, lost.Idle)
			assert.True(t, lost.Earlier)
			assert.Equal(t, d.At, lost.At)
			assert.Contains(t, err.Error(), "ended between runs, at "+d.At.Format("15:04:05.000"))
			assert.Equal(t, int64(7), valueIn(t, e, ns, "x = 7\nx"), "then it starts fresh")
			assert.Equal(t, uint64(1), e.Stats().IdleStateLost)
		})
	}
}

// A spare that dies while it waits is replaced at once: the namespace that takes it later
// runs first time.
func TestIsolatedDeadSpareIsNeverHandedOut(t *testing.T) {
	cfg, deaths := idleDeaths(minipy.IsolatedConfig{})
	e := newIsolated(t, cfg)
	first := e.NewNamespace() // (the first makes the spare)
	defer first.Close()
	mine := map[string]bool{}
	for _, ns := range []*minipy.Namespace{nil, first} {
		r, err := e.Run(t.Context(), whereAmI, &minipy.Options{Globals: ns})
		require.NoError(t, err)
		mine[r.Value.([]any)[0].(string)] = true
	}
	self, err := os.Readlink("/proc/self/ns/pid")
	require.NoError(t, err)
	mine[self] = true
	root := os.Getpid() // (an engine closed by an earlier test may still be ending)
	if pid := minipy.TemplatePID(e); pid != 0 {
		tmpl, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
		require.NoError(t, err)
		mine[tmpl] = true
		root = pid
	}
	// Killed once it has started: a kill before that fails its start (the next namespace
	// starts another), which is not a death between runs.
	require.Eventually(t, func() bool { return minipy.SpareStarted(e) }, 60*time.Second, 10*time.Millisecond,
		"the spare started")
	// The spare's sandbox: the one pid namespace of a guardian that is none of those.
	var spare string
	require.Eventually(t, func() bool {
		spare = ""
		entries, _ := os.ReadDir("/proc")
		for _, d := range entries {
			if _, err := strconv.Atoi(d.Name()); err != nil {
				continue
			}
			link, err := os.Readlink(filepath.Join("/proc", d.Name(), "ns/pid"))
			if err == nil && !mine[link] && nsProcs(t, link)[mustAtoi(d.Name())] == 1 && descends(d.Name(), root) {
				spare = link
			}
		}
		return spare != ""
	}, 30*time.Second, 20*time.Millisecond, "the spare's sandbox")
	starts := e.Stats().Starts
	killInside(t, spare, 1)
	d := awaitIdleDeath(t, deaths)
	assert.Zero(t, d.Namespaces, "a spare holds nothing")
	require.Eventually(t, func() bool { return e.Stats().Starts > starts }, 30*time.Second, 10*time.Millisecond,
		"its replacement starts without waiting for a NewNamespace")
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"), "first time")
	assert.Zero(t, e.Stats().IdleStateLost)
	assert.Equal(t, minipy.ProcessDeaths{Spare: 1}, e.Stats().Deaths)
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// descends reports whether process pid descends from process root.
func descends(pid string, root int) bool {
	for p := mustAtoi(pid); p > 1; {
		if p == root {
			return true
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			return false
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 {
			return false
		}
		p = mustAtoi(f[1])
	}
	return false
}

// A run that starts right after the kill, before the engine heard of it, still goes
// through: the request lay unread in the dead worker's pipe (or found no reader), so it had
// no effect, and it is sent again to the snapshot that took over. (A kill that lands while
// the request is on its way fails that run, rolled back: the dying worker may have read it.)
func TestIsolatedRunRightAfterAnIdleKill(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "n = 0")
	guardianOf := func(pidNS string) int {
		for pid, inner := range nsProcs(t, pidNS) {
			if inner == 1 {
				return pid
			}
		}
		t.Fatalf("no guardian in %s", pidNS)
		return 0
	}
	for i := 1; i <= 6; i++ {
		where := valueIn(t, e, ns, "n += 1\n"+whereAmI).([]any)
		_, err := ns.Get("n") // (the snapshot of the run's state is made)
		require.NoError(t, err)
		// The guardian, stopped, cannot report the death until the request is on its way.
		guardian := guardianOf(where[0].(string))
		require.NoError(t, syscall.Kill(guardian, syscall.SIGSTOP))
		killInside(t, where[0].(string), int(where[1].(int64)))
		type answer struct {
			v   any
			err error
		}
		got := make(chan answer, 1)
		go func() {
			if i%2 == 0 {
				r, err := runIn(t, e, ns, "n")
				if err != nil {
					got <- answer{nil, err}
					return
				}
				got <- answer{r.Value, nil}
			} else {
				v, err := ns.Get("n")
				got <- answer{v, err}
			}
		}()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, syscall.Kill(guardian, syscall.SIGCONT))
		a := <-got
		require.NoError(t, a.err, "kill %d", i)
		assert.Equal(t, int64(i), a.v, "kill %d", i)
	}
	assert.Equal(t, uint64(6), e.Stats().IdleDeaths)
}

// A Command worker has no snapshot: one that ends between runs costs its namespace's
// variables, which its next run says, once, with when.
func TestCommandWorkerIdleDeath(t *testing.T) {
	cfg, deaths := idleDeaths(minipy.IsolatedConfig{Command: []string{minipy.LinkedPython()}, Network: true})
	e := newIsolated(t, cfg)
	ns := e.NewNamespace()
	defer ns.Close()
	// (Its files are the host's: "go" is a path of the test's.)
	goFile := filepath.Join(t.TempDir(), "go")
	valueIn(t, e, ns, strings.ReplaceAll(killWhenGo, `"go"`, strconv.Quote(goFile))+"x = 1\n")
	require.NoError(t, os.WriteFile(goFile, nil, 0o644)) // (after the answer: the worker dies idle)
	d := awaitIdleDeath(t, deaths)
	assert.False(t, d.How.RolledBack)
	assert.Equal(t, 1, d.Namespaces)
	_, err := runIn(t, e, ns, "x")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.Idle)
	assert.Equal(t, syscall.SIGKILL, lost.Signal, "%v", err)
	assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"))
}

// The OOM killer picks the process that runs the code first (oom_score_adj 1000): the
// guardian and the rollback snapshot keep the guardian's score, so that the snapshot is
// there to take over from a worker the OOM killer ended.
func TestIsolatedOOMKillerPicksTheWorkerFirst(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	where := valueIn(t, e, ns, "x = 1\n"+whereAmI).([]any)
	_, err := ns.Get("x") // (answered once the run's snapshot is made)
	require.NoError(t, err)
	pidNS, worker := where[0].(string), int(where[1].(int64))
	score := func(pid int) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
		if err != nil {
			return "gone"
		}
		return strings.TrimSpace(string(b))
	}
	require.Eventually(t, func() bool {
		var guardian string
		others := map[int]string{}
		for pid, inner := range nsProcs(t, pidNS) {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil || strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[0] == "Z" {
				continue // (a replaced snapshot not reaped yet)
			}
			switch inner {
			case worker:
				if score(pid) != "1000" {
					t.Logf("the worker's score: %s", score(pid))
					return false
				}
			case 1:
				guardian = score(pid)
			default:
				others[pid] = score(pid)
			}
		}
		if len(others) != 1 {
			t.Logf("not one snapshot: %v", others)
			return false
		}
		for _, s := range others {
			if s != guardian || s == "1000" {
				t.Logf("the snapshot's score %s, the guardian's %s", s, guardian)
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
}

// A snapshot runs threading's and logging's after-fork hooks when it takes over, not at its
// fork (worker.py, _defer_child_hooks): after a rollback the threads are the worker's own,
// new ones start and end, and logging's locks are free, with or without a thread of the
// code's alive at the snapshot (with one, the hooks run at the fork as always).
func TestIsolatedRollbackRunsTheForkHooks(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	for _, withThread := range []bool{false, true} {
		t.Run(fmt.Sprintf("thread alive %v", withThread), func(t *testing.T) {
			ns := e.NewNamespace()
			defer ns.Close()
			setup := "import logging, threading\nh = logging.StreamHandler()\nlogging.getLogger('t').addHandler(h)\n"
			if withThread {
				setup += "stop = threading.Event()\nbg = threading.Thread(target=stop.wait, name='bg', daemon=True)\nbg.start()\n"
			}
			valueIn(t, e, ns, setup)
			threads := "sorted(th.name for th in threading.enumerate() if th.name != 'bg')"
			before := valueIn(t, e, ns, threads)
			_, err := runIn(t, e, ns, "import os; os._exit(3)")
			var lost *minipy.WorkerLostError
			require.ErrorAs(t, err, &lost)
			require.True(t, lost.RolledBack)
			assert.Equal(t, before, valueIn(t, e, ns, threads), "the dead worker's threads are gone")
			r := valueIn(t, e, ns, `done = []
th = threading.Thread(target=done.append, args=(1,))
th.start()
th.join(10)
got = h.lock.acquire(timeout=5)
h.lock.release()
(done, th.is_alive(), threading.current_thread() is threading.main_thread(), got)`)
			assert.Equal(t, []any{[]any{int64(1)}, false, true, true}, r)
			if withThread {
				assert.Equal(t, false, valueIn(t, e, ns, "bg.is_alive()"), "a thread does not outlive the fork")
			}
		})
	}
}

// Issue 47: who may die. Each process of a sandbox is killed in turn from outside while two
// namespaces hold state: the namespace whose process died keeps its variables unless its
// worker and its snapshot both died, or its guardian (the sandbox's pid 1, whose end ends its
// pid namespace: docs/isolated.md, "Who may die"); the other namespace never notices. (The
// template: TestIsolatedTemplateDies; a spare: TestIsolatedDeadSpareIsNeverHandedOut.)
func TestIsolatedWhoMayDie(t *testing.T) {
	for _, tc := range []struct {
		kill  string
		keeps bool
	}{{"worker", true}, {"snapshot", true}, {"guardian", false}, {"worker and snapshot", false}} {
		for _, osFork := range []bool{false, true} { // (the host's fork code, or os.fork: the snapshots' bookkeeping)
			t.Run(fmt.Sprintf("%s/os.fork=%v", tc.kill, osFork), func(t *testing.T) { testWhoMayDie(t, tc.kill, tc.keeps, osFork) })
		}
	}
}

func testWhoMayDie(t *testing.T, kill string, keeps, osFork bool) {
	cfg, deaths := idleDeaths(minipy.IsolatedConfig{})
	e := newIsolatedForking(t, cfg, osFork)
	a, b := e.NewNamespace(), e.NewNamespace()
	defer a.Close()
	defer b.Close()
	valueIn(t, e, b, "y = 7")
	where := valueIn(t, e, a, "x = 41\n"+whereAmI).([]any)
	pidNS, worker := where[0].(string), int(where[1].(int64))
	_, err := a.Get("x") // (answered after the snapshot of the run's state was made)
	require.NoError(t, err)
	var snapshots []int
	require.Eventually(t, func() bool {
		snapshots = snapshots[:0]
		for _, inner := range nsProcs(t, pidNS) {
			if inner != 1 && inner != worker {
				snapshots = append(snapshots, inner)
			}
		}
		return len(snapshots) > 0
	}, 10*time.Second, 5*time.Millisecond, "a's snapshot")
	switch kill {
	case "worker":
		killInside(t, pidNS, worker)
	case "snapshot":
		for _, s := range snapshots {
			killInside(t, pidNS, s)
		}
	case "guardian":
		killInside(t, pidNS, 1)
	case "worker and snapshot":
		stopInside(t, pidNS, worker) // (stopped, it forks no new snapshot meanwhile)
		for _, s := range snapshots {
			killInside(t, pidNS, s)
		}
		killInside(t, pidNS, worker)
	}
	if kill != "snapshot" {
		d := awaitIdleDeath(t, deaths)
		assert.Equal(t, keeps, d.How.RolledBack, "%v", d.How)
		counted := minipy.ProcessDeaths{Worker: 1}
		if kill == "guardian" {
			counted = minipy.ProcessDeaths{Sandbox: 1}
		}
		assert.Equal(t, counted, e.Stats().Deaths)
	}
	if keeps {
		assert.Equal(t, int64(42), valueIn(t, e, a, "x + 1"), "a keeps its state")
		assert.Zero(t, e.Stats().IdleStateLost)
	} else {
		_, err := runIn(t, e, a, "x")
		require.ErrorIs(t, err, minipy.ErrStateLost)
		assert.Equal(t, int64(1), valueIn(t, e, a, "x = 1\nx"), "then a starts fresh")
		assert.Equal(t, uint64(1), e.Stats().IdleStateLost)
	}
	assert.Equal(t, int64(8), valueIn(t, e, b, "y + 1"), "b never notices")
	if kill == "snapshot" {
		_, err := runIn(t, e, a, "x = 50")
		require.NoError(t, err)
		_, err = a.Get("x")
		require.NoError(t, err)
		killInside(t, pidNS, worker)
		awaitIdleDeath(t, deaths)
		assert.Equal(t, int64(50), valueIn(t, e, a, "x"), "a new snapshot follows the next run")
		assert.Equal(t, minipy.ProcessDeaths{Snapshot: 1, Worker: 1}, e.Stats().Deaths,
			"the snapshot counted at the next answer")
	}
}

// newIsolatedForking is newIsolated whose workers' snapshots fork with os.fork when osFork
// is set (as where the host's fork code cannot be used).
func newIsolatedForking(t *testing.T, cfg minipy.IsolatedConfig, osFork bool) *minipy.Isolated {
	t.Helper()
	defer func(was bool) { withOSFork = was }(withOSFork)
	withOSFork = osFork
	return newIsolated(t, cfg)
}

// stopInside SIGSTOPs the process of pid namespace pidNS whose pid there is inner.
func stopInside(t *testing.T, pidNS string, inner int) {
	t.Helper()
	for pid, in := range nsProcs(t, pidNS) {
		if in == inner {
			require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
			return
		}
	}
	t.Fatalf("no process %d in %s", inner, pidNS)
}

// The code's warnings filters and hooks never see the snapshots' forks: Python 3.12+ warns
// at each fork of a process with threads, and the worker's own filter (worker.py,
// _quiet_snapshot_forks) ignores that warning for the worker's frames only. With the code's
// filters put before it (every warning shown, or an error, which the fork reports to
// sys.unraisablehook) or its list replaced, the worker's forks fall back to their own
// catch_warnings: no hook of the code's runs between runs, each crash rolls back to the
// state before it, and the code's own warnings behave as the code set them. (Snapshots
// forked with os.fork, as where the host's fork code cannot be used; with it, nothing runs.)
func TestIsolatedSnapshotsIgnoreTheCodesWarningFilters(t *testing.T) {
	for _, osFork := range []bool{true, false} {
		t.Run(fmt.Sprintf("os.fork=%v", osFork), func(t *testing.T) { testSnapshotsIgnoreWarningFilters(t, osFork) })
	}
}

func testSnapshotsIgnoreWarningFilters(t *testing.T, osFork bool) {
	e := newIsolatedForking(t, minipy.IsolatedConfig{}, osFork)
	for _, setup := range []string{
		"", // the worker's filter first
		"warnings.simplefilter('error')",
		"warnings.simplefilter('always')",
		"warnings.filters = []",
		"warnings.resetwarnings()",
	} {
		t.Run(setup, func(t *testing.T) {
			lost := crashAfterFilters(t, e, setup)
			require.True(t, lost.RolledBack, "a snapshot was made after the last run: %v; the worker's stderr: %q",
				lost, lost.Stderr)
		})
	}
}

// crashAfterFilters runs setup (the code's warnings filters) and two runs in a new namespace
// of e, then one that crashes its worker, and checks what the code's hooks saw when the
// crash rolled back; it returns the crash's error.
func crashAfterFilters(t *testing.T, e *minipy.Isolated, setup string) *minipy.WorkerLostError {
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "import os, sys, warnings\nhits = []\n"+
		"warnings.showwarning = lambda *a, **k: hits.append(str(a[0]))\n"+
		"sys.unraisablehook = lambda u: hits.append(str(u.exc_value))\n"+setup+"\nn = 1")
	valueIn(t, e, ns, "n += 1")
	_, err := runIn(t, e, ns, "n += 1\nos._exit(3)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	if !lost.RolledBack {
		return lost
	}
	assert.Equal(t, []any{int64(2), []any{}}, valueIn(t, e, ns, "n, hits"), "no fork warning reached the code's hooks")
	if setup == "warnings.simplefilter('always')" {
		assert.Equal(t, []any{"mine"}, valueIn(t, e, ns, "warnings.warn('mine', DeprecationWarning)\nhits"),
			"the code's own warning is shown as the code set")
	}
	return lost
}

// A new worker makes no rollback snapshot until a request changes its state (its state is
// any new worker's: a sandbox's start saves a fork and the pages it copies). A run that
// crashes it before that rolls back to a new worker all the same: the error says rolled
// back, not lost, and the namespace goes on, as it was before the run.
func TestIsolatedFirstRunCrashRollsBack(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	procs := "import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit() and " +
		"open('/proc/%s/stat' % p).read().rsplit(') ', 1)[1][0] != 'Z')" // (a replaced snapshot may wait to be reaped)
	assert.Equal(t, []any{int64(1), int64(2)}, valueIn(t, e, ns, procs), "the guardian and the worker: no snapshot yet")
	_, err := runIn(t, e, ns, "x = 1\nos._exit(5)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, 5, lost.ExitCode)
	assert.True(t, lost.RolledBack)
	assert.NotErrorIs(t, err, minipy.ErrStateLost)
	assert.Contains(t, err.Error(), "the namespace was rolled back to before this run")
	assert.Equal(t, []any{false, int64(2)}, valueIn(t, e, ns, "'x' in dir(), 1 + 1"), "as before the run, on a new worker")
	// (3 or more: a replaced snapshot is killed without a wait, and may not have ended yet.)
	assert.GreaterOrEqual(t, len(valueIn(t, e, ns, procs).([]any)), 3, "a snapshot once a request changed the state")
}

// A run that leaves the sandbox at its Processes limit leaves the worker no room to fork
// its snapshot: a crash after it loses the namespace (the snapshot before it held an older
// state, and is gone), and the error's Stderr says why there was no snapshot.
func TestIsolatedNoRoomForASnapshot(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Processes: 16})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "x = 1")
	n := valueIn(t, e, ns, `import threading
stop = threading.Event()
held = []
while True:
    th = threading.Thread(target=stop.wait, daemon=True)
    try:
        th.start()
    except RuntimeError:
        break
    held.append(th)
len(held)`)
	assert.Positive(t, n)
	_, err := runIn(t, e, ns, "import os; os._exit(4)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.False(t, lost.RolledBack)
	assert.ErrorIs(t, err, minipy.ErrStateLost)
	assert.Contains(t, lost.Stderr, "minipy worker: no rollback snapshot after this answer: ")
	assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"), "the namespace goes on, on a new worker")
}

// A rollback snapshot runs no Python until it takes over (the host's fork code, worker.py's
// _SnapFork): the at-fork hooks in Python, the code's own among them, run once, in the
// snapshot that takes over after a crash, not in each snapshot as it is forked.
func TestIsolatedSnapshotsRunNoPythonUntilTheyTakeOver(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, `import os
def hook():
    with open("forked.txt", "a") as f:
        f.write("%d\n" % os.getpid())
os.register_at_fork(after_in_child=hook)`)
	for i := range 3 {
		valueIn(t, e, ns, fmt.Sprintf("x = %d", i))
	}
	assert.Equal(t, false, valueIn(t, e, ns, "os.path.exists('forked.txt')"), "three snapshots forked, no hook run")
	_, err := runIn(t, e, ns, "os._exit(3)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	require.True(t, lost.RolledBack)
	assert.Equal(t, []any{true, int64(2)}, valueIn(t, e, ns, "[int(p) for p in open('forked.txt').read().split()] == [os.getpid()], x"),
		"the hook ran once, in the snapshot that took over")
}
