package minipy_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a root host, sandboxed workers set their sandbox up as root of a user namespace of their
// own (mapped to the host's root), then become the unprivileged sandbox user (nobody on the
// host) before they build it: a Mount or a venv under a private directory of root's works,
// and the code still runs with no privilege at all.

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("runs only as root (this test runs as uid %d): it checks what sandboxed workers of a root host "+
			"reach while they set their sandbox up, and that they keep nothing of root", os.Geteuid())
	}
}

// engineModes are the two ways a sandboxed worker starts: forked from the template, or a
// process of its own.
var engineModes = []struct {
	name       string
	noTemplate bool
}{{"Template", false}, {"NoTemplate", true}}

func TestSandboxRootPrivateMounts(t *testing.T) {
	needRoot(t)
	private := t.TempDir()
	info, err := os.Stat(filepath.Dir(private))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o700), info.Mode().Perm(), "t.TempDir's directories are in a private one of root's")
	data := filepath.Join(private, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(data, "in.txt"), []byte("input"), 0o644))
	file := filepath.Join(private, "single.txt")
	require.NoError(t, os.WriteFile(file, []byte("one file"), 0o644))
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			mark := fmt.Sprintf("MINIPY_IDMAP_TEST=%d.%d", os.Getpid(), time.Now().UnixNano())
			e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate, Env: []string{mark}, Mounts: []minipy.Mount{
				{Source: data, Target: "/data"},
				{Source: data}, // at its own path, under the private directory
				{Source: file, Target: "/work/inputs/single.txt"},
			}})
			r, err := e.Minipy(fmt.Sprintf(`import os
(open("/data/in.txt").read(), sorted(os.listdir(%q)), open("inputs/single.txt").read(), os.getuid())`, data), nil)
			require.NoError(t, err)
			assert.Equal(t, []any{"input", []any{"in.txt"}, "one file", int64(1000)}, r.Value,
				"a Mount under a private directory of root's is bound, and read by the sandbox's user")
		})
	}
}

func TestSandboxRootPrivateVenv(t *testing.T) {
	needRoot(t)
	venv := filepath.Join(t.TempDir(), "venv") // under a 0700 directory of root's, and under /tmp
	out, err := exec.Command(minipy.LinkedPython(), "-m", "venv", "--without-pip", venv).CombinedOutput()
	require.NoError(t, err, string(out))
	site, err := filepath.Glob(filepath.Join(venv, "lib", "python3.*", "site-packages"))
	require.NoError(t, err)
	require.Len(t, site, 1)
	require.NoError(t, os.WriteFile(filepath.Join(site[0], "venvonly.py"), []byte("WHERE = 'venv'\n"), 0o644))
	python := filepath.Join(venv, "bin", "python")
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate, Python: python})
			r, err := e.Minipy("import os, sys, venvonly; sys.prefix, sys.executable, venvonly.WHERE, os.getuid()", nil)
			require.NoError(t, err)
			assert.Equal(t, []any{venv, python, "venv", int64(1000)}, r.Value,
				"the venv's python runs, its site-packages are bound, the code runs as the sandbox's user")
		})
	}
}

