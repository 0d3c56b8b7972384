package minipy_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The promises of the isolated engine's sandbox (docs/isolated.md: "What the model's code can see and
// do"), one test each.

func TestSandboxHostEnvironmentIsAbsent(t *testing.T) {
	t.Setenv("MINIPY_TEST_SECRET", "s3cret")
	probe := `import os, sys
(os.environ.get("MINIPY_TEST_SECRET"), os.environ.get("GREETING"), os.environ["HOME"], os.environ["TMPDIR"],
 sys.flags.dont_write_bytecode)`
	cfg := minipy.IsolatedConfig{Env: []string{"GREETING=hi there", "PYTHONDONTWRITEBYTECODE=1"}}
	r, err := newIsolated(t, cfg).Minipy(probe, nil)
	require.NoError(t, err)
	assert.Equal(t, []any{nil, "hi there", "/work", "/tmp", int64(1)}, r.Value,
		"no host variable; Env added, and PYTHON* ones reach the interpreter's start")

	cfg.AllowUnsandboxed = true
	e, err := minipy.NewIsolatedActingUnsandboxed(cfg)
	require.NoError(t, err)
	defer e.Close()
	r, err = e.Minipy(probe, nil)
	require.NoError(t, err)
	assert.Equal(t, []any{nil, "hi there", e.WorkDir(), os.TempDir(), int64(1)}, r.Value,
		"without the sandbox the environment is just as minimal")

	for _, bad := range []string{"NOEQUALS", "=value", "A=b\x00c"} {
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{Env: []string{bad}})
		assert.Error(t, err, "%q", bad)
	}
}

func TestSandboxHostFilesAreInvisible(t *testing.T) {
	dir := sandboxReadableDir(t)
	secret := filepath.Join(dir, "secret.txt")
	require.NoError(t, os.WriteFile(secret, []byte("s3cret"), 0o644))
	src, err := filepath.Abs("isolated_sandbox_test.go")
	require.NoError(t, err)
	code := fmt.Sprintf(`import os
def can(f, *a):
    try:
        f(*a)
        return True
    except OSError:
        return False
top = os.listdir("/")
(can(open, %q), can(os.listdir, %q), can(open, %q), [d for d in ("root", "home", "mnt", "srv", "run", "sys", "boot") if d in top],
 can(open, "/etc/shadow"), open("/etc/passwd").read().count("\n"))`, secret, dir, src)
	r, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	assert.Equal(t, []any{false, false, false, []any{}, false, int64(3)}, r.Value,
		"a world-readable file under the host's temp dir, its directory, the host program's source tree, "+
			"/root and /home: none reachable; /etc/passwd is the sandbox's stub")

	r, err = newIsolated(t, minipy.IsolatedConfig{}).Minipy(
		"import socket; socket.gethostname(), socket.gethostbyname(socket.gethostname())", nil)
	require.NoError(t, err)
	assert.Equal(t, []any{"minipy", "127.0.1.1"}, r.Value, "not the host's name")
}

func TestSandboxMounts(t *testing.T) {
	in := sandboxReadableDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(in, "data.txt"), []byte("input"), 0o644))
	out := sandboxReadableDir(t)
	require.NoError(t, os.Chmod(out, 0o777)) // the workers' host user must be able to write there
	e := newIsolated(t, minipy.IsolatedConfig{Mounts: []minipy.Mount{
		{Source: in, Target: "/data"},
		{Source: out, Target: "/out", Writable: true},
		{Source: in}, // at its own path
		{Source: filepath.Join(in, "data.txt"), Target: "/work/inputs/data.txt"}, // a file
	}})
	code := fmt.Sprintf(`import os
def write(p):
    try:
        open(p, "w").write("x")
        return "ok"
    except OSError as e:
        return e.errno
(open("/data/data.txt").read(), write("/data/new.txt"), open(%q).read(), write(%q),
 write("/out/result.txt"), open("inputs/data.txt").read(), write("inputs/data.txt"))`,
		filepath.Join(in, "data.txt"), filepath.Join(in, "new.txt"))
	r, err := e.Minipy(code, nil)
	require.NoError(t, err)
	erofs := int64(30)
	assert.Equal(t, []any{"input", erofs, "input", erofs, "ok", "input", erofs}, r.Value,
		"read-only unless Writable")
	assert.FileExists(t, filepath.Join(out, "result.txt"), "a Writable mount writes through")
	assert.NoFileExists(t, filepath.Join(in, "new.txt"))

	for _, bad := range []minipy.Mount{
		{Source: "relative", Target: "/x"},
		{Source: in, Target: "relative"},
		{Source: in, Target: "/"},
		{Source: in, Target: "/proc/x"},
		{Source: in, Target: "/dev"},
		{Source: filepath.Join(in, "missing"), Target: "/x"},
		{Source: in, Target: "/x\ny"},
	} {
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{Mounts: []minipy.Mount{bad}})
		assert.Error(t, err, "%+v", bad)
	}
	_, err = minipy.NewIsolated(minipy.IsolatedConfig{Command: []string{"python3"}, Network: true,
		Mounts: []minipy.Mount{{Source: in}}})
	assert.Error(t, err, "a Command worker's files are the other side's")
}

