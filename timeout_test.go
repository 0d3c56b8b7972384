package minipy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// The issue asks for a stop within 100 ms of the deadline (typically it is 1-10 ms); the
// bound the tests enforce is looser because -race on a loaded 2-core machine stretches
// everything (with four CPU-bound processes beside the test, the watchdog's own wake-up was
// seen 30 ms late and a busy loop's stop 250 ms late, once in 150 runs). It still sits below
// the 500 ms after which a run is abandoned, and every stop is also checked to have happened
// in Python (not Abandoned, with a traceback), which no abandoned run has.
const (
	testTimeout = 200 * time.Millisecond
	promptBound = 400 * time.Millisecond // the 100 ms, with room for -race and load
	// An abandoned run: the grace, which a loaded machine can stretch to its cap (the code
	// waited for a CPU), plus room for the watchdog's own wake-up.
	hardBound = minipy.AbandonCap + time.Second
)

// stopped is the outcome of a run that is expected to be stopped at its deadline.
type stopped struct {
	res  *minipy.Result
	err  error
	py   *minipy.PythonError
	late time.Duration // from the deadline to the return of Run
}

// runUntilStopped runs code with Options.Timeout = timeout in ns (nil: a fresh one) and
// checks that it was stopped, in Python, by the timeout.
func runUntilStopped(t *testing.T, code string, timeout time.Duration, ns *minipy.Namespace) stopped {
	t.Helper()
	if ns == nil {
		ns = minipy.NewNamespace()
		t.Cleanup(func() { ns.Close() })
	}
	start := time.Now()
	res, err := minipy.Run(context.Background(), code, &minipy.Options{Timeout: timeout, Globals: ns})
	s := stopped{res: res, err: err, late: time.Since(start) - timeout}
	t.Logf("latency: %s: %v after the deadline", t.Name(), s.late.Round(100*time.Microsecond))
	require.Error(t, err)
	require.ErrorIs(t, err, minipy.ErrTimeout)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "Options.Timeout is not a context deadline")
	failIfAbandoned(t, err)
	require.ErrorAs(t, err, &s.py, "the error must carry where the code was stopped")
	assert.Equal(t, "minipy.TimeoutInterrupt", s.py.Type)
	require.NotNil(t, res)
	return s
}

// failIfAbandoned ends the test process when err is an abandoned run: the code did not
// yield to the interrupt, so the shared interpreter stays busy with it for good, and every
// later namespace operation of this process (they have no deadline) would wait forever.
// Failing loudly now beats a test binary that hangs until its -timeout.
func failIfAbandoned(t *testing.T, err error) {
	t.Helper()
	var ie *minipy.InterruptedError
	if errors.As(err, &ie) && ie.Abandoned {
		fmt.Fprintf(os.Stderr, "--- FAIL: %s: the run was abandoned instead of stopped in Python (%v); "+
			"the in-process interpreter is lost for this test process\n", t.Name(), err)
		os.Exit(1)
	}
}