// The workers of a root host keep nothing of root: inside, the code is uid 1000 with no
// capability (as before the setup ran as root); on the host, every worker process (the
// template, guardians, workers, snapshots) is nobody; the template holds CAP_SYS_ADMIN of
// its own user namespace only, as always.
func TestSandboxRootWorkersAreNobody(t *testing.T) {
	needRoot(t)
	private := t.TempDir()
	shared := filepath.Join(private, "shared")
	require.NoError(t, os.Mkdir(shared, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(shared, "secret.txt"), []byte("s3cret"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(shared, "open.txt"), []byte("open"), 0o644))
	// root's 0755: a Writable mount that the sandbox's user writes as its owner, through an
	// idmapped mount that maps root alone: a directory of another user's in it stays theirs.
	out := filepath.Join(private, "out")
	require.NoError(t, os.Mkdir(out, 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(out, "theirs"), 0o755))
	require.NoError(t, os.Chown(filepath.Join(out, "theirs"), 54321, 54321))
	lastCap, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	require.NoError(t, err)
	var last int
	_, err = fmt.Sscan(string(lastCap), &last)
	require.NoError(t, err)
	bounding := fmt.Sprintf("%016x", uint64(1)<<(last+1)-1) // a new user namespace's: every capability
	code := `import errno, os
def try_(f):
    try:
        return f()
    except OSError as e:
        return e.errno
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
([os.getuid(), os.geteuid(), os.getgid(), os.getegid()], os.getresuid(), os.getgroups(),
 [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd", "NoNewPrivs", "Seccomp")],
 try_(lambda: open("/shared/secret.txt").read()), open("/shared/open.txt").read(),
 try_(lambda: open("/shared/new.txt", "w").close()), try_(lambda: open("/out/new.txt", "w").close()),
 try_(lambda: open("/out/theirs/new.txt", "w").close()),
 try_(lambda: os.setuid(0)) in (errno.EPERM, errno.EINVAL), try_(lambda: os.chown("/work", 0, 0)) in (errno.EPERM, errno.EINVAL))`
	none := "0000000000000000"
	eacces, erofs := int64(13), int64(30)
	want := []any{
		[]any{int64(1000), int64(1000), int64(1000), int64(1000)}, []any{int64(1000), int64(1000), int64(1000)}, []any{},
		[]any{none, none, none, none, bounding, "1", "2"},
		eacces, "open", erofs, nil, eacces, true, true,
	}
	// (One spare, Spares 1: sampled once it is up, no sandbox is still being made.)
	for _, cfg := range []minipy.IsolatedConfig{{Spares: 1}, {NoTemplate: true, Spares: 1}, {Workers: 2},
		{Workers: 2, NoTemplate: true}} {
		t.Run(fmt.Sprintf("Workers%d/NoTemplate=%v", cfg.Workers, cfg.NoTemplate), func(t *testing.T) {
			mark := fmt.Sprintf("MINIPY_ROOT_TEST=%d.%d", os.Getpid(), time.Now().UnixNano())
			cfg.Env = []string{mark}
			cfg.Mounts = []minipy.Mount{{Source: shared, Target: "/shared"}, {Source: out, Target: "/out", Writable: true}}
			e := newIsolated(t, cfg)
			// Two namespaces: with Workers: 2 one on each worker.
			for _, ns := range []*minipy.Namespace{nil, e.NewNamespace()} {
				r, err := e.Run(context.Background(), code, &minipy.Options{Globals: ns})
				require.NoError(t, err)
				assert.Equal(t, want, r.Value, "uid 1000, no group, no capability, no_new_privs, seccomp; "+
					"root's 0600 file unreadable, a read-only mount read-only, root's Writable mount written as its owner "+
					"but another user's directory in it unwritable, no way back to root "+
					"(EPERM, or EINVAL where the namespace has no uid 0)")
			}
			// The host's view: this engine's processes (the ones with mark in their
			// environment) are all nobody, once none is starting.
			var procs []int
			require.Eventually(t, func() bool {
				procs = processesWith(t, mark)
				for _, pid := range procs {
					if statusField(t, pid, "Uid") != "65534\t65534\t65534\t65534" ||
						statusField(t, pid, "Gid") != "65534\t65534\t65534\t65534" || statusField(t, pid, "Groups") != "" {
						return false
					}
				}
				return len(procs) >= 2
			}, 10*time.Second, 20*time.Millisecond, "every worker process is nobody on the host")
			if cfg.Workers == 0 {
				// The second NewNamespace started the spare's replacement: sampled while it
				// starts, its processes hold the capabilities of the namespaces they are making.
				require.Eventually(t, func() bool { return minipy.SpareStarted(e) }, 60*time.Second, 10*time.Millisecond)
				procs = processesWith(t, mark)
			}
			template := minipy.TemplatePID(e)
			assert.Equal(t, !cfg.NoTemplate, template != 0)
			for _, pid := range procs {
				caps := []string{statusField(t, pid, "CapInh"), statusField(t, pid, "CapPrm"), statusField(t, pid, "CapEff"),
					statusField(t, pid, "CapAmb")}
				if slices.Contains(caps, "") || statusField(t, pid, "State") == "Z (zombie)" {
					continue // gone since (a snapshot that was replaced, say)
				}
				if nspid := strings.Fields(statusField(t, pid, "NSpid")); len(nspid) == 1 && pid != template {
					// A fork of the template making a sandbox (a spare's, started by the second
					// NewNamespace), in the host's pid namespace: it holds every capability of the
					// user namespace it just made, runs no code, and exits once it has forked
					// the sandbox's pid 1.
					continue
				}
				if pid == template {
					sysAdmin := "0000000000200000"
					assert.Equal(t, []string{sysAdmin, sysAdmin, sysAdmin, sysAdmin}, caps,
						"the template keeps CAP_SYS_ADMIN (of its own user namespace), as before")
					continue
				}
				assert.Equal(t, []string{none, none, none, none}, caps, "process %d", pid)
			}
		})
	}
}

// A path the workers cannot reach even as root of their user namespace (a private directory
// of another user) is a permission error that names it, never the kernel's refusal: no
// fallback to an unsandboxed worker either.
func TestSandboxRootUnreachablePaths(t *testing.T) {
	needRoot(t)
	other := filepath.Join(t.TempDir(), "someone-else")
	require.NoError(t, os.Mkdir(other, 0o700))
	data := filepath.Join(other, "data")
	require.NoError(t, os.Mkdir(data, 0o755))
	python := filepath.Join(other, "python3")
	require.NoError(t, os.Symlink(minipy.LinkedPython(), python))
	require.NoError(t, os.Chown(other, 54321, 54321)) // a user the workers' namespace does not map
	for _, mode := range engineModes {
		for _, allow := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/AllowUnsandboxed=%v", mode.name, allow), func(t *testing.T) {
				for _, c := range []struct {
					cfg  minipy.IsolatedConfig
					path string
				}{
					{minipy.IsolatedConfig{Mounts: []minipy.Mount{{Source: data, Target: "/data"}}}, data},
					{minipy.IsolatedConfig{Python: python}, python},
				} {
					c.cfg.NoTemplate, c.cfg.AllowUnsandboxed = mode.noTemplate, allow
					e, err := minipy.NewIsolated(c.cfg)
					if e != nil {
						e.Close()
					}
					require.ErrorIs(t, err, minipy.ErrSandboxAccess, "%s", c.path)
					assert.ErrorIs(t, err, fs.ErrPermission)
					assert.NotErrorIs(t, err, minipy.ErrNoSandbox, "a permission problem is not the kernel's refusal")
					assert.Contains(t, err.Error(), c.path, "the error names the path")
				}
			})
		}
	}
}

