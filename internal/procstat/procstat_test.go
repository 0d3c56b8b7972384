package procstat

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestTaskWaitOfThisThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_, ok := TaskWait(os.Getpid(), syscall.Gettid())
	require.True(t, ok, "this kernel has no schedstat (CONFIG_SCHED_INFO)")
	_, ok = TaskWait(os.Getpid(), 1<<30)
	assert.False(t, ok, "no such thread")
}

// Two busy processes on one CPU each wait about half the time; one alone hardly waits.
func TestWaitsGrowWhenProcessesShareACPU(t *testing.T) {
	busy := func() *exec.Cmd {
		c := exec.Command("sh", "-c", "while :; do :; done")
		require.NoError(t, c.Start())
		t.Cleanup(func() { c.Process.Kill(); c.Wait() }) //nolint:errcheck // killed
		var one unix.CPUSet
		one.Set(0)
		require.NoError(t, unix.SchedSetaffinity(c.Process.Pid, &one))
		return c
	}
	a, b := busy(), busy()
	pids := []int{a.Process.Pid, b.Process.Pid}
	before := Waits(pids...)
	require.Len(t, before, 2)
	time.Sleep(400 * time.Millisecond)
	after := Waits(pids...)
	most := MostWaited(before, after)
	assert.Greater(t, most, 100*time.Millisecond, "two busy processes on CPU 0 for 400 ms")
	assert.LessOrEqual(t, most, after[a.Process.Pid]-before[a.Process.Pid]+after[b.Process.Pid]-before[b.Process.Pid])
	assert.Zero(t, MostWaited(before, map[int]time.Duration{}), "only pids in both count")
}

// A busy process's CPU time grows by about the time it ran; a sleeping one's hardly; a
// process that is gone has none.
func TestCPU(t *testing.T) {
	start := func(script string) *exec.Cmd {
		c := exec.Command("sh", "-c", script)
		require.NoError(t, c.Start())
		t.Cleanup(func() { c.Process.Kill(); c.Wait() }) //nolint:errcheck // killed
		return c
	}
	busy, idle := start("while :; do :; done"), start("sleep 30")
	b0, i0 := CPU(busy.Process.Pid), CPU(idle.Process.Pid)
	// Until the busy one has run 200 ms (a loaded machine gives it less of the wall clock).
	require.Eventually(t, func() bool { return CPU(busy.Process.Pid)-b0 >= 200*time.Millisecond },
		time.Minute, 10*time.Millisecond)
	assert.Less(t, CPU(idle.Process.Pid)-i0, 50*time.Millisecond)
	assert.Zero(t, CPU(1<<30), "no such process")
}

func TestTree(t *testing.T) {
	c := exec.Command("sh", "-c", "sleep 30 & sleep 30 & wait")
	require.NoError(t, c.Start())
	defer func() {
		for _, p := range Tree(c.Process.Pid) {
			syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck // already gone is fine
		}
		c.Wait() //nolint:errcheck // killed
	}()
	var tree []int
	require.Eventually(t, func() bool {
		tree = Tree(c.Process.Pid)
		return len(tree) == 3
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, c.Process.Pid, tree[0])
	assert.False(t, slices.Contains(tree[1:], c.Process.Pid))
	assert.Equal(t, []int{12345678}, Tree(12345678)[:1], "a pid that is gone is itself, with no children")
}
