package sandboxfs

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/worker"
)

// The walk of a sandbox's root leaves out what the image put there, deciding by the
// sandbox's own view alone: a directory that holds nothing but mounts (/home, the parents
// of a bind, however deep), a link at the root that imageLink names; an empty directory, a
// link and a file of the code's are kept, each directory before what is in it.
func TestTarSinkLeavesTheImageOut(t *testing.T) {
	var buf bytes.Buffer
	s := NewTarSink(&buf)
	s.ImageLink = func(rel, to string) bool { return rel == "bin" }
	steps := []func() error{
		func() error { return s.dir("home", 0o755) }, func() error { s.mount("home"); return nil },
		func() error { return s.dirDone("home", 0o755) },
		func() error { return s.dir("var", 0o755) }, func() error { return s.dir("var/cache", 0o755) },
		func() error { s.mount("var/cache"); return nil }, func() error { return s.dirDone("var/cache", 0o755) },
		func() error { return s.dirDone("var", 0o755) },
		func() error { return s.symlink("bin", "usr/bin") },
		func() error { return s.dir("app", 0o755) }, func() error { return s.dir("app/empty", 0o700) },
		func() error { return s.dirDone("app/empty", 0o700) }, func() error { return s.dir("app/src", 0o755) },
		func() error { return s.file("app/src/main.py", 0o644, 2, strings.NewReader("hi")) },
		func() error { return s.dirDone("app/src", 0o755) }, func() error { return s.dirDone("app", 0o755) },
		func() error { return s.symlink("mine", "app/src") },
	}
	for _, step := range steps {
		require.NoError(t, step())
	}
	require.NoError(t, s.Close())
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
	}
	assert.Equal(t, []string{"app/", "app/empty/", "app/src/", "app/src/main.py", "mine"}, names)
	assert.Equal(t, 5, s.n)
}

// A copy of a working directory that keeps owners (a sandbox with a root user's, moved to
// a new template) keeps root's entries root's; one that does not makes everything the
// user's.
func TestCopyKeepsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("owners other than the host's user need a root host")
	}
	src, dst := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(src, "d"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(src, "d", "root.txt"), []byte("r"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(src, "user.txt"), []byte("u"), 0o644))
	require.NoError(t, os.Symlink("d/root.txt", filepath.Join(src, "link")))
	for _, p := range []string{"d", "d/root.txt"} {
		require.NoError(t, os.Lchown(filepath.Join(src, p), worker.RootUID(), worker.RootUID()))
	}
	require.NoError(t, os.Lchown(filepath.Join(src, "link"), worker.RootUID(), worker.RootUID()))
	open := func(dir string) int {
		fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		require.NoError(t, err)
		t.Cleanup(func() { syscall.Close(fd) })
		return fd
	}
	owners := func(dir string) map[string]uint32 {
		out := map[string]uint32{}
		for _, p := range []string{"d", "d/root.txt", "user.txt", "link"} {
			var st syscall.Stat_t
			require.NoError(t, syscall.Lstat(filepath.Join(dir, p), &st))
			out[p] = st.Uid
		}
		return out
	}
	user, root := uint32(worker.UID()), uint32(worker.RootUID())
	dstRoot := func(dir string) *Root { return &Root{FD: open(dir), Owner: worker.UID()} }
	require.NoError(t, Copy(&Root{FD: open(src), KeepRoot: true}, dstRoot(dst), "."))
	assert.Equal(t, map[string]uint32{"d": root, "d/root.txt": root, "user.txt": user, "link": root}, owners(dst))
	plain := t.TempDir()
	require.NoError(t, Copy(&Root{FD: open(src)}, dstRoot(plain), "."))
	assert.Equal(t, map[string]uint32{"d": user, "d/root.txt": user, "user.txt": user, "link": user}, owners(plain))
}