// child re-runs the current test in a fresh process (with its own interpreter) when the
// test's work would leave the shared interpreter busy or could break the host. It returns
// true in that child, where the caller does the work; in the parent it runs the child,
// fails the test if the child failed, and returns false.
func child(t *testing.T, env ...string) bool {
	t.Helper()
	const marker = "MINIPY_TEST_CHILD"
	if os.Getenv(marker) == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v", "-test.timeout=120s")
	cmd.Env = append(append(os.Environ(), marker+"="+t.Name()), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A process group of its own: if a guard against os.kill(0, ...) or os.killpg failed,
	// only the child would die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Run()
	t.Logf("child process output:\n%s", out.String())
	require.NoError(t, err, "the child process failed")
	require.Contains(t, out.String(), "--- PASS: "+t.Name(), "the child did not run the test")
	return false
}

func TestTimeoutBusyLoopStopsAndKeepsOutput(t *testing.T) {
	s := runUntilStopped(t, "print('before', flush=True)\nn = 0\nwhile True:\n    n += 1\n", testTimeout, nil)
	assert.Less(t, s.late, promptBound)
	assert.Equal(t, "before\n", s.res.Stdout, "the Result carries the output printed so far")
	// At the loop's header or its body, depending on where the version's bytecode takes
	// the interrupt (on 3.13 minipy moves an interrupt at a backward jump to the next line).
	assert.Regexp(t, `File "<cell-\d+>", line [34], in <module>\n    (while True:|n \+= 1)\n`, s.py.Traceback,
		"the traceback points into the user's loop")
}

func TestTimeoutDeadlineAlreadyPassed(t *testing.T) {
	// A deadline that passes before the watchdog starts waiting must still be enforced.
	for _, timeout := range []time.Duration{time.Nanosecond, time.Microsecond} {
		s := runUntilStopped(t, "while True:\n    pass\n", timeout, nil)
		assert.Less(t, s.late, promptBound)
	}
}

func TestTimeoutContextDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	start := time.Now()
	res, err := minipy.Run(ctx, "print('x')\nwhile True:\n    pass\n", &minipy.Options{Timeout: time.Hour})
	late := time.Since(start) - testTimeout
	t.Logf("latency: %s: %v after the deadline", t.Name(), late.Round(100*time.Microsecond))
	failIfAbandoned(t, err)
	require.ErrorIs(t, err, minipy.ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, context.Canceled)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "minipy.TimeoutInterrupt", py.Type)
	assert.Equal(t, "x\n", res.Stdout)
	assert.Less(t, late, promptBound)
}

func TestTimeoutOptionsShorterThanContext(t *testing.T) {
	// Whichever ends first wins: here Options.Timeout, so it is not a context deadline.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	_, err := minipy.Run(ctx, "while True:\n    pass\n", &minipy.Options{Timeout: testTimeout})
	failIfAbandoned(t, err)
	require.ErrorIs(t, err, minipy.ErrTimeout)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
}

func TestTimeoutContextCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	timer := time.AfterFunc(testTimeout, cancel)
	defer timer.Stop()
	start := time.Now()
	res, err := minipy.Run(ctx, "print('working')\nimport time\nwhile True:\n    time.sleep(0.01)\n", nil)
	late := time.Since(start) - testTimeout
	t.Logf("latency: %s: %v after the cancel", t.Name(), late.Round(100*time.Microsecond))
	failIfAbandoned(t, err)
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, minipy.ErrTimeout, "a cancellation is not a timeout")
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "minipy.TimeoutInterrupt", py.Type)
	assert.Equal(t, "working\n", res.Stdout)
	assert.Less(t, late, promptBound)

	// A context that has already ended does not start the run.
	_, err = minipy.Run(ctx, "x = 1", nil)
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, minipy.ErrTimeout)
	var ie *minipy.InterruptedError
	require.ErrorAs(t, err, &ie)
	assert.Nil(t, ie.Python)
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err = minipy.Run(past, "x = 1", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, minipy.ErrTimeout, "a context deadline is a timeout, before the run as during it")
}

func TestTimeoutNotCaughtByExceptException(t *testing.T) {
	code := `
caught = 0
while True:
    try:
        n = 0
        while True:
            n += 1
    except Exception:
        caught += 1
`
	ns := minipy.NewNamespace()
	defer ns.Close()
	s := runUntilStopped(t, code, testTimeout, ns)
	assert.Less(t, s.late, promptBound)
	caught, err := ns.Get("caught")
	require.NoError(t, err)
	assert.Equal(t, int64(0), caught, "except Exception: must not see the timeout")
}

func TestTimeoutBlockingCalls(t *testing.T) {
	cases := []struct{ name, code string }{
		{"time.sleep", "import time\ntime.sleep(10)\n"},
		{"Event.wait", "import threading\nthreading.Event().wait()\n"},
		{"Lock.acquire", "import threading\nl = threading.Lock()\nl.acquire()\nl.acquire()\n"},
		{"input", "import os, sys\nr, w = os.pipe()\nsys.stdin = open(r)\ninput()\n"},
		{"socket.recv", "import socket\na, b = socket.socketpair()\na.recv(1)\n"},
		{"os.read", "import os\nr, w = os.pipe()\nos.read(r, 1)\n"},
		{"select", "import select, os\nr, w = os.pipe()\nselect.select([r], [], [])\n"},
		{"queue.get", "import queue\nqueue.Queue().get()\n"},
		{"asyncio", "import asyncio\nasyncio.run(asyncio.sleep(10))\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := runUntilStopped(t, c.code, testTimeout, nil)
			assert.Less(t, s.late, promptBound)
		})
	}
}

