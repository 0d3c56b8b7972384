package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// /proc/self/cgroup and mountinfo of a container whose hierarchies are mounted at the
// container's own cgroups (no cgroup namespace), and of a hybrid host like this one.
func TestParseCgroups(t *testing.T) {
	self := parseProcCgroup("12:pids:/docker/abc\n4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/docker/abc\n")
	assert.Equal(t, map[string]string{"pids": "/docker/abc", "memory": "/docker/abc", "cpu": "/docker/abc",
		"cpuacct": "/docker/abc", "": "/docker/abc"}, self)
	mounts := parseCgroupMounts(`30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 30 0:31 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:35 /docker/abc /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 30 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 30 0:37 / /sys/fs/cgroup/my\040unified rw,relatime - cgroup2 cgroup2 rw
41 30 0:37 / /elsewhere rw,relatime - cgroup2 cgroup2 rw
`)
	assert.Equal(t, map[string]cgroupMount{
		"memory": {dir: "/sys/fs/cgroup/memory", root: "/docker/abc"},
		"pids":   {dir: "/sys/fs/cgroup/pids", root: "/docker/abc"},
		"":       {dir: "/sys/fs/cgroup/my unified", root: "/"},
	}, mounts, "the first mount of each; controllers other than memory and pids are not needed")
	for p, want := range map[string]string{
		"/docker/abc": "/sys/fs/cgroup/memory", "/docker/abc/minipy-1-1": "/sys/fs/cgroup/memory/minipy-1-1",
		"/docker/abcd": "", "/": "",
	} {
		got, ok := mounts["memory"].dirOf(p)
		assert.Equal(t, want, got, p)
		assert.Equal(t, want != "", ok, p)
	}
	got, ok := mounts[""].dirOf("/a/b")
	assert.True(t, ok)
	assert.Equal(t, "/sys/fs/cgroup/my unified/a/b", got)
}

// A cgroup hierarchy of files in a temporary directory: what OpenCgroups reads and writes
// there, and why it refuses.
func TestOpenCgroupsV2(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(text), 0o644))
	}
	write("svc/cgroup.controllers", "cpu io memory pids\n")
	write("svc/cgroup.subtree_control", "memory pids\n")
	write("svc/main/cgroup.controllers", "memory pids\n")
	mounts := map[string]cgroupMount{"": {dir: root, root: "/"}}
	self := map[string]string{"": "/svc/main"}

	// The host's own cgroup holds it: its subtree_control cannot be written (a file here,
	// which takes the write; the kernel's says EBUSY), so the parent is named.
	c, err := openCgroups(self, mounts, CgroupOptions{Parent: "/svc", MemoryLimit: 1 << 20, Processes: 7})
	require.NoError(t, err)
	assert.Equal(t, 2, c.Version)
	assert.True(t, strings.HasPrefix(c.Path, "/svc/minipy-"+strconv.Itoa(os.Getpid())+"-"), c.Path)
	own, _ := mounts[""].dirOf(c.Path)
	assert.Equal(t, []string{own}, c.dirs)
	b, err := os.ReadFile(filepath.Join(own, "cgroup.subtree_control"))
	require.NoError(t, err)
	assert.Equal(t, "+memory +pids", string(b))
	require.NoError(t, os.Remove(filepath.Join(own, "cgroup.subtree_control")))
	require.NoError(t, os.Remove(own))

	write("bare/cgroup.controllers", "cpu io\n")
	write("bare/cgroup.subtree_control", "")
	_, err = openCgroups(self, mounts, CgroupOptions{Parent: "/bare", Bare: true})
	assert.NoError(t, err, "tests: no controller needed")
	_, err = openCgroups(self, mounts, CgroupOptions{Parent: "/bare"})
	require.ErrorIs(t, err, ErrNoCgroup)
	assert.Contains(t, err.Error(), "does not have the memory controller")
	assert.Contains(t, err.Error(), "cgroup v1: no memory hierarchy is mounted")
	_, err = openCgroups(self, mounts, CgroupOptions{Parent: "/missing"})
	require.ErrorIs(t, err, ErrNoCgroup)
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = OpenCgroups(CgroupOptions{Parent: "relative"})
	assert.ErrorIs(t, err, ErrNoCgroup)
}

