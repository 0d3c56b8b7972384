package minipy_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// manyDirs is code that makes n folders in the working directory, d00/ to dNN/, with a
// file f.txt in each.
func manyDirs(n int) string {
	return fmt.Sprintf(`import os
for i in range(%d):
    os.mkdir("d%%02d" %% i)
    open("d%%02d/f.txt" %% i, "w").write("x")`, n)
}

// pastSlack waits until the files made so far have times before the next run's start less
// the slack a walk allows for the file clock's tick (a walk would count them).
func pastSlack() { time.Sleep(100 * time.Millisecond) }

// A namespace that makes more folders than its bound on watches gets no more: the host's
// watches stay at the bound; a run whose walk of the folders without one stops at its own
// bound says that Files is incomplete (MoreFilesUnknown), and still names the files written
// in watched folders; later runs work. Deleting folders gives the watches back, and closing
// the namespace frees them all.
func TestFileWatchBound(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	minipy.SetWatchLimits(e, 8, 1000, 100, 0)
	ns := e.NewNamespace()
	defer ns.Close()
	r, err := runIn(t, e, ns, manyDirs(60))
	require.NoError(t, err)
	assert.Equal(t, 8, minipy.HostWatches(e), "the working directory and d00 to d06")
	assert.Equal(t, minipy.MoreFilesUnknown, r.MoreFiles, "60 folders and 60 files: more than the walk may visit")
	assert.Subset(t, fileNames(r.Files), []string{"d00/f.txt", "d06/f.txt"}, "those of watched folders are named")

	r, err = runIn(t, e, ns, `open("top.txt", "w").write("t"); open("d03/g.txt", "w").write("g")`)
	require.NoError(t, err)
	assert.Equal(t, 8, minipy.HostWatches(e))
	assert.Subset(t, fileNames(r.Files), []string{"d03/g.txt", "top.txt"})
	assert.Equal(t, minipy.MoreFilesUnknown, r.MoreFiles)

	pastSlack()
	r, err = runIn(t, e, ns, `import shutil
for i in range(60): shutil.rmtree("d%02d" % i)`)
	require.NoError(t, err)
	assert.Empty(t, r.Files)
	assert.Zero(t, r.MoreFiles, "what is left fits the walk")
	assert.Equal(t, 1, minipy.HostWatches(e), "the deleted folders' watches are gone")

	r, err = runIn(t, e, ns, `import os; os.mkdir("new"); open("new/f.txt", "w").write("n")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"new/f.txt"}, fileNames(r.Files))
	assert.Zero(t, r.MoreFiles)
	assert.Equal(t, 2, minipy.HostWatches(e), "the working directory and new/: the budget is back")

	require.NoError(t, ns.Close())
	assert.Zero(t, minipy.HostWatches(e), "a closed namespace's watches are freed")
}

// Past the bound on watches, the walk of the folders without one keeps Files whole while it
// stays within its own bound, a folder moved in whole included (its files keep their times).
func TestFileWatchBoundWalk(t *testing.T) {
	for name, cfg := range map[string]minipy.IsolatedConfig{"tmpfs": {}, "disk": {WorkSize: -1}} {
		t.Run(name, func(t *testing.T) {
			e := newIsolated(t, cfg)
			minipy.SetWatchLimits(e, 3, 1000, 1000, 0)
			ns := e.NewNamespace()
			defer ns.Close()
			require.NoError(t, ns.WriteFile("tree/sub/old.txt", []byte("o")))
			r, err := runIn(t, e, ns, manyDirs(20))
			require.NoError(t, err)
			assert.Equal(t, 3, minipy.HostWatches(e), "the working directory, tree/ and tree/sub/")
			assert.Len(t, r.Files, 20)
			assert.Equal(t, "d19/f.txt", r.Files[19].Name)
			assert.Zero(t, r.MoreFiles)

			pastSlack()
			r, err = runIn(t, e, ns, `import os; os.rename("tree", "d05/tree")`)
			require.NoError(t, err)
			assert.Equal(t, []string{"d05/tree/sub/old.txt"}, fileNames(r.Files), "moved into a folder without a watch")
			assert.Zero(t, r.MoreFiles)
		})
	}
}

// Hidden folders (caches, __pycache__, pip's --user tree) get no watch: their files are
// never named. A hidden folder moved to a visible name is named whole.
func TestFileWatchHidden(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	r, err := runIn(t, e, ns, `import os
os.makedirs(".cache/a/b/c"); open(".cache/a/b/c/x.txt", "w").write("x")
os.makedirs("pkg/__pycache__"); open("pkg/__pycache__/m.pyc", "w").write("x")
for i in range(30): os.makedirs(".local/lib/p%02d/q" % i)`)
	require.NoError(t, err)
	assert.Empty(t, r.Files)
	assert.Equal(t, 2, minipy.HostWatches(e), "the working directory and pkg/")
	r, err = runIn(t, e, ns, `import os; os.rename(".cache/a", "out")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"out/b/c/x.txt"}, fileNames(r.Files))
	assert.Equal(t, 5, minipy.HostWatches(e), "and out/, out/b/, out/b/c/")
}

