package minipy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

func runIn(t *testing.T, e *minipy.Isolated, ns *minipy.Namespace, code string) (*minipy.Result, error) {
	t.Helper()
	return e.Run(context.Background(), code, &minipy.Options{Globals: ns, Timeout: 20 * time.Second})
}

func valueIn(t *testing.T, e *minipy.Isolated, ns *minipy.Namespace, code string) any {
	t.Helper()
	r, err := runIn(t, e, ns, code)
	require.NoError(t, err, code)
	return r.Value
}

// A fork copies the namespace into a process of its own: the variables, the modules and
// the host functions are there, and from then on the two diverge, each way.
func TestIsolatedFork(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	a := e.NewNamespace()
	require.NoError(t, a.Register(minipy.Func("double", "Doubles n.", func(_ context.Context, in struct {
		N int `json:"n"`
	}) (int, error) {
		return 2 * in.N, nil
	})))
	_, err := runIn(t, e, a, "import json, os\nrows = [1, 2]\nx = 'before'\ndef f(): return len(rows)\npid = os.getpid()")
	require.NoError(t, err)

	b, err := a.Fork()
	require.NoError(t, err)
	assert.Equal(t, []any{int64(1), int64(2)}, valueIn(t, e, b, "rows"))
	assert.Equal(t, "before", valueIn(t, e, b, "x"))
	assert.Equal(t, int64(2), valueIn(t, e, b, "f()"), "functions see the copy's globals")
	assert.Equal(t, true, valueIn(t, e, b, "'json' in dir() and json.dumps([1]) == '[1]'"))
	assert.Equal(t, true, valueIn(t, e, b, "os.getpid() != pid"), "a process of its own")
	assert.Equal(t, int64(42), valueIn(t, e, b, "double(n=21)"), "its host functions are bound")

	_, err = runIn(t, e, b, "rows.append(3)\nx = 'copy'\ny = 1")
	require.NoError(t, err)
	_, err = runIn(t, e, a, "rows.append(4)\nx = 'original'")
	require.NoError(t, err)
	assert.Equal(t, []any{int64(1), int64(2), int64(4)}, valueIn(t, e, a, "rows"))
	assert.Equal(t, []any{int64(1), int64(2), int64(3)}, valueIn(t, e, b, "rows"))
	assert.Equal(t, "copy", valueIn(t, e, b, "x"))
	assert.Equal(t, false, valueIn(t, e, a, "'y' in globals()"))
	require.NoError(t, b.Set("z", 5))
	_, err = a.Get("z")
	assert.ErrorIs(t, err, minipy.ErrNameNotFound)

	// Functions registered later belong to one of them only.
	require.NoError(t, b.Register(minipy.Func("triple", "Triples n.", func(_ context.Context, in struct {
		N int `json:"n"`
	}) (int, error) {
		return 3 * in.N, nil
	})))
	assert.Equal(t, int64(9), valueIn(t, e, b, "triple(n=3)"))
	assert.Equal(t, false, valueIn(t, e, a, "'triple' in globals()"))

	// A fork of the copy, and closing the original, leave the others.
	c, err := b.Fork()
	require.NoError(t, err)
	require.NoError(t, a.Close())
	assert.Equal(t, int64(8), valueIn(t, e, b, "double(n=4)"), "the copy's functions outlive the original")
	assert.Equal(t, int64(12), valueIn(t, e, c, "triple(n=4)"))
	assert.Equal(t, "copy", valueIn(t, e, c, "x"))
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
}

// The output of a copy's runs is its own, also when both run at once.
func TestIsolatedForkOutputIsItsOwn(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	a := e.NewNamespace()
	_, err := runIn(t, e, a, "import os, time")
	require.NoError(t, err)
	b, err := a.Fork()
	require.NoError(t, err)
	done := make(chan *minipy.Result)
	go func() {
		r, err := runIn(t, e, a, "for i in range(50):\n    print('a', i)\n    os.write(1, b'A\\n')\n    time.sleep(0.002)")
		assert.NoError(t, err)
		done <- r
	}()
	rb, err := runIn(t, e, b, "for i in range(50):\n    print('b', i)\n    os.write(1, b'B\\n')\n    time.sleep(0.002)")
	require.NoError(t, err)
	ra := <-done
	assert.NotContains(t, ra.Stdout, "b")
	assert.NotContains(t, ra.Stdout, "B")
	assert.NotContains(t, rb.Stdout, "a")
	assert.NotContains(t, rb.Stdout, "A")
	assert.Equal(t, 100, strings.Count(ra.Stdout, "\n"))
	assert.Equal(t, 100, strings.Count(rb.Stdout, "\n"))
	runtime.KeepAlive(b)
}