// needCgroupV1 is the host's own cgroups in the memory and pids hierarchies, where this
// test process (as root) may make children; the test skips elsewhere.
func needCgroupV1(t *testing.T) *Cgroups {
	t.Helper()
	c, err := OpenCgroups(CgroupOptions{MemoryLimit: 64 << 20, Processes: 8})
	if err != nil || c.Version != 1 {
		if err == nil {
			require.NoError(t, c.Close())
		}
		t.Skipf("no cgroup v1 memory and pids hierarchies to use: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A group has its limits; killing it ends every process in it, however detached from one
// another, and removing it leaves nothing; Close removes the engine's cgroup.
func TestCgroupGroupKillRemove(t *testing.T) {
	c := needCgroupV1(t)
	g, err := c.newGroup()
	require.NoError(t, err)
	read := func(dir, name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return strings.TrimSpace(string(b))
	}
	// The limit is the work group's; the group holds the reserve more (TakeOverReserve).
	assert.Equal(t, filepath.Join(g.dirs[0], "w"), g.work)
	assert.Equal(t, filepath.Join(g.dirs[0], "g"), g.guard)
	assert.Equal(t, strconv.Itoa(64<<20), read(g.work, "memory.limit_in_bytes"))
	assert.Equal(t, strconv.Itoa(64<<20+TakeOverReserve), read(g.dirs[0], "memory.limit_in_bytes"))
	assert.Equal(t, "8", read(g.dirs[1], "pids.max"))
	if _, err := os.Stat(filepath.Join(g.dirs[0], "memory.memsw.limit_in_bytes")); err == nil {
		assert.Equal(t, strconv.Itoa(64<<20), read(g.work, "memory.memsw.limit_in_bytes"), "no swap past it")
		assert.Equal(t, strconv.Itoa(64<<20+TakeOverReserve), read(g.dirs[0], "memory.memsw.limit_in_bytes"))
	}
	// A shell in the group that starts a detached sleeper (once it is in: a line on its
	// stdin) and waits: the group holds both.
	cmd := exec.Command("sh", "-c", "read go; setsid sleep 300 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	require.NoError(t, g.place(cmd.Process.Pid))
	_, err = in.Write([]byte("go\n"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	require.Eventually(t, func() bool { return len(g.members()) == 2 }, 5*time.Second, 10*time.Millisecond, "the shell and its sleeper")
	work, err := os.ReadFile(filepath.Join(g.work, "cgroup.procs"))
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(string(work)), strconv.Itoa(cmd.Process.Pid), "placed in the work group")
	members := g.members()
	g.kill()
	<-done
	for _, p := range members {
		assert.NoError(t, waitGone(p))
	}
	require.NoError(t, g.remove())
	assertEmptied(t, g.dirs...)
	g.kill() // removed: nothing to do
	assert.Zero(t, g.oomCount())

	// A group left over (a removal that timed out) goes with Close, and the engine's too.
	left, err := c.newGroup()
	require.NoError(t, err)
	require.NoError(t, c.Close())
	for _, d := range append(left.dirs, c.dirs...) {
		assert.NoDirExists(t, d)
	}
	_, err = c.newGroup()
	assert.ErrorIs(t, err, ErrNoCgroup, "no group after Close")
}

// A worker launched with a cgroup is in its group before its bootstrap runs; Kill ends
// what is in the group, and its end removes the group.
func TestLaunchIntoCgroup(t *testing.T) {
	c := needCgroupV1(t)
	s, d := plainSpec(t)
	s.Cgroups = c
	w, err := s.Launch(d, 1)
	require.NoError(t, err)
	w, err = s.AwaitReady(w)
	require.NoError(t, err)
	dirs := w.CgroupDirs()
	require.Len(t, dirs, 2)
	// Its guardian in the guard group once it is ready (placeGuardian), the worker in the work group.
	procs, err := os.ReadFile(filepath.Join(dirs[0], "g", "cgroup.procs"))
	require.NoError(t, err)
	assert.Equal(t, []string{strconv.Itoa(w.Pid())}, strings.Fields(string(procs)), "the guardian is in the guard group")
	work, err := os.ReadFile(filepath.Join(dirs[0], "w", "cgroup.procs"))
	require.NoError(t, err)
	assert.Len(t, strings.Fields(string(work)), 1, "the worker")
	assert.False(t, w.OOMKilled())
	w.Kill()
	w.AwaitExit()
	assertEmptied(t, dirs...)
	assert.False(t, s.DenyShm(), "a cgroup counts shared memory")
}

// Without a cgroup, sandboxed workers under a MemoryLimit are told to refuse memfd_create
// and SysV shared memory (config deny_shm): their memory would count nowhere. With one, or
// without a MemoryLimit, or without the sandbox, they are not.
func TestConfigDenyShm(t *testing.T) {
	s, d := plainSpec(t)
	s.Sandbox, s.MemoryLimit = true, 1<<30
	assert.True(t, s.DenyShm())
	assert.Contains(t, configLines(t, s.configFrame(d)), "deny_shm=1")
	for name, change := range map[string]func(*Spec){
		"cgroup":    func(s *Spec) { s.Cgroups = &Cgroups{Version: 1} },
		"no limit":  func(s *Spec) { s.MemoryLimit = 0 },
		"unsandbox": func(s *Spec) { s.Sandbox = false },
		"command":   func(s *Spec) { s.Command = []string{"python3"} },
	} {
		other := *s
		change(&other)
		assert.False(t, other.DenyShm(), name)
		assert.NotContains(t, configLines(t, other.configFrame(d)), "deny_shm=1", name)
	}
}

// A worker without a cgroup has a nil group, whose methods do nothing; a group's directory
// that is gone already is removed.
func TestCgroupNil(t *testing.T) {
	var g *cgroup
	g.kill()
	assert.NoError(t, g.remove())
	assert.Zero(t, g.oomCount())
	w := &Worker{}
	assert.False(t, w.OOMKilled())
	assert.Empty(t, w.CgroupDirs())
	assert.NoError(t, rmdirCgroup(filepath.Join(t.TempDir(), "gone")))
}

// BenchmarkCgroupGroup: what a sandbox's group costs its start and its end (its
// cgroup.procs opened for the template's fork, then emptied): "reused", a group an earlier
// sandbox left (Cgroups.spare: a server's steady state), against "made", one made with its
// limits and removed.
func BenchmarkCgroupGroup(b *testing.B) {
	c, err := OpenCgroups(CgroupOptions{MemoryLimit: 256 << 20, Processes: 64})
	if err != nil {
		b.Skipf("no cgroup: %v", err)
	}
	defer c.Close()
	open := func(g *cgroup) {
		fs, err := g.procsFiles()
		if err != nil {
			b.Fatal(err)
		}
		closeFiles(fs...)
	}
	b.Run("reused", func(b *testing.B) {
		for b.Loop() {
			g, err := c.newGroup()
			if err != nil {
				b.Fatal(err)
			}
			open(g)
			if err := g.remove(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("made", func(b *testing.B) {
		n := 0
		for b.Loop() {
			n++
			c.mu.Lock()
			g, err := c.makeGroup("bench" + strconv.Itoa(n))
			c.mu.Unlock()
			if err != nil {
				b.Fatal(err)
			}
			open(g)
			if err := g.rmdirs(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// HostMemory's cgroup part: the lowest limit on this process's cgroup and those above it,
// "max" (v2) and v1's page-rounded 2^63-1 being none.
func TestCgroupMemoryLimit(t *testing.T) {
	v2 := t.TempDir()
	for dir, limit := range map[string]string{"": "max\n", "a": "8589934592\n", "a/b": "max\n"} {
		require.NoError(t, os.MkdirAll(filepath.Join(v2, dir), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(v2, dir, "memory.max"), []byte(limit), 0o644))
	}
	mounts := map[string]cgroupMount{"": {dir: v2, root: "/"}}
	assert.Equal(t, int64(8<<30), cgroupMemoryLimit(map[string]string{"": "/a/b"}, mounts), "the parent's")
	assert.Zero(t, cgroupMemoryLimit(map[string]string{"": "/"}, mounts), "none")

	v1 := t.TempDir()
	for dir, limit := range map[string]string{"": "9223372036854771712\n", "s": "4294967296\n"} {
		require.NoError(t, os.MkdirAll(filepath.Join(v1, dir), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(v1, dir, "memory.limit_in_bytes"), []byte(limit), 0o644))
	}
	mounts = map[string]cgroupMount{"memory": {dir: v1, root: "/"}}
	assert.Equal(t, int64(4<<30), cgroupMemoryLimit(map[string]string{"memory": "/s", "": "/"}, mounts),
		"v1's memory hierarchy when no cgroup2 one is mounted")
	assert.Zero(t, cgroupMemoryLimit(map[string]string{"memory": "/"}, mounts))
	assert.Equal(t, int64(2<<30), memTotal("MemTotal:        2097152 kB\nMemFree: 1 kB\n"))
	assert.Positive(t, HostMemory())
}

// An engine's cgroup whose host died (killed: its Close never ran) is removed by the next
// engine to open beside it, unless a process still holds one of its groups (nothing is
// killed). One named for a live pid goes too if that process started after it last
// changed (the pid was reused); a live host's stays.
func TestSweepDeadEngines(t *testing.T) {
	c := needCgroupV1(t)
	// The cases live in a group of their own: every engine that opens (other test
	// binaries run beside this one) sweeps the pids hierarchy's directory, and would
	// remove this test's dead hosts' directories before it does.
	hier := filepath.Dir(c.dirs[1])
	parent := filepath.Join(hier, fmt.Sprintf("sweep-test-%d", os.Getpid()))
	require.NoError(t, os.Mkdir(parent, 0o755))
	t.Cleanup(func() { RemoveCgroup(parent) })
	mk := func(name string, groups ...string) string {
		dir := filepath.Join(parent, name)
		require.NoError(t, os.Mkdir(dir, 0o755))
		t.Cleanup(func() { RemoveCgroup(dir) })
		for _, g := range groups {
			require.NoError(t, os.Mkdir(filepath.Join(dir, g), 0o755))
		}
		return dir
	}
	deadPid := func() int {
		cmd := exec.Command("true")
		require.NoError(t, cmd.Run())
		return cmd.Process.Pid
	}
	// (Made an hour ago, as a dead host's are: a machine busy starting processes may give
	// a dead pid to a new process within the second's grace of hostAlive, which then takes
	// it for the host.)
	hourAgo := time.Now().Add(-time.Hour)
	dead := mk(fmt.Sprintf("minipy-%d-7", deadPid()), "s1", "s2")
	held := mk(fmt.Sprintf("minipy-%d-8", deadPid()), "s1", "s2")
	for _, d := range []string{dead, held} {
		require.NoError(t, os.Chtimes(d, hourAgo, hourAgo))
	}
	sleeper := exec.Command("sleep", "300")
	require.NoError(t, sleeper.Start())
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	require.NoError(t, os.WriteFile(filepath.Join(held, "s1", "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0))
	self := os.Getpid()
	reused := mk(fmt.Sprintf("minipy-%d-9998", self), "s1")
	require.NoError(t, os.Chtimes(reused, hourAgo, hourAgo), "made before this process started: by a dead one with its pid")
	live := mk(fmt.Sprintf("minipy-%d-9999", self), "s1")
	other := mk("minipy-mine", "s1") // not an engine's name

	removed := SweepDeadEngines(parent)
	assert.Contains(t, removed, dead)
	assert.Contains(t, removed, reused)
	assert.NoDirExists(t, dead)
	assert.NoDirExists(t, reused)
	assert.NoDirExists(t, filepath.Join(held, "s2"), "its empty group goes")
	for _, d := range []string{filepath.Join(held, "s1"), filepath.Join(live, "s1"), filepath.Join(other, "s1"), c.dirs[1]} {
		assert.DirExists(t, d)
	}
	assert.Equal(t, strconv.Itoa(sleeper.Process.Pid), strings.TrimSpace(readFile(t, filepath.Join(held, "s1", "cgroup.procs"))),
		"nothing is killed")

	require.NoError(t, sleeper.Process.Kill())
	sleeper.Wait() //nolint:errcheck // killed
	require.Eventually(t, func() bool { return slices.Contains(SweepDeadEngines(parent), held) }, 5*time.Second,
		20*time.Millisecond, "once its last process has ended")

	// And an engine opening beside them sweeps them: a dead host's, named as this
	// process's next engine will be, would be in its way.
	// (Another test binary's engine may sweep it first: either way the name is free.)
	next := fmt.Sprintf("minipy-%d-%d", self, engineSeq.Load()+1)
	in := filepath.Join(hier, next)
	require.NoError(t, os.MkdirAll(filepath.Join(in, "s1"), 0o755))
	t.Cleanup(func() { RemoveCgroup(in) })
	require.NoError(t, os.Chtimes(in, hourAgo, hourAgo))
	c2, err := OpenCgroups(CgroupOptions{})
	require.NoError(t, err, "the name was a dead host's")
	defer c2.Close()
	assert.Equal(t, in, c2.dirs[1])
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	return string(b)
}

// The guard group's process is found as pid 1 of its pid namespace, whatever else is in
// the work group (placeGuardian): not the host's own processes.
func TestPidOneOf(t *testing.T) {
	first, ok := pidOneOf(os.Getpid())
	require.True(t, ok, "this kernel says (NSpid)")
	assert.False(t, first)
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}}
	require.NoError(t, cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait() }() //nolint:errcheck
	first, ok = pidOneOf(cmd.Process.Pid)
	assert.True(t, ok)
	assert.True(t, first, "pid 1 of its own pid namespace")
	_, ok = pidOneOf(1 << 30)
	assert.False(t, ok, "no such process")
}

// A sandbox's guardian, pid 1 of its pid namespace, is held by a pidfd once it is placed:
// killing the group kills it, and the kernel the rest of its namespace (a detached
// sleeper here); removing the group waits for its end and then lists the group once,
// rather than every few milliseconds until it is empty.
func TestCgroupRemoveAwaitsHeldGuardian(t *testing.T) {
	c, err := OpenCgroups(CgroupOptions{MemoryLimit: 64 << 20, Processes: 8})
	if err != nil {
		t.Skipf("no cgroup to use: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	for _, end := range []string{"kill", "remove", "outsider"} {
		t.Run(end, func(t *testing.T) {
			g, err := c.newGroup()
			require.NoError(t, err)
			cmd := exec.Command("sh", "-c", "read go; setsid sleep 300 & wait")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setpgid: true}
			in, err := cmd.StdinPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			require.NoError(t, g.place(cmd.Process.Pid))
			_, err = in.Write([]byte("go\n"))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(g.members()) == 2 }, 5*time.Second, 10*time.Millisecond,
				"the guardian and its sleeper")
			before := listings.Load()
			members := g.members()
			oneListing := listings.Load() - before // (each hierarchy's group and the groups in it)
			assert.False(t, g.empty())
			require.NoError(t, g.placeGuardian())
			require.NotNil(t, g.held.Load(), "the guardian is held")
			if end == "outsider" {
				// A process in the group outside the guardian's pid namespace (as the
				// template's fork T is for a moment): the guardian's end does not end it,
				// and remove finds it.
				out := exec.Command("sleep", "300")
				require.NoError(t, out.Start())
				outDone := make(chan error, 1)
				go func() { outDone <- out.Wait() }()
				require.NoError(t, g.place(out.Process.Pid))
				require.NoError(t, g.remove())
				<-outDone
				<-done
				for _, p := range append(members, out.Process.Pid) {
					assert.NoError(t, waitGone(p))
				}
				assertEmptied(t, g.dirs...)
				return
			}
			if end == "kill" {
				g.kill()
				<-done
				for _, p := range members {
					assert.NoError(t, waitGone(p), "everything in its pid namespace ends with it")
				}
			}
			before = listings.Load()
			require.NoError(t, g.remove())
			if end == "kill" { // (its guardian reaped: <-done)
				assert.Zero(t, listings.Load()-before, "no listing of the group once the guardian has ended: its count says it is empty")
			} else { // (one listing while its guardian, ended, awaits its reaping, which pids.current counts)
				assert.LessOrEqual(t, listings.Load()-before, oneListing, "one listing of the group, once the guardian has ended")
			}
			if end == "remove" {
				<-done
				for _, p := range members {
					assert.NoError(t, waitGone(p))
				}
			}
			assertEmptied(t, g.dirs...)
			assert.Nil(t, g.held.Load(), "the pidfd is closed with the group")
		})
	}
}

// assertEmptied asserts that each cgroup directory is gone, or holds no process, nor do the
// groups in it (a removed group is kept for the next sandbox: Cgroups.spare).
func assertEmptied(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		for _, dir := range append([]string{d}, subgroups(d)...) {
			assert.Empty(t, strings.Fields(readFile(t, filepath.Join(dir, "cgroup.procs"))), "%s holds no process", dir)
		}
	}
}

// A group its sandbox left empty is the next sandbox's, with its limits; nothing done
// through the first sandbox's group reaches the second's processes; its OOM kills are not
// the next sandbox's; one that still has memory charged to it is removed instead.
func TestCgroupReuse(t *testing.T) {
	c := needCgroupV1(t)
	made, reused := c.made.Load(), c.reused.Load()
	a, err := c.newGroup()
	require.NoError(t, err)
	// An OOM kill in a's work group (64 MiB).
	hog := exec.Command("/usr/bin/python3", "-c", "import sys; sys.stdin.read(1); b = bytearray(200 << 20)")
	in, err := hog.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, hog.Start())
	require.NoError(t, a.place(hog.Process.Pid))
	in.Write([]byte("x")) //nolint:errcheck // it may be killed before it reads
	err = hog.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "the OOM killer's")
	require.Equal(t, uint64(1), a.oomCount())
	require.NoError(t, a.remove())
	assert.Equal(t, uint64(1), a.oomCount(), "what it counted when it was removed")

	b, err := c.newGroup()
	require.NoError(t, err)
	assert.Equal(t, a.dirs, b.dirs, "a's group, reused")
	assert.Equal(t, made+1, c.made.Load())
	assert.Equal(t, reused+1, c.reused.Load())
	assert.Zero(t, b.oomCount(), "a's OOM kill is not b's")
	assert.Equal(t, strconv.Itoa(64<<20), strings.TrimSpace(readFile(t, filepath.Join(b.work, "memory.limit_in_bytes"))))
	assert.Equal(t, "8", strings.TrimSpace(readFile(t, filepath.Join(b.dirs[1], "pids.max"))))

	// b's process, which a's group value must not reach.
	cmd := exec.Command("sleep", "300")
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	require.NoError(t, b.place(cmd.Process.Pid))
	assert.Empty(t, a.members(), "a lists nothing of b's")
	a.kill()
	a.lendReserve()
	a.takeBack()
	assert.ErrorIs(t, a.place(os.Getpid()), ErrNoCgroup)
	assert.ErrorIs(t, a.placeGuardian(), ErrNoCgroup)
	_, err = a.workProcs()
	assert.ErrorIs(t, err, ErrNoCgroup)
	_, _, _, ok := (&Worker{cg: a}).CgroupUsage()
	assert.False(t, ok, "nor reads b's usage")
	select {
	case <-done:
		t.Fatal("a's kill reached b's process")
	case <-time.After(100 * time.Millisecond):
	}
	assert.Equal(t, []int{cmd.Process.Pid}, b.members())
	require.NoError(t, b.remove())
	<-done

	// A group whose last process has ended but is not reaped yet (which pids.current counts,
	// and cgroup.procs lists no more) is kept, but no sandbox starts in it until it is.
	z, err := c.newGroup()
	require.NoError(t, err)
	zombie := exec.Command("sh", "-c", "read go")
	in, err = zombie.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, zombie.Start())
	require.NoError(t, z.place(zombie.Process.Pid))
	in.Write([]byte("go\n")) //nolint:errcheck // read
	require.Eventually(t, func() bool { return waitGoneWithin(zombie.Process.Pid, 0) == nil }, 5*time.Second,
		10*time.Millisecond, "a zombie")
	require.NoError(t, z.remove())
	require.Positive(t, c.tasks(z), "its zombie counts")
	var taken []*cgroup
	for made := c.made.Load(); c.made.Load() == made; {
		g, err := c.newGroup()
		require.NoError(t, err)
		assert.NotEqual(t, z.dirs, g.dirs, "not while its zombie counts")
		taken = append(taken, g)
	}
	require.NoError(t, zombie.Wait())
	g, err := c.newGroup()
	require.NoError(t, err)
	assert.Equal(t, z.dirs, g.dirs, "once reaped")
	for _, g := range append(taken, g) {
		require.NoError(t, g.remove())
	}

	// A group whose sandbox left memory charged to it (a file's pages, written from it)
	// cools while new groups are made, then, still charged, is removed.
	d, err := c.newGroup()
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "pages")
	dd := exec.Command("sh", "-c", "read go; head -c 4194304 /dev/zero > "+file)
	in, err = dd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, dd.Start())
	require.NoError(t, d.place(dd.Process.Pid))
	in.Write([]byte("go\n")) //nolint:errcheck // read
	require.NoError(t, dd.Wait())
	require.Greater(t, c.charged(d), int64(reuseCharge))
	require.NoError(t, d.remove())
	e, err := c.newGroup()
	require.NoError(t, err)
	assert.NotEqual(t, d.dirs, e.dirs, "a new group while d's cools")
	for _, dir := range d.dirs {
		assert.DirExists(t, dir, "cooling")
	}
	c.mu.Lock()
	d.kept = d.kept.Add(-2 * reuseCool)
	c.mu.Unlock()
	f, err := c.newGroup()
	require.NoError(t, err)
	assert.NotEqual(t, d.dirs, f.dirs)
	for _, dir := range d.dirs {
		assert.NoDirExists(t, dir, "removed: charged past its cooling")
	}
	require.NoError(t, e.remove())
	require.NoError(t, f.remove())
}
