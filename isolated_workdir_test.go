package minipy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// Every namespace has a working directory of its own: namespaces with a worker of their
// own (the default) see nothing of each other's files, by any path.
func TestWorkDirPerNamespace(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	a, b := e.NewNamespace(), e.NewNamespace()
	defer b.Close()
	assert.Equal(t, []any{"/work", "/work"}, valueIn(t, e, a, `import os
os.makedirs("sub/deeper")
open("tenant_a.txt", "w").write("a-secret")
open("sub/deeper/nested.txt", "w").write("a-nested")
open("/tmp/tmp_a.txt", "w").write("a-tmp")
os.getcwd(), os.environ["HOME"]`))
	require.NotEqual(t, a.WorkDir(), b.WorkDir())
	got, err := os.ReadFile(filepath.Join(a.WorkDir(), "sub", "deeper", "nested.txt"))
	require.NoError(t, err, "the host reads what the code wrote")
	assert.Equal(t, "a-nested", string(got))

	// B looks everywhere it could: its directory, its tree, /tmp, every process's cwd and root.
	seen := valueIn(t, e, b, `import glob, os
found = []
for pattern in ("**", "/work/**", "/namespaces/**", "/tmp/**", "/*", "/*/*"):
    found += glob.glob(pattern, recursive=True)
for d in glob.glob("/proc/[0-9]*/cwd") + glob.glob("/proc/[0-9]*/root/work"):
    try:
        found += [os.path.join(d, f) for f in os.listdir(d)]
    except OSError:
        pass
sorted(set(p for p in found if "tenant_a" in p or "nested" in p or "tmp_a" in p))`)
	assert.Empty(t, seen, "B finds none of A's files")

	require.NoError(t, os.WriteFile(filepath.Join(b.WorkDir(), "input.csv"), []byte("x,y\n"), 0o644))
	assert.Equal(t, "x,y\n", valueIn(t, e, b, "open('input.csv').read()"), "files the host puts there are B's")
	assert.Equal(t, false, valueIn(t, e, a, "import os; os.path.exists('input.csv')"), "and not A's")

	// The engine's own WorkDir is the default namespace's.
	_, err = e.Minipy("open('default.txt', 'w').write('d')", nil)
	require.NoError(t, err)
	assert.FileExists(t, filepath.Join(e.WorkDir(), "default.txt"))
	assert.NoFileExists(t, filepath.Join(a.WorkDir(), "default.txt"))

	dir := minipy.HostWorkDir(a) // (WorkDir is the host's fd of its tmpfs, which Close closes)
	require.NoError(t, a.Close())
	assert.NoDirExists(t, dir, "Close removes the namespace's working directory")
	st, err := os.Stat(b.WorkDir()) // (a link in /proc to its tmpfs: Lstat sees the link)
	require.NoError(t, err, "and no other")
	assert.True(t, st.IsDir())
	assert.Equal(t, "x,y\n", valueIn(t, e, b, "open('input.csv').read()"))
}

// Files outlive the worker: a crash costs the variables (or, rolled back, only the run's),
// not the working directory.
func TestWorkDirSurvivesALostWorker(t *testing.T) {
	for _, cfg := range []minipy.IsolatedConfig{{}, {NoRollback: true}} {
		t.Run(fmt.Sprintf("NoRollback=%v", cfg.NoRollback), func(t *testing.T) {
			e := newIsolated(t, cfg)
			ns := e.NewNamespace()
			defer ns.Close()
			valueIn(t, e, ns, "open('kept.txt', 'w').write('kept')")
			_, err := runIn(t, e, ns, "import os; os._exit(3)")
			var lost *minipy.WorkerLostError
			require.ErrorAs(t, err, &lost)
			assert.Equal(t, "kept", valueIn(t, e, ns, "open('kept.txt').read()"))
		})
	}
}