// The host's own directories, private ones too (0700), are the code's to read, and to write
// when Writable: on a root host through an idmapped mount (TestSandboxRootIdmappedMounts),
// on an unprivileged one because the workers are its user (TestSandboxOwnMountsAsUser
// runs this as nobody). What the code writes is the host's user's. A Mount the workers
// could not use is refused as the engine starts, never at the code's first write.
func TestSandboxOwnMounts(t *testing.T) {
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			out, in := t.TempDir(), t.TempDir()
			require.NoError(t, os.Chmod(out, 0o700))
			require.NoError(t, os.Chmod(in, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(in, "in.txt"), []byte("input"), 0o600))
			e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate, Mounts: []minipy.Mount{
				{Source: out, Target: "/out", Writable: true}, {Source: in, Target: "/in"}}})
			r, err := e.Minipy(`import os
def write(p):
    try:
        open(p, "w").write("x")
        return "ok"
    except OSError as e:
        return e.errno
open("/out/result.txt", "w").write("result")
(open("/in/in.txt").read(), write("/in/new.txt"), write("/in/in.txt"))`, nil)
			require.NoError(t, err)
			erofs := int64(30)
			assert.Equal(t, []any{"input", erofs, erofs}, r.Value, "read-only unless Writable")
			info, err := os.Stat(filepath.Join(out, "result.txt"))
			require.NoError(t, err)
			st := info.Sys().(*syscall.Stat_t)
			assert.Equal(t, []int{os.Geteuid(), os.Getegid()}, []int{int(st.Uid), int(st.Gid)},
				"what the code writes belongs to the host's user")
		})
	}
	if os.Geteuid() != 0 {
		// A directory of root's that the host's user (and so its workers) may not write.
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{Mounts: []minipy.Mount{{Source: "/usr/share", Target: "/out", Writable: true}}})
		require.ErrorIs(t, err, minipy.ErrSandboxAccess)
		assert.ErrorIs(t, err, fs.ErrPermission)
		assert.NotErrorIs(t, err, minipy.ErrNoSandbox)
		assert.Contains(t, err.Error(), "/usr/share", "the error names the path")
	}
}

func TestSandboxProcShowsOnlyItsProcesses(t *testing.T) {
	marker := fmt.Sprintf("%d.%d", 1000+os.Getpid()%1000, time.Now().UnixNano()%1000000)
	host := exec.Command("sleep", marker)
	require.NoError(t, host.Start())
	defer func() { host.Process.Kill(); host.Wait() }()
	code := fmt.Sprintf(`import os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
seen = [p for p in pids if %q in open("/proc/%%d/cmdline" %% p).read()]
pids, seen`, marker)
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	_, err := e.Minipy("x = 1", &minipy.Options{Globals: ns}) // (a new worker's first snapshot comes after a change)
	require.NoError(t, err)
	r, err := e.Minipy(code, &minipy.Options{Globals: ns})
	require.NoError(t, err)
	v := r.Value.([]any)
	pids := v[0].([]any)
	require.Len(t, pids, 3, "the sandbox's reaper, its worker and the worker's rollback snapshot, nothing else")
	assert.Equal(t, []any{int64(1), int64(2)}, pids[:2])
	assert.Empty(t, v[1], "a process of the host is not visible")
}

