package worker

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNobodyMay: the sandbox's user of a root host has, by a file's mode, the owner's bits
// when it owns it, the group's when its group is nogroup, else the others'.
func TestNobodyMay(t *testing.T) {
	for _, c := range []struct {
		uid, gid, mode, want uint32
		may                  bool
	}{
		{0, 0, 0o755, 5, true}, {0, 0, 0o755, 7, false}, {0, 0, 0o700, 5, false}, {0, 0, 0o777, 7, true},
		{0, 0, 0o644, 4, true}, {0, 0, 0o600, 4, false},
		{nobodyID, 0, 0o700, 7, true}, {nobodyID, 0, 0o507, 7, false},
		{0, nobodyID, 0o770, 7, true}, {0, nobodyID, 0o707, 7, false},
	} {
		st := syscall.Stat_t{Uid: c.uid, Gid: c.gid, Mode: syscall.S_IFDIR | c.mode}
		assert.Equal(t, c.may, nobodyMay(&st, c.want), "%+v", c)
	}
}

// TestConfigFrameIdmapped: the config frame tells a worker the fd of each idmapped Mount,
// in order from fd 5 (after the control socket and the control pipe), and nothing for the
// others.
func TestConfigFrameIdmapped(t *testing.T) {
	userns, err := os.Open(os.DevNull) // (any file: only its presence counts here)
	require.NoError(t, err)
	defer userns.Close()
	s := &Spec{Python: "python3", Sandbox: true, Trees: "/e/work", RootDir: "/e/root", Mounts: []Mount{
		{Source: "/a", Target: "/a", Writable: true, userns: userns}, {Source: "/b", Target: "/b"},
		{Source: "/c", Target: "/x/c", userns: userns},
	}}
	lines := configLines(t, s.configFrame(Dirs{Tree: "3", Home: "work"}))
	for _, want := range []string{"mount=rw /a\t/a\t5", "mount=ro /b\t/b", "mount=ro /c\t/x/c\t6"} {
		assert.Contains(t, lines, want)
	}
}

// TestPrepareMounts (root): which Mounts get an idmapped mount (those the sandbox's user
// could not use as they say), one user namespace per owner, and a detached mount of each
// for every worker that starts.
func TestPrepareMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("idmapped mounts are made by a root host")
	}
	dir := t.TempDir()
	mk := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.Mkdir(p, mode))
		require.NoError(t, os.Chmod(p, mode))
		require.NoError(t, os.Chown(p, uid, uid))
		return p
	}
	rootOwn, open, private, theirs := mk("root", 0o755, 0), mk("open", 0o777, 0), mk("private", 0o700, 0), mk("theirs", 0o755, 4321)
	s := &Spec{Python: "python3", Sandbox: true, Mounts: []Mount{
		{Source: rootOwn, Target: "/w", Writable: true}, // nobody may not write it
		{Source: open, Target: "/o", Writable: true},    // nobody may
		{Source: rootOwn, Target: "/r"},                 // nobody may read it
		{Source: private, Target: "/p"},                 // nobody may not
		{Source: theirs, Target: "/t", Writable: true},  // another owner
	}}
	require.NoError(t, s.PrepareMounts())
	defer s.Close()
	idmapped := []bool{}
	for _, m := range s.Mounts {
		idmapped = append(idmapped, m.userns != nil)
	}
	assert.Equal(t, []bool{true, false, false, true, true}, idmapped)
	assert.Same(t, s.Mounts[0].userns, s.Mounts[3].userns, "one user namespace per owner")
	assert.NotSame(t, s.Mounts[0].userns, s.Mounts[4].userns)

	files, err := s.mountFiles()
	require.NoError(t, err)
	require.Len(t, files, 3, "a detached mount per idmapped Mount")
	for _, f := range files {
		info, err := f.Stat()
		require.NoError(t, err)
		assert.True(t, info.IsDir())
	}
	closeFiles(files...)

	s.Close()
	_, err = s.mountFiles()
	assert.ErrorIs(t, err, ErrSandboxAccess, "a worker that starts after Close fails to")
}
