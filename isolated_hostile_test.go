package minipy_test

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/internal/worker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Probes of issue 34, as a hostile model's code would try them: each one got through once.
// TestSandboxWithoutTemplate runs them with workers started as processes of their own too,
// and TestSandboxHostileAsUser as an unprivileged host.

func TestSandboxHostileAsUser(t *testing.T) {
	out := rerunAsNobody(t, "^(TestSandboxGuardianIsOutOfReach|TestSandboxSeccompRefusesEscapes|TestSandboxInheritedDescriptorsAreClosed)$")
	assert.Contains(t, out, "--- PASS: TestSandboxGuardianIsOutOfReach")
}

// The guardian (the sandbox's pid 1) runs as the code's user, and the worker is a fork of
// it: the code must not reach its memory, its descriptors or its signal handlers, since the
// guardian is what kills the code's processes when the namespace closes.
func TestSandboxGuardianIsOutOfReach(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	probe := `import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def sc(nr, *a):
    r = libc.syscall(nr, *a)
    return r if r >= 0 else -ctypes.get_errno()
def opens(path, mode):
    try:
        open(path, mode).close()
        return "opened"
    except OSError as e:
        return e.errno
nrs = {"x86_64": (434, 438, 440), "aarch64": (434, 438, 440)}[os.uname().machine]
pidfd = sc(nrs[0], os.getppid(), 0)
(os.getppid(), opens("/proc/1/mem", "r+b"), opens("/proc/1/mem", "rb"), sorted(os.listdir("/proc/1/fd")) if os.access("/proc/1/fd", os.R_OK) else "closed",
 pidfd >= 0, sc(nrs[1], pidfd, 3, 0), sc(nrs[2], pidfd, 0, 0, 0, 0))`
	v := valueIn(t, e, ns, probe).([]any)
	eacces, eperm := int64(13), int64(-1)
	assert.Equal(t, []any{int64(1), eacces, eacces, "closed", true, eperm, eperm}, v,
		"the guardian's memory, fds (pidfd_getfd) and process_madvise are out of reach")

	// Signals: pid 1 gets from inside its namespace only those it handles (Python: SIGINT).
	valueIn(t, e, ns, `import os, signal, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
          signal.SIGSEGV, signal.SIGCHLD, signal.SIGPIPE, signal.SIGALRM):
    os.kill(1, s)
time.sleep(0.3)
X = 1`)
	// The guardian still serves: a crash rolls back (the guardian hands the snapshot over).
	_, err := runIn(t, e, ns, "import os; X = 2; os._exit(3)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	assert.True(t, lost.RolledBack)
	assert.Equal(t, int64(1), valueIn(t, e, ns, "X"))

	// A daemon that left the worker's tree still ends with the namespace.
	marker := sleepMarker()
	valueIn(t, e, ns, fmt.Sprintf(`import os, subprocess
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        subprocess.Popen(["sleep", "300", %q], start_new_session=True)
    os._exit(0)
os.wait()
None`, marker))
	require.Eventually(t, func() bool { pids, _ := markerProcs(t, marker); return len(pids) == 1 },
		10*time.Second, 20*time.Millisecond, "the daemon started")
	start := time.Now()
	require.NoError(t, ns.Close())
	requireGoneSoon(t, "after ns.Close", marker)
	assert.Less(t, time.Since(start), 5*time.Second, "Close did not stall")
	runtime.KeepAlive(ns)
}

// The seccomp filter is an allowlist (Docker's default profile, narrowed): besides what
// TestSandboxSeccompRefusesKernelAttackSurface holds, the calls a hostile model's code would
// use against the guardian, the hypervisor or the host's logs are refused, and ordinary
// sockets still work.
func TestSandboxSeccompRefusesEscapes(t *testing.T) {
	code := `import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, *a):
    nr = {"x86_64": {"syslog": 103, "name_to_handle_at": 303, "userfaultfd": 323, "io_uring_setup": 425,
                     "keyctl": 250, "process_vm_readv": 310, "pidfd_getfd": 438, "process_madvise": 440,
                     "kcmp": 312, "perf_event_open": 298},
          "aarch64": {"syslog": 116, "name_to_handle_at": 264, "userfaultfd": 282, "io_uring_setup": 425,
                      "keyctl": 219, "process_vm_readv": 270, "pidfd_getfd": 438, "process_madvise": 440,
                      "kcmp": 272, "perf_event_open": 241}}[os.uname().machine][name]
    r = libc.syscall(nr, *a)
    return r if r >= 0 else ctypes.get_errno()
def sock(family, kind=socket.SOCK_STREAM, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return "ok"
    except OSError as e:
        return e.errno
buf = ctypes.create_string_buffer(128)
mount_id = ctypes.c_int()
calls = {n: sc(n, 0, 0, 0, 0, 0) for n in ("syslog", "userfaultfd", "io_uring_setup", "keyctl", "process_vm_readv",
                                           "pidfd_getfd", "process_madvise", "kcmp", "perf_event_open")}
calls["name_to_handle_at"] = sc("name_to_handle_at", -100, b"/work", buf, ctypes.byref(mount_id), 0)
families = {"vsock": sock(40), "packet": sock(17, socket.SOCK_RAW), "alg": sock(38, socket.SOCK_SEQPACKET),
            "bluetooth": sock(31), "unix": sock(socket.AF_UNIX), "inet": sock(socket.AF_INET),
            "inet6": sock(socket.AF_INET6), "netlink": sock(16, socket.SOCK_RAW), "raw": sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)}
calls, families`
	r, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	eperm, eafnosupport := int64(syscall.EPERM), int64(syscall.EAFNOSUPPORT)
	v := r.Value.([]any)
	calls := map[string]any{}
	for _, n := range []string{"syslog", "userfaultfd", "io_uring_setup", "keyctl", "process_vm_readv", "pidfd_getfd",
		"process_madvise", "kcmp", "perf_event_open", "name_to_handle_at"} {
		calls[n] = eperm
	}
	assert.Equal(t, calls, v[0], "refused with EPERM")
	assert.Equal(t, map[string]any{"vsock": eafnosupport, "packet": eafnosupport, "alg": eafnosupport,
		"bluetooth": eafnosupport, "unix": "ok", "inet": "ok", "inet6": "ok", "netlink": "ok", "raw": eperm}, v[1],
		"only local, IP and netlink sockets; raw IP needs CAP_NET_RAW")
}

// Descriptors the host process inherited without close-on-exec (from a shell, a service
// manager) are not the code's: Go closes only its own at exec.
func TestSandboxInheritedDescriptorsAreClosed(t *testing.T) {
	var p [2]int
	require.NoError(t, syscall.Pipe(p[:])) // (syscall.Pipe: no O_CLOEXEC)
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	const high = 300 // (low numbers are the worker's own by then)
	require.NoError(t, syscall.Dup2(p[1], high))
	defer syscall.Close(high)
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(p[1], &st))
	code := fmt.Sprintf(`import os
inodes = []
for fd in os.listdir("/proc/self/fd"):
    try:
        inodes.append(os.stat(int(fd)).st_ino)
    except (OSError, ValueError):
        pass
%d in inodes`, st.Ino)
	for _, cfg := range []minipy.IsolatedConfig{{}, {NoTemplate: true}} {
		r, err := newIsolated(t, cfg).Minipy(code, nil)
		require.NoError(t, err)
		assert.Equal(t, false, r.Value, "NoTemplate %v: the host's pipe is not in the worker", cfg.NoTemplate)
	}
}

