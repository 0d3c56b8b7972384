package minipy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// writeProtocol is code that writes a frame header claiming claim bytes (kind A) to its
// worker's protocol pipe, then streams mib MiB of zeros after it: what a model's code can
// do, since the worker's objects are its to reach.
func writeProtocol(claim, mib int) string {
	return fmt.Sprintf(`import os, sys
fd = sys.modules["_minipy_runtime"].call_host.__self__.out_fd
os.write(fd, (%d).to_bytes(4, "little") + b"A")
chunk = bytes(1 << 20)
for _ in range(%d):
    os.write(fd, chunk)`, claim, mib)
}

// TestIsolatedLyingFrameHeader: a worker that claims a 512 MiB frame and streams it is
// killed at the header, before the host holds any of it (it held 2.5 GB before); its
// namespace rolls back, and the engine serves the next run.
func TestIsolatedLyingFrameHeader(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	opts := &minipy.Options{Globals: ns, Timeout: time.Minute}
	_, err := e.Run(context.Background(), "kept = 1", opts)
	require.NoError(t, err)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = e.Run(context.Background(), "lost = 1\n"+writeProtocol(512<<20, 512), opts)
	runtime.ReadMemStats(&after)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.ErrorIs(t, err, minipy.ErrProtocol)
	require.Error(t, lost.Protocol)
	assert.Contains(t, err.Error(), fmt.Sprintf("a frame of %d bytes (kind 'A') past the cap of", 512<<20))
	assert.True(t, lost.RolledBack, "the snapshot predates the run: %v", err)
	assert.NotErrorIs(t, err, minipy.ErrStateLost)
	grew := after.TotalAlloc - before.TotalAlloc
	assert.Less(t, grew, uint64(32<<20), "the host allocated %d MiB for a frame it should have refused", grew>>20)
	t.Logf("the host allocated %d KiB in the run", grew>>10)

	r, err := e.Run(context.Background(), "kept, 'lost' in dir()", opts)
	require.NoError(t, err)
	assert.Equal(t, []any{int64(1), false}, r.Value)

	// Without a snapshot the namespace is lost, and the engine still serves.
	e = newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	_, err = e.Minipy(writeProtocol(1<<30, 2), &minipy.Options{Timeout: time.Minute})
	require.ErrorAs(t, err, &lost)
	assert.ErrorIs(t, err, minipy.ErrProtocol)
	assert.ErrorIs(t, err, minipy.ErrStateLost)
	r, err = e.Minipy("1 + 1", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Value)
}

// A guardian slow to read its worker's report of a new snapshot (a loaded machine: it was
// stopped here) when the host asks it to kill the worker still keeps that snapshot: it
// reads the report first. (It killed the worker's tree but the snapshot it knew of, an
// older one, so the new snapshot died with the worker and the namespace was lost: compat
// 3.12 and 3.13 under load, TestIsolatedLyingFrameHeader and TestIsolatedProtocolBrokenInSave.)
func TestIsolatedKillRightAfterSnapshot(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	opts := &minipy.Options{Globals: ns, Timeout: time.Minute}
	r, err := e.Run(context.Background(), whereAmI, opts)
	require.NoError(t, err)
	guardian := 0
	for pid, inner := range nsProcs(t, r.Value.([]any)[0].(string)) {
		if inner == 1 {
			guardian = pid
		}
	}
	require.NotZero(t, guardian)
	require.NoError(t, syscall.Kill(guardian, syscall.SIGSTOP))
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		// By then the host has asked for the kill (on a machine so loaded that it has not,
		// the guardian reads the report first anyway, and the test proves nothing).
		time.Sleep(500 * time.Millisecond)
		syscall.Kill(guardian, syscall.SIGCONT) //nolint:errcheck // gone: the test fails below
	}()
	defer func() { <-resumed }()
	_, err = e.Run(context.Background(), "kept = 1", opts) // its snapshot's report waits unread
	require.NoError(t, err)
	_, err = e.Run(context.Background(), "lost = 1\n"+writeProtocol(512<<20, 1), opts)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.ErrorIs(t, err, minipy.ErrProtocol)
	assert.True(t, lost.RolledBack, "the snapshot of the run before: %v", err)
	r, err = e.Run(context.Background(), "kept, 'lost' in dir()", opts)
	require.NoError(t, err)
	assert.Equal(t, []any{int64(1), false}, r.Value)
}

