package main

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// localTree makes a file sales.csv and a directory data (data/a.txt, data/sub/deep/b.txt,
// and a link and a FIFO that --put skips) in a temporary directory, and returns it.
func localTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{
		"sales.csv":           "region,amount\nnorth,10\nsouth,32\n",
		"data/a.txt":          "a\n",
		"data/sub/deep/b.txt": "b\n",
	} {
		file := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o755))
		require.NoError(t, os.WriteFile(file, []byte(content), 0o644))
	}
	require.NoError(t, os.Symlink("/etc/hostname", filepath.Join(dir, "data", "link")))
	return dir
}

// treeOf lists the regular files under dir, slash-separated, with their contents.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(file string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(file)
		rel, _ := filepath.Rel(dir, file)
		got[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if os.IsNotExist(err) {
		return got
	}
	require.NoError(t, err)
	return got
}

func TestCLIPutAndOut(t *testing.T) {
	local := localTree(t)
	out := filepath.Join(t.TempDir(), "results") // made by the CLI
	code, stdout, errOut := cli(t, "", "--isolated", "--put", filepath.Join(local, "sales.csv"),
		"--put", filepath.Join(local, "data"), "--out", out, "-c", `
import csv, os
tree = sorted(os.path.join(d, f) for d, _, fs in os.walk('data') for f in fs)
print(os.getcwd(), tree)
total = sum(int(r['amount']) for r in csv.DictReader(open('sales.csv')))
os.makedirs('report/deep', exist_ok=True)
open('report/deep/total.txt', 'w').write(f'{total}\n')
open('data/a.txt', 'a').write('changed\n')
open('empty', 'w').close()
total`)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "/work ['data/a.txt', 'data/sub/deep/b.txt']\n42\n", stdout, "the link is not put")
	// New and changed files come out, nested; the unchanged --put ones do not.
	assert.Equal(t, map[string]string{
		"data/a.txt":            "a\nchanged\n",
		"empty":                 "",
		"report/deep/total.txt": "42\n",
	}, treeOf(t, out))
	assert.Equal(t, fmt.Sprintf("minipy: saved data/a.txt (10 bytes) to %[1]s/data/a.txt\n"+
		"minipy: saved empty (0 bytes) to %[1]s/empty\n"+
		"minipy: saved report/deep/total.txt (3 bytes) to %[1]s/report/deep/total.txt\n", out), errOut)

	// A second run overwrites what is there.
	code, _, errOut = cli(t, "", "--isolated", "--out", out, "-c", "open('empty', 'w').write('full')")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "full", treeOf(t, out)["empty"])
}

func TestCLIPutNames(t *testing.T) {
	local := localTree(t)
	t.Chdir(local)
	// NAME renames; a NAME ending in / is a folder to put it in; "." takes a directory's
	// files to the top. Relative LOCALs are from the current directory.
	code, stdout, errOut := cli(t, "", "--isolated", "--put", "sales.csv:in/s.csv", "--put", "sales.csv:in/",
		"--put", "data:.", "--put", "data/sub:more/", "-c",
		"import os; print(*sorted(os.path.join(d, f) for d, _, fs in os.walk('.') for f in fs))")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "./a.txt ./in/s.csv ./in/sales.csv ./more/sub/deep/b.txt ./sub/deep/b.txt\n", stdout)
	assert.Empty(t, errOut)
}

func TestCLIPutErrors(t *testing.T) {
	local := localTree(t)
	missing := filepath.Join(local, "missing.csv")
	code, stdout, errOut := cli(t, "", "--isolated", "--put", missing, "-c", "print('ran')")
	assert.Equal(t, 2, code)
	assert.Empty(t, stdout, "nothing ran")
	assert.Equal(t, "minipy: --put "+missing+": no such file or directory\n", errOut)

	code, _, errOut = cli(t, "", "--isolated", "--put", missing+":x.csv", "-c", "1")
	assert.Equal(t, 2, code)
	assert.Equal(t, "minipy: --put "+missing+":x.csv: "+missing+": no such file or directory\n", errOut)

	for _, name := range []string{"/work/sales.csv", "../sales.csv", "in/../../sales.csv"} {
		code, stdout, errOut = cli(t, "", "--isolated", "--put", filepath.Join(local, "sales.csv")+":"+name, "-c", "print('ran')")
		assert.Equal(t, 2, code, name)
		assert.Empty(t, stdout)
		assert.Contains(t, errOut, fmt.Sprintf("NAME %q is not inside the run's working directory", name))
		assert.Contains(t, errOut, "such as sales.csv or data/sales.csv")
	}

	code, _, errOut = cli(t, "", "--isolated", "--put", "/dev/null", "-c", "1")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "not a regular file or a directory")
}