// The sandbox writes anywhere in its own root, /tmp, /dev/shm and working directory, never
// in the image (/usr, /etc) nor the host's files, each place capped.
func TestSandboxWritesStayInTheSandbox(t *testing.T) {
	marker := fmt.Sprintf("minipy-host-%d-%d", os.Getpid(), time.Now().UnixNano())
	require.NoError(t, os.WriteFile(filepath.Join(os.TempDir(), marker), nil, 0o644))
	defer os.Remove(filepath.Join(os.TempDir(), marker))
	code := fmt.Sprintf(`import os
def write(p, n=1):
    try:
        with open(p, "wb") as f:
            f.write(b"x" * n)
        return "ok"
    except OSError as e:
        return e.errno
([write(p) for p in ("/usr/x", "/usr/lib/x", "/etc/x", "/bin/x")],
 write("/work/x"), write("/tmp/x"), os.path.exists("/tmp/" + %q), write("/tmp/%s-sandbox"),
 write("/tmp/big", 2 << 20), write("/dev/shm/big", 2 << 20), write("/%s"), write("/big", 2 << 20))`, marker, marker, marker)
	for name, cfg := range map[string]minipy.IsolatedConfig{
		"template": {TmpSize: 1 << 20}, "no template": {TmpSize: 1 << 20, NoTemplate: true}} {
		r, err := newIsolated(t, cfg).Minipy(code, nil)
		require.NoError(t, err)
		erofs, enospc := int64(30), int64(28)
		assert.Equal(t, []any{[]any{erofs, erofs, erofs, erofs}, "ok", "ok", false, "ok", enospc, enospc, "ok", enospc},
			r.Value, "%s: the image read-only; the root, /tmp and /dev/shm private, each capped by TmpSize", name)
	}
	assert.NoFileExists(t, filepath.Join(os.TempDir(), marker+"-sandbox"), "the sandbox's /tmp is not the host's")
	assert.NoFileExists(t, "/"+marker, "the sandbox's root is not the host's")
}

func TestSandboxDevIsMinimal(t *testing.T) {
	code := `import os
n = open("/dev/null", "w").write("gone")
sorted(os.listdir("/dev")), len(open("/dev/urandom", "rb").read(16)), open("/dev/zero", "rb").read(2)`
	r, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	assert.Equal(t, []any{
		[]any{"fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"},
		int64(16), []byte{0, 0},
	}, r.Value, "no tty, no disk, no host device")
}

func TestSandboxUserHasNoPrivileges(t *testing.T) {
	code := `import os, pwd
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
(os.getuid(), os.getgid(), pwd.getpwuid(os.getuid()).pw_name, status["CapEff"].strip(), status["CapPrm"].strip(),
 status["CapAmb"].strip(), status["NoNewPrivs"].strip(), os.getgroups())`
	r, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	none := "0000000000000000"
	want := []any{int64(1000), int64(1000), "user", none, none, none, "1"}
	v := r.Value.([]any)
	assert.Equal(t, want, v[:7], "an ordinary user with no capability, not even inside its namespaces")
	if os.Geteuid() == 0 {
		assert.Equal(t, []any{}, v[7], "root's supplementary groups are dropped")
	}
}