// statusField is the value of a field of /proc/PID/status ("" when the process is gone).
func statusField(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// processesWith lists the processes whose environment holds the entry kv.
func processesWith(t *testing.T, kv string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []int
	for _, d := range entries {
		var pid int
		if _, err := fmt.Sscan(d.Name(), &pid); err != nil {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && strings.Contains("\x00"+string(env), "\x00"+kv+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A Mount of a directory of root's that the sandbox's user (nobody on the host) could not
// use as the Mount says, a Writable t.TempDir() (0755) or a read-only os.MkdirTemp (0700),
// is an idmapped bind mount: inside, its owner is the sandbox's user, so the code writes the
// one and reads the other, and what it writes belongs to the directory's owner (root) on
// the host. Every worker gets it: the template's tenants, a process of its own
// (NoTemplate), a Fork copy's, the next one.
func TestSandboxRootIdmappedMounts(t *testing.T) {
	needRoot(t)
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			out, in, work := t.TempDir(), t.TempDir(), t.TempDir() // root's, 0755
			require.NoError(t, os.Chmod(in, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(in, "in.txt"), []byte("input"), 0o600))
			require.NoError(t, os.WriteFile(filepath.Join(out, "old.txt"), []byte("old"), 0o644))
			mark := fmt.Sprintf("MINIPY_IDMAP_TEST=%d.%d", os.Getpid(), time.Now().UnixNano())
			e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate, Env: []string{mark}, Mounts: []minipy.Mount{
				{Source: out, Target: "/out", Writable: true},
				{Source: in, Target: "/in"},
				{Source: work, Target: "/work/results", Writable: true},      // under the working directory
				{Source: filepath.Join(in, "in.txt"), Target: "/single.txt"}, // a file (0600)
			}})
			code := `import os
def try_(f):
    try:
        return f()
    except OSError as e:
        return e.errno
open("/out/result.txt", "w").write("result " + NAME)
os.makedirs("/out/sub/" + NAME)
open("/out/sub/%s/deep.txt" % NAME, "w").write("deep")
open("/work/results/%s.txt" % NAME, "w").write(NAME)
(os.getuid(), os.stat("/out").st_uid, open("/out/old.txt").read(), open("/in/in.txt").read() + open("/single.txt").read(),
 try_(lambda: open("/in/new.txt", "w")), try_(lambda: open("/in/in.txt", "a")), sorted(os.listdir("/out")))`
			erofs := int64(30)
			want := []any{int64(1000), int64(1000), "old", "inputinput", erofs, erofs, []any{"old.txt", "result.txt", "sub"}}
			ns := e.NewNamespace()
			r, err := e.Run(context.Background(), "NAME = 'first'\n"+code, &minipy.Options{Globals: ns})
			require.NoError(t, err)
			assert.Equal(t, want, r.Value, "the code writes /out as its owner; /in is read, and read-only")
			b, err := ns.Fork()
			require.NoError(t, err)
			r, err = e.Run(context.Background(), "NAME = 'fork'\n"+code, &minipy.Options{Globals: b})
			require.NoError(t, err)
			assert.Equal(t, want, r.Value, "a Fork copy's worker")
			r, err = e.Minipy("NAME = 'next'\n"+code, nil)
			require.NoError(t, err)
			assert.Equal(t, want, r.Value, "another worker")

			got, err := os.ReadFile(filepath.Join(out, "result.txt"))
			require.NoError(t, err)
			assert.Equal(t, "result next", string(got))
			for _, p := range []string{filepath.Join(out, "result.txt"), filepath.Join(out, "sub", "fork"),
				filepath.Join(out, "sub", "first", "deep.txt"), filepath.Join(work, "next.txt")} {
				info, err := os.Stat(p)
				require.NoError(t, err)
				st := info.Sys().(*syscall.Stat_t)
				assert.Equal(t, []uint32{0, 0}, []uint32{st.Uid, st.Gid}, "%s belongs to the directory's owner, root", p)
			}
			_, err = os.Stat(filepath.Join(in, "new.txt"))
			assert.ErrorIs(t, err, fs.ErrNotExist)

			// The mounts' fds, which the host passed to the template or worker, are closed
			// before any code runs: no process of the engine holds one. (A spare worker the
			// pool is starting meanwhile holds them until its sandbox is built, which a
			// loaded machine may take a while to finish: held fds must go, not be absent at
			// one instant.)
			sources := map[[2]uint64]string{}
			for _, dir := range []string{out, in, work, filepath.Join(in, "in.txt")} {
				info, err := os.Stat(dir)
				require.NoError(t, err)
				st := info.Sys().(*syscall.Stat_t)
				sources[[2]uint64{st.Dev, st.Ino}] = dir
			}
			procs := processesWith(t, mark)
			assert.GreaterOrEqual(t, len(procs), 4, "guardians and workers")
			var holding []string
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				holding = nil
				for _, pid := range processesWith(t, mark) {
					fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
					for _, fd := range fds {
						info, err := os.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
						if err != nil {
							continue
						}
						st := info.Sys().(*syscall.Stat_t)
						if dir, held := sources[[2]uint64{st.Dev, st.Ino}]; held {
							holding = append(holding, fmt.Sprintf("process %d holds fd %s on %s", pid, fd.Name(), dir))
						}
					}
				}
				if len(holding) == 0 || time.Now().After(deadline) {
					break
				}
				t.Logf("(waiting: %s)", holding[0])
			}
			assert.Empty(t, holding, "30 s on, processes of the engine still hold the mounts' fds")
			// (Collected, ns would be closed, and its working directory, where /work/results
			// is mounted for its Fork copy too, removed.)
			runtime.KeepAlive(ns)
			runtime.KeepAlive(b)
		})
	}
}

