package minipy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// needCgroup skips a test of what a sandbox's cgroup bounds where the engine has none (an
// unprivileged host without a delegated cgroup): there the limits are rlimits, and
// memfd_create is refused instead.
func needCgroup(t *testing.T, e *minipy.Isolated) {
	t.Helper()
	if st := e.Stats(); st.Limits == minipy.LimitsRlimits {
		t.Skipf("the engine has no cgroup here: %v", st.CgroupError)
	}
}

// requireMemoryLimit checks that err is a run's end at the sandbox's memory limit: the
// worker killed by the cgroup's OOM killer and rolled back, or (a write the kernel refused
// with ENOMEM rather than kill for) a MemoryError.
func requireMemoryLimit(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, minipy.ErrLimit)
	assert.Contains(t, err.Error(), "memory limit")
	var lost *minipy.WorkerLostError
	if errors.As(err, &lost) {
		assert.Equal(t, "memory", lost.Limit, "%v", err)
		assert.True(t, lost.RolledBack, "%v", err)
		assert.NotErrorIs(t, err, minipy.ErrStateLost)
		return
	}
	var limit *minipy.LimitError
	require.ErrorAs(t, err, &limit)
	assert.Equal(t, "memory", limit.Limit)
}

// sysvBomb fills 768 MiB of SysV shared memory, 64 MiB segments attached one at a time:
// a segment outlives its mappings and the process (until the sandbox's IPC namespace ends).
const sysvBomb = `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
for _ in range(12):
    sid = libc.shmget(0, 64 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    p = libc.shmat(sid, None, 0)
    ctypes.memset(p, 1, 64 << 20)
    libc.shmdt(p)
x = "not rolled back"`

// memfdBombs write 3 x 256 MiB into a memfd, which RLIMIT_AS does not count (its pages are
// never mapped, or a window at a time): written, and through mmap (page faults, which the
// kernel answers with its OOM killer).
var memfdBombs = map[string]string{
	"write": `import os
with open(os.memfd_create("bomb"), "wb", buffering=0) as f:
    chunk = b"x" * (1 << 20)
    for _ in range(768):
        f.write(chunk)
x = "not rolled back"`,
	"mmap": `import mmap, os
fd = os.memfd_create("bomb")
os.ftruncate(fd, 768 << 20)
for i in range(12):
    m = mmap.mmap(fd, 64 << 20, offset=i * (64 << 20))
    for j in range(0, 64 << 20, 4096):
        m[j] = 1
    m.close()
x = "not rolled back"`,
}

// The finding: memory that RLIMIT_AS does not count (a memfd written to, never mapped)
// held 384 MiB under a 128 MiB MemoryLimit. The sandbox's cgroup counts it: each way of
// filling a memfd ends at the limit, rolled back; another namespace is untouched; the
// engine serves on. (256 MiB here: under less, a worker's address space, 166 MiB of thread
// stacks and malloc arenas at start, leaves RLIMIT_AS no room for a rollback snapshot's
// threads, or a run's 1 MiB allocation.)
func TestMemoryLimitCountsMemfd(t *testing.T) {
	for _, mode := range engineModes {
		for _, how := range []string{"write", "mmap"} {
			t.Run(mode.name+"/"+how, func(t *testing.T) {
				e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 256 << 20, NoTemplate: mode.noTemplate})
				needCgroup(t, e)
				ns := e.NewNamespace()
				defer ns.Close()
				other := e.NewNamespace()
				defer other.Close()
				_, err := runIn(t, e, ns, "x = 1")
				require.NoError(t, err)
				_, err = runIn(t, e, other, "y = 2")
				require.NoError(t, err)
				_, err = runIn(t, e, ns, memfdBombs[how])
				requireMemoryLimit(t, err)
				if how == "mmap" {
					var lost *minipy.WorkerLostError
					assert.ErrorAs(t, err, &lost, "a page fault past the limit is the OOM killer's")
				}
				assert.Equal(t, int64(1), valueIn(t, e, ns, "x"), "as before the run")
				assert.Equal(t, int64(2), valueIn(t, e, other, "y"), "another namespace is untouched")
				assert.Equal(t, int64(3), valueIn(t, e, e.NewNamespace(), "1 + 2"))
			})
		}
	}
}

