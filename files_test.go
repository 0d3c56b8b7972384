package minipy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// fileEngines are the isolated engines whose namespaces have files the host reaches: a
// worker per namespace forked from the template or started plainly, shared workers, and
// no sandbox.
func fileEngines(t *testing.T) map[string]*minipy.Isolated {
	unsandboxed, err := minipy.NewIsolatedActingUnsandboxed(minipy.IsolatedConfig{AllowUnsandboxed: true})
	require.NoError(t, err)
	t.Cleanup(func() { unsandboxed.Close() })
	return map[string]*minipy.Isolated{
		"template":    newIsolated(t, minipy.IsolatedConfig{}),
		"no template": newIsolated(t, minipy.IsolatedConfig{NoTemplate: true}),
		"packed":      newIsolated(t, minipy.IsolatedConfig{Workers: 1}),
		"unsandboxed": unsandboxed,
	}
}

func fileNames(files []minipy.FileInfo) []string {
	out := []string{}
	for _, f := range files {
		out = append(out, f.Name)
	}
	return out
}

// The host puts files in and takes them out; the code sees them and may change them.
func TestNamespaceFiles(t *testing.T) {
	for name, e := range fileEngines(t) {
		t.Run(name, func(t *testing.T) {
			ns := e.NewNamespace()
			defer ns.Close()
			require.NoError(t, ns.WriteFile("data/raw/in.csv", []byte("a,b\n1,2\n")))
			require.NoError(t, ns.WriteFile("top.txt", []byte("top")))
			assert.Equal(t, "a,b\n1,2\nmore\n", valueIn(t, e, ns, `import os
with open("data/raw/in.csv", "a") as f:
    f.write("more\n")
os.makedirs("out")
open("out/result.txt", "w").write("made by code")
os.remove("top.txt")  # the code may remove what the host made
open("data/raw/in.csv").read()`), "the code reads and changes what the host wrote")

			got, err := ns.ReadFile("out/result.txt")
			require.NoError(t, err)
			assert.Equal(t, "made by code", string(got))
			var buf bytes.Buffer
			n, err := ns.ReadFileTo("data/raw/in.csv", &buf)
			require.NoError(t, err)
			assert.Equal(t, int64(13), n)
			assert.Equal(t, "a,b\n1,2\nmore\n", buf.String())

			list, err := ns.ListFiles("")
			require.NoError(t, err)
			assert.Equal(t, []string{"data", "out"}, fileNames(list))
			assert.True(t, list[0].IsDir)
			list, err = ns.ListFiles("data/raw")
			require.NoError(t, err)
			require.Len(t, list, 1)
			assert.Equal(t, "data/raw/in.csv", list[0].Name, "names are relative to the working directory")
			assert.Equal(t, int64(13), list[0].Size)
			assert.False(t, list[0].IsDir)
			assert.WithinDuration(t, time.Now(), list[0].ModTime, time.Minute)

			_, err = ns.ReadFile("top.txt")
			assert.ErrorIs(t, err, fs.ErrNotExist)
			_, err = ns.ListFiles("nope")
			assert.ErrorIs(t, err, fs.ErrNotExist)
			_, err = ns.ReadFile("data")
			assert.ErrorIs(t, err, fs.ErrInvalid, "a directory is not read")
			valueIn(t, e, ns, "import os; os.mkfifo('fifo')")
			_, err = ns.ReadFile("fifo")
			assert.ErrorIs(t, err, fs.ErrInvalid, "a FIFO is refused, not waited on")
			assert.ErrorIs(t, ns.WriteFile("fifo", []byte("x")), fs.ErrInvalid)
			assert.ErrorIs(t, ns.WriteFile("data", []byte("x")), syscall.EISDIR)

			// Overwrite replaces; the code's view follows.
			require.NoError(t, ns.WriteFile("out/result.txt", []byte("new")))
			assert.Equal(t, "new", valueIn(t, e, ns, "open('out/result.txt').read()"))
			require.NoError(t, ns.WriteFile("empty", nil))
			assert.Equal(t, int64(0), valueIn(t, e, ns, "import os; os.path.getsize('empty')"))

			// A reader that fails leaves no partial file.
			_, err = ns.WriteFileFrom("partial.bin", io.MultiReader(strings.NewReader("half"), errReader{}))
			require.ErrorIs(t, err, errBroken)
			_, err = ns.ReadFile("partial.bin")
			assert.ErrorIs(t, err, fs.ErrNotExist)

			dir := ns.WorkDir()
			require.NoError(t, ns.Close())
			assert.NoDirExists(t, dir)
			assert.ErrorIs(t, ns.WriteFile("x", nil), minipy.ErrNamespaceClosed)
			_, err = ns.ReadFile("data/raw/in.csv")
			assert.ErrorIs(t, err, minipy.ErrNamespaceClosed)
		})
	}
}