func TestCLIFilesNeedIsolated(t *testing.T) {
	local := localTree(t)
	code, _, errOut := cli(t, "", "--backend", "inprocess", "--put", filepath.Join(local, "sales.csv"), "-c", "1")
	assert.Equal(t, 2, code)
	assert.Equal(t, "minipy: --put only applies to --backend isolated\n", errOut)
	code, _, errOut = cli(t, "", "--backend", "inprocess", "--out", t.TempDir(), "-c", "1")
	assert.Equal(t, 2, code)
	assert.Equal(t, "minipy: --out only applies to --backend isolated\n", errOut)
}

// Files a run made before it raised, or before its time ran out, are real: they come out.
func TestCLIOutAfterError(t *testing.T) {
	out := t.TempDir()
	code, _, errOut := cli(t, "", "--isolated", "--out", out, "-c",
		"import os; os.makedirs('part', exist_ok=True); open('part/1.txt', 'w').write('one'); 1/0")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "ZeroDivisionError")
	assert.Contains(t, errOut, "minipy: saved part/1.txt (3 bytes) to "+filepath.Join(out, "part", "1.txt")+"\n")
	assert.Equal(t, map[string]string{"part/1.txt": "one"}, treeOf(t, out))

	// Its worker killed by the timeout: the working directory is still there.
	code, _, errOut = cli(t, "", "--isolated", "--out", out, "--timeout", "1s", "-c",
		"open('before.txt', 'w').write('before')\nsum(range(10**12))")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "timed out")
	assert.Equal(t, "before", treeOf(t, out)["before.txt"])
}

// A link out of the working directory and a FIFO the code made are not copied: a note says
// so, and the run still succeeds.
func TestCLIOutSkipsLinksOutAndSpecialFiles(t *testing.T) {
	out := t.TempDir()
	code, _, errOut := cli(t, "", "--isolated", "--out", out, "-c",
		"import os; os.symlink('/etc/passwd', 'pw'); os.mkfifo('fifo'); open('ok.txt', 'w').write('ok')")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, map[string]string{"ok.txt": "ok"}, treeOf(t, out))
	assert.Contains(t, errOut, "minipy: saved ok.txt (2 bytes)")
	assert.Contains(t, errOut, "minipy: not saved pw: a symbolic link out of the working directory\n")
	assert.Contains(t, errOut, "minipy: not saved fifo: not a regular file\n")
}

func TestCLIJSONFiles(t *testing.T) {
	local := localTree(t)
	out := t.TempDir()
	writer := "import os; os.makedirs('o/p', exist_ok=True); open('o/p/r.txt', 'w').write('hi'); " +
		"open('sales.csv', 'a').write('east,1\\n')"
	type doc struct {
		Files []struct {
			Name string
			Size int64
			Path *string
		}
		MoreFiles *int `json:"more_files"`
	}
	code, stdout, errOut := cli(t, "", "--json", "--isolated", "--put", filepath.Join(local, "sales.csv"), "--out", out, "-c", writer)
	require.Equal(t, 0, code, errOut)
	assert.Empty(t, errOut, "with --json the paths are in the document")
	var d doc
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	require.Len(t, d.Files, 2)
	assert.Equal(t, "o/p/r.txt", d.Files[0].Name)
	assert.Equal(t, int64(2), d.Files[0].Size)
	require.NotNil(t, d.Files[0].Path)
	assert.Equal(t, filepath.Join(out, "o", "p", "r.txt"), *d.Files[0].Path)
	assert.Equal(t, "sales.csv", d.Files[1].Name)
	assert.Equal(t, int64(len("region,amount\nnorth,10\nsouth,32\neast,1\n")), d.Files[1].Size)
	assert.FileExists(t, *d.Files[1].Path)
	assert.Nil(t, d.MoreFiles)

	// Without --out an isolated run still lists its files, with no path; in-process runs none.
	code, stdout, errOut = cli(t, "", "--json", "--isolated", "-c", writer)
	require.Equal(t, 0, code, errOut)
	d = doc{}
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	require.Len(t, d.Files, 2)
	assert.Equal(t, "o/p/r.txt", d.Files[0].Name)
	assert.Nil(t, d.Files[0].Path)
	assert.Nil(t, d.Files[1].Path)
	code, stdout, _ = cli(t, "", "--json", "--backend", "inprocess", "-c", "1")
	require.Equal(t, 0, code)
	assert.NotContains(t, stdout, `"files"`)
}