// A worker that starts as a process of its own (not forked from the template) imports
// modules before its sandbox is built, with the access it starts with (root's, on a root
// host): never from the namespace's working directory, where the code of an earlier worker
// can leave modules with the names of those the worker imports then (worker.py's imports
// up to _enter_sandbox's).
func TestSandboxWorkdirModulesAreNotImportedAtStart(t *testing.T) {
	marks := sandboxReadableDir(t)
	require.NoError(t, os.Chmod(marks, 0o777)) // whoever the planted code would run as could write here
	e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: true, NoRollback: true})
	plant := fmt.Sprintf(`import os
open("mymod.py", "w").write("X = 5\n")
for name in ("signal", "struct", "threading", "types", "socket", "ctypes", "stat", "faulthandler"):
    with open(name + ".py", "w") as f:
        f.write("open(%%r + '/' + __name__, 'w').write(repr(__import__('os').getuid()))\n" %% %q)
os._exit(3)`, marks)
	_, err := e.Minipy(plant, nil)
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost, "the worker exits, without a snapshot to roll back to")
	r, err := e.Minipy("import os; sorted(n for n in os.listdir('.') if n.endswith('.py'))[:2], os.getuid()", nil)
	require.NoError(t, err, "a fresh worker starts (the worker's own imports, in the sandbox too, skip the working directory)")
	assert.Equal(t, []any{[]any{"ctypes.py", "faulthandler.py"}, int64(1000)}, r.Value, "the planted files are there")
	r, err = e.Minipy("import mymod; mymod.X", nil)
	require.NoError(t, err)
	assert.Equal(t, int64(5), r.Value, "the code imports its own modules from the working directory")
	found, err := os.ReadDir(marks)
	require.NoError(t, err)
	assert.Empty(t, found, "no planted module ran outside the sandbox")
}

func TestSandboxNumpyFindsItsBLAS(t *testing.T) {
	needModule(t, "numpy")
	r, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy("import numpy as np; float((np.ones((3, 3)) @ np.ones(3)).sum())", nil)
	require.NoError(t, err)
	assert.Equal(t, 9.0, r.Value)
}

func TestSandboxRefusedMounts(t *testing.T) {
	_, err := minipy.NewIsolatedRefusingMounts(minipy.IsolatedConfig{})
	require.ErrorIs(t, err, minipy.ErrNoSandbox, "a refused mount is a refused sandbox")
	assert.True(t, strings.Contains(err.Error(), "mount"), err.Error())

	e, err := minipy.NewIsolatedRefusingMounts(minipy.IsolatedConfig{AllowUnsandboxed: true})
	require.NoError(t, err, "AllowUnsandboxed falls back to a worker without namespaces")
	defer e.Close()
	r, err := e.Minipy("import os; os.getcwd()", nil)
	require.NoError(t, err)
	assert.Equal(t, e.WorkDir(), r.Value)
}

func TestSandboxSeccompRefusesKernelAttackSurface(t *testing.T) {
	code := `import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(ret):
    return ctypes.get_errno() if ret == -1 else ret
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
t = threading.Thread(target=lambda: None); t.start(); t.join()  # threads start (clone3 falls back)
(status["Seccomp"].strip(),
 errno_of(libc.unshare(0x10000000)),  # a nested user namespace
 errno_of(libc.ptrace(0, 0, 0, 0)),    # PTRACE_TRACEME
 errno_of(libc.syscall({"x86_64": 321, "aarch64": 280}[os.uname().machine], 0, 0, 0)),  # bpf
 subprocess.run(["true"]).returncode, os.waitpid(os.fork() or os._exit(0), 0)[1])`
	r, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	eperm := int64(1)
	assert.Equal(t, []any{"2", eperm, eperm, eperm, int64(0), int64(0)}, r.Value,
		"filtered; the refused calls fail with EPERM; threads, subprocess and fork still work")
}

// The sandbox's promises hold for workers forked from the template (the default, the
// tests above: the sandbox made by the host's fork code), for workers started as processes
// of their own, and for a template's sandboxes made in Python (where the code cannot run).
var sandboxPromises = []struct {
	name string
	fn   func(*testing.T)
}{
	{"HostEnvironmentIsAbsent", TestSandboxHostEnvironmentIsAbsent},
	{"HostFilesAreInvisible", TestSandboxHostFilesAreInvisible},
	{"BootIDIsItsOwn", TestSandboxBootIDIsItsOwn},
	{"Mounts", TestSandboxMounts},
	{"ProcShowsOnlyItsProcesses", TestSandboxProcShowsOnlyItsProcesses},
	{"WritesStayInTheSandbox", TestSandboxWritesStayInTheSandbox},
	{"DevIsMinimal", TestSandboxDevIsMinimal},
	{"UserHasNoPrivileges", TestSandboxUserHasNoPrivileges},
	{"SeccompRefusesKernelAttackSurface", TestSandboxSeccompRefusesKernelAttackSurface},
	{"TenantsAreApart", TestSandboxTenantsAreApart},
	{"GuardianIsOutOfReach", TestSandboxGuardianIsOutOfReach},
	{"SeccompRefusesEscapes", TestSandboxSeccompRefusesEscapes},
	{"TakeOverReachesTheSnapshot", TestSandboxTakeOverReachesTheSnapshot},
}

