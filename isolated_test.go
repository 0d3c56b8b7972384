package minipy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// withoutTemplate makes newIsolated's engines start each worker as a process of its own
// (TestSandboxWithoutTemplate); withOSFork makes them fork with os.fork where the host's
// fork code would (TestSandboxSetUpInPython).
var withoutTemplate, withOSFork bool

func newIsolated(t testing.TB, cfg minipy.IsolatedConfig) *minipy.Isolated {
	t.Helper()
	cfg.NoTemplate = cfg.NoTemplate || withoutTemplate
	newEngine := minipy.NewIsolated
	if withOSFork {
		newEngine = minipy.NewIsolatedOSFork
	}
	e, err := newEngine(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

func TestIsolatedSameSemantics(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})

	r, err := e.Minipy("import math; math.factorial(12)", nil)
	require.NoError(t, err)
	assert.True(t, r.HasValue)
	assert.Equal(t, int64(479001600), r.Value)
	assert.Equal(t, "479001600", r.Repr)

	r, err = e.Minipy("x = [1, 'two', 3.5]\nprint('hello')\nx", nil)
	require.NoError(t, err)
	assert.Equal(t, []any{int64(1), "two", 3.5}, r.Value)
	assert.Equal(t, "hello\n", r.Stdout)

	r, err = e.Minipy("x;", nil)
	require.NoError(t, err)
	assert.False(t, r.HasValue, "a trailing ';' hides the value, as in-process")

	// The default namespace persists between runs.
	r, err = e.Minipy("len(x)", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(3), r.Value)

	r, err = e.Minipy("def f():\n    return 1 / 0\nf()", nil)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "ZeroDivisionError", py.Type)
	assert.Contains(t, py.Traceback, "return 1 / 0")
	assert.NotContains(t, py.Traceback, "minipy-runtime")
	assert.False(t, errors.Is(err, minipy.ErrStateLost))
	require.NotNil(t, r)

	_, err = e.Minipy("raise SystemExit(3)", nil)
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "SystemExit", py.Type)
	r, err = e.Minipy("len(x)", nil)
	require.NoError(t, err, "SystemExit does not end the worker")
	assert.Equal(t, int64(3), r.Value)
}

func TestIsolatedCapturesFileDescriptorOutput(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	code := `import os, subprocess, sys
print("one")
os.write(1, b"two\n")
subprocess.run(["sh", "-c", "echo three; echo err-three >&2"])
sys.stderr.write("four\n")
os.write(2, b"five\n")
# Bytes that look like a protocol frame cannot confuse the engine: fd 1 is not the protocol.
os.write(1, b"\x05\x00\x00\x00A\x00\x00\x00\x00")
"done"`
	r, err := e.Minipy(code, nil)
	require.NoError(t, err)
	assert.Equal(t, "one\ntwo\nthree\n\x05\x00\x00\x00A\x00\x00\x00\x00", r.Stdout)
	assert.Equal(t, "err-three\nfour\nfive\n", r.Stderr)
	assert.Equal(t, "done", r.Value)

	r, err = e.Minipy("print('x' * 100000)", &minipy.Options{MaxOutput: 1000})
	require.NoError(t, err)
	assert.Less(t, len(r.Stdout), 1200)
	assert.Contains(t, r.Stdout, "characters of stdout omitted")

	r, err = e.Minipy("1", nil)
	require.NoError(t, err)
	assert.Empty(t, r.Stdout, "each run's output starts empty")
}

func TestIsolatedNamespaces(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Workers: 2})
	a, b := e.NewNamespace(), e.NewNamespace()
	require.NoError(t, a.Set("n", 41))
	_, err := e.Minipy("n += 1", &minipy.Options{Globals: a})
	require.NoError(t, err)
	v, err := a.Get("n")
	require.NoError(t, err)
	assert.Equal(t, int64(42), v)
	assert.Equal(t, []string{"n"}, names(t, a))

	_, err = b.Get("n")
	assert.ErrorIs(t, err, minipy.ErrNameNotFound)
	_, err = e.Minipy("n", &minipy.Options{Globals: b})
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "NameError", py.Type)

	require.NoError(t, a.Close())
	_, err = e.Minipy("1", &minipy.Options{Globals: a})
	assert.ErrorIs(t, err, minipy.ErrNamespaceClosed)
	_, err = a.Get("n")
	assert.ErrorIs(t, err, minipy.ErrNamespaceClosed)
}

func TestIsolatedNamespaceBelongsToItsEngine(t *testing.T) {
	e1 := newIsolated(t, minipy.IsolatedConfig{})
	e2 := newIsolated(t, minipy.IsolatedConfig{})
	ns := e1.NewNamespace()
	_, err := e2.Minipy("1", &minipy.Options{Globals: ns})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "belongs to")
	_, err = minipy.Minipy("1", &minipy.Options{Globals: ns})
	require.Error(t, err)
	_, err = e1.Minipy("1", &minipy.Options{Globals: minipy.NewNamespace()})
	require.Error(t, err)
	_, err = e1.Minipy("1", &minipy.Options{Globals: ns})
	assert.NoError(t, err)
}

func TestIsolatedSoftTimeoutKeepsState(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	_, err := e.Minipy("kept = 7", nil)
	require.NoError(t, err)
	_, err = e.Minipy("import time; time.sleep(10)", &minipy.Options{Timeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, minipy.ErrTimeout)
	assert.False(t, errors.Is(err, minipy.ErrStateLost), "the code yielded: nothing was lost")
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "minipy.TimeoutInterrupt", py.Type)
	r, err := e.Minipy("kept", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(7), r.Value)
}

func TestIsolatedHardTimeoutKillsCLoop(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	ns := e.NewNamespace()
	_, err := e.Minipy("kept = 7", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	start := time.Now()
	_, err = e.Minipy("sum(range(10**12))", &minipy.Options{Globals: ns, Timeout: 200 * time.Millisecond})
	took := time.Since(start)
	require.Error(t, err)
	assert.ErrorIs(t, err, minipy.ErrTimeout)
	assert.ErrorIs(t, err, minipy.ErrStateLost)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.Killed)
	assert.Less(t, took, 200*time.Millisecond+hardBound+time.Second, "deadline + grace (to its cap on a loaded machine) + kill")

	// The namespace lives on, empty, in a fresh worker.
	_, err = e.Minipy("kept", &minipy.Options{Globals: ns})
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "NameError", py.Type)
	r, err := e.Minipy("kept = 8; kept", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	assert.Equal(t, int64(8), r.Value)
}