// Code that used up its file descriptors still gets its error's message (formatting the
// traceback imports traceback.py, which needs one). (In-process code shares the host's
// descriptors: not tried there.)
func TestOutOfFileDescriptorsKeepsTheMessage(t *testing.T) {
	_, err := newIsolated(t, minipy.IsolatedConfig{NoRollback: true}).Minipy(`import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
files = []
while True:
    files.append(open("/dev/null"))`, nil)
	var pyErr *minipy.PythonError
	require.ErrorAs(t, err, &pyErr)
	assert.Equal(t, "OSError", pyErr.Type)
	assert.Contains(t, pyErr.Message, "Too many open files")
}

// The code's /proc/self/mountinfo names its own tree and working directories alone: the
// template binds every namespace's tree, and a worker forked from it once saw the others
// (covered, but listed: how many namespaces the engine serves and their working
// directories' mounts).
func TestSandboxMountinfoNamesNoOtherNamespace(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	var nss []*minipy.Namespace
	for i := 0; i < 3; i++ {
		ns := e.NewNamespace()
		valueIn(t, e, ns, fmt.Sprintf("X = %d", i))
		nss = append(nss, ns)
	}
	mountPoints := `[l.split()[4] for l in open("/proc/self/mountinfo") if l.split()[4].startswith(%q)]`
	mountPoints = fmt.Sprintf(mountPoints, worker.SandboxTree)
	v := valueIn(t, e, nss[1], mountPoints).([]any)
	require.Len(t, v, 2, "the tree and its one working directory: %v", v)
	assert.Equal(t, worker.SandboxTree, v[0])

	// A Fork copy's working directory, mounted later in the same tree, still appears there.
	b, err := nss[1].Fork()
	require.NoError(t, err)
	defer b.Close()
	assert.Len(t, valueIn(t, e, nss[1], mountPoints), 3, "the tree, its working directory and the Fork copy's")
	assert.Equal(t, int64(1), valueIn(t, e, b, "X"))
	assert.Len(t, valueIn(t, e, nss[2], mountPoints), 2, "not another tree's")
}