var errBroken = errors.New("broken reader")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errBroken }

// Names that are not below the working directory, literally or through the code's links,
// are refused, whichever way the data would go.
func TestNamespaceFilesBadPath(t *testing.T) {
	for name, e := range fileEngines(t) {
		t.Run(name, func(t *testing.T) {
			ns := e.NewNamespace()
			defer ns.Close()
			outside := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o600))
			valueIn(t, e, ns, fmt.Sprintf(`import os
os.makedirs("sub")
open("sub/f.txt", "w").write("inside")
os.symlink(%q, "out")             # to a host directory
os.symlink("/etc", "etc")         # absolute
os.symlink("../..", "sub/up")     # up and out
os.symlink("sub/f.txt", "alias")  # stays inside
os.symlink("../sub", "sub/self")  # leaves sub, not the working directory
os.symlink(%q, "dangling")`, outside, filepath.Join(outside, "new")))
			for _, bad := range []string{"/etc/passwd", "../x", "sub/../../x", "out/secret", "etc/passwd",
				"sub/up/x", "dangling", "a\x00b", ""} {
				_, err := ns.ReadFile(bad)
				if bad == "" {
					assert.ErrorIs(t, err, fs.ErrInvalid, "the working directory itself is not a file")
					continue
				}
				assert.ErrorIs(t, err, minipy.ErrBadPath, bad)
				assert.ErrorIs(t, ns.WriteFile(bad, []byte("x")), minipy.ErrBadPath, bad)
				_, err = ns.ListFiles(bad)
				assert.ErrorIs(t, err, minipy.ErrBadPath, bad)
			}
			assert.ErrorIs(t, ns.WriteFile("out/new/deeper", []byte("x")), minipy.ErrBadPath,
				"folders are not made through a link either")
			entries, err := os.ReadDir(outside)
			require.NoError(t, err)
			assert.Len(t, entries, 1, "nothing was written outside")

			for _, ok := range []string{"alias", "sub/self/f.txt", "sub/./f.txt"} {
				got, err := ns.ReadFile(ok)
				require.NoError(t, err, ok)
				assert.Equal(t, "inside", string(got))
			}
			list, err := ns.ListFiles("")
			require.NoError(t, err)
			assert.Equal(t, []string{"alias", "dangling", "etc", "out", "sub"}, fileNames(list), "links are listed, not followed")
		})
	}
}

// In-process namespaces share the host's files: the file methods say so.
func TestNamespaceFilesInProcess(t *testing.T) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	assert.ErrorIs(t, ns.WriteFile("x.txt", []byte("x")), minipy.ErrNoFiles)
	_, err := ns.ReadFile("x.txt")
	assert.ErrorIs(t, err, minipy.ErrNoFiles)
	_, err = ns.ListFiles("")
	assert.ErrorIs(t, err, minipy.ErrNoFiles)
	assert.Equal(t, "", ns.WorkDir())
	r, err := minipy.Minipy("open('/dev/null', 'w').write('x')", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	assert.Empty(t, r.Files)
}