// TestIsolatedProtocolBrokenInSave: code that runs during a Namespace method (a value's
// __reduce__ while Save pickles it) and writes a lying frame gets its worker killed too; the
// method fails with ErrProtocol and the namespace rolls back.
func TestIsolatedProtocolBrokenInSave(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	code := "class Evil:\n    def __reduce__(self):\n" +
		strings.ReplaceAll("\n"+writeProtocol(256<<20, 4), "\n", "\n        ") + "\n        return (int, ())\n" +
		"kept = 1\nevil = Evil()"
	_, err := e.Run(context.Background(), code, &minipy.Options{Globals: ns})
	require.NoError(t, err)
	_, err = ns.Save(&strings.Builder{})
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.ErrorIs(t, err, minipy.ErrProtocol)
	assert.True(t, lost.RolledBack)
	v, err := ns.Get("kept")
	require.NoError(t, err)
	assert.Equal(t, int64(1), v)
}

// TestIsolatedMaxTransfer: what a worker sends the host stays within MaxTransfer. Up to
// it, values, saves and output arrive whole, and the host's read buffer shrinks after each;
// past it, Get and Save fail with ErrTooLarge and the worker lives on, a run's value is
// left out (its repr kept), its output is cut, and a host call raises ValueError.
func TestIsolatedMaxTransfer(t *testing.T) {
	const limit = 4 << 20
	e := newIsolated(t, minipy.IsolatedConfig{MaxTransfer: limit})
	ns := e.NewNamespace()
	require.NoError(t, ns.Register(minipy.Function{Name: "size", Call: func(_ context.Context, args map[string]any) (any, error) {
		return int64(len(args["data"].([]byte))), nil
	}, InputSchema: map[string]any{"type": "object", "properties": map[string]any{"data": map[string]any{}}}}))
	run := func(code string, opts *minipy.Options) (*minipy.Result, error) {
		if opts == nil {
			opts = &minipy.Options{}
		}
		opts.Globals = ns
		return e.Run(context.Background(), code, opts)
	}
	_, err := run("near = bytes(4_000_000); far = bytes(5_000_000)", nil)
	require.NoError(t, err)

	v, err := ns.Get("near")
	require.NoError(t, err)
	assert.Len(t, v, 4_000_000)
	assert.LessOrEqual(t, minipy.ReadBufferCap(ns), 64<<10, "the read buffer shrank after the value")
	_, err = ns.Get("far")
	require.ErrorIs(t, err, minipy.ErrTooLarge)
	assert.Contains(t, err.Error(), "the value of far is 5000005 bytes")

	_, err = ns.Save(&strings.Builder{})
	require.ErrorIs(t, err, minipy.ErrTooLarge)
	_, err = run("del far", nil)
	require.NoError(t, err)
	var saved strings.Builder
	_, err = ns.Save(&saved)
	require.NoError(t, err, "a save near the cap")
	assert.Greater(t, saved.Len(), 4_000_000)

	r, err := run("near", nil)
	require.NoError(t, err)
	assert.Len(t, r.Value, 4_000_000, "a value near the cap")
	r, err = run("near + near", nil)
	require.NoError(t, err)
	assert.True(t, r.HasValue)
	assert.Nil(t, r.Value, "a value past the cap is left out")
	assert.True(t, strings.HasPrefix(r.Repr, "b'\\x00"), r.Repr)

	r, err = run("print('x' * 6_000_000)", &minipy.Options{MaxOutput: -1})
	require.NoError(t, err)
	assert.Less(t, len(r.Stdout), limit)
	assert.Contains(t, r.Stdout, "characters of stdout omitted")

	r, err = run("class Big:\n    def _repr_png_(self): return near + near\ndisplay(Big())\nprint('shown')",
		&minipy.Options{MaxImageBytes: -1})
	require.NoError(t, err)
	require.Len(t, r.Displays, 1, "a display past the cap keeps its place and caption")
	assert.Empty(t, r.Images(), "its data is left out")
	assert.Regexp(t, `^\[image 1: PNG, [\d.]+ MB\]$`, r.Displays[0].Caption)
	assert.Equal(t, r.Displays[0].Caption, r.Displays[0].Text())
	assert.Equal(t, "shown\n", r.Stdout)
	assert.Equal(t, r.Displays[0].Caption+"\nshown\n", r.Output())
	assert.Contains(t, r.Stderr, "the data of the run's 1 displays was left out")

	_, err = run("size(data=near[:1000])", nil)
	require.NoError(t, err)
	_, err = run("size(data=near + near)", nil)
	var py *minipy.PythonError
	require.ErrorAs(t, err, &py)
	assert.Equal(t, "ValueError", py.Type)
	assert.Contains(t, py.Message, "IsolatedConfig.MaxTransfer")

	v, err = ns.Get("near")
	require.NoError(t, err, "the worker lived through all of it")
	assert.Len(t, v, 4_000_000)
	assert.LessOrEqual(t, minipy.ReadBufferCap(ns), 64<<10)
}

