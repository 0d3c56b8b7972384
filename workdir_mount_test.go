package minipy_test

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// fillCode writes n KiB to name and reports how it ended: "ok", or the errno's name.
const fillCode = `
import errno
def fill(name, kib):
    try:
        with open(name, "wb") as f:
            for _ in range(kib):
                f.write(b"x" * 1024)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
`

// capacity is the size of the file system of the namespace's working directory, as the
// code sees it.
const capacity = "import os\nst = os.statvfs('.')\nst.f_blocks * st.f_frsize"

// A namespace's working directory holds at most WorkSize bytes: the code gets ENOSPC past
// it, and so does the host's WriteFile; nothing of it is on the host's disk, and the host
// reaches the files through the file methods and WorkDir.
func TestWorkSize(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 1 << 20})
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, int64(1<<20), valueIn(t, e, ns, capacity))
	assert.Equal(t, "ok", valueIn(t, e, ns, fillCode+"fill('small.bin', 100)"))
	assert.Equal(t, "ENOSPC", valueIn(t, e, ns, "fill('big.bin', 2048)"), "past the cap")
	assert.Equal(t, "ok", valueIn(t, e, ns, "import os; os.remove('big.bin'); fill('again.bin', 500)"),
		"removing a file frees its space")

	// The host's side.
	err := ns.WriteFile("host.bin", bytes.Repeat([]byte("y"), 1<<20))
	require.ErrorIs(t, err, syscall.ENOSPC)
	_, err = ns.ReadFile("host.bin")
	assert.ErrorIs(t, err, fs.ErrNotExist, "a write that failed leaves no file")
	require.NoError(t, ns.WriteFile("sub/note.txt", []byte("hi")))
	assert.Equal(t, "hi", valueIn(t, e, ns, "open('sub/note.txt').read()"))
	got, err := ns.ReadFile("small.bin")
	require.NoError(t, err)
	assert.Len(t, got, 100<<10)
	got, err = os.ReadFile(filepath.Join(ns.WorkDir(), "sub", "note.txt"))
	require.NoError(t, err, "WorkDir is a path to the files for this process")
	assert.Equal(t, "hi", string(got))
	infos, err := ns.ListFiles("")
	require.NoError(t, err)
	assert.Equal(t, []string{"again.bin", "small.bin", "sub"}, fileNames(infos))
	onDisk, err := os.ReadDir(minipy.HostTreeDir(ns))
	require.NoError(t, err)
	assert.Empty(t, onDisk, "the host's disk holds nothing, not even the working directory's mount point")

	r, err := runIn(t, e, ns, "fill('new.bin', 10)")
	require.NoError(t, err)
	assert.Equal(t, []string{"new.bin"}, fileNames(r.Files), "Result.Files sees the tmpfs")
}

// The default cap is 1 GiB, for every kind of namespace of a sandboxed engine with a
// template; a negative WorkSize and NoTemplate leave working directories on the host's disk.
func TestWorkSizeDefault(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	assert.Equal(t, int64(1<<30), valueIn(t, e, nil, capacity), "the default namespace")
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, int64(1<<30), valueIn(t, e, ns, capacity))
	assert.NotEqual(t, minipy.HostWorkDir(ns), ns.WorkDir())

	for name, cfg := range map[string]minipy.IsolatedConfig{
		"negative":    {WorkSize: -1},
		"no template": {NoTemplate: true, WorkSize: 1 << 20},
	} {
		e := newIsolated(t, cfg)
		ns := e.NewNamespace()
		assert.NotEqual(t, int64(1<<20), valueIn(t, e, ns, capacity), name)
		assert.NotEqual(t, int64(1<<30), valueIn(t, e, ns, capacity), name)
		assert.Equal(t, minipy.HostWorkDir(ns), ns.WorkDir(), name)
		assert.Zero(t, minipy.WorkMounts(e), name)
		require.NoError(t, ns.Close())
	}
}