// Big files stream: the host never holds the whole file.
func TestNamespaceFilesStream(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	const size = 64 << 20
	alloc := func() uint64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.TotalAlloc
	}
	before := alloc()
	n, err := ns.WriteFileFrom("big.bin", io.LimitReader(zeros{}, size))
	require.NoError(t, err)
	assert.Equal(t, int64(size), n)
	n, err = ns.ReadFileTo("big.bin", io.Discard)
	require.NoError(t, err)
	assert.Equal(t, int64(size), n)
	assert.Less(t, alloc()-before, uint64(size/8), "writing and reading 64 MiB allocated less than 8 MiB")
	assert.Equal(t, int64(size), valueIn(t, e, ns, "import os; os.path.getsize('big.bin')"))
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Result.Files names what the run created or changed, however it did, and nothing else.
func TestResultFiles(t *testing.T) {
	for name, e := range fileEngines(t) {
		t.Run(name, func(t *testing.T) {
			ns := e.NewNamespace()
			defer ns.Close()
			require.NoError(t, ns.WriteFile("keep.txt", []byte("k")))
			require.NoError(t, ns.WriteFile("old/edit.txt", []byte("e")))
			require.NoError(t, ns.WriteFile("old/gone.txt", []byte("g")))
			r, err := runIn(t, e, ns, `import os, subprocess
os.makedirs("new/deep")
open("new/deep/a.txt", "w").write("aaa")
open("old/edit.txt", "a").write("more")
os.remove("old/gone.txt")
subprocess.run(["sh", "-c", "echo hi > shell.txt"], check=True)
import shutil, tempfile; d = tempfile.mkdtemp(); open(d + "/t.txt", "w").write("not the working directory"); shutil.rmtree(d)
os.makedirs("moved_src"); open("moved_src/m.txt", "w").write("m")
os.rename("moved_src", "moved_dst")
open("leftopen.txt", "w").write("x")  # not closed: CPython closes it at collection
`)
			require.NoError(t, err)
			assert.Equal(t, []string{"leftopen.txt", "moved_dst/m.txt", "new/deep/a.txt", "old/edit.txt", "shell.txt"},
				fileNames(r.Files))
			assert.Equal(t, int64(3), r.Files[2].Size)
			assert.Zero(t, r.MoreFiles)

			r, err = runIn(t, e, ns, "x = open('keep.txt').read()")
			require.NoError(t, err)
			assert.Empty(t, r.Files, "reading changes nothing")
			require.NoError(t, ns.WriteFile("host.txt", []byte("h")))
			r, err = runIn(t, e, ns, "1")
			require.NoError(t, err)
			assert.Empty(t, r.Files, "the host's writes are not the run's")

			r, err = runIn(t, e, ns, "open('moved_dst/m.txt', 'w').write('after the move'); 1/0")
			var py *minipy.PythonError
			require.ErrorAs(t, err, &py)
			assert.Equal(t, []string{"moved_dst/m.txt"}, fileNames(r.Files), "a run that raised still reports, at the moved path")

			r, err = runIn(t, e, ns, "for i in range(150): open('many_%03d' % i, 'w').write('x')")
			require.NoError(t, err)
			require.Len(t, r.Files, minipy.MaxResultFiles)
			assert.Equal(t, "many_000", r.Files[0].Name)
			assert.Equal(t, 50, r.MoreFiles)
		})
	}
}

// When the kernel's event queue overflows, the run walks its directory instead, and still
// names what it changed.
func TestResultFilesOverflow(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.WriteFile("before.txt", []byte("b")))
	time.Sleep(100 * time.Millisecond) // past the slack the walk allows for the file clock
	r, err := runIn(t, e, ns, `import os
for i in range(8000):  # 24,000 events: more than the kernel queues (16,384)
    with open("%05d" % i, "w") as f:
        f.write("x")
`)
	require.NoError(t, err)
	require.Len(t, r.Files, minipy.MaxResultFiles)
	assert.Equal(t, "00000", r.Files[0].Name)
	assert.Equal(t, 8000-minipy.MaxResultFiles, r.MoreFiles, "every file is counted, before.txt is not")
	r, err = runIn(t, e, ns, "open('after.txt', 'w').write('a')")
	require.NoError(t, err)
	assert.Equal(t, []string{"after.txt"}, fileNames(r.Files), "and the next run is exact again")
}

// A timed-out run that was killed still reports the files it made.
func TestResultFilesKilledRun(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "1")
	r, err := e.Run(context.Background(), `open("partial.txt", "w").write("p")
import ctypes
ctypes.CDLL(None).sleep(60)`, &minipy.Options{Globals: ns, Timeout: 200 * time.Millisecond})
	require.Error(t, err)
	require.NotNil(t, r)
	assert.Equal(t, []string{"partial.txt"}, fileNames(r.Files))
}

