package sandboxfs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openRoot opens dir as a Root (the host's own files: Owner -1), closed with the test.
func openRoot(t *testing.T, dir string, limit int64) *Root {
	fd, err := syscall.Open(dir, OPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	r := &Root{FD: fd, Owner: -1, Limit: limit}
	t.Cleanup(r.Close)
	return r
}

// The code's files are hostile: a link out of the root (absolute, relative, through /proc)
// is ErrBadPath for every operation that would follow it, and the host's file outside is
// neither read nor changed.
func TestRootLinksOut(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(outside, []byte("host"), 0o600))
	dir := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(dir, "abs")))
	require.NoError(t, os.Symlink("../"+filepath.Base(filepath.Dir(outside))+"/secret", filepath.Join(dir, "rel")))
	require.NoError(t, os.Symlink("/proc/self/root"+outside, filepath.Join(dir, "proc")))
	require.NoError(t, os.Symlink(filepath.Dir(outside), filepath.Join(dir, "dirout")))
	r := openRoot(t, dir, 0)
	for _, name := range []string{"abs", "rel", "proc", "dirout/secret"} {
		_, err := r.ReadFile(name)
		assert.ErrorIs(t, err, ErrBadPath, name)
		_, err = r.Write(name, strings.NewReader("x"))
		assert.ErrorIs(t, err, ErrBadPath, name)
	}
	assert.ErrorIs(t, r.MkdirAll("dirout/new"), ErrBadPath)
	assert.ErrorIs(t, r.Rename("abs", "dirout/moved"), ErrBadPath)
	b, err := os.ReadFile(outside)
	require.NoError(t, err)
	assert.Equal(t, "host", string(b))
	_, err = os.Stat(filepath.Join(filepath.Dir(outside), "new"))
	assert.ErrorIs(t, err, fs.ErrNotExist)
	// A link is listed and removed as itself, never followed.
	info, err := r.Stat("abs")
	require.NoError(t, err)
	assert.Equal(t, outside, info.Target)
	require.NoError(t, r.Remove("dirout"))
	_, err = os.Stat(outside)
	assert.NoError(t, err, "removing a link to a directory leaves the directory")
}

// A FIFO never makes the host wait, to read or to write; a name with .. or NUL, or an
// absolute one, is refused before anything is opened.
func TestRootRefusesFIFOsAndBadNames(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o600))
	r := openRoot(t, dir, 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := r.ReadFile("pipe")
		assert.ErrorIs(t, err, fs.ErrInvalid)
		_, err = r.Write("pipe", strings.NewReader("x"))
		assert.ErrorIs(t, err, fs.ErrInvalid)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a FIFO made the host wait")
	}
	for _, bad := range []string{"../x", "a/../../x", "/etc/passwd", "a\x00b"} {
		_, err := CleanName("read", bad, false)
		assert.ErrorIs(t, err, ErrBadPath, "%q", bad)
	}
	_, err := CleanName("read", ".", false)
	assert.ErrorIs(t, err, fs.ErrInvalid)
}

// A sparse file that claims more than the root's limit is refused without reading it, to
// read, to walk (Save) and to size (Usage): the host's memory never holds its holes.
func TestRootSparseFilePastLimit(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "sparse"))
	require.NoError(t, err)
	require.NoError(t, f.Truncate(1<<30))
	require.NoError(t, f.Close())
	r := openRoot(t, dir, 1<<20)
	_, err = r.ReadFile("sparse")
	assert.ErrorIs(t, err, ErrFileTooLarge)
	_, err = r.ReadFileTo("sparse", &bytes.Buffer{})
	assert.ErrorIs(t, err, ErrFileTooLarge)
	var buf bytes.Buffer
	_, err = Tar(r, &buf)
	assert.ErrorIs(t, err, ErrFileTooLarge)
	assert.Zero(t, buf.Len(), "nothing of it written")
	_, err = Size(r)
	assert.ErrorIs(t, err, ErrFileTooLarge)
}

// A tree saved and restored comes back whole: files with their modes, empty and read-only
// directories, links as links (never followed, even one that points out).
func TestRootTarRoundTrip(t *testing.T) {
	src := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(src, "a/b"), 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(src, "empty"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(src, "a/b/f.txt"), []byte("data"), 0o640))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(src, "out")))
	require.NoError(t, os.Mkdir(filepath.Join(src, "ro"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "ro/kept"), []byte("k"), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(src, "ro"), 0o555))
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "ro"), 0o755) })
	var buf bytes.Buffer
	n, err := Tar(openRoot(t, src, 0), &buf)
	require.NoError(t, err)
	assert.Equal(t, 7, n)
	dst := t.TempDir()
	require.NoError(t, Untar(openRoot(t, dst, 0), &buf))
	t.Cleanup(func() { os.Chmod(filepath.Join(dst, "ro"), 0o755) })
	b, err := os.ReadFile(filepath.Join(dst, "a/b/f.txt"))
	require.NoError(t, err)
	assert.Equal(t, "data", string(b))
	for name, mode := range map[string]fs.FileMode{"a/b/f.txt": 0o640, "empty": fs.ModeDir | 0o700, "ro": fs.ModeDir | 0o555} {
		st, err := os.Lstat(filepath.Join(dst, name))
		require.NoError(t, err)
		assert.Equal(t, mode, st.Mode(), name)
	}
	to, err := os.Readlink(filepath.Join(dst, "out"))
	require.NoError(t, err)
	assert.Equal(t, "/etc/passwd", to)
}