func TestSandboxWithoutTemplate(t *testing.T) {
	withoutTemplate = true
	defer func() { withoutTemplate = false }()
	for _, test := range sandboxPromises {
		t.Run(test.name, test.fn)
	}
}

func TestSandboxSetUpInPython(t *testing.T) {
	withOSFork = true
	defer func() { withOSFork = false }()
	for _, test := range sandboxPromises {
		t.Run(test.name, test.fn)
	}
	t.Run("EgressUsualClients", TestEgressUsualClients)
	t.Run("EgressSurvivesRollbackAndFork", TestEgressSurvivesRollbackAndFork)
}

// A sandbox forked from the template is made by the host's fork code: no Python runs in
// the template's fork or the sandbox's pid 1 before the sandbox is made. An audit hook that
// the template loads (Preload) sees the set-up's own events (setgroups denied in the new
// user namespace, the host named) only where the sandbox is made in Python, and the worker,
// forked from that pid 1, holds what it saw.
func TestSandboxSetUpRunsNoPython(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755)) // (the sandbox's user reads it)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "minipy_audit_probe.py"), []byte(`import sys
seen = []
def _hook(event, args):
    if event == "socket.sethostname" or (event == "open" and str(args[0]).endswith("setgroups")):
        seen.append(event)
sys.addaudithook(_hook)
`), 0o644))
	seen := func(osFork bool) any {
		e := newIsolatedForking(t, minipy.IsolatedConfig{Preload: []string{"minipy_audit_probe"},
			Env: []string{"PYTHONPATH=" + dir}}, osFork)
		ns := e.NewNamespace()
		defer ns.Close()
		return valueIn(t, e, ns, "import minipy_audit_probe; sorted(set(minipy_audit_probe.seen))")
	}
	assert.Equal(t, []any{"open", "socket.sethostname"}, seen(true), "(the probe sees a set-up in Python)")
	assert.Equal(t, []any{}, seen(false))
}

// A worker forked from the template imports no module of its own before its first answer:
// each import there is the import system's Python and the module's loading in every
// sandbox's start (resource, which the worker's limits need, cost ~115 of a start's ~1,050
// faults until the template imported it). An audit hook the template preloads sees each
// import (CPython raises "import" only for a module not yet in sys.modules); the fork
// clears what it saw in the template.
func TestTemplateWorkersImportNothing(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755)) // (the sandbox's user reads it)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "minipy_import_probe.py"), []byte(`import os, sys
seen = []
def _hook(event, args):
    if event == "import":
        seen.append(args[0])
sys.addaudithook(_hook)
os.register_at_fork(after_in_child=seen.clear)
`), 0o644))
	e := newIsolated(t, minipy.IsolatedConfig{Preload: []string{"minipy_import_probe"},
		Env: []string{"PYTHONPATH=" + dir}, CPULimit: time.Minute})
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, []any{}, valueIn(t, e, ns, "import minipy_import_probe; minipy_import_probe.seen"))
}

// On CPython 3.12+ (with the GIL) what a template has loaded is immortal in its workers
// (template.py's _immortalize): a worker that uses it writes none of its reference counts,
// so its pages stay shared with the template and with the rollback snapshots. What the code
// makes stays mortal (freed when its last reference goes), and so do the namespaces, the
// default one too, which the template made; a worker started without a template has
// nothing made immortal, and 3.11 has no immortal objects.
func TestTemplateObjectsImmortal(t *testing.T) {
	const probe = `import sys, os, weakref