func TestTimeoutJoinOfBusyWorker(t *testing.T) {
	// The worker is stopped too (as every thread the run started): afterwards only the
	// threads that existed before the run remain.
	if !child(t) {
		return
	}
	ns := minipy.NewNamespace()
	defer ns.Close()
	_, err := minipy.Run(context.Background(), "import threading\nbefore = threading.active_count()", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	code := `
def work():
    while True:
        pass
t = threading.Thread(target=work)
t.start()
t.join()
`
	s := runUntilStopped(t, code, testTimeout, ns)
	assert.Less(t, s.late, promptBound)
	assert.Eventually(t, func() bool {
		r, err := minipy.Run(context.Background(), "t.is_alive() or threading.active_count() != before", &minipy.Options{Globals: ns})
		return err == nil && r.Value == false
	}, 2*time.Second, 10*time.Millisecond, "the busy worker must be stopped")
}

func TestTimeoutStopsThreadsTheRunStarted(t *testing.T) {
	if !child(t) {
		return
	}
	ns := minipy.NewNamespace()
	defer ns.Close()
	code := `
import threading, time
counts = {"busy": 0, "sleepy": 0}
def busy():
    while True:
        counts["busy"] += 1
def sleepy():
    while True:
        counts["sleepy"] += 1
        time.sleep(0.2)
threads = [threading.Thread(target=busy), threading.Thread(target=sleepy)]
for th in threads:
    th.start()
while True:
    time.sleep(1)
`
	s := runUntilStopped(t, code, testTimeout, ns)
	assert.Less(t, s.late, promptBound)
	assert.Eventually(t, func() bool {
		r, err := minipy.Run(context.Background(), "any(th.is_alive() for th in threads)", &minipy.Options{Globals: ns})
		return err == nil && r.Value == false
	}, 2*time.Second, 10*time.Millisecond, "the threads the run started must be stopped")
	// Stopped means stopped: the counters no longer move.
	get := func() map[string]any {
		v, err := ns.Get("counts")
		require.NoError(t, err)
		return v.(map[string]any)
	}
	first := get()
	assert.Positive(t, first["busy"], "the busy thread ran before the timeout")
	assert.Positive(t, first["sleepy"], "the sleeping thread ran before the timeout")
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, first, get())
}

func TestTimeoutSubprocessRunKillsChild(t *testing.T) {
	if !child(t) {
		return
	}
	s := runUntilStopped(t, "import subprocess\nsubprocess.run(['sleep', '10'])\n", testTimeout, nil)
	assert.Less(t, s.late, promptBound)
	// subprocess.run kills and reaps its child when interrupted: no sleep process of ours
	// is left, running or zombie.
	assert.Empty(t, childrenNamed(t, "sleep"))
}

// childrenNamed lists this process's child processes (zombies included) whose command
// name is comm, as "pid state".
func childrenNamed(t *testing.T, comm string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	me := os.Getpid()
	var found []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		if ppid == me && s[open+1:end] == comm {
			found = append(found, strconv.Itoa(pid)+" "+fields[0])
		}
	}
	return found
}