// A copy rolls back on its own: a crash in one leaves the other as it was, and each
// comes back as it was before its failed run.
func TestIsolatedForkRollsBackAlone(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	a := e.NewNamespace()
	_, err := runIn(t, e, a, "v = 'a'")
	require.NoError(t, err)
	b, err := a.Fork()
	require.NoError(t, err)
	_, err = runIn(t, e, b, "v = 'b'")
	require.NoError(t, err)

	_, err = runIn(t, e, a, "v = 'lost'\nimport os; os._exit(3)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.RolledBack)
	assert.NotErrorIs(t, err, minipy.ErrStateLost)
	assert.Equal(t, "a", valueIn(t, e, a, "v"))
	assert.Equal(t, "b", valueIn(t, e, b, "v"), "the copy never noticed")

	// A hard-killed C loop in the copy.
	_, err = e.Run(context.Background(), "v = 'lost'\nsum(range(10**12))",
		&minipy.Options{Globals: b, Timeout: 200 * time.Millisecond})
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.Killed)
	assert.True(t, lost.RolledBack)
	assert.Equal(t, "b", valueIn(t, e, b, "v"))
	assert.Equal(t, "a", valueIn(t, e, a, "v"))

	// A copy without a snapshot to fall back on (NoRollback) loses only its own state.
	e2 := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	p := e2.NewNamespace()
	_, err = runIn(t, e2, p, "v = 'p'")
	require.NoError(t, err)
	q, err := p.Fork()
	require.NoError(t, err)
	_, err = runIn(t, e2, q, "import os; os._exit(4)")
	require.ErrorIs(t, err, minipy.ErrStateLost)
	assert.Equal(t, "p", valueIn(t, e2, p, "v"), "the original lives on")
	assert.Equal(t, false, valueIn(t, e2, q, "'v' in globals()"), "the copy starts afresh, in a new worker")
	runtime.KeepAlive(b)
	runtime.KeepAlive(q)
}

// Closing a copy, the original or the engine leaves nothing behind.
func TestIsolatedForkLeavesNoProcesses(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	a := e.NewNamespace()
	marker := sleepMarker()
	// The name (comm) of the worker process is inherited by its snapshots and copies.
	comm := fmt.Sprintf("mp%d", time.Now().UnixNano()%1e9)
	_, err := runIn(t, e, a, fmt.Sprintf("x = 1\nwith open('/proc/self/comm', 'w') as f: f.write(%q)", comm))
	require.NoError(t, err)
	count := func(n int, msg string) {
		t.Helper()
		assert.Eventually(t, func() bool { return commProcesses(t, comm) == n }, 5*time.Second, 10*time.Millisecond,
			"%s: want %d processes named %s", msg, n, comm)
	}
	count(2, "the worker and its snapshot")
	sleeper := "import subprocess, sys\nP = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', %q])"
	b, err := a.Fork()
	require.NoError(t, err)
	_, err = runIn(t, e, b, fmt.Sprintf(sleeper, marker+"-b"))
	require.NoError(t, err)
	c, err := a.Fork()
	require.NoError(t, err)
	_, err = runIn(t, e, c, fmt.Sprintf(sleeper, marker+"-c"))
	require.NoError(t, err)
	requireRunning(t, "the copies' children", marker+"-b", marker+"-c")
	count(6, "each copy is a worker and a snapshot")

	require.NoError(t, b.Close())
	requireGoneSoon(t, "the closed copy's child", marker+"-b")
	requireRunning(t, "the other copy's child", marker+"-c")
	count(4, "the closed copy's worker and snapshot are gone")
	require.NoError(t, a.Close())
	count(2, "the original's are gone")
	assert.Equal(t, int64(1), valueIn(t, e, c, "x"), "the copy outlives its original")
	requireRunning(t, "the copy's child", marker+"-c")
	require.NoError(t, e.Close())
	requireGoneSoon(t, "the last copy's child", marker+"-c")
	count(0, "nothing is left")
	runtime.KeepAlive(c)
}