// Files in /dev/shm, /tmp and the tmpfs working directory are memory too: they count
// towards the sandbox's limit for as long as they exist. The run that writes past it ends
// there; the file stays, holding the sandbox at its limit until it is removed (here by the
// host, in the working directory, or with the namespace, whose /tmp and /dev/shm go with
// its sandbox).
func TestMemoryLimitCountsTmpfsFiles(t *testing.T) {
	for _, where := range []string{"/dev/shm/big", "/work/big", "/tmp/big"} {
		t.Run(strings.ReplaceAll(where[1:], "/", "_"), func(t *testing.T) {
			e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 256 << 20, TmpSize: 1 << 30})
			needCgroup(t, e)
			ns := e.NewNamespace()
			defer ns.Close()
			_, err := runIn(t, e, ns, "x = 1")
			require.NoError(t, err)
			_, err = runIn(t, e, ns, fmt.Sprintf(`chunk = b"x" * (1 << 20)
with open(%q, "wb") as f:
    for _ in range(768):
        f.write(chunk)
        f.flush()
x = "not rolled back"`, where))
			requireMemoryLimit(t, err)
			if where != "/work/big" {
				require.NoError(t, ns.Close())
				assert.Equal(t, int64(3), valueIn(t, e, e.NewNamespace(), "1 + 2"), "the engine serves on")
				return
			}
			file := filepath.Join(ns.WorkDir(), "big")
			info, err := os.Stat(file)
			require.NoError(t, err)
			assert.Less(t, info.Size(), int64(256<<20), "the file holds less than the limit")
			require.NoError(t, os.Remove(file))
			assert.Equal(t, int64(1), valueIn(t, e, ns, "x"), "as before the run, once the file is gone")
		})
	}
}

// removeSysV removes the sandbox's SysV shared memory segments and gives how many.
const removeSysV = `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ids = [int(l.split()[1]) for l in open("/proc/sysvipc/shm").read().splitlines()[1:]]
for i in ids:
    libc.shmctl(i, 0, None)  # IPC_RMID
len(ids)`

// SysV shared memory counts too, for as long as its segments exist: they outlive the
// worker that the limit killed, and hold the sandbox at its limit until they are removed.
// The rollback has room all the same (the group's reserve beyond the limit: the guardian's
// first Python and the snapshot's take-over), every time (the rolled-back worker is killed
// again as it runs, the sandbox at its limit); the code that removes the segments gets
// its namespace back.
func TestMemoryLimitCountsSysV(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 256 << 20})
	needCgroup(t, e)
	ns := e.NewNamespace()
	_, err := runIn(t, e, ns, "x = 1")
	require.NoError(t, err)
	_, err = runIn(t, e, ns, sysvBomb)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost, "a page fault past the limit is the OOM killer's")
	requireMemoryLimit(t, err)
	// (Each try that the limit kills is a rollback; on a machine loaded 4x its cores the
	// removal's run has needed 4 tries and once more than 5. Without the reserve a rollback
	// finds no snapshot to take over and the namespace is lost: the checks here fail.)
	removed := false
	for i := 0; i < 20 && !removed; i++ {
		res, err := runIn(t, e, ns, removeSysV)
		if err != nil {
			requireMemoryLimit(t, err)
			continue
		}
		assert.Equal(t, int64(4), res.Value, "the bomb's segments: three filled, the fourth the limit stopped")
		t.Logf("the segments removed by run %d", i+1)
		removed = true
	}
	require.True(t, removed, "the segments' removal ran once the sandbox was at its limit")
	assert.Equal(t, int64(1), valueIn(t, e, ns, "x"), "as before the bomb")
	_, err = runIn(t, e, ns, sysvBomb)
	requireMemoryLimit(t, err)
	require.NoError(t, ns.Close())
	assert.Equal(t, int64(3), valueIn(t, e, e.NewNamespace(), "1 + 2"), "the engine serves on")
}

// A sandbox with a memory limit has two memory groups: "g", with its guardian alone (its
// pid 1), and "w", with the rest: the worker, its snapshot, what the code and the host
// start (a command, the guardian's child: it joins "w" before it runs anything); so after
// a rollback, whose snapshot takes over in "g" (the reserve's room), and when the
// guardian's Python serves (a command's start).
func TestSandboxMemoryGroups(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  minipy.IsolatedConfig
	}{{"forked", minipy.IsolatedConfig{MemoryLimit: 256 << 20}},
		{"started", minipy.IsolatedConfig{MemoryLimit: 256 << 20, NoTemplate: true}}} {
		t.Run(c.name, func(t *testing.T) { testSandboxMemoryGroups(t, c.cfg) })
	}
}