class A: pass
a = A()
r = weakref.ref(a)
del a
[sys.version_info >= (3, 12) and "t" not in sys.abiflags, sys.getrefcount(os.read) > 1 << 30,
 sys.getrefcount(globals()) < 1 << 30, r() is None, sys.getrefcount(A) < 1 << 30]`
	for _, noTemplate := range []bool{false, true} {
		e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: noTemplate})
		ns := e.NewNamespace()
		for _, space := range []*minipy.Namespace{nil, ns} { // (nil: the default namespace)
			got := valueIn(t, e, space, probe).([]any)
			immortal := got[0].(bool) && !noTemplate
			assert.Equal(t, []any{got[0], immortal, true, true, true}, got, "NoTemplate %v, namespace %v", noTemplate, space)
		}
		ns.Close()
	}
}

// A sandbox's guardian stays in C while all it does is take its worker's snapshot reports
// and reap (its fds: a signalfd, not guardian.py's wake-up pipe); the worker's death hands
// it over to guardian.py, which goes on with the snapshot C was told of: the rollback
// brings back the state that snapshot held, and the next snapshot gets the guardian's OOM
// score from Python.
func TestGuardianStaysInC(t *testing.T) {
	signalfd := func(osFork bool) (before, after bool) {
		e := newIsolatedForking(t, minipy.IsolatedConfig{}, osFork)
		ns := e.NewNamespace()
		defer ns.Close()
		where := valueIn(t, e, ns, "x = 1\n"+whereAmI).([]any)
		for i := 2; i <= 4; i++ {
			valueIn(t, e, ns, fmt.Sprintf("x = %d", i))
		}
		_, err := ns.Get("x") // (answered once the run's snapshot is made)
		require.NoError(t, err)
		before = guardianHasSignalfd(t, where[0].(string))
		_, err = runIn(t, e, ns, "x = 5\nimport os, signal; os.kill(os.getpid(), signal.SIGKILL)")
		require.Error(t, err)
		assert.Equal(t, int64(4), valueIn(t, e, ns, "x"), "rolled back to the snapshot the guardian was told of in C")
		valueIn(t, e, ns, "x = 6")
		assert.Equal(t, int64(6), valueIn(t, e, ns, "x"))
		return before, guardianHasSignalfd(t, where[0].(string))
	}
	before, after := signalfd(false)
	assert.True(t, before, "the guardian in C")
	assert.False(t, after, "the guardian in Python once the worker died")
	before, after = signalfd(true)
	assert.False(t, before || after, "(a sandbox made in Python has its guardian in Python)")
}

// The template prepares the runtime for its workers (runtime.py's prepare), but the kick
// handler is the worker's alone: a sandbox's pid 1 with a handler would take the kick
// signal from the sandbox's code (pid 1 ignores only signals it has no handler for), and
// its Python would run the worker's kick handler. The code sends it the kick anyway.
func TestOnlyTheWorkerCatchesTheKick(t *testing.T) {
	const kick = 40
	code := fmt.Sprintf(`import os