// Namespaces that share a process, or live in the host's, cannot fork.
func TestForkRefused(t *testing.T) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	_, err := ns.Fork()
	assert.ErrorIs(t, err, minipy.ErrNoFork)

	e := newIsolated(t, minipy.IsolatedConfig{Workers: 1})
	_, err = e.NewNamespace().Fork()
	assert.ErrorIs(t, err, minipy.ErrNoFork)

	e2 := newIsolated(t, minipy.IsolatedConfig{})
	closed := e2.NewNamespace()
	require.NoError(t, closed.Close())
	_, err = closed.Fork()
	assert.ErrorIs(t, err, minipy.ErrNamespaceClosed)

	// A namespace that was never used forks too: the copy starts empty.
	fresh := e2.NewNamespace()
	cp, err := fresh.Fork()
	require.NoError(t, err)
	assert.Equal(t, int64(2), valueIn(t, e2, cp, "1 + 1"))
	runtime.KeepAlive(fresh)
}

// commProcesses counts the live processes named comm.
func commProcesses(t *testing.T, comm string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	n := 0
	for _, ent := range entries {
		if _, err := strconv.Atoi(ent.Name()); err != nil {
			continue
		}
		name, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "stat")); err == nil {
			s := string(stat)
			if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] != "Z" {
				n++
			}
		}
	}
	return n
}

// Copies share their original's sandbox, and so its Processes limit: a fork past it fails
// with ErrNoFork, and the original and the copies made go on.
func TestIsolatedForkUnderProcessLimit(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Processes: 16})
	a := e.NewNamespace()
	_, err := runIn(t, e, a, "v = 1")
	require.NoError(t, err)
	var copies []*minipy.Namespace
	for i := 0; ; i++ {
		require.Less(t, i, 10, "the limit never bit")
		cp, err := a.Fork()
		if err != nil {
			require.ErrorIs(t, err, minipy.ErrNoFork)
			t.Logf("fork %d: %v", i, err)
			break
		}
		copies = append(copies, cp)
	}
	assert.Equal(t, int64(1), valueIn(t, e, a, "v"))
	for _, cp := range copies {
		assert.Equal(t, int64(1), valueIn(t, e, cp, "v"))
	}
}

// Workers are forked from the template, but their sandboxes are not its: when it dies,
// every namespace keeps its variables and its worker, a Fork copy still forks, a new
// template starts for the next namespace, and work goes on.
func TestIsolatedTemplateDies(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Preload: []string{"json"}})
	first := minipy.TemplatePID(e)
	require.NotZero(t, first)
	a := e.NewNamespace()
	assert.Equal(t, true, valueIn(t, e, a, "import sys\nx = 1\n'json' in sys.modules"), "preloaded by the template")
	assert.Equal(t, true, valueIn(t, e, a, "'pickle' in sys.modules"),
		"Restore's pickle too: a resume into a new namespace does not import it (BenchmarkSaveRestore's restore-new-small)")
	pid := valueIn(t, e, a, "import os\nos.getpid()")
	require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
	require.Eventually(t, func() bool { return syscall.Kill(first, 0) == syscall.ESRCH }, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, int64(2), valueIn(t, e, a, "x += 1\nx"), "the variables are kept")
	assert.Equal(t, pid, valueIn(t, e, a, "os.getpid()"), "by the same worker")
	cp, err := a.Fork()
	require.NoError(t, err)
	assert.Equal(t, int64(3), valueIn(t, e, cp, "x += 1\nx"))
	require.NoError(t, cp.Close())
	assert.Equal(t, int64(3), valueIn(t, e, e.NewNamespace(), "3"))
	again := minipy.TemplatePID(e)
	assert.NotZero(t, again)
	assert.NotEqual(t, first, again, "a new template")
	assert.Zero(t, e.Stats().IdleStateLost)
	assert.Equal(t, minipy.ProcessDeaths{Template: 1}, e.Stats().Deaths)
	require.NoError(t, e.Close())
	assert.Equal(t, minipy.ProcessDeaths{Template: 1}, e.Stats().Deaths, "Close's ends are not deaths")
	assert.Zero(t, minipy.TemplatePID(e))
	runtime.KeepAlive(a)

	plain := newIsolated(t, minipy.IsolatedConfig{NoTemplate: true})
	assert.Zero(t, minipy.TemplatePID(plain))
}