func testSandboxMemoryGroups(t *testing.T, cfg minipy.IsolatedConfig) {
	e := newIsolated(t, cfg)
	needCgroup(t, e)
	ns := e.NewNamespace()
	defer ns.Close()
	_, err := runIn(t, e, ns, "x = 1")
	require.NoError(t, err)
	dir := minipy.CgroupDirs(ns)[0]
	check := func(when string) {
		t.Helper()
		guard := procsOf(t, filepath.Join(dir, "g"))
		require.Len(t, guard, 1, when)
		assert.Equal(t, "1", nsPid(t, guard[0]), "%s: the guardian, the sandbox's pid 1", when)
		work := procsOf(t, filepath.Join(dir, "w"))
		assert.NotEmpty(t, work, when)
		for _, p := range work {
			assert.NotEqual(t, "1", nsPid(t, p), when)
		}
		assert.Empty(t, procsOf(t, dir), "%s: none in the group itself", when)
	}
	check("started")
	_, err = runIn(t, e, ns, "import os; os.kill(os.getpid(), 9)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	require.True(t, lost.RolledBack)
	assert.Equal(t, int64(1), valueIn(t, e, ns, "x"))
	check("rolled back")
	p, err := ns.Start(minipy.Command{Args: []string{"/bin/sh", "-c", "grep memory /proc/self/cgroup"}})
	require.NoError(t, err)
	require.NoError(t, p.Stdin.Close())
	stdout, _, st := output(t, p)
	assert.Equal(t, 0, st.ExitStatus())
	assert.True(t, strings.HasSuffix(strings.TrimSpace(stdout), "/w"), "a command is the code's: %q", stdout)
	check("a command started")
}

// procsOf lists the processes of cgroup dir.
func procsOf(t *testing.T, dir string) []int {
	t.Helper()
	var pids []int
	for _, f := range strings.Fields(readTrim(t, filepath.Join(dir, "cgroup.procs"))) {
		p, err := strconv.Atoi(f)
		require.NoError(t, err)
		pids = append(pids, p)
	}
	return pids
}

// nsPid is process pid's pid in its own pid namespace (/proc/PID/status's NSpid, last).
func nsPid(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "NSpid:" {
			return f[len(f)-1]
		}
	}
	return ""
}

// cappedForkBomb forks up to 200 children that wait, then ends them and gives how many it made.
const cappedForkBomb = `import os, time
kids = []
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.kill(k, 9)
for k in kids:
    os.waitpid(k, 0)
len(kids)`

// Processes is the pids.max of each sandbox's cgroup: a fork bomb stays within it even
// where RLIMIT_NPROC does not bind (the workers of a root host without the sandbox run as
// root), and the engine serves on.
func TestProcessesBoundByPidsMax(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name        string
		unsandboxed bool
	}{{"sandboxed", false}, {"unsandboxed", true}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := minipy.IsolatedConfig{Processes: 20, AllowUnsandboxed: true}
			var e *minipy.Isolated
			if c.unsandboxed {
				var err error
				e, err = minipy.NewIsolatedActingUnsandboxed(cfg)
				require.NoError(t, err)
				t.Cleanup(func() { e.Close() })
			} else {
				e = newIsolated(t, cfg)
			}
			needCgroup(t, e)
			n := valueIn(t, e, nil, cappedForkBomb).(int64)
			assert.Greater(t, n, int64(0))
			assert.Less(t, n, int64(20), "the children made, with the worker's own processes and threads")
			assert.Equal(t, int64(2), valueIn(t, e, nil, "1 + 1"))
		})
	}
}

