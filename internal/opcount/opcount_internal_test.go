package opcount

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// without runs f with no tracefs where Start looks for one, and mounts of its own made on
// mountAt.
func without(t *testing.T, mountAt string, f func()) {
	dirs, at := tracefsDirs, privateMount
	tracefsDirs, privateMount = []string{t.TempDir() + "/no-tracefs"}, mountAt
	defer func() { tracefsDirs, privateMount = dirs, at }()
	f()
}

// threadsMounts is the mount table each thread of this process sees, by thread id, and
// the process's under "".
func threadsMounts(t *testing.T) map[string]string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	mounts := map[string]string{"": string(b)}
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	for _, task := range tasks {
		if b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/mountinfo"); err == nil {
			mounts[task.Name()] = string(b)
		}
	}
	return mounts
}

// A fresh machine has no tracefs mounted: as root, Start reads the tracepoints' ids from a
// tracefs of its own, in a mount namespace the host never sees, and counts all four.
func TestStartsWithoutTracefsMounted(t *testing.T) {
	require.Zero(t, os.Geteuid(), "mounting a tracefs needs root (make test runs as root)")
	hostMounts := threadsMounts(t)
	var m *Meter
	var err error
	// (On a directory of its own: where the host has a tracefs on /sys/kernel/tracing, a
	// second mount there is EBUSY. make test-no-tracefs runs Start's own choice, without one.)
	without(t, t.TempDir(), func() { m, err = Start() })
	require.NoError(t, err)
	defer m.Close()
	for ev := range numEvents {
		assert.True(t, m.Counting(ev), "%v", ev)
	}
	before := m.Read()
	for range 100 {
		os.Getppid()
	}
	assert.GreaterOrEqual(t, m.Since(before).Syscalls, int64(100))
	// Whichever thread the mount was made on (the main one too, which the runtime keeps),
	// no thread of this process is left with it.
	for tid, mounts := range threadsMounts(t) {
		assert.Equal(t, hostMounts[""], mounts, "thread %s: the private tracefs stayed private", tid)
	}
	// The ids are the kernel's: the same as a mounted tracefs shows, where there is one.
	for _, dir := range tracefsDirs {
		if _, err := os.Stat(dir + "/events"); err == nil {
			want, err := readIDs(dir, []string{"raw_syscalls/sys_enter"})
			require.NoError(t, err)
			got, err := readIDsPrivately(t.TempDir(), []string{"raw_syscalls/sys_enter"})
			require.NoError(t, err)
			assert.Equal(t, want, got)
			break
		}
	}
}

// With no tracefs and none to be had, Start still counts the software events, and its
// error says which counts are missing and how to get them.
func TestStartsWithWhatItCan(t *testing.T) {
	var m *Meter
	var err error
	without(t, t.TempDir()+"/nowhere", func() { m, err = Start() })
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "system calls and forks")
	assert.Contains(t, err.Error(), "To fix:")
	assert.Contains(t, err.Error(), "mount -t tracefs nodev /sys/kernel/tracing")
	if os.Geteuid() != 0 && m == nil {
		return // an unprivileged process with perf_event_paranoid 2 counts nothing
	}
	require.NotNil(t, m)
	defer m.Close()
	assert.True(t, m.Counting(ContextSwitches))
	assert.True(t, m.Counting(PageFaults))
	assert.False(t, m.Counting(Syscalls))
	assert.False(t, m.Counting(Forks))
	before := m.Read()
	buf := make([]byte, 8<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	d := m.Since(before)
	assert.Positive(t, d.PageFaults)
	assert.Zero(t, d.Syscalls)
	assert.Zero(t, m.Slack())
	assert.False(t, errors.Is(err, os.ErrNotExist))
}