func TestIsolatedContextCancelKillsCLoop(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := e.Run(ctx, "sum(range(10**12))", nil)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, minipy.ErrStateLost)
	r, err := e.Minipy("2 + 2", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(4), r.Value)
}

// markerProcs lists the pids whose command line contains marker, and the zombies among
// this test process's children.
func markerProcs(t *testing.T, marker string) (pids []int, zombies []int) {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	me := os.Getpid()
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if cmd, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline")); err == nil &&
			strings.Contains(string(cmd), marker) {
			pids = append(pids, pid)
		}
		stat, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == strconv.Itoa(me) {
			zombies = append(zombies, pid)
		}
	}
	return pids, zombies
}

func TestIsolatedHardKillLeavesNoProcesses(t *testing.T) {
	checkHardKillLeavesNoProcesses(t, newIsolated(t, minipy.IsolatedConfig{}))
}

func TestIsolatedUnsandboxed(t *testing.T) {
	_, err := minipy.NewIsolatedActingUnsandboxed(minipy.IsolatedConfig{})
	require.ErrorIs(t, err, minipy.ErrNoSandbox, "no silent fallback: the network would stay on")

	e, err := minipy.NewIsolatedActingUnsandboxed(minipy.IsolatedConfig{AllowUnsandboxed: true})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	// Without a pid namespace the worker is its descendants' subreaper and the host kills
	// the tree it finds in /proc.
	checkHardKillLeavesNoProcesses(t, e)
}

func checkHardKillLeavesNoProcesses(t *testing.T, e *minipy.Isolated) {
	marker := fmt.Sprintf("minipy-tree-%d-%d", os.Getpid(), time.Now().UnixNano())
	_, before := markerProcs(t, marker)
	code := fmt.Sprintf(`import os, subprocess, sys
marker = %q
sleeper = [sys.executable, "-c", "import time; time.sleep(300)", marker]
subprocess.Popen(sleeper, start_new_session=True)  # a child in a session of its own
subprocess.Popen(["sh", "-c", " ".join(sleeper[:2]) + " 'import time; time.sleep(300)' " + marker + " &"])  # orphaned
if os.fork() == 0:  # a double fork that leaves its parent's session
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, sleeper)
    os._exit(0)
os.wait()
`, marker)
	_, err := e.Minipy(code, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		pids, _ := markerProcs(t, marker)
		return len(pids) == 3
	}, 10*time.Second, 20*time.Millisecond, "the code's three detached sleepers run")

	// The worker is killed at the deadline and its snapshot takes over; what the earlier
	// run left running was the worker's, not the snapshot's, and goes with it.
	_, err = e.Minipy("sum(range(10**12))", &minipy.Options{Timeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, minipy.ErrTimeout)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.Killed)
	assert.True(t, lost.RolledBack)
	// The kill is synchronous for the worker; give the kernel a moment for the rest.
	require.Eventually(t, func() bool {
		pids, zombies := markerProcs(t, marker)
		return len(pids) == 0 && len(newZombies(zombies, before)) == 0
	}, 2*time.Second, 10*time.Millisecond, "no survivors, no zombies")
}

// newZombies is the zombies not in before: the test process may hold zombies of earlier
// tests (children that in-process runs started and nobody reaped).
func newZombies(zombies, before []int) []int {
	var fresh []int
	for _, z := range zombies {
		if !slices.Contains(before, z) {
			fresh = append(fresh, z)
		}
	}
	return fresh
}

func TestIsolatedCrashesAreReportedAndSurvived(t *testing.T) {
	// Namespaces share the worker, and there is no snapshot to roll back to.
	e := newIsolated(t, minipy.IsolatedConfig{Workers: 1, NoRollback: true})
	other := e.NewNamespace()
	_, err := e.Minipy("x = 1", &minipy.Options{Globals: other})
	require.NoError(t, err)

	_, err = e.Minipy("import os; os._exit(7)", nil)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.ErrorIs(t, err, minipy.ErrStateLost)
	assert.False(t, lost.Killed)
	assert.Equal(t, 7, lost.ExitCode)

	// Another namespace of that worker learns of its loss once, then starts fresh.
	_, err = e.Minipy("x", &minipy.Options{Globals: other})
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.Earlier)
	_, err = e.Minipy("x = 2", &minipy.Options{Globals: other})
	require.NoError(t, err)

	_, err = e.Minipy("import ctypes; ctypes.string_at(0)", nil)
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, syscall.SIGSEGV, lost.Signal)
	assert.Contains(t, lost.Stderr, "Segmentation fault", "faulthandler's report reaches the error")

	_, err = e.Minipy("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", nil)
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, syscall.SIGKILL, lost.Signal)

	r, err := e.Minipy("6 * 7", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(42), r.Value)
}

func TestIsolatedMemoryLimit(t *testing.T) {
	bomb := "b = bytearray(2 << 30); len(b)"
	unlimited := newIsolated(t, minipy.IsolatedConfig{})
	_, err := unlimited.Minipy(bomb+"; del b", nil)
	require.NoError(t, err, "without the limit the allocation succeeds")

	e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 512 << 20})
	_, err = e.Minipy("kept = 1", nil)
	require.NoError(t, err)
	_, err = e.Minipy(bomb, nil)
	assert.ErrorIs(t, err, minipy.ErrLimit)
	var limit *minipy.LimitError
	require.ErrorAs(t, err, &limit)
	assert.Equal(t, "memory", limit.Limit)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "MemoryError", py.Type)
	r, err := e.Minipy("kept", nil)
	require.NoError(t, err, "the worker survives a memory bomb")
	assert.Equal(t, int64(1), r.Value)
}

func TestIsolatedCPULimit(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{CPULimit: time.Second, NoRollback: true})
	_, err := e.Minipy("sum(range(10**6))", nil)
	require.NoError(t, err, "short runs stay under the per-run limit")
	start := time.Now()
	_, err = e.Minipy("while True: pass", &minipy.Options{Timeout: time.Minute})
	assert.Less(t, time.Since(start), 20*time.Second)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, "cpu", lost.Limit)
	assert.ErrorIs(t, err, minipy.ErrLimit)
	assert.ErrorIs(t, err, minipy.ErrStateLost)
	_, err = e.Minipy("1", nil)
	require.NoError(t, err)
}