// No two sandboxes share memory that either can write. A mapping the template makes shared
// is shared with every sandbox forked from it, and code can make it writable again
// (mprotect): the fork code's was, until 2026-12-05, so code in one sandbox could change
// the machine code that the other sandboxes, their guardians and the template run. Here
// code in one sandbox makes each shared mapping it has writable where the kernel lets it
// and changes its last byte; another sandbox, and one started after, see none of it.
func TestSandboxesShareNoWritableMemory(t *testing.T) {
	const poke = `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
poked = []
for line in open('/proc/self/maps').read().splitlines():
    f = line.split()
    lo, hi = (int(x, 16) for x in f[0].split('-'))
    if f[1][3] == 's' and libc.mprotect(lo, hi - lo, 3) == 0:  # PROT_READ | PROT_WRITE
        b = ctypes.c_uint8.from_address(hi - 1)
        b.value ^= 0x5A
        poked.append([hi - 1, b.value])
poked`
	const peek = `import ctypes
mapped = [[int(x, 16) for x in l.split()[0].split('-')] for l in open('/proc/self/maps').read().splitlines()]
[[at, ctypes.c_uint8.from_address(at).value] for at, _ in %s if any(lo <= at < hi for lo, hi in mapped)]`
	e := newIsolated(t, minipy.IsolatedConfig{})
	a, b := e.NewNamespace(), e.NewNamespace()
	defer a.Close()
	defer b.Close()
	valueIn(t, e, b, "1") // (started before the poke)
	poked := valueIn(t, e, a, poke).([]any)
	t.Logf("made writable and changed in one sandbox: %v", poked)
	later := e.NewNamespace()
	defer later.Close()
	for _, ns := range []*minipy.Namespace{b, later} {
		seen := valueIn(t, e, ns, fmt.Sprintf(peek, pyList(poked))).([]any)
		for _, s := range seen {
			for _, p := range poked {
				if s.([]any)[0] == p.([]any)[0] {
					assert.NotEqual(t, p, s, "a byte one sandbox wrote, seen in another")
				}
			}
		}
	}
}

// pyList writes v (lists of int64) as a Python literal.
func pyList(v []any) string {
	s := "["
	for _, x := range v {
		p := x.([]any)
		s += fmt.Sprintf("[%d, %d], ", p[0], p[1])
	}
	return s + "]"
}

// A crash's take-over (the host's new pipes, through the guardian) reaches the rollback
// snapshot and no other process: not the processes the guardian kills as the worker ends,
// which, until each has run once more, can still take a message waiting on a socket they
// were waiting on (a killed old snapshot, starved on a loaded machine, took it: the
// namespace was lost). Here the code's own children wait on every socket the worker holds,
// as an old snapshot does, and there are enough of them that some have not run again by the
// time the host answers.
func TestSandboxTakeOverReachesTheSnapshot(t *testing.T) {
	for _, osFork := range []bool{false, true} {
		t.Run(fmt.Sprintf("os.fork=%v", osFork), func(t *testing.T) {
			e := newIsolatedForking(t, minipy.IsolatedConfig{}, osFork)
			ns := e.NewNamespace()
			valueIn(t, e, ns, `import os, socket, stat, time
socks = []
for name in os.listdir("/proc/self/fd"):
    try:
        if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
            socks.append(int(name))
    except OSError:
        pass
# Page tables each child has to tear down as it ends: the last to run again after the
# kill does so after the host's answer (without the ballast: 1 time in 20 on 2 cores).
import mmap
ballast = os.memfd_create("ballast")
os.ftruncate(ballast, 32 << 20)
r, w = os.pipe()
waiting = []
for fd in socks:
    for _ in range(64):
        pid = os.fork()
        if pid == 0:
            m = mmap.mmap(ballast, 32 << 20)
            m.madvise(getattr(mmap, "MADV_POPULATE_READ", 22))  # (Linux 5.14+)
            os.write(w, b".")
            # (as a snapshot does: nothing else of the worker's, the host's pipes above all)
            os.closerange(0, fd)
            os.closerange(fd + 1, 65536)
            try:
                socket.socket(fileno=fd).recvmsg(256, 1024)
            finally:
                os._exit(0)
        waiting.append(pid)
got = 0
while got < len(waiting):
    got += len(os.read(r, 4096))
def asleep(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"
while not all(asleep(p) for p in waiting):
    time.sleep(0.01)
X = 1`)
			// As the worker kills its old snapshot when it makes a new one: SIGKILL, no wait.
			_, err := runIn(t, e, ns, `import signal
X = 2
for pid in waiting:
    os.kill(pid, signal.SIGKILL)
os._exit(3)`)
			var lost *minipy.WorkerLostError
			require.ErrorAs(t, err, &lost)
			require.True(t, lost.RolledBack, "%s", lost.Stderr)
			require.Equal(t, int64(1), valueIn(t, e, ns, "X"))
		})
	}
}