func TestTimeoutBareExceptSwallower(t *testing.T) {
	// The statement before the inner loop matters: see the CPython 3.11 quirk in the design
	// notes (an interrupt at the backward jump of a `try:` that starts with the loop is not
	// caught by that try).
	cases := map[string]string{
		"bare except": `
swallowed = 0
while True:
    try:
        n = 0
        while True:
            n += 1
    except:
        swallowed += 1
`,
		"except BaseException": `
swallowed = 0
while True:
    try:
        n = 0
        while True:
            n += 1
    except BaseException:
        swallowed += 1
`,
		"swallower in a function": `
swallowed = 0
def spin():
    try:
        n = 0
        while True:
            n += 1
    except:
        return False
while not spin():
    swallowed += 1
`,
		"contextlib.suppress": `
import contextlib
swallowed = 0
while True:
    with contextlib.suppress(BaseException):
        n = 0
        while True:
            n += 1
    swallowed += 1
`,
		"sleep swallower": `
import time
swallowed = 0
while True:
    try:
        time.sleep(10)
    except:
        swallowed += 1
`,
	}
	for name, code := range cases {
		t.Run(name, func(t *testing.T) {
			ns := minipy.NewNamespace()
			defer ns.Close()
			s := runUntilStopped(t, code, testTimeout, ns)
			assert.Less(t, s.late, hardBound, "the hard stage may take up to 1 s")
			swallowed, err := ns.Get("swallowed")
			require.NoError(t, err)
			assert.Positive(t, swallowed, "the first interrupt was swallowed: the hard stage stopped it")
			assertFramesOnce(t, s.py.Traceback)
		})
	}
}

func TestTimeoutInterpreterHealthyAfterwards(t *testing.T) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	_, err := minipy.Run(context.Background(), "x = 41", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	runUntilStopped(t, "x = 42\ny = 'set before the interrupt'\nwhile True:\n    pass\nz = 'never'\n", testTimeout, ns)

	x, err := ns.Get("x")
	require.NoError(t, err)
	assert.Equal(t, int64(42), x, "assignments made before the interrupt are kept")
	_, err = ns.Get("z")
	require.ErrorIs(t, err, minipy.ErrNameNotFound)

	// After a hard-stage stop too, the next runs are ordinary: no tracer, no pending
	// interrupt, sleeps sleep, and the value comes back.
	runUntilStopped(t, "while True:\n    try:\n        n = 0\n        while True: n += 1\n    except:\n        pass\n", testTimeout, ns)
	r, err := minipy.Run(context.Background(), "import sys, time\ntime.sleep(0.3)\n(x + 1, sys.gettrace(), y)", &minipy.Options{Globals: ns, Timeout: 5 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, []any{int64(43), nil, "set before the interrupt"}, r.Value)
	r, err = minipy.Run(context.Background(), "sum(range(1000))", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	assert.Equal(t, int64(499500), r.Value)
}

func TestTimeoutDuringImportLeavesPackageImportable(t *testing.T) {
	// An import cut short leaves the submodules it finished in sys.modules, while importlib
	// drops the package itself; the next import must not pair a new package with them
	// (seen with numpy: "module 'numpy' has no attribute 'ndarray'"). A child process: the
	// package and the flag live in its interpreter.
	if !child(t) {
		return
	}
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(dir+"/slowpkg", 0o755))
	require.NoError(t, os.WriteFile(dir+"/slowpkg/__init__.py", []byte(`
from . import part
import builtins
if getattr(builtins, "slowpkg_slow", False):
    import time
    time.sleep(10)
VALUE = 42
`), 0o644))
	require.NoError(t, os.WriteFile(dir+"/slowpkg/part.py", []byte("import slowpkg\ndef value():\n    return slowpkg.VALUE\n"), 0o644))
	ns := minipy.NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.Set("d", dir))
	_, err := minipy.Run(context.Background(), "import sys, builtins\nsys.path.insert(0, d)\nbuiltins.slowpkg_slow = True", &minipy.Options{Globals: ns})
	require.NoError(t, err)

	runUntilStopped(t, "import slowpkg\n", testTimeout, ns)

	r, err := minipy.Run(context.Background(), "builtins.slowpkg_slow = False\nimport slowpkg\nslowpkg.part.value()", &minipy.Options{Globals: ns})
	require.NoError(t, err, "the package must import cleanly after an interrupted import")
	assert.Equal(t, int64(42), r.Value)
}