// One namespace past its bound leaves another's watches, and Files, whole.
func TestFileWatchBoundNamespaces(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	minipy.SetWatchLimits(e, 8, 1000, 100, 0)
	a, b := e.NewNamespace(), e.NewNamespace()
	defer a.Close()
	defer b.Close()
	r, err := runIn(t, e, a, manyDirs(60))
	require.NoError(t, err)
	assert.Equal(t, minipy.MoreFilesUnknown, r.MoreFiles)
	r, err = runIn(t, e, b, `import os; os.makedirs("x/y"); open("x/y/f.txt", "w").write("f"); open("g.txt", "w").write("g")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"g.txt", "x/y/f.txt"}, fileNames(r.Files))
	assert.Zero(t, r.MoreFiles)
	assert.Equal(t, 8+3, minipy.HostWatches(e))
}

// Past the engine's bound, namespaces get no more watches either; their runs walk instead,
// and get watches again once another namespace frees its own.
func TestFileWatchEngineBound(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	minipy.SetWatchLimits(e, 100, 6, 1000, 0)
	a, b := e.NewNamespace(), e.NewNamespace()
	defer b.Close()
	r, err := runIn(t, e, a, manyDirs(10))
	require.NoError(t, err)
	assert.Len(t, r.Files, 10)
	assert.Zero(t, r.MoreFiles)
	assert.Equal(t, 6, minipy.HostWatches(e))
	r, err = runIn(t, e, b, `import os; os.mkdir("x"); open("x/f.txt", "w").write("f"); open("g.txt", "w").write("g")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"g.txt", "x/f.txt"}, fileNames(r.Files), "walked: no watch at all")
	assert.Zero(t, r.MoreFiles)
	assert.Equal(t, 6, minipy.HostWatches(e))
	require.NoError(t, a.Close())
	assert.Zero(t, minipy.HostWatches(e))
	r, err = runIn(t, e, b, `open("x/h.txt", "w").write("h")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"x/h.txt"}, fileNames(r.Files))
	assert.Equal(t, 2, minipy.HostWatches(e), "the working directory and x/")
}

// The probe, with the real bounds: 5,000 folders leave the host holding the
// namespace's bound of watches, and the walk of the rest keeps Files whole.
func TestFileWatchDefaultBound(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	r, err := runIn(t, e, ns, `import os
for i in range(5000): os.mkdir("d%04d" % i)
open("d4999/out.txt", "w").write("x")`)
	require.NoError(t, err)
	assert.Equal(t, minipy.NSWatchLimit, minipy.HostWatches(e))
	assert.Equal(t, []string{"d4999/out.txt"}, fileNames(r.Files))
	assert.Zero(t, r.MoreFiles)
	pastSlack()
	r, err = runIn(t, e, ns, `open("d0000/a.txt", "w").write("a"); open("d4000/b.txt", "w").write("b")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"d0000/a.txt", "d4000/b.txt"}, fileNames(r.Files))
	assert.Equal(t, minipy.NSWatchLimit, minipy.HostWatches(e))
}

// A folder the host cannot read (the code made it mode 0; a host that runs as root reads
// it all the same) can be neither watched nor walked: Files says it may leave out files,
// and names the others.
func TestFileWatchUnreadable(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	r, err := runIn(t, e, ns, `import os
os.mkdir("locked"); open("locked/f.txt", "w").write("x"); os.chmod("locked", 0)
open("top.txt", "w").write("t")`)
	require.NoError(t, err)
	if os.Geteuid() == 0 {
		assert.Equal(t, []string{"locked/f.txt", "top.txt"}, fileNames(r.Files))
		assert.Zero(t, r.MoreFiles)
		return
	}
	assert.Equal(t, []string{"top.txt"}, fileNames(r.Files))
	assert.Equal(t, minipy.MoreFilesUnknown, r.MoreFiles)
	pastSlack()
	r, err = runIn(t, e, ns, `import os; os.chmod("locked", 0o755); open("locked/g.txt", "w").write("g")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"locked/g.txt"}, fileNames(r.Files), "readable again: walked")
	assert.Zero(t, r.MoreFiles)
}

// Setting watches up lists at most so many entries from one run's start to the next's:
// folders past that get no watch (the walk stands in), and a run that moved one in whole
// says that Files may leave some of its files out.
func TestFileWatchListBound(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	minipy.SetWatchLimits(e, 100, 1000, 1000, 50)
	ns := e.NewNamespace()
	defer ns.Close()
	for i := range 200 {
		require.NoError(t, ns.WriteFile(fmt.Sprintf("big/%03d.txt", i), nil))
	}
	for i := range 30 {
		require.NoError(t, ns.WriteFile(fmt.Sprintf("dirs/%02d/x.txt", i), nil))
	}
	r, err := runIn(t, e, ns, `open("big/new.txt", "w").write("n"); open("dirs/29/y.txt", "w").write("y")`)
	require.NoError(t, err)
	assert.Equal(t, []string{"big/new.txt", "dirs/29/y.txt"}, fileNames(r.Files), "watched or walked")
	assert.Zero(t, r.MoreFiles)
	assert.Less(t, minipy.HostWatches(e), 1+2+30, "the listing stopped: some folders have no watch")

	r, err = runIn(t, e, ns, `import os; os.rename("big", "moved")`)
	require.NoError(t, err)
	assert.Equal(t, minipy.MoreFilesUnknown, r.MoreFiles, "201 files moved in, at most 50 listed")
	assert.LessOrEqual(t, len(r.Files), 50)
}

// As an unprivileged host (whose workers run as itself, so a folder of mode 0 is closed to
// the host too), the bounds hold and an unreadable folder is said to be.
func TestFileWatchAsUser(t *testing.T) {
	out := rerunAsNobody(t, "^(TestFileWatchBound|TestFileWatchUnreadable)$")
	assert.Contains(t, out, "--- PASS: TestFileWatchBound")
	assert.Contains(t, out, "--- PASS: TestFileWatchUnreadable")
}