def caught(pid):
    for line in open("/proc/%%s/status" %% pid):
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16) >> (%d - 1) & 1
os.kill(1, %d)
[caught(1), caught("self"), os.getppid()]`, kick, kick)
	for _, osFork := range []bool{false, true} {
		e := newIsolatedForking(t, minipy.IsolatedConfig{KickSignal: kick}, osFork)
		ns := e.NewNamespace()
		got := valueIn(t, e, ns, code).([]any)
		assert.Equal(t, []any{int64(0), int64(1), int64(1)}, got, "osFork %v: pid 1 and the worker's handlers", osFork)
		assert.Equal(t, int64(1), valueIn(t, e, ns, "os.getppid()"), "the guardian lives on")
		res, err := e.Run(context.Background(), "import time; time.sleep(30)", &minipy.Options{Globals: ns, Timeout: 200 * time.Millisecond})
		var stopped *minipy.InterruptedError
		require.ErrorAs(t, err, &stopped, "%+v", res)
		assert.ErrorIs(t, err, minipy.ErrTimeout)
		assert.NotErrorIs(t, err, minipy.ErrStateLost, "stopped by the kick, not killed")
		assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"))
		ns.Close()
	}
}

// A worker forked from the template has its deadman (worker.py's _Deadman, whose ctypes
// objects the template makes once): a POSIX timer that sends SIGKILL on the monotonic clock.
// So does a snapshot once it takes over (timers are not inherited by a fork).
func TestWorkersHaveADeadman(t *testing.T) {
	const timers = `open("/proc/self/timers").read()`
	for _, osFork := range []bool{false, true} {
		e := newIsolatedForking(t, minipy.IsolatedConfig{}, osFork)
		ns := e.NewNamespace()
		for _, when := range []string{"first", "after a rollback"} {
			got := valueIn(t, e, ns, timers).(string)
			assert.Contains(t, got, "signal: 9/", "osFork %v, %s", osFork, when)
			assert.Contains(t, got, "ClockID: 1", "osFork %v, %s", osFork, when)
			valueIn(t, e, ns, "x = 1")
			_, err := ns.Get("x") // (answered once the run's snapshot is made)
			require.NoError(t, err)
			_, err = runIn(t, e, ns, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
			require.Error(t, err)
			assert.Equal(t, int64(1), valueIn(t, e, ns, "x"), "rolled back")
		}
		ns.Close()
	}
}

// guardianHasSignalfd says whether pid namespace pidNS's pid 1 holds a signalfd.
func guardianHasSignalfd(t *testing.T, pidNS string) bool {
	t.Helper()
	for pid, inner := range nsProcs(t, pidNS) {
		if inner != 1 {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		require.NoError(t, err)
		for _, fd := range fds {
			if link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); link == "anon_inode:[signalfd]" {
				return true
			}
		}
		return false
	}
	t.Fatalf("no pid 1 in %s", pidNS)
	return false
}

// Workers of one engine (forked from one template by default) are in namespaces of their
// own, each kind; one's /proc, /tmp, /dev/shm, abstract sockets and Processes count are
// not another's.
// A sandbox's boot id is its own: the host's would tell code in two users' sandboxes that
// they share a kernel (and when it booted), and a new sandbox process is a new boot for
// what runs in it (E2B's SDK reads a changed boot id as a cold boot). Its processes see
// the same one; the code can neither write it nor take the bind away.
func TestSandboxBootIDIsItsOwn(t *testing.T) {
	host, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	e := newIsolated(t, minipy.IsolatedConfig{})
	a, b := e.NewNamespace(), e.NewNamespace()
	probe := `import ctypes, errno, subprocess
libc = ctypes.CDLL(None, use_errno=True)
own = open("/proc/sys/kernel/random/boot_id").read()
try:
    open("/proc/sys/kernel/random/boot_id", "w").write("0" * 36)
    wrote = "written"
except OSError as e:
    wrote = errno.errorcode[e.errno]
gone = libc.umount2(b"/proc/sys/kernel/random/boot_id", 2) == 0
(own, subprocess.run(["cat", "/proc/sys/kernel/random/boot_id"], capture_output=True, text=True).stdout,
 wrote, gone, open("/proc/sys/kernel/random/boot_id").read())`
	va, vb := valueIn(t, e, a, probe).([]any), valueIn(t, e, b, probe).([]any)
	require.Len(t, va, 5)
	idA := va[0].(string)
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$`, idA, "a random UUID, as the kernel's")
	assert.NotEqual(t, string(host), idA, "not the host's")
	assert.Equal(t, idA, va[1], "the sandbox's commands see the same one")
	assert.Contains(t, []string{"EROFS", "EACCES", "EPERM"}, va[2], "read-only")
	assert.Equal(t, false, va[3], "the bind stays")
	assert.Equal(t, idA, va[4])
	assert.NotEqual(t, idA, vb[0], "another sandbox's is another")
	assert.Equal(t, idA, valueIn(t, e, a, `open("/proc/sys/kernel/random/boot_id").read()`), "it lasts as the sandbox does")
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

