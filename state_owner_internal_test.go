package minipy

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/worker"
)

// A copy of a working directory that keeps owners (a sandbox with a root user's, moved to
// a new template) keeps root's entries root's; one that does not makes everything the
// user's.
func TestCopyFilesKeepsRoot(t *testing.T) {
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
	dstRoot := func(dir string) *workRoot {
		return &workRoot{fd: open(dir), owner: worker.UID(), wrote: func(string, syscall.Timespec) {}}
	}
	require.NoError(t, copyFiles(&workRoot{fd: open(src), keepRoot: true}, dstRoot(dst), "."))
	assert.Equal(t, map[string]uint32{"d": root, "d/root.txt": root, "user.txt": user, "link": root}, owners(dst))
	plain := t.TempDir()
	require.NoError(t, copyFiles(&workRoot{fd: open(src)}, dstRoot(plain), "."))
	assert.Equal(t, map[string]uint32{"d": user, "d/root.txt": user, "user.txt": user, "link": user}, owners(plain))
}