// Past minipy.MaxResultFiles, --out finds the rest in the working directory (all but the
// unchanged --put files); the terminal gets a line per file up to a cap, --json all of them.
func TestCLIOutMoreFiles(t *testing.T) {
	local := localTree(t)
	const n = minipy.MaxResultFiles + 20
	writer := fmt.Sprintf("import os\nos.makedirs('many/sub', exist_ok=True)\n"+
		"for i in range(%d): open(f'many/sub/f{i:03}.txt', 'w').write(str(i))", n)
	out := t.TempDir()
	code, _, errOut := cli(t, "", "--isolated", "--put", filepath.Join(local, "data"), "--out", out, "-c", writer)
	require.Equal(t, 0, code, errOut)
	got := treeOf(t, out)
	assert.Len(t, got, n)
	assert.Equal(t, "119", got["many/sub/f119.txt"])
	assert.NotContains(t, got, "data/a.txt")
	assert.Equal(t, maxFileLines+1, strings.Count(errOut, "\n"))
	assert.Contains(t, errOut, fmt.Sprintf("minipy: saved %d more files to %s\n", n-maxFileLines, out))

	out = t.TempDir()
	code, stdout, errOut := cli(t, "", "--json", "--isolated", "--out", out, "-c", writer)
	require.Equal(t, 0, code, errOut)
	var d struct {
		Files     []struct{ Name, Path string }
		MoreFiles int `json:"more_files"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	assert.Len(t, d.Files, n)
	assert.Zero(t, d.MoreFiles, "all listed")
	assert.Equal(t, filepath.Join(out, "many", "sub", "f119.txt"), d.Files[n-1].Path)

	// Without --out the document counts those it leaves out.
	code, stdout, errOut = cli(t, "", "--json", "--isolated", "-c", writer)
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(stdout), &d))
	assert.Len(t, d.Files, minipy.MaxResultFiles)
	assert.Equal(t, 20, d.MoreFiles)
}

// fakeSource is a working directory for copyResult: its files, by name.
type fakeSource map[string]minipy.FileInfo

func (f fakeSource) ReadFileTo(name string, w io.Writer, _ ...minipy.FileOption) (int64, error) {
	if _, ok := f[name]; !ok {
		return 0, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	n, err := io.WriteString(w, "content of "+name)
	return int64(n), err
}

func (f fakeSource) ListFiles(dir string, _ ...minipy.FileOption) ([]minipy.FileInfo, error) {
	seen := map[string]bool{}
	var out []minipy.FileInfo
	for name, fi := range f {
		rel := name
		if dir != "" {
			var ok bool
			if rel, ok = strings.CutPrefix(name, dir+"/"); !ok {
				continue
			}
		}
		if first, _, nested := strings.Cut(rel, "/"); nested {
			sub := strings.TrimPrefix(dir+"/"+first, "/")
			if !seen[sub] {
				seen[sub] = true
				out = append(out, minipy.FileInfo{Name: sub, IsDir: true})
			}
			continue
		}
		out = append(out, fi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Names come from the code: one that would leave the directory is never written, whatever
// the library returns; nor does a link in the directory lead a write out.
func TestCopyResultStaysInDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "out")
	outside := filepath.Join(base, "outside")
	require.NoError(t, os.MkdirAll(outside, 0o755))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "link")))

	bad := []string{"../escape.txt", "/abs.txt", outside + "/abs.txt", "a/../../escape.txt", "a/../b.txt", "./dot.txt",
		"a//b.txt", "..", ".", "", "nul\x00.txt", "a/.."}
	src := fakeSource{}
	res := &minipy.Result{}
	for _, name := range append(bad, "ok/fine.txt", "link/through.txt") {
		fi := minipy.FileInfo{Name: name, Size: 1, ModTime: time.Now()}
		src[name] = fi
		res.Files = append(res.Files, fi)
	}
	o := &outCopier{dir: dir}
	copied, notes, err := o.copyResult(src, res, time.Now())
	require.Error(t, err, "link/through.txt is refused by the root")
	assert.Contains(t, err.Error(), "link/through.txt")
	require.Len(t, copied, 1)
	assert.Equal(t, outFile{name: "ok/fine.txt", size: int64(len("content of ok/fine.txt")), path: filepath.Join(dir, "ok", "fine.txt")}, copied[0])
	require.Len(t, notes, len(bad)+1)
	for i, name := range bad {
		assert.Equal(t, fmt.Sprintf("not saved %q: the name leads out of %s", name, dir), notes[i])
	}
	assert.Contains(t, notes[len(bad)], "saving link/through.txt: ")
	assert.Equal(t, map[string]string{"ok/fine.txt": "content of ok/fine.txt"}, treeOf(t, dir))
	assert.Empty(t, treeOf(t, outside))
	entries, err := os.ReadDir(base)
	require.NoError(t, err)
	assert.Len(t, entries, 2, "nothing beside out and outside")
}

// With Result.MoreFiles, copyResult walks the directory for files modified since the run's
// start (less outSlack), leaving --put files the run did not change.
func TestCopyResultMoreFiles(t *testing.T) {
	started := time.Now()
	old, recent := started.Add(-time.Hour), started.Add(-outSlack/2)
	src := fakeSource{
		"listed.txt":      {Name: "listed.txt", ModTime: started},
		"a/new.txt":       {Name: "a/new.txt", ModTime: started.Add(time.Millisecond)},
		"a/b/c/deep.txt":  {Name: "a/b/c/deep.txt", ModTime: started.Add(time.Second)},
		"a/slack.txt":     {Name: "a/slack.txt", ModTime: recent},
		"a/old.txt":       {Name: "a/old.txt", ModTime: old},
		"put/same.csv":    {Name: "put/same.csv", ModTime: recent},
		"put/changed.csv": {Name: "put/changed.csv", ModTime: started},
	}
	res := &minipy.Result{Files: []minipy.FileInfo{src["listed.txt"]}, MoreFiles: 4}
	o := &outCopier{dir: t.TempDir(), put: map[string]bool{"put/same.csv": true, "put/changed.csv": true}}
	copied, notes, err := o.copyResult(src, res, started)
	require.NoError(t, err)
	assert.Empty(t, notes)
	var names []string
	for _, f := range copied {
		names = append(names, f.name)
	}
	assert.Equal(t, []string{"listed.txt", "a/b/c/deep.txt", "a/new.txt", "a/slack.txt", "put/changed.csv"}, names)

	// The same when how many is not known.
	res.MoreFiles = minipy.MoreFilesUnknown
	copied, _, err = o.copyResult(src, res, started)
	require.NoError(t, err)
	assert.Len(t, copied, 5)

	// Without MoreFiles only the listed ones.
	res.MoreFiles = 0
	copied, _, err = o.copyResult(src, res, started)
	require.NoError(t, err)
	assert.Len(t, copied, 1)
}

// The --json document's more_files: Result.MoreFiles less those --out found, and -1 (some
// may have been left out) only without --out, whose walk looks for all of them.
func TestJSONMoreFiles(t *testing.T) {
	res := &minipy.Result{Files: []minipy.FileInfo{{Name: "a.txt", Size: 1}}, MoreFiles: minipy.MoreFilesUnknown}
	files, more := jsonFiles(res, nil, false)
	assert.Equal(t, []jsonFile{{Name: "a.txt", Size: 1}}, files)
	assert.Equal(t, -1, more)
	copied := []outFile{{name: "a.txt", size: 1, path: "out/a.txt"}, {name: "b.txt", size: 2, path: "out/b.txt"}}
	files, more = jsonFiles(res, copied, true)
	assert.Equal(t, []jsonFile{{Name: "a.txt", Size: 1, Path: "out/a.txt"}, {Name: "b.txt", Size: 2, Path: "out/b.txt"}}, files)
	assert.Zero(t, more)
	res.MoreFiles = 3
	_, more = jsonFiles(res, copied, true)
	assert.Equal(t, 2, more, "one of the three found")
}

// A file that cannot be read leaves the local one as it was.
func TestCopyOutKeepsLocalFileOnSourceError(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gone.txt"), []byte("kept"), 0o644))
	res := &minipy.Result{Files: []minipy.FileInfo{{Name: "gone.txt"}}}
	copied, notes, err := (&outCopier{dir: dir}).copyResult(fakeSource{}, res, time.Now())
	require.NoError(t, err)
	assert.Empty(t, copied)
	assert.Equal(t, []string{"not saved gone.txt: gone since the run"}, notes)
	b, err := os.ReadFile(filepath.Join(dir, "gone.txt"))
	require.NoError(t, err)
	assert.Equal(t, "kept", string(b))
}

func TestParsePut(t *testing.T) {
	local := localTree(t)
	t.Chdir(local)
	for arg, want := range map[string]putSpec{
		"sales.csv":             {local: "sales.csv", name: "sales.csv"},
		"./sales.csv":           {local: "./sales.csv", name: "sales.csv"},
		"sales.csv:in/x.csv":    {local: "sales.csv", name: "in/x.csv"},
		"sales.csv:in/":         {local: "sales.csv", name: "in/sales.csv"},
		"sales.csv:.":           {local: "sales.csv", name: "sales.csv"},
		"sales.csv:./in//x.csv": {local: "sales.csv", name: "in/x.csv"},
		"data":                  {local: "data", name: "data", dir: true},
		"data/":                 {local: "data/", name: "data", dir: true},
		"data:.":                {local: "data", name: ".", dir: true},
		"data:in/":              {local: "data", name: "in/data", dir: true},
		".":                     {local: ".", name: filepath.Base(local), dir: true},
	} {
		want.arg = arg
		got, err := parsePut(arg)
		if assert.NoError(t, err, arg) {
			assert.Equal(t, want, got, arg)
		}
	}
	// A LOCAL with ':' in its name is taken whole when it exists.
	require.NoError(t, os.WriteFile("a:b", nil, 0o644))
	got, err := parsePut("a:b")
	require.NoError(t, err)
	assert.Equal(t, putSpec{arg: "a:b", local: "a:b", name: "a:b"}, got)

	for _, arg := range []string{":x", "", "missing", "sales.csv:/abs", "sales.csv:..", "data:../up"} {
		_, err := parsePut(arg)
		assert.Error(t, err, arg)
	}
}

func TestSizeText(t *testing.T) {
	for n, want := range map[int64]string{0: "0 bytes", 1: "1 byte", 10: "10 bytes", 1023: "1023 bytes", 1024: "1 KB",
		23 * 1024: "23 KB", 3 << 20: "3.0 MB"} {
		assert.Equal(t, want, sizeText(n), n)
	}
}

// --put in the REPL: the files are there for the first cell; --out copies each cell's files.
func TestREPLPutAndOut(t *testing.T) {
	local := localTree(t)
	out := t.TempDir()
	term := startTerminal(t, "--backend", "isolated", "--put", filepath.Join(local, "sales.csv"), "--out", out)
	term.expect(">>> ")
	term.send("open('sales.csv').read().count('\\n')\r")
	term.expect("3\r\n")
	term.expect(">>> ")
	term.send("open('one.txt', 'w').write('1')\r")
	term.expect("minipy: saved one.txt (1 byte) to " + filepath.Join(out, "one.txt"))
	term.expect(">>> ")
	term.send("open('two.txt', 'w').write('22'); 1/0\r")
	term.expect("ZeroDivisionError")
	term.expect("minipy: saved two.txt (2 bytes) to " + filepath.Join(out, "two.txt"))
	term.expect(">>> ")
	term.exit()
	assert.Equal(t, map[string]string{"one.txt": "1", "two.txt": "22"}, treeOf(t, out))
}

func TestCLIOutDirError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	code, stdout, errOut := cli(t, "", "--isolated", "--out", file, "-c", "open('y', 'w').write('y')")
	assert.Equal(t, 1, code, "the code ran, its files could not be saved")
	assert.Equal(t, "1\n", stdout)
	assert.Equal(t, "minipy: saving files: mkdir "+file+": not a directory\n", errOut)
}