func TestSandboxTenantsAreApart(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Processes: 24})
	a, b := e.NewNamespace(), e.NewNamespace()
	marker := sleepMarker()
	ids := `import os
{k: os.readlink("/proc/self/ns/" + k) for k in ("user", "pid", "mnt", "net", "ipc", "uts")}`
	na, nb := valueIn(t, e, a, ids).(map[string]any), valueIn(t, e, b, ids).(map[string]any)
	for k := range na {
		assert.NotEqual(t, na[k], nb[k], "a %s namespace each", k)
	}
	_, err := runIn(t, e, a, fmt.Sprintf(`import socket, subprocess, sys
open("/tmp/a.txt", "w").write("a")
open("/dev/shm/a", "w").write("a")
S = socket.socket(socket.AF_UNIX)
S.bind("\0minipy-tenant")
P = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", %q])
# a's processes up to its limit: forks fail in a
import os, time
kids, refused = [], False
for i in range(40):
    try:
        kids.append(subprocess.Popen(["sleep", "300"]))
    except OSError:
        refused = True
        break`, marker))
	require.NoError(t, err)
	assert.Equal(t, true, valueIn(t, e, a, "refused"), "a reached its Processes limit")
	assert.Equal(t, []any{false, false, false, true}, valueIn(t, e, b, fmt.Sprintf(`import os, socket, subprocess
seen = any(%q in open("/proc/%%s/cmdline" %% p).read() for p in os.listdir("/proc") if p.isdigit())
s = socket.socket(socket.AF_UNIX)
s.bind("\0minipy-tenant")  # free in b's network namespace
(os.path.exists("/tmp/a.txt"), os.path.exists("/dev/shm/a"), seen,
 subprocess.run(["true"]).returncode == 0)`, marker)), "b sees nothing of a, and a's processes do not count against b")
	valueIn(t, e, a, "for k in kids: k.kill()\nfor k in kids: k.wait()\nNone")
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

// A sandboxed worker runs site (its .pth files, sitecustomize) inside its sandbox, as its
// user: code that can write to a venv (a writable Mount of it) must not get to run with the
// host's access at the next worker's start.
func TestSandboxSiteRunsInside(t *testing.T) {
	venv := filepath.Join(sandboxReadableDir(t), "venv")
	out, err := exec.Command(minipy.LinkedPython(), "-m", "venv", "--without-pip", venv).CombinedOutput()
	require.NoError(t, err, string(out))
	site, err := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages"))
	require.NoError(t, err)
	require.Len(t, site, 1)
	require.NoError(t, os.MkdirAll(filepath.Join(site[0], "extra"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(site[0], "extra", "from_pth.py"), []byte("X = 1\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(site[0], "minipy_test.pth"), []byte(
		"extra\nimport builtins, os; builtins.minipy_pth = (os.getuid(), os.path.isdir('/namespaces'))\n"), 0o644))
	for _, noTemplate := range []bool{false, true} {
		e := newIsolated(t, minipy.IsolatedConfig{Python: filepath.Join(venv, "bin", "python"), NoTemplate: noTemplate})
		r, err := e.Minipy("import sys, from_pth; minipy_pth, sys.prefix, from_pth.X", nil)
		require.NoError(t, err)
		assert.Equal(t, []any{[]any{int64(1000), true}, venv, int64(1)}, r.Value,
			"NoTemplate=%v: the .pth ran in the sandbox as its user, and its path line counts", noTemplate)
	}
}

// PYTHONPATH (IsolatedConfig.Env) reaches the code, but nothing is imported from it before
// the sandbox exists: it may be a directory the code can write to.
func TestSandboxPythonPathRunsInside(t *testing.T) {
	lib, marks := sandboxReadableDir(t), sandboxReadableDir(t)
	require.NoError(t, os.Chmod(marks, 0o777))
	require.NoError(t, os.WriteFile(filepath.Join(lib, "mylib.py"), []byte("X = 7\n"), 0o644))
	for _, name := range []string{"struct", "signal", "threading", "encodings"} {
		require.NoError(t, os.WriteFile(filepath.Join(lib, name+".py"), []byte(fmt.Sprintf(
			"open(%q + '/' + __name__, 'w').write('ran')\n", marks)), 0o644))
	}
	for _, noTemplate := range []bool{false, true} {
		e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: noTemplate, Env: []string{"PYTHONPATH=" + lib}})
		r, err := e.Minipy("import os, sys, mylib; mylib.X, os.environ['PYTHONPATH'], sys.path.index(os.environ['PYTHONPATH'])", nil)
		require.NoError(t, err)
		assert.Equal(t, []any{int64(7), lib, int64(1)}, r.Value, "NoTemplate=%v", noTemplate)
		found, err := os.ReadDir(marks)
		require.NoError(t, err)
		assert.Empty(t, found, "NoTemplate=%v: nothing of PYTHONPATH ran outside the sandbox", noTemplate)
	}
}
