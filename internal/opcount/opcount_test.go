package opcount_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/minipy-go/minipy/internal/opcount"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// start is a Meter that counts all four events. Where the kernel does not let this process
// count them (not root, no tracefs), the test fails with the error, which names the fix:
// counts that quietly read zero would pass every bound below them.
func start(t *testing.T) *opcount.Meter {
	t.Helper()
	m, err := opcount.Start()
	require.NoError(t, err)
	t.Cleanup(m.Close)
	return m
}

// A child's and a grandchild's work is counted, after they have exited, and so are this
// process's page faults and the calls of a thread started after the count began.
func TestCountsTheProcessTree(t *testing.T) {
	m := start(t)
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
// both ran on one thread with nothing between them, within Slack when the goroutine moved
// between them. The Go runtime's own threads (sysmon, the GC's workers, the race
// detector's) make calls of their own now and then, which land between two Reads more
// often the more the machine is loaded (in every one of twenty pairs once, with the
// module's tests beside it under -race), so the median of twenty pairs is held to Slack,
// not each, and pairs go on until one counts nothing (2,000 at most).
func TestSinceLeavesOutTheReads(t *testing.T) {
	m := start(t)
	var off []int64
	exact := 0
	for i := 0; i < 20 || exact == 0 && i < 2000; i++ {
		d := m.Since(m.Read())
		n := max(d.Syscalls, -d.Syscalls)
		if i < 20 {
			off = append(off, n)
		}
		if n == 0 {
			exact++
		}
	}
	slices.Sort(off)
	t.Logf("|Since - 0| over 20 pairs, sorted: %v (Slack %d)", off, m.Slack())
	assert.Positive(t, exact, "a pair that counts nothing")
	assert.LessOrEqual(t, off[len(off)/2], m.Slack())
	assert.Positive(t, m.Slack())
}

func TestPer(t *testing.T) {
	p := opcount.Counts{ContextSwitches: 15, PageFaults: 3, Syscalls: 30, Forks: 1}.Per(10)
	assert.Equal(t, opcount.PerOp{ContextSwitches: 1.5, PageFaults: 0.3, Syscalls: 3, Forks: 0.1}, p)
	assert.Equal(t, "1.5 context switches, 0.3 page faults, 3.0 system calls, 0.10 forks", p.String())
}

// Run as an unprivileged user, the counting tests fail (never skip, never pass on zeros),
// and their message holds the fix. (As root only: the tests are run again as nobody.)
func TestWithoutRootTheTestsFailWithTheFix(t *testing.T) {
	if os.Getenv("OPCOUNT_AS_NOBODY") != "" {
		t.Skip("this is the run as nobody")
	}
	require.Zero(t, os.Geteuid(), "runs the tests again as nobody; run as root (make test does)")
	dir, err := os.MkdirTemp("", "opcount-nobody-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "opcount.test")
	exe, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, exe, 0o755))
	cmd := exec.Command(bin, "-test.run", "^(TestCountsTheProcessTree|TestSinceLeavesOutTheReads)$", "-test.count=1", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "OPCOUNT_AS_NOBODY=1", "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	assert.Contains(t, string(out), "--- FAIL: TestCountsTheProcessTree")
	assert.Contains(t, string(out), "--- FAIL: TestSinceLeavesOutTheReads")
	assert.Contains(t, string(out), "To fix: run as root")
	assert.NotContains(t, string(out), "SKIP")
}
