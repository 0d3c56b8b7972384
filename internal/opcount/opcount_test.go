package opcount_test

import (
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"

	"github.com/minipy-go/minipy/internal/opcount"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// start is a Meter, or (where the kernel lets this process count nothing) the error that
// says why; as root the counters must work.
func start(t *testing.T) *opcount.Meter {
	t.Helper()
	m, err := opcount.Start()
	if os.Geteuid() != 0 && err != nil {
		require.ErrorIs(t, err, opcount.ErrUnavailable)
		t.Log("not root:", err)
		return nil
	}
	require.NoError(t, err)
	t.Cleanup(m.Close)
	return m
}

// A child's and a grandchild's work is counted, after they have exited, and so is a thread
// started after the count began.
func TestCountsTheProcessTree(t *testing.T) {
	m := start(t)
	if m == nil {
		return
	}
	before := m.Read()
	out, err := exec.Command("sh", "-c", "sh -c 'echo one' && echo two").Output()
	require.NoError(t, err)
	assert.Equal(t, "one\ntwo\n", string(out))
	d := m.Since(before)
	t.Logf("sh -c: %+v", d)
	assert.GreaterOrEqual(t, d.Forks, int64(2), "sh and the inner sh (echo is a builtin)")
	assert.Less(t, d.Forks, int64(10))
	assert.Greater(t, d.Syscalls, int64(50), "two execs and their dynamic loading")
	assert.Greater(t, d.PageFaults, int64(50))
	assert.Greater(t, d.ContextSwitches, int64(1), "waiting for a child to exit")

	// A new thread of this process (one the count began without) and its page faults.
	before = m.Read()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread() // (and not unlocked: the thread exits with the goroutine)
		b := make([]byte, 64<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		runtime.KeepAlive(b)
	}()
	wg.Wait()
	d = m.Since(before)
	assert.Zero(t, d.Forks, "a thread is not a fork")
	assert.Greater(t, d.PageFaults, int64(1000), "64 MiB touched")
}

// Two Reads back to back count nothing: Since leaves out what reading costs.
func TestSinceLeavesOutTheReads(t *testing.T) {
	m := start(t)
	if m == nil {
		return
	}
	var most opcount.Counts
	for range 20 {
		d := m.Since(m.Read())
		most.Syscalls = max(most.Syscalls, d.Syscalls)
	}
	assert.LessOrEqual(t, most.Syscalls, int64(2), "(a Go runtime's stray call may land between)")
}

func TestPer(t *testing.T) {
	p := opcount.Counts{ContextSwitches: 15, PageFaults: 3, Syscalls: 30, Forks: 1}.Per(10)
	assert.Equal(t, opcount.PerOp{ContextSwitches: 1.5, PageFaults: 0.3, Syscalls: 3, Forks: 0.1}, p)
	assert.Equal(t, "1.5 context switches, 0.3 page faults, 3.0 system calls, 0.10 forks", p.String())
}