func TestTimeoutNeverLeaksIntoTheNextRun(t *testing.T) {
	// Deadlines and cancellations that hit around the end of short runs: whether a run
	// counts as stopped or finished, the plain run after it must never see an interrupt.
	ns := minipy.NewNamespace()
	defer ns.Close()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	const rounds = 3000
	codes := []string{"x = 1", "x = sum(range(300))", "x = [i * i for i in range(300)]\nlen(x)", "for i in range(100):\n    x = i"}
	var interrupted, finished int
	for i := range rounds {
		// Mostly within a short run's length (tens of microseconds), sometimes longer.
		tiny := time.Duration(1+rng.IntN(60)) * time.Microsecond
		if rng.IntN(5) == 0 {
			tiny = time.Duration(1+rng.IntN(2000)) * time.Microsecond
		}
		opts := &minipy.Options{Globals: ns, Timeout: -1}
		ctx := context.Background()
		var cancel context.CancelFunc = func() {}
		switch i % 3 {
		case 0:
			opts.Timeout = tiny
		case 1:
			ctx, cancel = context.WithTimeout(ctx, tiny)
		case 2:
			ctx, cancel = context.WithCancel(ctx)
			time.AfterFunc(tiny, cancel)
		}
		_, err := minipy.Run(ctx, codes[i%len(codes)], opts)
		cancel()
		failIfAbandoned(t, err)
		if err != nil {
			var ie *minipy.InterruptedError
			require.ErrorAs(t, err, &ie, "round %d: a short run either finishes or is interrupted", i)
			interrupted++
		} else {
			finished++
		}
		r, err := minipy.Run(context.Background(), "y = 7\ny", &minipy.Options{Globals: ns, Timeout: -1})
		require.NoError(t, err, "round %d: an interrupt leaked into the next run", i)
		require.Equal(t, int64(7), r.Value)
	}
	t.Logf("%d runs interrupted, %d finished", interrupted, finished)
	assert.Positive(t, interrupted, "the deadlines must hit some runs")
	assert.Positive(t, finished, "some runs must beat their deadline")
}

func TestTimeoutCLoopIsAbandoned(t *testing.T) {
	// sum(range(10**10)) holds the GIL in C for minutes: nothing in-process stops it. This
	// leaves the interpreter busy, so it runs in a child process.
	if !child(t) {
		return
	}
	start := time.Now()
	res, err := minipy.Run(context.Background(), "print('started')\nsum(range(10**10))", &minipy.Options{Timeout: testTimeout})
	late := time.Since(start) - testTimeout
	t.Logf("latency: %s: %v after the deadline", t.Name(), late.Round(100*time.Microsecond))
	require.ErrorIs(t, err, minipy.ErrTimeout)
	var ie *minipy.InterruptedError
	require.ErrorAs(t, err, &ie)
	assert.True(t, ie.Abandoned)
	assert.Nil(t, ie.Python, "the code never yielded, so there is no traceback")
	require.NotNil(t, res)
	assert.Less(t, late, hardBound, "the caller gets ErrTimeout at the deadline plus a short grace")

	// Later runs wait for the interpreter, but only until their own deadline...
	start = time.Now()
	_, err = minipy.Run(context.Background(), "1", &minipy.Options{Timeout: testTimeout})
	require.ErrorIs(t, err, minipy.ErrTimeout)
	require.ErrorAs(t, err, &ie)
	assert.False(t, ie.Abandoned, "this run never started")
	assert.Less(t, time.Since(start), testTimeout+promptBound)

	// Namespace methods take no deadline, so they refuse at once rather than wait for a C
	// call that may never end.
	ns := minipy.NewNamespace()
	assert.ErrorIs(t, ns.Set("x", 1), minipy.ErrInterpreterBusy)
	_, err = ns.Get("x")
	assert.ErrorIs(t, err, minipy.ErrInterpreterBusy)
	assert.Less(t, time.Since(start), testTimeout+2*promptBound)

	// ...or their context.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = minipy.Run(ctx, "1", &minipy.Options{Timeout: -1})
	require.ErrorIs(t, err, context.Canceled)
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = minipy.Run(ctx, "1", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, minipy.ErrTimeout)
}