// Where the kernel refuses the idmapped mount that a Mount needs (its file system does not
// support them: ramfs, /proc, FUSE, tmpfs before Linux 6.3), NewIsolated fails with
// ErrSandboxAccess naming the path and the fix, rather than the code's first write; a Mount
// there that needs none works as before.
func TestSandboxRootIdmapRefused(t *testing.T) {
	needRoot(t)
	ramfs := filepath.Join(t.TempDir(), "ramfs")
	require.NoError(t, os.Mkdir(ramfs, 0o755))
	require.NoError(t, syscall.Mount("minipy-test", ramfs, "ramfs", 0, "mode=0755"))
	t.Cleanup(func() { syscall.Unmount(ramfs, syscall.MNT_DETACH) })
	private := filepath.Join(ramfs, "private")
	require.NoError(t, os.Mkdir(private, 0o700))
	open := filepath.Join(ramfs, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(open, "in.txt"), []byte("input"), 0o644))
	for _, mode := range engineModes {
		for _, allow := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/AllowUnsandboxed=%v", mode.name, allow), func(t *testing.T) {
				for _, m := range []minipy.Mount{
					{Source: ramfs, Target: "/out", Writable: true}, // root's 0755: nobody may not write it
					{Source: private, Target: "/in"},                // root's 0700: nobody may not read it
				} {
					e, err := minipy.NewIsolated(minipy.IsolatedConfig{NoTemplate: mode.noTemplate, AllowUnsandboxed: allow,
						Mounts: []minipy.Mount{m}})
					if e != nil {
						e.Close()
					}
					require.ErrorIs(t, err, minipy.ErrSandboxAccess, "%+v", m)
					assert.ErrorIs(t, err, fs.ErrPermission)
					assert.ErrorIs(t, err, syscall.EINVAL, "the kernel's answer: ramfs does not support idmapped mounts")
					assert.NotErrorIs(t, err, minipy.ErrNoSandbox)
					assert.Contains(t, err.Error(), m.Source, "the error names the path")
					assert.Contains(t, err.Error(), "uid 65534", "and the fix")
				}
				e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate, AllowUnsandboxed: allow,
					Mounts: []minipy.Mount{{Source: open, Target: "/in"}}})
				r, err := e.Minipy(`open("/in/in.txt").read()`, nil)
				require.NoError(t, err)
				assert.Equal(t, "input", r.Value, "a Mount that nobody may read needs no idmapped mount")
			})
		}
	}
}

// On an unprivileged host (nobody here) the workers are the host's user: its own Mounts work
// as they are, and one it may not use is refused as the engine starts.
func TestSandboxOwnMountsAsUser(t *testing.T) {
	out := rerunAsNobody(t, "^TestSandboxOwnMounts$")
	assert.Contains(t, out, "--- PASS: TestSandboxOwnMounts/NoTemplate")
}