// Namespaces packed into shared workers (IsolatedConfig.Workers) have distinct directories
// too, and each keeps its own current directory between its runs.
func TestWorkDirPacked(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Workers: 1})
	a, b := e.NewNamespace(), e.NewNamespace()
	defer b.Close()
	cwdA := valueIn(t, e, a, "import os; os.makedirs('sub'); open('a.txt', 'w').write('a'); os.getcwd()")
	assert.Equal(t, "/namespaces/"+filepath.Base(minipy.HostWorkDir(a)), cwdA)
	assert.FileExists(t, filepath.Join(a.WorkDir(), "a.txt"))
	assert.Equal(t, []any{}, valueIn(t, e, b, "import os; os.listdir('.')"), "B's directory is its own")
	valueIn(t, e, a, "%cd sub")
	assert.Equal(t, "/namespaces/"+filepath.Base(minipy.HostWorkDir(b)), valueIn(t, e, b, "import os; os.getcwd()"))
	r, err := e.Minipy("import os; os.getcwd(), os.environ['HOME']", nil)
	require.NoError(t, err)
	assert.Equal(t, []any{"/work", "/work"}, r.Value, "the default namespace's is /work")
	assert.Equal(t, []any{cwdA.(string) + "/sub", cwdA}, valueIn(t, e, a, "import os; os.getcwd(), os.environ['HOME']"),
		"A is still where %cd took it; HOME is its root")
	dir := minipy.HostWorkDir(a)
	require.NoError(t, a.Close())
	assert.NoDirExists(t, dir)
	assert.Equal(t, "/namespaces/"+filepath.Base(minipy.HostWorkDir(b)), valueIn(t, e, b, "import os; os.getcwd()"))
}

// A Fork copy gets a copy of the files, then each has its own; symlinks are copied as
// links, never followed.
func TestWorkDirFork(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, `import os
os.makedirs("data/raw")
open("data/raw/f.txt", "w").write("original")
os.symlink("/etc/hostname", "link")
os.mkfifo("pipe")
os.chdir("data")`)
	c, err := ns.Fork()
	require.NoError(t, err)
	root := "/namespaces/" + filepath.Base(minipy.HostWorkDir(c))
	assert.Equal(t, []any{root + "/data", root, "original", true, "/etc/hostname", false},
		valueIn(t, e, c, `import os
(os.getcwd(), os.environ["HOME"], open("raw/f.txt").read(), os.path.islink("../link"), os.readlink("../link"),
 os.path.exists("../pipe"))`), "the copy works in its own directory, from the same place; FIFOs are left out")
	valueIn(t, e, c, "open('raw/f.txt', 'w').write('copy')")
	assert.Equal(t, "original", valueIn(t, e, ns, "open('raw/f.txt').read()"), "the copy's writes stay its own")
	valueIn(t, e, ns, "open('raw/g.txt', 'w').write('later')")
	assert.Equal(t, false, valueIn(t, e, c, "import os; os.path.exists('raw/g.txt')"), "and the source's its own")
	got, err := os.ReadFile(filepath.Join(c.WorkDir(), "data", "raw", "f.txt"))
	require.NoError(t, err)
	assert.Equal(t, "copy", string(got))

	dir := minipy.HostWorkDir(ns)
	require.NoError(t, ns.Close())
	assert.NoDirExists(t, dir)
	assert.Equal(t, "copy", valueIn(t, e, c, "open('raw/f.txt').read()"), "closing the source leaves the copy's files")
	dir = minipy.HostWorkDir(c)
	require.NoError(t, c.Close())
	assert.NoDirExists(t, dir)
}

// Without the sandbox, each namespace's working directory is its host directory.
func TestWorkDirUnsandboxed(t *testing.T) {
	e, err := minipy.NewIsolatedActingUnsandboxed(minipy.IsolatedConfig{AllowUnsandboxed: true})
	require.NoError(t, err)
	defer e.Close()
	a, b := e.NewNamespace(), e.NewNamespace()
	defer a.Close()
	defer b.Close()
	assert.Equal(t, a.WorkDir(), valueIn(t, e, a, "import os; open('a.txt', 'w').write('a'); os.getcwd()"))
	assert.Equal(t, []any{b.WorkDir(), false}, valueIn(t, e, b, "import os; os.getcwd(), os.path.exists('a.txt')"))
	c, err := a.Fork()
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, []any{c.WorkDir(), "a"}, valueIn(t, e, c, "import os; os.getcwd(), open('a.txt').read()"))
}