// A namespace's processes are gone when its Close returns, and its cgroup with them,
// whatever became of its guardian (here stopped by the host, as code that took it over
// could leave it: it cannot end them).
func TestNamespaceCloseEmptiesItsCgroup(t *testing.T) {
	needRoot(t)
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate})
			needCgroup(t, e)
			ns := e.NewNamespace()
			marker := sleepMarker()
			_, err := runIn(t, e, ns, fmt.Sprintf(`import subprocess
P = subprocess.Popen(["sleep", %q], start_new_session=True)`, marker))
			require.NoError(t, err)
			requireRunning(t, "the code's child", marker)
			pids, _ := markerProcs(t, marker)
			require.Len(t, pids, 1)
			guardian := parentOf(t, parentOf(t, pids[0])) // sleep's parent is the worker, whose parent is the guardian
			require.NoError(t, syscall.Kill(guardian, syscall.SIGSTOP))
			defer syscall.Kill(guardian, syscall.SIGCONT) //nolint:errcheck // gone, once the test passes
			dirs := minipy.CgroupDirs(ns)
			require.NotEmpty(t, dirs)
			for _, d := range dirs {
				require.DirExists(t, d)
			}
			start := time.Now()
			require.NoError(t, ns.Close())
			assert.Less(t, time.Since(start), 4*time.Second, "Close did not wait out its bound")
			pids, _ = markerProcs(t, marker)
			assert.Empty(t, pids, "the namespace's processes are gone when Close returns")
			assert.True(t, goneOrZombie(guardian), "its guardian too")
			assertCgroupEmptied(t, dirs...)
		})
	}
}

// goneOrZombie reports whether process pid has ended (its parent may not have reaped it).
func goneOrZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	return strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z")
}

// parentOf is pid's parent.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, err := strconv.Atoi(fields[1])
	require.NoError(t, err)
	return ppid
}

// The engine's cgroup holds its sandboxes' groups; Close removes them all, and it.
func TestEngineCloseRemovesItsCgroup(t *testing.T) {
	e, err := minipy.NewIsolated(minipy.IsolatedConfig{MemoryLimit: 256 << 20, Processes: 64})
	require.NoError(t, err)
	defer e.Close()
	needCgroup(t, e)
	engine := minipy.EngineCgroupDirs(e)
	require.NotEmpty(t, engine)
	a, b := e.NewNamespace(), e.NewNamespace()
	valueIn(t, e, a, "1")
	valueIn(t, e, b, "1")
	groups := append(minipy.CgroupDirs(a), minipy.CgroupDirs(b)...)
	require.NotEmpty(t, groups)
	for _, g := range groups {
		assert.Equal(t, filepath.Dir(g), engine[slicesIndex(engine, filepath.Dir(g))], "under the engine's cgroup")
	}
	if st := e.Stats(); st.Limits == minipy.LimitsCgroupV1 {
		assert.Equal(t, "268435456", readTrim(t, filepath.Join(minipy.CgroupDirs(a)[0], "w", "memory.limit_in_bytes")))
		assert.Equal(t, strconv.Itoa(256<<20+minipy.TakeOverReserve),
			readTrim(t, filepath.Join(minipy.CgroupDirs(a)[0], "memory.limit_in_bytes")))
		assert.Equal(t, "64", readTrim(t, filepath.Join(minipy.CgroupDirs(a)[1], "pids.max")))
	}
	require.NoError(t, e.Close())
	for _, d := range append(groups, engine...) {
		assert.NoDirExists(t, d)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return 0
}

func readTrim(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// Stats says what enforces the limits: a cgroup (which version, which one), or rlimits
// alone, and why.
func TestIsolatedStatsLimits(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	st := e.Stats()
	if st.Limits == minipy.LimitsRlimits {
		// (An unprivileged host, or a cgroup v2 host whose cgroup holds the host.)
		assert.ErrorIs(t, st.CgroupError, minipy.ErrNoCgroup)
		assert.Empty(t, st.Cgroup)
	} else {
		assert.Contains(t, []string{minipy.LimitsCgroupV1, minipy.LimitsCgroupV2}, st.Limits)
		assert.NoError(t, st.CgroupError)
		assert.True(t, strings.HasPrefix(st.Cgroup, "/") && strings.Contains(st.Cgroup, "/minipy-"), st.Cgroup)
	}
	if os.Geteuid() == 0 && cgroupV1Here() {
		assert.Equal(t, minipy.LimitsCgroupV1, st.Limits, "root on a cgroup v1 host: %v", st.CgroupError)
	}
	off := newIsolated(t, minipy.IsolatedConfig{NoCgroup: true})
	st = off.Stats()
	assert.Equal(t, minipy.LimitsRlimits, st.Limits)
	assert.NoError(t, st.CgroupError, "none was looked for")
	assert.Empty(t, st.Cgroup)
	assert.Empty(t, minipy.EngineCgroupDirs(off))
}

// cgroupV1Here reports whether this process is in writable cgroup v1 memory and pids
// hierarchies (as on this project's machines).
func cgroupV1Here() bool {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return false
	}
	var memory, pids bool
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			memory = memory || parts[1] == "memory"
			pids = pids || parts[1] == "pids"
		}
	}
	return memory && pids && syscall.Access("/sys/fs/cgroup/memory", 2) == nil && syscall.Access("/sys/fs/cgroup/pids", 2) == nil
}