func TestIsolatedFileSizeLimit(t *testing.T) {
	code := "with open('big', 'wb') as f:\n    f.write(b'x' * (2 << 20))"
	_, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	_, err = newIsolated(t, minipy.IsolatedConfig{FileSizeLimit: 1 << 20}).Minipy(code, nil)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "OSError", py.Type)
	assert.Contains(t, py.Message, "File too large")
}

func TestIsolatedOpenFilesLimit(t *testing.T) {
	code := "files = [open('/dev/null') for _ in range(200)]; len(files)"
	_, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	_, err = newIsolated(t, minipy.IsolatedConfig{OpenFiles: 64}).Minipy(code, nil)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "OSError", py.Type)
	assert.Contains(t, py.Message, "Too many open files")
}

func TestIsolatedProcessLimit(t *testing.T) {
	code := `import subprocess
procs = [subprocess.Popen(["sleep", "30"]) for _ in range(20)]
for p in procs:
    p.kill()
    p.wait()
len(procs)`
	_, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	_, err = newIsolated(t, minipy.IsolatedConfig{Processes: 10}).Minipy(code, nil)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "BlockingIOError", py.Type)
}

// A sandbox that cannot start for a process limit (here its own: Processes 1, which only
// a test can set, leaves its pid 1 no fork; a host's pid_max or pids.max fails the same
// way) says which limits those are, not a bare errno.
func TestIsolatedStartAtProcessLimitSaysSo(t *testing.T) {
	e, err := minipy.NewIsolatedBelowProcessFloor(minipy.IsolatedConfig{Processes: 1})
	if err == nil {
		e.Close()
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), "process limit is reached: kernel.pid_max")
}

// Processes under MinProcesses is refused at NewIsolated, with why: below it a sandbox did
// not start (2: "failed to start:" and no reason), or a rollback lost the variables (5: the
// next snapshot's fork failed). At MinProcesses a sandbox starts and rolls back, again and
// again, and Command workers (whose count is the far side's) are not held to it.
func TestIsolatedProcessesFloor(t *testing.T) {
	for _, n := range []int{1, 2, minipy.MinProcesses - 1} {
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{Processes: n})
		require.Error(t, err, "Processes %d", n)
		assert.Contains(t, err.Error(), "MinProcesses")
	}
	e := newIsolated(t, minipy.IsolatedConfig{Processes: minipy.MinProcesses})
	ns := e.NewNamespace()
	opts := &minipy.Options{Globals: ns}
	for i := range 3 {
		_, err := e.Minipy(fmt.Sprintf("kept%d = %d", i, i), opts)
		require.NoError(t, err)
		_, err = e.Minipy("import os; os._exit(7)", opts)
		var lost *minipy.WorkerLostError
		require.ErrorAs(t, err, &lost)
		r, err := e.Minipy(fmt.Sprintf("kept%d", i), opts)
		require.NoError(t, err, "rollback %d", i+1)
		assert.Equal(t, int64(i), r.Value)
	}
	c, err := minipy.NewIsolated(minipy.IsolatedConfig{Processes: 1, Command: []string{"/nonexistent/worker"}, Network: true})
	if err == nil {
		c.Close()
	} else {
		assert.NotContains(t, err.Error(), "MinProcesses")
	}
}

func TestIsolatedPrivateWorkdir(t *testing.T) {
	e1, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	require.NoError(t, err)
	defer e1.Close()
	e2 := newIsolated(t, minipy.IsolatedConfig{})
	r, err := e1.Minipy("import os; open('note.txt', 'w').write('hi'); os.getcwd(), os.environ['HOME']", nil)
	require.NoError(t, err)
	assert.Equal(t, []any{"/work", "/work"}, r.Value, "the sandbox's own path, not the host's")
	dir := e1.WorkDir()
	assert.FileExists(t, filepath.Join(dir, "note.txt"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "input.csv"), []byte("a,b\n"), 0o644))
	r, err = e1.Minipy("open('input.csv').read()", nil)
	require.NoError(t, err)
	assert.Equal(t, "a,b\n", r.Value, "files the host puts in WorkDir are the code's")
	r, err = e2.Minipy("import os; os.listdir('.')", nil)
	require.NoError(t, err)
	assert.Empty(t, r.Value, "another engine's workdir is its own")
	assert.NotEqual(t, dir, e2.WorkDir())
	require.NoError(t, e1.Close())
	assert.NoDirExists(t, dir, "Close removes the working directory")
	_, err = e1.Minipy("1", nil)
	assert.ErrorIs(t, err, minipy.ErrEngineClosed)
}

func TestIsolatedNetworkOffByDefault(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	code := fmt.Sprintf("import socket; socket.create_connection(('127.0.0.1', %d), timeout=5).close(); 'connected'", port)

	r, err := newIsolated(t, minipy.IsolatedConfig{Network: true}).Minipy(code, nil)
	require.NoError(t, err)
	assert.Equal(t, "connected", r.Value)

	_, err = newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py, "with Network false the host's listener is unreachable")
	assert.Contains(t, []string{"OSError", "ConnectionRefusedError"}, py.Type)
}