// A Fork copy gets the files in a tmpfs of its own, capped alike; namespaces packed into a
// shared worker each have theirs, including those made after the worker started.
func TestWorkSizeForkAndPacked(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 1 << 20})
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, "ok", valueIn(t, e, ns, fillCode+"fill('half.bin', 600)"))
	cp, err := ns.Fork()
	require.NoError(t, err)
	defer cp.Close()
	assert.Equal(t, int64(1<<20), valueIn(t, e, cp, capacity))
	assert.Equal(t, int64(600<<10), valueIn(t, e, cp, "import os; os.path.getsize('half.bin')"))
	assert.Equal(t, "ENOSPC", valueIn(t, e, cp, "fill('more.bin', 600)"), "the copy's own cap")
	assert.Equal(t, "ok", valueIn(t, e, ns, "import os; os.remove('half.bin'); fill('more.bin', 600)"),
		"the source's is apart")

	packed := newIsolated(t, minipy.IsolatedConfig{Workers: 1, WorkSize: 1 << 20})
	a := packed.NewNamespace()
	assert.Equal(t, "ok", valueIn(t, packed, a, fillCode+"fill('a.bin', 600)"))
	b := packed.NewNamespace() // after the worker started
	assert.Equal(t, int64(1<<20), valueIn(t, packed, b, capacity))
	assert.Equal(t, "ok", valueIn(t, packed, b, fillCode+"fill('b.bin', 600)"))
	assert.Equal(t, "ENOSPC", valueIn(t, packed, b, "fill('c.bin', 600)"))
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

// Closing a namespace lets go of its tmpfs: the host closes its fd and the template's
// mount is gone.
func TestWorkSizeClose(t *testing.T) {
	// One spare, fixed: the adaptive pool holds two after two namespaces in 10 s, and went
	// back to one only as the first aged out, 10 s on: the test passed only on a slow
	// enough machine (0.15 s to spare on a fast one).
	e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 1 << 20, Spares: 1})
	first := e.NewNamespace() // (and a spare, whose start makes its directory, for the next)
	defer first.Close()
	valueIn(t, e, first, "1")
	require.Eventually(t, func() bool { return minipy.WorkMounts(e) == 3 }, 10*time.Second, 5*time.Millisecond,
		"the default namespace's, first's and the spare's")
	before := minipy.WorkMounts(e)
	mounts := func() int {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(minipy.TemplatePID(e)), "mountinfo"))
		require.NoError(t, err)
		return strings.Count(string(b), " tmpfs tmpfs ") // (mountinfo: "... - tmpfs tmpfs rw,...")
	}
	tmpfs := mounts()
	ns := e.NewNamespace()
	assert.Equal(t, "ok", valueIn(t, e, ns, fillCode+"fill('f.bin', 10)"))
	// ns took the spare; the next spare's start mounts its directory in the background.
	require.Eventually(t, func() bool { return minipy.WorkMounts(e) > before && mounts() > tmpfs },
		10*time.Second, 5*time.Millisecond)
	require.NoError(t, ns.Close())
	runtime.GC()
	require.Eventually(t, func() bool { return minipy.WorkMounts(e) <= before && mounts() <= tmpfs },
		10*time.Second, 10*time.Millisecond)
}