// The code cannot add to the tree of working directories (it could otherwise take the name
// of the next namespace's), and what it leaves there never leads the host out.
func TestWorkDirTreeIsTheHosts(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	got := valueIn(t, e, ns, `import os
def try_(f, *a):
    try:
        f(*a)
        return "ok"
    except OSError as e:
        return e.errno
(try_(os.mkdir, "/namespaces/999"), try_(os.symlink, "/etc", "/namespaces/998"), sorted(os.listdir("/namespaces")))`)
	if os.Geteuid() == 0 { // the workers run as nobody; a non-root host's workers are its own user
		assert.Equal(t, []any{int64(13), int64(13), []any{"work"}}, got, "EACCES: the tree is the host's")
	}
	// A symlink that the code leaves where a Fork copy's directory goes is replaced, not followed.
	outside := sandboxReadableDir(t)
	require.NoError(t, os.Chmod(outside, 0o777))
	tree := filepath.Dir(minipy.HostWorkDir(ns))
	for i := 1; i < 50; i++ { // the next namespace ids
		os.Symlink(outside, filepath.Join(tree, strconv.Itoa(i))) //nolint:errcheck // some ids are taken
	}
	c, err := ns.Fork()
	require.NoError(t, err)
	defer c.Close()
	valueIn(t, e, c, "open('mine.txt', 'w').write('x')")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "the copy's directory is a fresh one")
	assert.FileExists(t, filepath.Join(c.WorkDir(), "mine.txt"))
}

// A replacement worker never binds a working directory that has become a symlink (the code
// of a non-root host's workers could make one in its tree): it fails to start instead.
func TestWorkDirSymlinkNotFollowed(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "1")
	outside := sandboxReadableDir(t)
	require.NoError(t, os.Chmod(outside, 0o777))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "host-secret.txt"), []byte("s3cret"), 0o644))
	require.NoError(t, os.RemoveAll(minipy.HostWorkDir(ns)))
	require.NoError(t, os.Symlink(outside, minipy.HostWorkDir(ns)))
	_, err := runIn(t, e, ns, "import os; os._exit(1)")
	require.ErrorIs(t, err, minipy.ErrStateLost)
	r, err := runIn(t, e, ns, "import os; os.listdir('.')")
	if err == nil {
		assert.NotContains(t, r.Value, "host-secret.txt", "the symlink was followed")
	}
	assert.Error(t, err, "the replacement worker must not start on a symlinked working directory")
}

// Mounts under /work appear in every namespace's working directory.
func TestWorkDirMounts(t *testing.T) {
	in := sandboxReadableDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(in, "data.txt"), []byte("input"), 0o644))
	e := newIsolated(t, minipy.IsolatedConfig{Mounts: []minipy.Mount{{Source: in, Target: "/work/inputs"}}})
	for range 2 {
		ns := e.NewNamespace()
		assert.Equal(t, "input", valueIn(t, e, ns, "open('inputs/data.txt').read()"))
		c, err := ns.Fork()
		require.NoError(t, err)
		assert.Equal(t, []any{"input", false}, valueIn(t, e, c, `import os
open("/work/inputs/data.txt").read(), os.path.exists("inputs/data.txt")`),
			"a Fork copy reads a mount at its path; its directory holds no copy of it")
		c.Close()
		ns.Close()
	}
	_, err := minipy.NewIsolated(minipy.IsolatedConfig{Mounts: []minipy.Mount{{Source: in, Target: "/namespaces/x"}}})
	assert.Error(t, err, "the sandbox makes /namespaces itself")
}

// The same promises with each worker started as a process of its own.
func TestWorkDirWithoutTemplate(t *testing.T) {
	withoutTemplate = true
	defer func() { withoutTemplate = false }()
	for _, test := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"PerNamespace", TestWorkDirPerNamespace},
		{"Packed", TestWorkDirPacked},
		{"Fork", TestWorkDirFork},
		{"TreeIsTheHosts", TestWorkDirTreeIsTheHosts},
		{"Mounts", TestWorkDirMounts},
		{"SymlinkNotFollowed", TestWorkDirSymlinkNotFollowed},
	} {
		t.Run(test.name, test.fn)
	}
}