func TestIsolatedParallelWorkers(t *testing.T) {
	const n = 8
	e := newIsolated(t, minipy.IsolatedConfig{Workers: n})
	spaces := make([]*minipy.Namespace, n)
	pids := map[int64]bool{}
	for i := range spaces {
		spaces[i] = e.NewNamespace()
		r, err := e.Minipy("import os; os.getppid(), id(os)", &minipy.Options{Globals: spaces[i]})
		require.NoError(t, err) // warm: every worker has started
		_ = r
	}
	for i := range spaces {
		r, err := e.Minipy("import os; open('/proc/self/stat').read().split()[0]", &minipy.Options{Globals: spaces[i]})
		require.NoError(t, err)
		pid, _ := strconv.ParseInt(r.Value.(string), 10, 64)
		pids[pid] = true
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	spans := make([][2]float64, n) // each sleep's start and end, by the machine's clock
	for i := range spaces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r *minipy.Result
			r, errs[i] = e.Minipy("import time\nstart = time.time()\ntime.sleep(1)\n(start, time.time())",
				&minipy.Options{Globals: spaces[i]})
			if errs[i] == nil {
				spans[i] = [2]float64{r.Value.([]any)[0].(float64), r.Value.([]any)[1].(float64)}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	// The 8 sleeps overlap: there is a moment when all of them sleep (the last to start
	// started before the first to end ended). One after another, none would; a loaded
	// machine has a second to start them all.
	lastStart, firstEnd := spans[0][0], spans[0][1]
	for _, s := range spans {
		lastStart, firstEnd = max(lastStart, s[0]), min(firstEnd, s[1])
	}
	assert.Less(t, lastStart, firstEnd, "8 sleeps on 8 workers overlap: %v", spans)
}

func TestIsolatedCommandWrapper(t *testing.T) {
	// A local stand-in for kubectl exec -i / docker exec -i: a wrapper that pipes
	// stdin/stdout to python, and marks the environment so the test can see it was used.
	python := minipy.LinkedPython()
	wrapper := []string{"sh", "-c", `MINIPY_VIA=wrapper exec /usr/bin/env "$0" "$@"`, python}
	e := newIsolated(t, minipy.IsolatedConfig{Command: wrapper, Network: true})
	r, err := e.Minipy("import os; print('out'); os.environ.get('MINIPY_VIA')", nil)
	require.NoError(t, err)
	assert.Equal(t, "wrapper", r.Value)
	assert.Equal(t, "out\n", r.Stdout)

	_, err = e.Minipy("sum(range(10**12))", &minipy.Options{Timeout: 100 * time.Millisecond})
	assert.ErrorIs(t, err, minipy.ErrTimeout)
	assert.ErrorIs(t, err, minipy.ErrStateLost)
	r, err = e.Minipy("1 + 1", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Value)

	// ssh passes its arguments through the remote user's shell: CommandShell quotes them.
	ssh := []string{"sh", "-c", `eval "$*"`, "ssh-like", python}
	e2 := newIsolated(t, minipy.IsolatedConfig{Command: ssh, CommandShell: true, Network: true})
	r, err = e2.Minipy("'it' + \"works\"", nil)
	require.NoError(t, err)
	assert.Equal(t, "itworks", r.Value)

	_, err = minipy.NewIsolated(minipy.IsolatedConfig{Command: wrapper})
	assert.Error(t, err, "Network: false cannot be honoured through a command")
}

func TestIsolatedLateKicksNeverLeak(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	for i := 0; i < 60; i++ {
		// Deadlines that land around the end of the run.
		timeout := time.Duration(8+i%5) * time.Millisecond
		_, err := e.Minipy("import time; time.sleep(0.01)", &minipy.Options{Timeout: timeout})
		if err != nil {
			require.ErrorIs(t, err, minipy.ErrTimeout)
			require.False(t, errors.Is(err, minipy.ErrStateLost))
		}
		r, err := e.Minipy("sum(range(1000))", nil)
		require.NoError(t, err, "run %d", i)
		require.Equal(t, int64(499500), r.Value)
	}
}

func TestIsolatedLocalsOnAnotherWorker(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Workers: 2})
	a, b := e.NewNamespace(), e.NewNamespace()
	_, err := e.Minipy("1", &minipy.Options{Globals: a, Locals: b})
	require.Error(t, err)
	c := e.NewNamespace() // round-robin: back on a's worker
	_, err = e.Minipy("y = 1", &minipy.Options{Globals: a, Locals: c})
	require.NoError(t, err)
	v, err := c.Get("y")
	require.NoError(t, err)
	assert.Equal(t, int64(1), v)
}

func TestIsolatedBadConfig(t *testing.T) {
	_, err := minipy.NewIsolated(minipy.IsolatedConfig{Python: "/nonexistent/python3"})
	assert.Error(t, err)
	_, err = minipy.NewIsolated(minipy.IsolatedConfig{Python: "/bin/false"})
	assert.Error(t, err)
	_, err = minipy.NewIsolated(minipy.IsolatedConfig{TmpSize: -1})
	assert.Error(t, err, "a tmpfs has no Unlimited")
	_, err = minipy.NewIsolated(minipy.IsolatedConfig{Workers: -1})
	assert.Error(t, err)
}

func TestIsolatedCloseStopsRunsInProgress(t *testing.T) {
	e, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := e.Minipy("sum(range(10**12))", &minipy.Options{Timeout: time.Minute})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, e.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, minipy.ErrEngineClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("the run outlived Close")
	}
	ns := e.NewNamespace()
	assert.ErrorIs(t, ns.Set("x", 1), minipy.ErrEngineClosed)
}

func TestIsolatedCodeThatWritesToTheProtocolIsContained(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	// The code finds the worker's private pipes and writes a frame header claiming ~1 GB:
	// the host must neither allocate it nor wait past the run's deadline (it refuses the
	// header: isolated_frames_test.go).
	code := `import os
for fd in range(3, 64):
    try:
        if os.readlink("/proc/self/fd/%d" % fd).startswith("pipe:"):
            os.write(fd, b"\xff\xff\xff\x3fA")
    except OSError:
        pass`
	_, err := e.Minipy(code, &minipy.Options{Timeout: 300 * time.Millisecond})
	require.ErrorIs(t, err, minipy.ErrStateLost)
	assert.ErrorIs(t, err, minipy.ErrProtocol)
	r, err := e.Minipy("1 + 1", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Value)
}

// sandboxReadableDir is a temporary directory that the sandboxed workers' unprivileged user
// can enter (t.TempDir's parent is private to the host's user).
func sandboxReadableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "minipy-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

func TestIsolatedPythonFromAVenv(t *testing.T) {
	venv := filepath.Join(sandboxReadableDir(t), "venv")
	out, err := exec.Command(minipy.LinkedPython(), "-m", "venv", "--without-pip", venv).CombinedOutput()
	require.NoError(t, err, string(out))

	e := newIsolated(t, minipy.IsolatedConfig{Python: filepath.Join(venv, "bin", "python")})
	r, err := e.Minipy("import sys; sys.prefix, sys.executable", nil)
	require.NoError(t, err)
	assert.Equal(t, []any{venv, filepath.Join(venv, "bin", "python")}, r.Value)
}

