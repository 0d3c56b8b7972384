package opcount_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/minipy-go/minipy/internal/opcount"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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

// A child's and a grandchild's work is counted, after they have exited, and so are this
// process's page faults and the calls of a thread started after the count began.
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

	// Page faults of this process: 16 MiB touched a page at a time, in a mapping of its
	// own (not the Go heap, which a test run before may have touched already).
	const size = 16 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(mem) //nolint:errcheck // the test's own mapping
	require.NoError(t, unix.Madvise(mem, unix.MADV_NOHUGEPAGE))
	before = m.Read()
	for i := 0; i < size; i += 4096 {
		mem[i] = 1
	}
	d = m.Since(before)
	assert.GreaterOrEqual(t, d.PageFaults, int64(size/4096))
	assert.Zero(t, d.Forks)

	// A thread the tree starts (in a child, after the count began): its calls count, and
	// a thread is not a fork.
	before = m.Read()
	out, err = exec.Command("/usr/bin/python3", "-c", `import os, threading
t = threading.Thread(target=lambda: [os.getppid() for _ in range(5000)])
t.start()
t.join()
print("done")`).Output()
	require.NoError(t, err)
	assert.Equal(t, "done\n", string(out))
	d = m.Since(before)
	assert.GreaterOrEqual(t, d.Syscalls, int64(5000))
	assert.Equal(t, int64(1), d.Forks, "the python, not its thread")
}

// Two Reads back to back count nothing: Since leaves out what reading costs, exactly when
// both ran on one thread (the least of twenty pairs), within Slack when the goroutine
// moved between them, and a call of the Go runtime's own (or the race detector's) may land
// between two.
func TestSinceLeavesOutTheReads(t *testing.T) {
	m := start(t)
	if m == nil {
		return
	}
	least := int64(1 << 62)
	for range 20 {
		d := m.Since(m.Read())
		least = min(least, max(d.Syscalls, -d.Syscalls))
		assert.LessOrEqual(t, max(d.Syscalls, -d.Syscalls), m.Slack()+2)
	}
	assert.Zero(t, least)
	assert.Positive(t, m.Slack())
}

func TestPer(t *testing.T) {
	p := opcount.Counts{ContextSwitches: 15, PageFaults: 3, Syscalls: 30, Forks: 1}.Per(10)
	assert.Equal(t, opcount.PerOp{ContextSwitches: 1.5, PageFaults: 0.3, Syscalls: 3, Forks: 0.1}, p)
	assert.Equal(t, "1.5 context switches, 0.3 page faults, 3.0 system calls, 0.10 forks", p.String())
}