func TestTimeoutAbandonedRunFinishesLater(t *testing.T) {
	// A C loop that outlasts the grace but ends after a second or two: the caller gets
	// ErrTimeout early, the next run waits for the interpreter, then finds it healthy (the
	// interrupt that was pending for the abandoned run ends that run, not the next one).
	if !child(t) {
		return
	}
	ns := minipy.NewNamespace()
	defer ns.Close()
	// The loop's length is the machine's: ~2 s of it here, and never less than 10**8 (a
	// fixed 10**8 ended within the grace on a machine twice as fast as this VM).
	_, err := minipy.Run(context.Background(), "import time\nt = time.perf_counter()\nsum(range(10**7))\n"+
		"n = max(10**8, int(2 * 10**7 / (time.perf_counter() - t)))", &minipy.Options{Globals: ns, Timeout: time.Minute})
	require.NoError(t, err)
	start := time.Now()
	_, err = minipy.Run(context.Background(), "before = 1\ntotal = sum(range(n))\nafter = 1", &minipy.Options{Globals: ns, Timeout: 100 * time.Millisecond})
	abandonedAfter := time.Since(start)
	var ie *minipy.InterruptedError
	require.ErrorAs(t, err, &ie)
	require.True(t, ie.Abandoned)
	require.ErrorIs(t, err, minipy.ErrTimeout)

	r, err := minipy.Run(context.Background(), "x = 6 * 7\nx", &minipy.Options{Globals: ns, Timeout: time.Minute})
	require.NoError(t, err, "the run after an abandoned one must not see its interrupt")
	assert.Equal(t, int64(42), r.Value)
	assert.Greater(t, r.Duration, time.Duration(0))
	t.Logf("abandoned after %v; the next run waited %v for the interpreter", abandonedAfter, r.Duration)
	// The abandoned run did assign before its C call, and was stopped right after it.
	got := names(t, ns)
	assert.Contains(t, got, "before")
	assert.NotContains(t, got, "total", "the pending interrupt stopped the run as the C call returned")
	assert.NotContains(t, got, "after")
}

func TestTimeoutCustomKickSignal(t *testing.T) {
	// The kick signal is configurable, but only before the interpreter starts: a child.
	if !child(t) {
		return
	}
	sig := minipy.DefaultKickSignal - 2
	require.NoError(t, minipy.Start(minipy.Config{KickSignal: sig}))
	require.NoError(t, minipy.Start(minipy.Config{KickSignal: sig}), "the same configuration again is fine")
	require.ErrorIs(t, minipy.Start(minipy.Config{}), minipy.ErrAlreadyStarted, "the interpreter already runs with another signal")

	r, err := minipy.Run(context.Background(), "import signal\n(signal.getsignal("+strconv.Itoa(int(sig))+").__name__, signal.getsignal("+strconv.Itoa(int(minipy.DefaultKickSignal))+"))", nil)
	require.NoError(t, err)
	assert.Equal(t, []any{"_on_kick", nil}, r.Value, "the runtime handles the configured signal, not the default")

	s := runUntilStopped(t, "while True:\n    pass\n", testTimeout, nil)
	assert.Less(t, s.late, promptBound)
	s = runUntilStopped(t, "import time\ntime.sleep(10)\n", testTimeout, nil)
	assert.Less(t, s.late, promptBound)
}

func TestTimeoutStartAfterFirstRun(t *testing.T) {
	if !child(t) {
		return
	}
	_, err := minipy.Minipy("1", nil)
	require.NoError(t, err)
	require.NoError(t, minipy.Start(minipy.Config{}), "the default configuration is what runs")
	require.ErrorIs(t, minipy.Start(minipy.Config{KickSignal: minipy.DefaultKickSignal - 1}), minipy.ErrAlreadyStarted, "too late to change the signal")
}