func TestIsolatedContextEndedBeforeRun(t *testing.T) {
	e, err := minipy.NewIsolated(minipy.IsolatedConfig{Workers: 1})
	require.NoError(t, err)
	defer e.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = e.Run(ctx, "1+1", nil)
	var stopped *minipy.InterruptedError
	require.ErrorAs(t, err, &stopped, "the same error as the in-process engine")
	assert.ErrorIs(t, err, context.Canceled)
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err = e.Run(ctx, "1+1", nil)
	assert.ErrorIs(t, err, minipy.ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestIsolatedCallTool(t *testing.T) {
	e, err := minipy.NewIsolated(minipy.IsolatedConfig{Workers: 1})
	require.NoError(t, err)
	defer e.Close()
	ns := e.NewNamespace()
	opts := &minipy.Options{Globals: ns}

	schema := e.ToolSchemaFor(opts)
	r, err := e.Minipy("import platform; platform.python_version()", opts)
	require.NoError(t, err)
	assert.Contains(t, schema.Description, "Python "+r.Value.(string), "the workers' Python is described")

	text, isError := e.CallTool(context.Background(), json.RawMessage(`{"code": "import os\nx = 41\nos.getpid()"}`), opts)
	require.False(t, isError, text)
	assert.NotContains(t, text, fmt.Sprintf("\n%d\n", os.Getpid()), "the code ran in a worker process")
	text, isError = e.CallTool(context.Background(), json.RawMessage(`{"code": "x + 1"}`), opts)
	assert.False(t, isError)
	assert.Equal(t, "[value]\n42\n", text, "state persists between tool calls")

	// What would end the host in-process only costs the worker here.
	text, isError = e.CallTool(context.Background(), json.RawMessage(`{"code": "import os; os._exit(3)"}`), opts)
	assert.True(t, isError)
	assert.Contains(t, text, "exited with status 3", "the model learns what happened")
	assert.Contains(t, text, "the namespace was rolled back to before this run")
	text, isError = e.CallTool(context.Background(), json.RawMessage(`{"code": "'still serving'"}`), opts)
	assert.False(t, isError, text)
	assert.Contains(t, text, "still serving")
}

func TestIsolatedDefaultPythonIsTheLinkedOne(t *testing.T) {
	// Both engines run one Python build: the workers' default is the executable of the
	// libpython this binary links (found from the library, not from PATH), and it is what
	// the in-process interpreter reports as sys.executable.
	python := minipy.LinkedPython()
	require.NotEmpty(t, python)
	const probe = "import sys; [sys.executable, sys.version]"
	in, err := minipy.Minipy(probe, nil)
	require.NoError(t, err)
	out, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(probe, nil)
	require.NoError(t, err)
	assert.Equal(t, python, in.Value.([]any)[0])
	assert.Equal(t, in.Value, out.Value)
}

func TestIsolatedPythonTheSandboxCannotReach(t *testing.T) {
	// A python in a directory that the sandbox's workers may not enter gets an error that
	// says why, not a bare "permission denied". (A root host's workers start as root of their
	// user namespace, which enters root's private directories, /root say, but not another
	// user's: TestSandboxRootUnreachablePaths.)
	dir := t.TempDir()
	link := filepath.Join(dir, "python")
	require.NoError(t, os.Symlink(minipy.LinkedPython(), link))
	require.NoError(t, os.Chmod(dir, 0o700))
	if os.Geteuid() == 0 {
		require.NoError(t, os.Chown(dir, 54321, 54321)) // another user's
	} else {
		// Sandboxed workers of a non-root host run as that same user: shut it out too.
		require.NoError(t, os.Chmod(dir, 0o000))
		t.Cleanup(func() { os.Chmod(dir, 0o700) })
	}
	_, err := minipy.NewIsolated(minipy.IsolatedConfig{Python: link})
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrPermission)
	if os.Geteuid() == 0 {
		assert.ErrorIs(t, err, minipy.ErrSandboxAccess)
		assert.Contains(t, err.Error(), link)
	}
}

func TestIsolatedTimeoutRunsFinallyAndWithExits(t *testing.T) {
	// The same interrupt as in-process, raised in the worker: cleanup runs there too.
	e := newIsolated(t, minipy.IsolatedConfig{})
	for name, code := range cleanupShapes {
		if name == "one-line while 1" {
			continue // see TestTimeoutRunsFinallyAndWithExits
		}
		t.Run(name, func(t *testing.T) {
			// The interrupt must find the code inside its try: not a time window (a machine
			// loaded 5x its cores took up to 300 ms from the request to the first line, and two
			// seconds were once too little under more load than that), but a cancel after the
			// code's first line says it runs, a few bytecodes before its try: 200 ms, then,
			// where that was not enough to reach the try (a decorator and a generator's start
			// before it, on a machine loaded 8x its cores), 1 s and 3 s. A cleanup that an
			// interrupt in the loop skips fails all three.
			for i, after := range []time.Duration{200 * time.Millisecond, time.Second, 3 * time.Second} {
				err := stopInsideCleanup(t, e, code, after)
				if err == nil || i == 2 {
					require.NoError(t, err, "the cleanup did not run")
					break
				}
				t.Logf("stopped %v after its first line, the cleanup had not run (%v): again, later", after, err)
			}
		})
	}
}

// stopInsideCleanup runs code in a fresh namespace of e and cancels it after its first line
// ran, then says whether its cleanup ran (nil) or not.
func stopInsideCleanup(t *testing.T, e *minipy.Isolated, code string, after time.Duration) error {
	t.Helper()
	ns := e.NewNamespace()
	defer ns.Close()
	// Its worker first: a run's timeout counts the wait for it, which on a busy machine can
	// last until the interrupt comes before the code's first line. So do the shapes' imports
	// (a loaded machine took over 100 ms for `import contextlib`).
	_, err := e.Minipy("import contextlib, threading, types", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := &startSignal{cancel: func() { time.AfterFunc(after, cancel) }}
	_, err = e.Run(ctx, "print('started', flush=True)\n"+code, &minipy.Options{Globals: ns, Timeout: time.Minute, Stdout: started})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, minipy.ErrStateLost, "stopped in Python, not killed")
	check := "done"
	if strings.Contains(code, "lock") {
		check = "not lock.locked()"
	}
	r, err := e.Minipy(check, &minipy.Options{Globals: ns})
	if err != nil {
		return err
	}
	if r.Value != true {
		return fmt.Errorf("%s is %v", check, r.Value)
	}
	return nil
}

func TestIsolatedSwallowerStoppedInPython(t *testing.T) {
	// Code that swallows the first interrupt meets the worker's hard stage (a tracer that
	// raises at the next line, re-armed by each repeated kick) before the kill.
	e := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	code := "swallowed = 0\nwhile True:\n    try:\n        n = 0\n        while True:\n            n += 1\n    except:\n        swallowed += 1\n"
	// On a machine loaded past what the grace accounts for (it subtracts the time the code
	// waited for a CPU; seen once, compat 3.14 beside compat 3.15 and 8 busy loops on 2 cores,
	// not with the busy loops alone in 45 runs), the kill can come first: the hard stage is
	// shown to work by one run it stopped, of up to 5 (a hard stage that never stops one
	// fails all 5).
	for attempt := 1; ; attempt++ {
		ns := e.NewNamespace()
		_, err := e.Minipy("pass", &minipy.Options{Globals: ns}) // its worker first (the timeout counts the wait)
		require.NoError(t, err)
		_, err = e.Minipy(code, &minipy.Options{Globals: ns, Timeout: 100 * time.Millisecond})
		require.ErrorIs(t, err, minipy.ErrTimeout)
		if minipy.LinkedVersion() == "3.11" {
			// 3.11 has no sys.monitoring, and a sys.settrace tracer is dropped once it raises:
			// the swallower catches each raise, so the kill after the grace period stops it.
			assert.ErrorIs(t, err, minipy.ErrStateLost, "3.11: the kill is what stops a swallower in a worker")
			return
		}
		if errors.Is(err, minipy.ErrStateLost) && attempt < 5 {
			t.Logf("attempt %d: killed before the hard stage stopped it (a loaded machine): %v", attempt, err)
			ns.Close()
			continue
		}
		require.NotErrorIs(t, err, minipy.ErrStateLost, "stopped in Python, not killed (%d attempts)", attempt)
		var py *minipy.PythonError
		require.ErrorAs(t, err, &py)
		assert.Equal(t, "minipy.TimeoutInterrupt", py.Type)
		assertFramesOnce(t, py.Traceback)
		swallowed, gerr := ns.Get("swallowed")
		if (gerr != nil || swallowed == int64(0)) && attempt < 5 {
			// The first interrupt came before the code was inside its try (on a loaded machine
			// the 100 ms can end before it gets there: seen in compat 3.12 beside 8 busy
			// loops): nothing was swallowed, so this run says nothing of the hard stage.
			t.Logf("attempt %d: interrupted before it could swallow (%v, %v)", attempt, swallowed, gerr)
			ns.Close()
			continue
		}
		require.NoError(t, gerr)
		assert.Positive(t, swallowed)
		return
	}
}

func TestOldestPythonIsOneRule(t *testing.T) {
	// The C layer refuses to build against an older libpython with an #error; its hex
	// version must be the one the isolated engine checks workers against.
	src, err := os.ReadFile(filepath.Join("internal", "cpython", "cpython.c"))
	require.NoError(t, err)
	v := minipy.MinPythonVersion
	want := fmt.Sprintf("#if PY_VERSION_HEX < 0x%02X%02X0000\n#error", v[0], v[1])
	assert.Contains(t, string(src), want)
}

func TestIsolatedRefusesAnOldPython(t *testing.T) {
	// A stand-in "python" that runs the real one with sys.version_info faked as 3.10: the
	// worker starts, and the engine refuses it by the version it reports.
	fake := filepath.Join(sandboxReadableDir(t), "python3.10")
	script := "#!/bin/sh\nfor a; do last=$a; done\nexec " + minipy.LinkedPython() + " -S -c 'import sys\nclass V(tuple):\n    pass\n" +
		"sys.version_info = V((3, 10, 4))\nexec(sys.argv[1])' \"$last\"\n" // the bootstrap, after -S -c
	require.NoError(t, os.WriteFile(fake, []byte(script), 0o755))
	_, err := minipy.NewIsolated(minipy.IsolatedConfig{Python: fake})
	require.ErrorIs(t, err, minipy.ErrPythonVersion)
}

// Preload's modules are imported as each worker starts: already in sys.modules on the first
// run, and again in a worker that replaced a lost one. A module that cannot be imported
// fails NewIsolated with an error naming it.
func TestIsolatedPreload(t *testing.T) {
	preload := []string{"json", "xml.dom.minidom"}
	eng := newIsolated(t, minipy.IsolatedConfig{Preload: preload, NoRollback: true})
	check := "import sys\n[m in sys.modules for m in ('json', 'xml.dom.minidom', 'xml.sax')]"
	r, err := eng.Minipy(check, nil)
	require.NoError(t, err)
	assert.Equal(t, []any{true, true, false}, r.Value)
	_, err = eng.Minipy("import os\nos._exit(3)", nil)
	require.ErrorIs(t, err, minipy.ErrStateLost)
	r, err = eng.Minipy(check, nil)
	require.NoError(t, err)
	assert.Equal(t, []any{true, true, false}, r.Value, "the replacement worker preloads too")

	_, err = minipy.NewIsolated(minipy.IsolatedConfig{Preload: []string{"json", "minipy_no_such_module"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "IsolatedConfig.Preload: importing minipy_no_such_module failed: ModuleNotFoundError")
	_, err = minipy.NewIsolated(minipy.IsolatedConfig{Preload: []string{"os; import this"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"os; import this" is not a module name`)
}

// Startup's code runs once in each worker before its first run (in the template, which
// each worker is forked from, or in each worker started without one), in a module of its
// own: what it registers holds in every namespace, a crashed worker's replacement included.
// Code that fails fails NewIsolated with its error.
func TestIsolatedStartup(t *testing.T) {
	startup := "import builtins\nbuiltins.startups = getattr(builtins, 'startups', 0) + 1\nprint('dropped')\n" +
		"__minipy__.display_formatter.formatters['text/x-shout'] = lambda o: str(o).upper() if isinstance(o, str) else None"
	for _, noTemplate := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoTemplate=%v", noTemplate), func(t *testing.T) {
			eng := newIsolated(t, minipy.IsolatedConfig{Startup: startup, NoTemplate: noTemplate})
			check := func() {
				t.Helper()
				ns := eng.NewNamespace()
				defer ns.Close()
				r, err := eng.Run(context.Background(), "startups, __name__, 'hey'", &minipy.Options{Globals: ns})
				require.NoError(t, err)
				assert.Equal(t, []any{int64(1), "__main__", "hey"}, r.Value, "once, and not in the code's module")
				assert.Empty(t, r.Stdout)
				_, err = eng.Run(context.Background(), "x = 'hey'\nx", &minipy.Options{Globals: ns})
				require.NoError(t, err)
				r, err = eng.Run(context.Background(), "x", &minipy.Options{Globals: ns})
				require.NoError(t, err)
				require.Len(t, r.Displays, 1, "the registered formatter's form makes the value a display")
				assert.Equal(t, "HEY", string(r.Displays[0].Data["text/x-shout"]))
			}
			check()
			check()
			_, err := eng.Minipy("import os\nos._exit(3)", nil)
			require.Error(t, err)
			check()
		})
	}
	_, err := minipy.NewIsolated(minipy.IsolatedConfig{Startup: "raise ValueError('no startup today')"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "IsolatedConfig.Startup failed: ValueError: no startup today")
}

// By default each namespace is a worker process of its own: one cannot reach another's
// objects, one's crash leaves the other's variables, and Close (the namespace's or the
// engine's) leaves none of its processes behind.
func TestIsolatedNamespacesAreProcesses(t *testing.T) {
	before := workerProcesses(t)
	_, zombiesBefore := markerProcs(t, "-")
	e := newIsolated(t, minipy.IsolatedConfig{Spares: 1}) // (one spare: the adaptive pool grows with the calls)
	a, b := e.NewNamespace(), e.NewNamespace()
	run := func(ns *minipy.Namespace, code string) (*minipy.Result, error) {
		return e.Run(context.Background(), code, &minipy.Options{Globals: ns, Timeout: 20 * time.Second})
	}
	_, err := run(a, "secret = 'a-s3cret-value'\nx = 1")
	require.NoError(t, err)
	r, err := run(b, "import gc\nany(isinstance(o, dict) and o.get('secret') == 'a-s3cret-value' for o in gc.get_objects())")
	require.NoError(t, err)
	assert.Equal(t, false, r.Value, "b cannot find a's namespace")
	_, err = run(b, "y = 2")
	require.NoError(t, err)

	_, err = run(a, "import os; os._exit(3)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	r, err = run(b, "y")
	require.NoError(t, err, "b's process never noticed")
	assert.Equal(t, int64(2), r.Value)

	_, err = e.Run(context.Background(), "1", &minipy.Options{Globals: a, Locals: b})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "set IsolatedConfig.Workers to pack namespaces")

	sleeper := func(ns *minipy.Namespace, marker string) {
		_, err := run(ns, fmt.Sprintf("import subprocess, sys\nP = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', %q])", marker))
		require.NoError(t, err)
	}
	gone := func(marker string) {
		require.Eventually(t, func() bool {
			pids, zombies := markerProcs(t, marker)
			return len(pids) == 0 && len(newZombies(zombies, zombiesBefore)) == 0
		}, 5*time.Second, 10*time.Millisecond, "nothing of %s is left", marker)
	}
	base := fmt.Sprintf("minipy-ns-%d-%d", os.Getpid(), time.Now().UnixNano())
	sleeper(a, base+"-a")
	sleeper(b, base+"-b")
	require.NoError(t, a.Close())
	gone(base + "-a")
	r, err = run(b, "y")
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Value, "b's process lives on")
	c := e.NewNamespace()
	sleeper(c, base+"-c")
	// Besides the template, the default namespace's worker, b's and c's, the spare started
	// ahead for the next NewNamespace.
	assert.Eventually(t, func() bool { return workerProcesses(t) == before+5 }, 5*time.Second, 10*time.Millisecond,
		"the template, and the default's, b's, c's and the spare (its start may still be under way)")
	runtime.KeepAlive(b) // a namespace that is collected is closed, its worker with it
	runtime.KeepAlive(c)
	require.NoError(t, e.Close())
	gone(base + "-b")
	gone(base + "-c")
	require.Eventually(t, func() bool { return workerProcesses(t) == before }, 5*time.Second, 10*time.Millisecond,
		"no worker is left, the spare included")
}

// workerProcesses counts the live sandboxes this test process started, the pid-1 processes
// of a pid namespace that run the worker bootstrap (the guardian of each worker), and the
// engines' templates (its children that run it in this pid namespace).
func workerProcesses(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	parent := map[int]int{}
	var pid1 []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "status"))
		if err != nil {
			continue
		}
		var nspid []string
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				switch f[0] {
				case "PPid:":
					parent[pid], _ = strconv.Atoi(f[1])
				case "NSpid:":
					nspid = f[1:]
				case "State:":
					if f[1] == "Z" {
						nspid = nil
					}
				}
			}
		}
		if len(nspid) > 1 && nspid[len(nspid)-1] == "1" || len(nspid) == 1 && parent[pid] == os.Getpid() {
			if cmd, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline")); err == nil &&
				strings.Contains(string(cmd), "def _read(n)") {
				pid1 = append(pid1, pid)
			}
		}
	}
	me, n := os.Getpid(), 0
	for _, pid := range pid1 {
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == me {
				n++
				break
			}
		}
	}
	return n
}

// A run that crashes its worker or is killed at its deadline costs only itself: the
// worker's snapshot from before it takes over, the variables set before it are there and
// its own are not, and the error says what happened without matching ErrStateLost. It
// rolls back again after a rollback, and host functions are still bound.
func TestIsolatedRollback(t *testing.T) {
	cfg := minipy.IsolatedConfig{MemoryLimit: 1 << 30, CPULimit: time.Second}
	if minipy.FreeThreaded() {
		// A free-threaded worker under a MemoryLimit takes no snapshots (worker.py says why).
		cfg.MemoryLimit = 0
	}
	e := newIsolated(t, cfg)
	ns := e.NewNamespace()
	require.NoError(t, ns.Register(minipy.Function{Name: "host_add", Call: func(_ context.Context, args map[string]any) (any, error) {
		return args["a"].(int64) + 1, nil
	}, InputSchema: map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "integer"}}}}))
	opts := &minipy.Options{Globals: ns, Timeout: time.Minute} // (the CPU limit counts CPU time: on a loaded machine 1 s of it takes longer)
	run := func(code string) (*minipy.Result, error) { return e.Run(context.Background(), code, opts) }
	short := &minipy.Options{Globals: ns, Timeout: 200 * time.Millisecond} // before the CPU limit
	_, err := run("kept = [1, 2, 3]")
	require.NoError(t, err)
	crashes := []struct {
		name, code string
		check      func(t *testing.T, lost *minipy.WorkerLostError)
	}{
		{"exit", "import os; os._exit(7)", func(t *testing.T, lost *minipy.WorkerLostError) {
			assert.Equal(t, 7, lost.ExitCode)
		}},
		{"segfault", "import ctypes; ctypes.string_at(0)", func(t *testing.T, lost *minipy.WorkerLostError) {
			assert.Equal(t, syscall.SIGSEGV, lost.Signal)
			assert.Contains(t, lost.Stderr, "Segmentation fault")
		}},
		{"memory limit", "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\n" +
			"p = libc.malloc(ctypes.c_size_t(1 << 31))\nctypes.memset(p or 0, 1, 1)", func(t *testing.T, lost *minipy.WorkerLostError) {
			assert.Equal(t, syscall.SIGSEGV, lost.Signal, "malloc failed under RLIMIT_AS and C wrote through NULL")
		}},
		{"cpu limit", "while True: pass", func(t *testing.T, lost *minipy.WorkerLostError) {
			assert.Equal(t, "cpu", lost.Limit)
			assert.ErrorIs(t, lost, minipy.ErrLimit)
		}},
		{"hard kill", "sum(range(10**12))", func(t *testing.T, lost *minipy.WorkerLostError) {
			assert.True(t, lost.Killed)
			assert.ErrorIs(t, lost, minipy.ErrTimeout)
		}},
	}
	for i, c := range crashes {
		if c.name == "memory limit" && cfg.MemoryLimit == 0 {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			o := opts
			if c.name == "hard kill" {
				o = short
			}
			_, err := e.Run(context.Background(), fmt.Sprintf("lost_%d = 1\n", i)+c.code, o)
			var lost *minipy.WorkerLostError
			require.ErrorAs(t, err, &lost)
			assert.True(t, lost.RolledBack)
			assert.NotErrorIs(t, err, minipy.ErrStateLost)
			assert.Contains(t, err.Error(), "the namespace was rolled back to before this run")
			c.check(t, lost)
			r, err := run(fmt.Sprintf("kept, 'lost_%d' in dir(), host_add(%d)", i, i))
			require.NoError(t, err)
			assert.Equal(t, []any{[]any{int64(1), int64(2), int64(3)}, false, int64(i + 1)}, r.Value)
			_, err = run(fmt.Sprintf("kept.append(%d)\nkept.pop()", i)) // a change that stays
			require.NoError(t, err)
		})
	}
	v, err := ns.Get("kept")
	require.NoError(t, err)
	assert.Equal(t, []any{int64(1), int64(2), int64(3)}, v)
}

// A sandbox without Network has its own loopback, up: its processes talk over 127.0.0.1 (a
// server and its client, git daemon), whichever way the sandbox was made; the host's
// listeners stay unreachable (TestIsolatedNetworkOffByDefault).
func TestSandboxLoopback(t *testing.T) {
	code := `import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
c = socket.create_connection(s.getsockname(), timeout=5)
a, _ = s.accept(); c.sendall(b"hi"); a.recv(2)`
	// More than 16 mounts under /tmp are more than the host's fork code holds: the tenant's
	// sandbox is made in Python (template.py's _become_tenant).
	var mounts []minipy.Mount
	for i := range 17 {
		mounts = append(mounts, minipy.Mount{Source: t.TempDir(), Target: fmt.Sprintf("/tmp/m%d", i)})
	}
	for name, e := range map[string]*minipy.Isolated{
		"template":                 newIsolated(t, minipy.IsolatedConfig{}),
		"template, python tenants": newIsolated(t, minipy.IsolatedConfig{Mounts: mounts}),
		"no template":              newIsolated(t, minipy.IsolatedConfig{NoTemplate: true}),
	} {
		r, err := e.Minipy(code, nil)
		require.NoError(t, err, name)
		assert.Equal(t, []byte("hi"), r.Value, name)
	}
}

// startSignal calls cancel once, at the first output it is given.
type startSignal struct {
	once   sync.Once
	cancel func()
}

func (s *startSignal) Write(b []byte) (int, error) {
	s.once.Do(s.cancel)
	return len(b), nil
}

// On CPython 3.12+ the filter that keeps a snapshot's fork quiet (worker.py's
// _quiet_snapshot_forks) is the template's, made once there and immortal with what else it
// loaded: a worker forked from it finds the filter in place and compiles none of its own
// (adding it, its two patterns compiled, wrote 45 pages of each worker's start on 3.13, 85
// on 3.14). On 3.11 there is no warning, and no filter.
func TestForkWarningFilterIsTheTemplates(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	r, err := e.Minipy(`import sys, warnings
f = warnings.filters[0] if warnings.filters else None
ours = f is not None and f[0] == "ignore" and f[2] is DeprecationWarning and getattr(f[3], "pattern", None) == r"_minipy_worker\Z"
immortal = sys.version_info >= (3, 12) and getattr(sys, "_is_gil_enabled", lambda: True)() and not hasattr(sys, "gettotalrefcount")
[sys.version_info >= (3, 12), ours, immortal, ours and sys.getrefcount(f) > 1 << 30]`, nil)
	require.NoError(t, err)
	got := r.Value.([]any)
	if got[0] != true {
		assert.Equal(t, false, got[1], "no filter before 3.12: no warning to silence")
		return
	}
	require.Equal(t, true, got[1], "the fork filter is first")
	if got[2] == true {
		assert.Equal(t, true, got[3], "the template's (immortal), not one the worker made")
	}
}