// When the template dies, its sandboxes go on: the namespace keeps its worker, its files and
// its cap. A Fork copy made afterwards works on the host's disk (the new template's mounts
// would not reach the sandbox). When the namespace's worker is lost, the next start moves
// its files into a tmpfs of the new template, capped as before.
func TestWorkSizeTemplateDies(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 1 << 20, NoRollback: true})
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, "ok", valueIn(t, e, ns, fillCode+"import os; os.makedirs('d/e'); os.symlink('d', 'link')\n"+
		"os.chmod('d/e', 0o700); fill('d/e/f.bin', 300)"))
	dir := ns.WorkDir()
	first := minipy.TemplatePID(e)
	require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
	require.Eventually(t, func() bool { return syscall.Kill(first, 0) == syscall.ESRCH }, 30*time.Second, 5*time.Millisecond) // (room for a loaded machine)
	got, err := ns.ReadFile("d/e/f.bin")
	require.NoError(t, err, "the host still holds the files")
	assert.Len(t, got, 300<<10)
	assert.Equal(t, "ENOSPC", valueIn(t, e, ns, fillCode+"fill('more.bin', 800)"), "the worker lives on, capped")
	cp, err := ns.Fork()
	require.NoError(t, err)
	assert.Equal(t, int64(300<<10), valueIn(t, e, cp, "import os\nos.path.getsize('d/e/f.bin')"), "the copy's files")
	require.NoError(t, cp.WriteFile("from-host.txt", []byte("hi")))
	assert.Equal(t, "hi", valueIn(t, e, cp, "open('from-host.txt').read()"), "one directory, the host's and the copy's")
	require.NoError(t, cp.Close())

	_, err = runIn(t, e, ns, "import os; os._exit(3)")
	require.ErrorIs(t, err, minipy.ErrStateLost)
	assert.Equal(t, []any{int64(300 << 10), "d", "0o700", int64(1 << 20)}, valueIn(t, e, ns,
		"import os\nst = os.statvfs('.')\n"+
			"os.path.getsize('d/e/f.bin'), os.readlink('link'), oct(os.stat('d/e').st_mode & 0o777), st.f_blocks * st.f_frsize"))
	assert.NotEqual(t, first, minipy.TemplatePID(e), "its worker is a new template's")
	assert.Equal(t, "ENOSPC", valueIn(t, e, ns, fillCode+"fill('more.bin', 800)"), "capped as before")
	r, err := runIn(t, e, ns, "open('after.txt', 'w').write('x')")
	require.NoError(t, err)
	assert.Equal(t, []string{"after.txt"}, fileNames(r.Files), "Result.Files watches the new tmpfs")
	assert.Equal(t, dir, ns.WorkDir(), "WorkDir stays")
	got, err = os.ReadFile(filepath.Join(dir, "d", "e", "f.bin"))
	require.NoError(t, err)
	assert.Len(t, got, 300<<10)
}

// Issue 48, finding 8: a sparse file of 512 MiB in a 16 MiB working directory: ReadFile
// returned 512 MiB of zeros, ReadFileTo streamed them, and Save allocated 2.2 GiB in the
// host. The host reads no file past WorkSize: each refuses it (ErrFileTooLarge), holding
// none of it.
func TestWorkSizeSparseFile(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 16 << 20})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "with open('sparse.bin', 'wb') as f:\n    f.truncate(512 << 20)\nopen('ok.txt', 'w').write('fine')")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ns.ReadFile("sparse.bin")
	require.ErrorIs(t, err, minipy.ErrFileTooLarge)
	assert.Contains(t, err.Error(), "sparse.bin")
	var sink countingWriter
	n, err := ns.ReadFileTo("sparse.bin", &sink)
	require.ErrorIs(t, err, minipy.ErrFileTooLarge)
	assert.Zero(t, n)
	_, err = ns.Save(io.Discard)
	require.ErrorIs(t, err, minipy.ErrFileTooLarge)
	runtime.ReadMemStats(&after)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "the host held none of it")
	got, err := ns.ReadFile("ok.txt")
	require.NoError(t, err)
	assert.Equal(t, "fine", string(got))
}

// Issue 66: 8 sparse files of just under 16 MiB each in a 16 MiB working directory, each
// within WorkSize alone: Save read them whole (the server of a paused E2B sandbox grew by
// 920 MiB for 32 MiB files). The files together may claim WorkSize, counted before any is
// read: Save refuses them, having read none of them. Real files that fill the directory
// still save.
func TestWorkSizeSparseFilesTogether(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 16 << 20})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "import os\nfor i in range(8):\n    with open('s%d.bin' % i, 'wb') as f:\n"+
		"        f.truncate((16 << 20) - 4096)\nsum(os.stat('s%d.bin' % i).st_blocks for i in range(8))")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ns.Save(io.Discard)
	require.ErrorIs(t, err, minipy.ErrFileTooLarge)
	assert.Contains(t, err.Error(), "in all")
	runtime.ReadMemStats(&after)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "the host read none of it")
	_, err = ns.Fork() // (its copy is the sandbox's, into a tmpfs of the same size: ENOSPC)
	require.Error(t, err, "a fork's copy of the files")

	valueIn(t, e, ns, "import os\nfor i in range(8):\n    os.remove('s%d.bin' % i)\n"+
		"open('real.bin', 'wb').write(os.urandom(12 << 20))")
	var saved bytes.Buffer
	_, err = ns.Save(&saved)
	require.NoError(t, err)
	assert.Greater(t, saved.Len(), 12<<20)
}