func TestIsolatedMaxTransferBounds(t *testing.T) {
	for _, bad := range []int64{-1, 1<<20 - 1, 1<<30 + 1} {
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{MaxTransfer: bad})
		require.Error(t, err, "MaxTransfer %d", bad)
		assert.False(t, errors.Is(err, minipy.ErrNoSandbox))
	}
}

// forgeCalls is code that makes one real call of host function fn (capturing its call
// event), then sends n more call events like it with ids of its own: what code that reaches
// its worker's objects can do. With stopReading, it first stops reading its control pipe
// (fd 4) while holding it open, so that the host's replies fill it.
func forgeCalls(fn string, n int, stopReading bool) string {
	stop := ""
	if stopReading {
		stop = `held = os.dup(4)
quiet_r, quiet_w = os.pipe()
os.dup2(quiet_r, 4)  # the control thread's next read waits on a pipe nobody writes
`
	}
	return fmt.Sprintf(`import os, sys
w = sys.modules["_minipy_runtime"].call_host.__self__
orig, seen = w.write_frame, []
w.write_frame = lambda *a: (seen.append(a), orig(*a))[1]
%s()
w.write_frame = orig
kind, rid, _, payload = seen[-1]
%sfor i in range(%d):
    orig(kind, rid, (1000000 + i).to_bytes(8, "little"), payload)
import time
time.sleep(30)`, fn, stop, n)
}