// A Cgroup that cannot be used fails NewIsolated with ErrNoCgroup, saying why; one that
// can is where the engine makes its own.
func TestIsolatedCgroupNamed(t *testing.T) {
	for _, bad := range []string{"/minipy-no-such-cgroup", "relative", "/a/../b"} {
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{Cgroup: bad})
		require.ErrorIs(t, err, minipy.ErrNoCgroup, bad)
	}
	_, err := minipy.NewIsolated(minipy.IsolatedConfig{Cgroup: "/x", NoCgroup: true})
	require.Error(t, err)
	needRoot(t)
	probe := newIsolated(t, minipy.IsolatedConfig{})
	needCgroup(t, probe)
	parent := filepath.Dir(probe.Stats().Cgroup) // the host's own cgroup, named
	e := newIsolated(t, minipy.IsolatedConfig{Cgroup: parent})
	assert.Equal(t, parent, filepath.Dir(e.Stats().Cgroup))
	assert.NotEqual(t, probe.Stats().Cgroup, e.Stats().Cgroup, "a cgroup per engine")
	assert.Equal(t, int64(2), valueIn(t, e, nil, "1 + 1"))
}

// On cgroup v2 (here a hierarchy without controllers, whose groups place and kill only:
// this machine's memory and pids controllers are on v1) every sandbox, forked from the
// template (which joins its group through the host's cgroup.procs fd) or started as a
// process of its own, is in a group of its own, removed with it.
func TestCgroupV2Groups(t *testing.T) {
	needRoot(t)
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			e, err := minipy.NewIsolatedCgroupBare(minipy.IsolatedConfig{NoTemplate: mode.noTemplate})
			if errors.Is(err, minipy.ErrNoCgroup) {
				t.Skipf("no cgroup2 hierarchy to use: %v", err)
			}
			require.NoError(t, err)
			defer e.Close()
			st := e.Stats()
			require.Equal(t, minipy.LimitsCgroupV2, st.Limits, "%v", st.CgroupError)
			ns := e.NewNamespace()
			defer ns.Close()
			line := valueIn(t, e, ns, `[l for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")][0]`)
			dirs := minipy.CgroupDirs(ns)
			require.Len(t, dirs, 1)
			assert.Equal(t, "0::"+st.Cgroup+"/"+filepath.Base(dirs[0]), line, "the worker is in its sandbox's group")
			marker := sleepMarker()
			valueIn(t, e, ns, fmt.Sprintf(`import subprocess
P = subprocess.Popen(["sleep", %q], start_new_session=True)
None`, marker))
			require.NoError(t, ns.Close())
			pids, _ := markerProcs(t, marker)
			assert.Empty(t, pids)
			assertCgroupEmptied(t, dirs[0])
			engine := minipy.EngineCgroupDirs(e)
			require.NoError(t, e.Close())
			assert.NoDirExists(t, engine[0])
		})
	}
}

// Without a cgroup nothing would count a memfd's or a SysV segment's memory: sandboxed
// workers under a MemoryLimit are refused both (config deny_shm, the seccomp filter's).
func TestSharedMemoryRefusedWithoutCgroup(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 256 << 20, NoCgroup: true})
	require.Equal(t, minipy.LimitsRlimits, e.Stats().Limits)
	// Each is refused with EPERM (1): memfd_create, memfd_secret (447 on x86_64 and arm64),
	// SysV shmget and msgget (IPC_PRIVATE, IPC_CREAT).
	assert.Equal(t, []any{int64(1), int64(1), int64(1), int64(1)}, valueIn(t, e, nil, `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
def errno(ret):
    return ctypes.get_errno() if ret == -1 else 0
try:
    os.memfd_create("x")
    memfd = 0
except OSError as e:
    memfd = e.errno
[memfd, errno(libc.syscall(447, 0)), errno(libc.shmget(0, 1 << 20, 0o1000 | 0o600)), errno(libc.msgget(0, 0o1000 | 0o600))]`))
	// The worker captures output in files of /dev/shm instead, a Fork copy in its own.
	ns := e.NewNamespace()
	r, err := runIn(t, e, ns, "import os; print('hello'); os.write(1, b'raw\\n'); os.readlink('/proc/self/fd/1')")
	require.NoError(t, err)
	assert.Equal(t, "hello\nraw\n", r.Stdout)
	assert.Contains(t, r.Value, "/dev/shm/")
	cp, err := ns.Fork()
	require.NoError(t, err)
	r, err = runIn(t, e, cp, "print('copy')")
	require.NoError(t, err)
	assert.Equal(t, "copy\n", r.Stdout)
	r, err = runIn(t, e, ns, "print('original')")
	require.NoError(t, err)
	assert.Equal(t, "original\n", r.Stdout)
	require.NoError(t, cp.Close())
	// With a cgroup, both work (and count).
	if os.Geteuid() == 0 {
		c := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 256 << 20})
		needCgroup(t, c)
		assert.Equal(t, true, valueIn(t, c, nil, "import os\nos.close(os.memfd_create('x'))\nTrue"))
	}
}