func TestKickSignalMustBeRealTime(t *testing.T) {
	// A standard signal would take its handler from the Go runtime (SIGSEGV, SIGURG) or
	// from glibc (32, 33); Start refuses before it starts anything, so this is safe here.
	for _, sig := range []syscall.Signal{syscall.SIGSEGV, syscall.SIGURG, syscall.SIGUSR1, 32, 33, 65, -1} {
		require.ErrorIs(t, minipy.Start(minipy.Config{KickSignal: sig}), minipy.ErrKickSignal, "signal %d", int(sig))
	}
}

func TestHostSignalHandlingIsGuarded(t *testing.T) {
	// If a guard failed, the child's Go runtime would lose its handlers (or the child would
	// exit): the parent's interpreter is never exposed to that.
	if !child(t) {
		return
	}
	attempts := map[string]string{
		"signal.signal":          "import signal\nsignal.signal(signal.SIGSEGV, signal.SIG_DFL)",
		"_signal.signal":         "import _signal\n_signal.signal(11, _signal.SIG_DFL)",
		"signal.pthread_sigmask": "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {" + strconv.Itoa(int(minipy.DefaultKickSignal)) + "})",
		"signal.setitimer":       "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0.01)",
		"signal.alarm":           "import signal\nsignal.alarm(1)",
		"signal.raise_signal":    "import signal\nsignal.raise_signal(signal.SIGTERM)",
		"faulthandler.enable":    "import faulthandler\nfaulthandler.enable()",
		"faulthandler.register":  "import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1)",
		"os._exit":               "import os\nos._exit(3)",
		"posix._exit":            "import posix\nposix._exit(3)",
		"os.abort":               "import os\nos.abort()",
		"os.kill":                "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
		"os.killpg":              "import os, signal\nos.killpg(os.getpgid(0), signal.SIGTERM)",
		"os.kill(0)":             "import os, signal\nos.kill(0, signal.SIGTERM)",
		"posix.kill":             "import posix, signal\nposix.kill(posix.getpid(), signal.SIGTERM)",
		"signal.pthread_kill":    "import signal, threading\nsignal.pthread_kill(threading.get_ident(), signal.SIGTERM)",
	}
	for name, code := range attempts {
		t.Run(name, func(t *testing.T) {
			_, err := minipy.Minipy(code, nil)
			var py *minipy.PythonError
			require.ErrorAs(t, err, &py)
			assert.Equal(t, "RuntimeError", py.Type)
			assert.Contains(t, py.Message, "not available inside minipy's in-process engine", "a clear message")
		})
	}
	// Go's own signal handling still works: a nil dereference is still a recoverable panic
	// (faulthandler or a replaced SIGSEGV handler would kill the process here), and the
	// host still gets the signals it asked for.
	recovered := func() (r any) {
		defer func() { r = recover() }()
		var p *int
		return *p
	}()
	assert.NotNil(t, recovered)

	// And the timeout still works.
	s := runUntilStopped(t, "while True:\n    pass\n", testTimeout, nil)
	assert.Less(t, s.late, promptBound)
}

// TestTimeoutErrorMatching pins the error shapes: errors.Is/As reach the sentinels and
// the Python error through InterruptedError, and the sentinel is not a Python error.
func TestTimeoutErrorMatching(t *testing.T) {
	s := runUntilStopped(t, "while True:\n    pass\n", 50*time.Millisecond, nil)
	var ie *minipy.InterruptedError
	require.ErrorAs(t, s.err, &ie)
	assert.Equal(t, minipy.ErrTimeout, ie.Cause)
	assert.GreaterOrEqual(t, ie.After, 50*time.Millisecond)
	assert.Same(t, s.py, ie.Python)
	assert.False(t, errors.Is(s.err, syscall.EINTR))
}