// TestForkCopiesClosedThenCollected: a Fork copy that is closed and then garbage-collected
// is freed once: its tree, which the source shares, stays, and the source forks again
// (the collector's free of a closed copy used to release the tree a second time).
func TestForkCopiesClosedThenCollected(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	_, err := runIn(t, e, ns, "x = 1")
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		cp, err := ns.Fork()
		require.NoError(t, err, "fork %d", i)
		require.NoError(t, cp.Close())
		cp = nil //nolint:ineffassign,wastedassign // let the collector have it
		runtime.GC()
		runtime.GC()
		time.Sleep(100 * time.Millisecond) // (cleanups run on a goroutine of their own)
	}
	_, err = os.Stat(minipy.HostWorkDir(ns))
	require.NoError(t, err, "the source's working directory")
	cp, err := ns.Fork()
	require.NoError(t, err)
	defer cp.Close()
}

// Packed workers are sandboxes forked from the template too: its death costs the namespaces
// they hold nothing, and a namespace made afterwards on the same worker works.
func TestIsolatedTemplateDiesPacked(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Workers: 2})
	first := minipy.TemplatePID(e)
	require.NotZero(t, first)
	a, b := e.NewNamespace(), e.NewNamespace()
	valueIn(t, e, a, "x = 1")
	valueIn(t, e, b, "y = 2")
	require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
	require.Eventually(t, func() bool { return syscall.Kill(first, 0) == syscall.ESRCH }, 30*time.Second, 5*time.Millisecond)
	assert.Equal(t, int64(2), valueIn(t, e, a, "x += 1\nx"))
	assert.Equal(t, int64(3), valueIn(t, e, b, "y += 1\ny"))
	c := e.NewNamespace() // (on one of the two workers, which outlived their template)
	assert.Equal(t, int64(4), valueIn(t, e, c, "open('f.txt', 'w').write('data')"))
	got, err := c.ReadFile("f.txt")
	require.NoError(t, err)
	assert.Equal(t, "data", string(got), "its working directory, the host's and the code's")
	assert.Zero(t, e.Stats().IdleStateLost)
	require.Eventually(t, func() bool { return e.Stats().Deaths.Template == 1 }, 10*time.Second, 10*time.Millisecond)
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

// A Fork's copy serves with its own rollback state (its snapshots, numbered from the
// Fork's): a crash in the copy rolls it back to before that run, and neither it nor the
// original counts a snapshot death it did not have. (The copy takes over from inside its
// worker's loop in C, whose notes of the original's snapshots it must not keep.)
func TestIsolatedForkCopyRollsBack(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	a := e.NewNamespace()
	defer a.Close()
	for i := range 3 {
		valueIn(t, e, a, fmt.Sprintf("x = %d", i))
	}
	b, err := a.Fork()
	require.NoError(t, err)
	defer b.Close()
	for i := range 3 {
		valueIn(t, e, b, fmt.Sprintf("x = %d", 10+i))
		valueIn(t, e, a, fmt.Sprintf("x = %d", 20+i))
	}
	_, err = runIn(t, e, b, "x = -1\nimport os; os._exit(3)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.RolledBack, "%v", err)
	assert.Equal(t, int64(12), valueIn(t, e, b, "x"))
	assert.Equal(t, int64(22), valueIn(t, e, a, "x"))
	assert.Equal(t, minipy.ProcessDeaths{}, e.Stats().Deaths, "no death but the run's")
}