// Stats counts the namespaces, workers and processes, and their memory.
func TestIsolatedStats(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	var spaces []*minipy.Namespace
	for range 3 {
		ns := e.NewNamespace()
		valueIn(t, e, ns, "x = list(range(100000))")
		spaces = append(spaces, ns)
	}
	st := e.Stats()
	assert.Equal(t, 3, st.Namespaces)
	assert.GreaterOrEqual(t, st.Workers, 4, "three namespaces and the spare (and the default namespace's)")
	assert.Greater(t, st.Processes, st.Workers, "a guardian and a rollback snapshot besides each worker")
	assert.Greater(t, st.MemoryBytes, int64(5<<20))
	assert.GreaterOrEqual(t, st.Starts, uint64(4))
	assert.Zero(t, st.StartFailures)
	assert.NoError(t, st.StartError)

	c, err := spaces[0].Fork()
	require.NoError(t, err)
	assert.Equal(t, 4, e.Stats().Namespaces, "a Fork copy is a namespace")
	for _, ns := range append(spaces, c) {
		require.NoError(t, ns.Close())
		require.NoError(t, ns.Close(), "twice is no error and counts once")
	}
	st = e.Stats()
	assert.Zero(t, st.Namespaces)
	assert.Equal(t, st.Workers, 1+st.Spares, "the spares and the default namespace's are left")
	assert.LessOrEqual(t, st.Spares, 3, "a spare for each NewNamespace of the last 10 s")
	require.NoError(t, e.Close())
	assert.Zero(t, e.Stats().Processes)
}

// Ready tells whether a new namespace would get a worker, and sees the engine recover.
func TestIsolatedReady(t *testing.T) {
	dir := sandboxReadableDir(t)
	python := filepath.Join(dir, "python3")
	require.NoError(t, os.Symlink(minipy.LinkedPython(), python))
	e := newIsolated(t, minipy.IsolatedConfig{Python: python, NoTemplate: true})
	ctx := context.Background()
	require.NoError(t, e.Ready(ctx))

	require.NoError(t, os.Remove(python)) // workers cannot start now
	ns := e.NewNamespace()
	defer ns.Close()
	_, err := runIn(t, e, ns, "1")
	require.Error(t, err)
	assert.Error(t, e.Stats().StartError)
	assert.Error(t, e.Ready(ctx))

	require.NoError(t, os.Symlink(minipy.LinkedPython(), python))
	assert.NoError(t, e.Ready(ctx), "a successful start clears it")
	assert.NoError(t, e.Stats().StartError)
	assert.Positive(t, e.Stats().StartFailures)
	require.NoError(t, e.Close())
	assert.ErrorIs(t, e.Ready(ctx), minipy.ErrEngineClosed)
}

// A Close while another is in progress returns once the engine is closed: its directories
// are gone (a server that exits after either must leave nothing behind).
func TestIsolatedCloseWaitsForAnotherClose(t *testing.T) {
	e, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	require.NoError(t, err)
	ns := e.NewNamespace()
	valueIn(t, e, ns, "open('f.txt', 'w').write('x')")
	dir := filepath.Dir(filepath.Dir(minipy.HostTreeDir(ns)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Close()
	}()
	require.Eventually(t, func() bool { return errors.Is(e.Ready(context.Background()), minipy.ErrEngineClosed) },
		10*time.Second, time.Millisecond, "the first Close has begun")
	require.NoError(t, e.Close())
	assert.NoDirExists(t, dir, "the second Close returned before the directories were removed")
	<-done
}

// IsolatedConfig.WorkDirPath moves the working directory where the code sees it (E2B's
// /home/user): its cwd, HOME and passwd home; the host's file methods reach the same files.
// Paths in what the sandbox makes itself are refused.
func TestWorkDirPath(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{WorkDirPath: "/home/user/"})
	ns := e.NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.WriteFile("data.csv", []byte("a,b\n")))
	assert.Equal(t, []any{"/home/user", "/home/user", "/home/user", "a,b\n", false}, valueIn(t, e, ns, `import os, pwd
open("/home/user/out.txt", "w").write("from code")
(os.getcwd(), os.environ["HOME"], pwd.getpwuid(os.getuid()).pw_dir, open("/home/user/data.csv").read(),
 os.path.exists("/work"))`))
	got, err := ns.ReadFile("out.txt")
	require.NoError(t, err)
	assert.Equal(t, "from code", string(got))

	for _, bad := range []string{"work", "/", "/tmp/w", "/proc", "/etc/x", "/usr/local/w", "/namespaces/x", "/dev/shm/w", "/a\nb"} {
		_, err := minipy.NewIsolated(minipy.IsolatedConfig{WorkDirPath: bad})
		assert.Error(t, err, bad)
	}
}