// assertCgroupEmptied asserts that each of a sandbox's cgroup directories is gone, or holds
// no process, nor do the groups in it: an engine keeps a group its sandbox left empty for
// its next sandbox (internal/worker's Cgroups).
func assertCgroupEmptied(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		in := []string{d}
		for _, e := range ents {
			if e.IsDir() {
				in = append(in, filepath.Join(d, e.Name()))
			}
		}
		for _, dir := range in {
			assert.Empty(t, strings.Fields(readTrim(t, filepath.Join(dir, "cgroup.procs"))), "%s holds no process", dir)
		}
	}
}

// A sandbox's cgroup, once its sandbox has ended, is the next sandbox's (kept empty, with
// its limits: internal/worker's Cgroups): the next starts in it, and what the last did
// there (an OOM kill) is not said of the next's end.
func TestCgroupReusedByTheNextSandbox(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 128 << 20})
	needCgroup(t, e)
	a := e.NewNamespace()
	valueIn(t, e, a, "1")
	dirs := minipy.CgroupDirs(a)
	require.NotEmpty(t, dirs)
	_, err := runIn(t, e, a, "b = bytearray(1 << 30)")
	requireMemoryLimit(t, err)
	require.NoError(t, a.Close())
	assertCgroupEmptied(t, dirs...)

	// The engine keeps the groups its sandboxes leave, oldest first (its first sandboxes'
	// may come before a's), each once it has cooled: new sandboxes, each kept open, until
	// one is in a's.
	var b *minipy.Namespace
	for i := 0; i < 8 && b == nil; i++ {
		time.Sleep(50 * time.Millisecond)
		ns := e.NewNamespace()
		defer ns.Close()
		valueIn(t, e, ns, "1")
		if got := minipy.CgroupDirs(ns); slices.Equal(got, dirs) {
			b = ns
		}
	}
	require.NotNil(t, b, "no new sandbox started in a's group")
	_, err = runIn(t, e, b, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, syscall.SIGKILL, lost.Signal)
	assert.Empty(t, lost.Limit, "b's worker was not the OOM killer's: a's kill is not b's")
}

// What a sandbox leaves charged to its cgroup (the page cache of a file it wrote to a
// writable Mount, which outlives it) is not the next sandbox's: its group is not reused
// while so charged (it cools, then is removed), and each next sandbox starts with little
// memory of its own counted.
func TestCgroupReuseLeavesNothingCharged(t *testing.T) {
	out := t.TempDir()
	e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 512 << 20,
		Mounts: []minipy.Mount{{Source: out, Target: "/out", Writable: true}}})
	needCgroup(t, e)
	a := e.NewNamespace()
	valueIn(t, e, a, `with open("/out/left", "wb") as f:
    for _ in range(200):
        f.write(b"x" * (1 << 20))
None`)
	dirs := minipy.CgroupDirs(a)
	require.NotEmpty(t, dirs)
	require.NoError(t, a.Close())
	// Past the group's cooling (a second), each in a group of its own.
	for start := time.Now(); time.Since(start) < 1500*time.Millisecond; time.Sleep(100 * time.Millisecond) {
		ns := e.NewNamespace()
		defer ns.Close()
		valueIn(t, e, ns, "1")
		assert.NotEqual(t, dirs, minipy.CgroupDirs(ns), "a's group, with 200 MiB charged")
		u, err := ns.Usage()
		require.NoError(t, err)
		assert.Less(t, u.Memory, int64(100<<20), "what a new sandbox holds: none of a's")
	}
	for _, d := range dirs {
		assert.NoDirExists(t, d, "removed, still charged after its cooling")
	}
}