// countingWriter counts and drops what is written.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(b []byte) (int, error) {
	w.n += int64(len(b))
	return len(b), nil
}

// mountinfoCode prints the mounts the code sees: each one's root in its file system and
// where it is mounted.
const mountinfoCode = `[" ".join(l.split()[3:5]) for l in open("/proc/self/mountinfo")]`

// Issue 48, finding 12: /proc/self/mountinfo named the host path of the engine's directories
// (/tmp/minipy-isolated-N/work/8 /namespaces): the tree was a bind of a host directory. Each
// tree is a tmpfs of its own now, which the host reaches by descriptor: the code sees its
// root, "/", at /namespaces, and no path of the host's, for the default namespace, a new
// one, a Fork copy, packed namespaces, and after the template's death.
func TestMountinfoNamesNoHostPath(t *testing.T) {
	noHostPath := func(t *testing.T, e *minipy.Isolated, ns *minipy.Namespace) {
		t.Helper()
		mounts := valueIn(t, e, ns, mountinfoCode).([]any)
		assert.Contains(t, mounts, "/ /namespaces", "the tree's own root")
		for _, m := range mounts {
			assert.NotContains(t, m, "minipy-isolated-", "a host path of the engine's")
			assert.False(t, strings.HasPrefix(m.(string), os.TempDir()), "a host path of the engine's: %s", m)
		}
	}
	t.Run("own", func(t *testing.T) {
		e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 1 << 20})
		ns := e.NewNamespace()
		defer ns.Close()
		noHostPath(t, e, ns)
		cp, err := ns.Fork()
		require.NoError(t, err)
		defer cp.Close()
		noHostPath(t, e, cp)
		first := minipy.TemplatePID(e)
		require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
		require.Eventually(t, func() bool { return syscall.Kill(first, 0) == syscall.ESRCH }, 30*time.Second, 5*time.Millisecond)
		late, err := ns.Fork() // (a plain directory in the dead template's tree)
		require.NoError(t, err)
		defer late.Close()
		noHostPath(t, e, late)
		assert.Equal(t, int64(1), valueIn(t, e, late, "import os; os.makedirs('x'); len(os.listdir('.'))"))
		_, err = runIn(t, e, ns, "import os; os._exit(3)") // (its next worker is the new template's)
		require.Error(t, err)
		noHostPath(t, e, ns)
	})
	t.Run("packed", func(t *testing.T) {
		e := newIsolated(t, minipy.IsolatedConfig{WorkSize: 1 << 20, Workers: 1})
		a, b := e.NewNamespace(), e.NewNamespace()
		defer a.Close()
		defer b.Close()
		noHostPath(t, e, a)
		noHostPath(t, e, b)
	})
}

// On an unprivileged host the trees' tmpfs is the host user's (the only one its template's
// user namespace maps): the host makes the working directories in it as their owner, and
// the tests above hold as they do for root.
func TestWorkSizeAsUser(t *testing.T) {
	out := rerunAsNobody(t, "^(TestMountinfoNamesNoHostPath|TestWorkSize|TestWorkSizeTemplateDies|TestWorkDirFork|TestWorkDirTreeIsTheHosts)$")
	for _, name := range []string{"TestMountinfoNamesNoHostPath", "TestWorkSize", "TestWorkSizeTemplateDies", "TestWorkDirFork",
		"TestWorkDirTreeIsTheHosts"} {
		assert.Contains(t, out, "--- PASS: "+name+" ", name)
	}
}