// As root, the file methods and Result.Files work with workers that run as nobody; the
// tests above run as root here, and this one runs them again as an unprivileged user, whose
// workers run as that user.
func TestNamespaceFilesAsUser(t *testing.T) {
	out := rerunAsNobody(t, "^(TestNamespaceFiles|TestNamespaceFilesBadPath|TestNamespaceFilesStream|TestResultFiles|TestWorkSize|"+
		"TestWorkSizeTemplateDies|TestFilesAnywhere|TestFilesAnywhereStaysInTheSandbox|TestSandboxLoopback|"+
		"TestSaveRestoreSandboxFiles)$")
	assert.Contains(t, out, "--- PASS: TestResultFiles/template")
	assert.Contains(t, out, "--- PASS: TestSaveRestoreSandboxFiles/template")
	assert.Contains(t, out, "--- PASS: TestFilesAnywhere/template")
	assert.Contains(t, out, "--- PASS: TestSandboxLoopback")
	assert.Contains(t, out, "--- PASS: TestWorkSizeTemplateDies")
}

// rerunAsNobody runs the tests that match run again as the unprivileged user nobody, when
// the tests run as root (else it skips t), and returns their output, which holds no SKIP.
func rerunAsNobody(t *testing.T, run string) string {
	t.Helper()
	if os.Geteuid() != 0 || os.Getenv("MINIPY_AS_USER") != "" {
		t.Skip("runs tests again as nobody when the tests run as root; they are running as a user")
	}
	dir := sandboxReadableDir(t)
	bin := filepath.Join(dir, "minipy.test")
	exe, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, exe, 0o755))
	tmp := filepath.Join(dir, "tmp")
	require.NoError(t, os.Mkdir(tmp, 0o700))
	require.NoError(t, os.Chown(tmp, 65534, 65534))
	cmd := exec.Command(bin, "-test.run", run, "-test.count=1", "-test.v")
	cmd.Dir = tmp
	// The test's environment (LD_LIBRARY_PATH for a libpython of its own: make compat), with
	// the user's own HOME and TMPDIR.
	cmd.Env = append(os.Environ(), "HOME="+tmp, "TMPDIR="+tmp, "MINIPY_AS_USER=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, string(out), "SKIP")
	return string(out)
}

// Result.Files leaves out what libraries keep in HOME (the working directory) and Python's
// byte code.
func TestResultFilesHidden(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	r, err := e.Minipy(`import os
os.makedirs(".cache/lib", exist_ok=True)
open(".cache/lib/state.json", "w").write("{}")
open(".env", "w").write("A=1")
open("mod.py", "w").write("X = 1")
import mod
open("result.txt", "w").write("r")`, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"mod.py", "result.txt"}, fileNames(r.Files))
	assert.True(t, minipy.FileInfo{Name: "a/__pycache__/m.pyc"}.Hidden())
	assert.True(t, minipy.FileInfo{Name: ".env"}.Hidden())
	assert.False(t, minipy.FileInfo{Name: "out/a.b.csv"}.Hidden())
}

// A file opened for writing and closed unchanged is not a change; one written through mmap
// (which makes no IN_MODIFY) is. (The first is also what a worker starting while the host's
// WriteFile holds a file open looks like: the child's copy of the descriptor closes at exec.)
func TestResultFilesClosedUnchanged(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.WriteFile("a.bin", make([]byte, 4096)))
	require.NoError(t, ns.WriteFile("b.bin", make([]byte, 4096)))
	time.Sleep(100 * time.Millisecond) // their ctime is well before the runs'
	r, err := runIn(t, e, ns, "open('a.bin', 'r+b').close(); open('b.bin', 'ab').close()")
	require.NoError(t, err)
	assert.Empty(t, r.Files)
	r, err = runIn(t, e, ns, `import mmap
with open("b.bin", "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    m[0] = 1
    m.close()`)
	require.NoError(t, err)
	assert.Equal(t, []string{"b.bin"}, fileNames(r.Files))
}