// Issue 48, finding 6: 20,000 forged call events for one registered host function made the
// host run 20,000 goroutines at once. A run's calls in flight are bounded by what the
// worker's threads can make (Processes, 256 by default): past it, the worker is killed
// (ErrProtocol) and the namespace rolled back.
func TestIsolatedForgedHostCallsBounded(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	var calls atomic.Int64
	require.NoError(t, ns.Register(minipy.Function{Name: "wait", Call: func(ctx context.Context, _ map[string]any) (any, error) {
		if calls.Add(1) == 1 {
			return nil, nil // (the real call)
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}}))
	_, err := e.Run(context.Background(), "kept = 1", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	goroutines := runtime.NumGoroutine()
	_, err = e.Run(context.Background(), forgeCalls("wait", 2000, false), &minipy.Options{Globals: ns, Timeout: time.Minute})
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.ErrorIs(t, err, minipy.ErrProtocol)
	assert.Contains(t, err.Error(), "more than 256 host calls in flight")
	assert.True(t, lost.RolledBack, "%v", err)
	assert.LessOrEqual(t, calls.Load(), int64(258), "the calls the host served")
	assert.Eventually(t, func() bool { return runtime.NumGoroutine() < goroutines+50 }, 10*time.Second, 20*time.Millisecond,
		"the calls' goroutines end with the run")
	r, err := e.Run(context.Background(), "kept", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	assert.Equal(t, int64(1), r.Value)
}

// Issue 48, finding 5: code that stops reading its control pipe and forges host calls fills
// the pipe with the host's replies; the watchdog's kick waited behind the blocked writes,
// and a run with a 1 s Timeout had not returned after 10 s. The kick never waits on the
// worker: the run ends by its deadline, killed, and the namespace rolls back.
func TestIsolatedTimeoutWithTheControlPipeFull(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	reply := strings.Repeat("x", 4096)
	require.NoError(t, ns.Register(minipy.Function{Name: "big", Call: func(context.Context, map[string]any) (any, error) {
		return reply, nil
	}}))
	start := time.Now()
	_, err := e.Run(context.Background(), forgeCalls("big", 200, true), &minipy.Options{Globals: ns, Timeout: time.Second})
	took := time.Since(start)
	require.ErrorIs(t, err, minipy.ErrTimeout)
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	// (A generous bound: on a loaded machine the grace counts up to 5 s of waiting for a CPU.
	// The old code hung past 120 s.)
	assert.Less(t, took, 20*time.Second, "the run ends by its deadline and the kill's grace")
	r, err := e.Run(context.Background(), "1 + 1", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Value)
	require.NoError(t, ns.Close())
}

// A local worker's loop runs in the host's fork code (worker.py's _ServeLoop, MP_OP_SERVE):
// the Python it runs for a request is the answer's (handle, called from C). Frames larger
// than the loop's buffer come in whole, answers of many parts and larger than a pipe go out
// whole, the snapshots roll back, and where the fork code cannot be used (os.fork) the loop
// is Python's.
func TestWorkerLoopInC(t *testing.T) {
	const caller = `import sys
f = sys._getframe()
while f.f_code.co_name != "handle":
    f = f.f_back
f.f_back.f_code.co_qualname`
	for _, osFork := range []bool{false, true} {
		e := newIsolatedForking(t, minipy.IsolatedConfig{}, osFork)
		ns := e.NewNamespace()
		want := map[bool]string{false: "_ServeLoop.run", true: "_Worker.serve"}[osFork]
		assert.Equal(t, want, valueIn(t, e, ns, caller), "os.fork %v", osFork)

		big := strings.Repeat("x", 300_000) // (a pipe holds 64 KiB)
		assert.Equal(t, int64(len(big)), valueIn(t, e, ns, "s = '"+big+"'\nlen(s)"))
		require.NoError(t, ns.Set("b", big))
		got, err := ns.Get("b")
		require.NoError(t, err)
		assert.Equal(t, big, got)
		valueIn(t, e, ns, "parts = [bytes([i % 256]) * 70_000 for i in range(40)]") // (a Save of many chunks)
		var saved bytes.Buffer
		_, err = ns.Save(&saved)
		require.NoError(t, err)
		copied := e.NewNamespace()
		require.NoError(t, copied.Restore(&saved))
		assert.Equal(t, []any{int64(40), int64(70_000), int64(39)},
			valueIn(t, e, copied, "[len(parts), len(parts[5]), parts[39][0]]"))

		_, err = runIn(t, e, ns, "s = 'changed'\nimport os; os._exit(3)")
		var lost *minipy.WorkerLostError
		require.ErrorAs(t, err, &lost)
		assert.True(t, lost.RolledBack)
		assert.Equal(t, int64(len(big)), valueIn(t, e, ns, "len(s)"), "rolled back")
		assert.Equal(t, want, valueIn(t, e, ns, caller), "the snapshot that took over, os.fork %v", osFork)
		copied.Close()
		ns.Close()
	}
}

// After a snapshot's fork the worker copies ahead the pages it wrote since the last one
// (worker.py's _ServeLoop, MP_OP_SERVE's copy ahead), while it waits for the next request:
// a run that writes the same pages as the last one finds them copied and takes no
// copy-on-write fault for them. Where the loop is Python's (os.fork), and under a
// MemoryLimit (a page copied for nothing would count towards it), each write is a fault.
func TestRollbackCopiesAhead(t *testing.T) {
	const touch = `import resource
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(0, len(b), 4096):
    b[i] = (b[i] + 1) % 256
resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0`
	for _, c := range []struct {
		osFork bool
		memory int64
	}{{false, 0}, {true, 0}, {false, 512 << 20}} {
		e := newIsolatedForking(t, minipy.IsolatedConfig{MemoryLimit: c.memory}, c.osFork)
		ns := e.NewNamespace()
		valueIn(t, e, ns, "b = bytearray(300 * 4096)")
		var faults []int64
		for range 4 {
			faults = append(faults, valueIn(t, e, ns, touch).(int64))
			time.Sleep(300 * time.Millisecond) // (the copies are made while the worker waits)
		}
		t.Logf("os.fork %v, MemoryLimit %d: the runs' faults %v", c.osFork, c.memory, faults)
		if c.osFork || c.memory != 0 {
			assert.Greater(t, faults[3], int64(250), "os.fork %v, MemoryLimit %d: %v", c.osFork, c.memory, faults)
		} else {
			assert.Less(t, faults[3], int64(100), "faults of the runs: %v", faults) // (an eighth is left to the run)
		}
		ns.Close()
	}
}

// The copy ahead's notes read a bounded part of the address space: code that reserves
// 64 TiB (MAP_NORESERVE) and maps thousands of areas still gets its answers at once (read
// whole, the notes of that reservation alone would take minutes).
func TestRollbackCopyAheadBounded(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, `import mmap
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
big = mmap.mmap(-1, 1 << 46, flags=flags | getattr(mmap, "MAP_NORESERVE", 0x4000))
big[0] = 1
small = [mmap.mmap(-1, 1 << 20, flags=flags) for _ in range(3000)]
for m in small:
    m[0] = 1`)
	for i := range 4 {
		r, err := e.Run(context.Background(), fmt.Sprintf("big[4096 * %d] = 1\nsmall[%d][0] = 2\n%d", i, i, i),
			&minipy.Options{Globals: ns, Timeout: 10 * time.Second})
		require.NoError(t, err)
		assert.Equal(t, int64(i), r.Value)
	}
}