// A swallower stopped by the hard stage must not leave its TimeoutInterrupt behind as the
// interpreter's "exception being handled": a later error would show it as its context
// ("During handling of the above exception, another exception occurred").
func TestHardStageLeavesNoHandledException(t *testing.T) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	runUntilStopped(t, "import contextlib\nwhile True:\n    with contextlib.suppress(BaseException):\n        n = 0\n        while True:\n            n += 1\n", testTimeout, ns)
	_, err := minipy.Minipy("import sys\nctx = sys.exc_info()[1]\n1 / 0", &minipy.Options{Globals: ns})
	var pe *minipy.PythonError
	require.ErrorAs(t, err, &pe)
	assert.NotContains(t, pe.Traceback, "During handling")
	assert.NotContains(t, pe.Traceback, "TimeoutInterrupt")
	ctx, err := ns.Get("ctx")
	require.NoError(t, err)
	assert.Nil(t, ctx, "sys.exc_info() is empty at the start of a run")
}

// cleanupShapes are loops stopped by the timeout inside try/finally or with: the cleanup
// must run. Some put the interrupt at a loop's backward jump, which CPython's exception
// table can leave outside the try (3.13: `while cond: pass`, gh-130279; 3.11 and 3.12: a
// one-line `while 1: pass`, gh-108214).
var cleanupShapes = map[string]string{
	"while True":           "try:\n    while True:\n        pass\nfinally:\n    done = True",
	"one-line while 1":     "try:\n    while 1: pass\nfinally:\n    done = True",
	"while cond":           "x = 0\ntry:\n    while x >= 0:\n        pass\nfinally:\n    done = True",
	"while not attribute":  "import types\na = types.SimpleNamespace(stop=False)\ntry:\n    while not a.stop:\n        pass\nfinally:\n    done = True",
	"while cond, function": "def f(x):\n    try:\n        while x >= 0:\n            pass\n    finally:\n        global done\n        done = True\nf(0)",
	"counting loop":        "try:\n    n = 0\n    while True:\n        n += 1\nfinally:\n    done = True",
	"for range":            "try:\n    for i in range(10**12):\n        pass\nfinally:\n    done = True",
	"sleep":                "import time\ntry:\n    time.sleep(30)\nfinally:\n    done = True",
	"except BaseException": "x = 0\ntry:\n    while x >= 0:\n        pass\nexcept BaseException:\n    done = True\n    raise",
	"with, while cond": `import contextlib
@contextlib.contextmanager
def cleanup():
    try:
        yield
    finally:
        global done
        done = True
x = 0
with cleanup():
    while x >= 0:
        pass`,
	"with lock": "import threading\nlock = threading.Lock()\nx = 0\nwith lock:\n    while x >= 0:\n        pass\n",
}

func TestTimeoutRunsFinallyAndWithExits(t *testing.T) {
	for name, code := range cleanupShapes {
		t.Run(name, func(t *testing.T) {
			ns := minipy.NewNamespace()
			defer ns.Close()
			s := runUntilStopped(t, code, 100*time.Millisecond, ns)
			assert.Less(t, s.late, promptBound)
			if name == "one-line while 1" {
				// The loop's only instruction is its jump, which is the first of the try
				// body; CPython (3.11 to 3.13 at least) attributes an interrupt raised there
				// to no handler, even a KeyboardInterrupt without minipy (gh-108214). The
				// run still stops promptly, but its cleanup cannot be promised.
				t.Skip("cleanup is skipped by CPython itself for a one-line `while 1: pass` as the first statement of a try (gh-108214)")
			}
			if strings.Contains(code, "lock") {
				r, err := minipy.Minipy("lock.locked()", &minipy.Options{Globals: ns})
				require.NoError(t, err)
				assert.Equal(t, false, r.Value, "the with block released its lock")
				return
			}
			done, err := ns.Get("done")
			require.NoError(t, err, "the cleanup did not run")
			assert.Equal(t, true, done)
		})
	}
}

// assertFramesOnce checks that no frame line of a traceback follows itself (for code
// without recursion): 3.11 records a frame twice in the traceback of an exception that a
// sys.settrace tracer raised, so a stop that raised through one would show it.
func assertFramesOnce(t *testing.T, traceback string) {
	t.Helper()
	var prev string
	for _, line := range strings.Split(traceback, "\n") {
		if !strings.HasPrefix(line, "  File ") {
			continue
		}
		assert.NotEqual(t, prev, line, "a frame shown twice in a row:\n%s", traceback)
		prev = line
	}
}
