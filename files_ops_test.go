package minipy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// Stat, MakeDir, Rename and Remove change the working directory's tree, and the code sees
// each change; no path leads them out of it.
func TestNamespaceFileOps(t *testing.T) {
	for name, e := range fileEngines(t) {
		t.Run(name, func(t *testing.T) {
			ns := e.NewNamespace()
			defer ns.Close()
			require.NoError(t, ns.MakeDir("a/b/c"))
			require.NoError(t, ns.MakeDir("a/b/c"), "one that is there already")
			require.NoError(t, ns.WriteFile("a/b/f.txt", []byte("hello")))
			assert.Error(t, ns.MakeDir("a/b/f.txt"), "a file is there")

			fi, err := ns.Stat("a/b/f.txt")
			require.NoError(t, err)
			assert.Equal(t, "a/b/f.txt", fi.Name)
			assert.Equal(t, int64(5), fi.Size)
			assert.True(t, fi.Mode.IsRegular())
			fi, err = ns.Stat("a/b")
			require.NoError(t, err)
			assert.True(t, fi.IsDir && fi.Mode.IsDir())
			fi, err = ns.Stat("")
			require.NoError(t, err)
			assert.True(t, fi.IsDir, "the working directory itself")
			_, err = ns.Stat("missing")
			assert.ErrorIs(t, err, fs.ErrNotExist)

			require.NoError(t, ns.Rename("a/b/f.txt", "moved/g.txt"))
			require.NoError(t, ns.Rename("a/b/c", "d"))
			assert.Equal(t, []any{"hello", true, false}, valueIn(t, e, ns,
				`import os; (open("moved/g.txt").read(), os.path.isdir("d"), os.path.exists("a/b/f.txt"))`))

			require.NoError(t, ns.Remove("moved/g.txt"))
			require.NoError(t, ns.Remove("a"))
			_, err = ns.Stat("a")
			assert.ErrorIs(t, err, fs.ErrNotExist)
			assert.ErrorIs(t, ns.Remove("a"), fs.ErrNotExist)
			assert.Error(t, ns.Remove(""), "the working directory itself")

			for _, bad := range []string{"../x", "/etc", "a/../../x"} {
				assert.ErrorIs(t, ns.MakeDir(bad), minipy.ErrBadPath, bad)
				assert.ErrorIs(t, ns.Remove(bad), minipy.ErrBadPath, bad)
				assert.ErrorIs(t, ns.Rename("d", bad), minipy.ErrBadPath, bad)
				_, err := ns.Stat(bad)
				assert.ErrorIs(t, err, minipy.ErrBadPath, bad)
			}
		})
	}
}

// The code's symbolic links are never followed: Stat describes the link, Remove removes the
// link (or the directory holding it) and nothing it points to, even a directory of the host
// that the host could write; a path through a link is refused.
func TestNamespaceFileOpsLinks(t *testing.T) {
	victim := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(victim, "precious"), []byte("x"), 0o644))
	for name, e := range fileEngines(t) {
		t.Run(name, func(t *testing.T) {
			ns := e.NewNamespace()
			defer ns.Close()
			valueIn(t, e, ns, `import os
os.makedirs("tree/sub")
os.symlink(`+pyString(victim)+`, "tree/sub/link")
os.symlink(`+pyString(victim)+`, "top")
os.symlink("/", "root")`)
			fi, err := ns.Stat("top")
			require.NoError(t, err)
			assert.Equal(t, fs.ModeSymlink, fi.Mode.Type())
			assert.Equal(t, victim, fi.Target, "a link's target, as it holds it")
			listed, err := ns.ListFiles("tree/sub")
			require.NoError(t, err)
			require.Len(t, listed, 1)
			assert.Equal(t, victim, listed[0].Target)
			fi, err = ns.Stat("tree")
			require.NoError(t, err)
			assert.Empty(t, fi.Target, "no target but a link's")
			_, err = ns.Stat("root/etc/passwd")
			assert.ErrorIs(t, err, minipy.ErrBadPath, "a path through a link")
			assert.ErrorIs(t, ns.MakeDir("top/new"), minipy.ErrBadPath)
			assert.ErrorIs(t, ns.Rename("top/precious", "stolen"), minipy.ErrBadPath)
			assert.ErrorIs(t, ns.Remove("top/precious"), minipy.ErrBadPath)
			require.NoError(t, ns.Remove("tree"))
			require.NoError(t, ns.Remove("top"))
			_, err = os.Stat(filepath.Join(victim, "precious"))
			assert.NoError(t, err, "the host's file behind the links is gone")
			_, err = ns.Stat("tree")
			assert.ErrorIs(t, err, fs.ErrNotExist)
		})
	}
}

func pyString(s string) string { return "r'" + s + "'" }

// The in-process engine has no working directory of its own.
func TestNamespaceFileOpsInProcess(t *testing.T) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	assert.ErrorIs(t, ns.MakeDir("x"), minipy.ErrNoFiles)
	assert.ErrorIs(t, ns.Remove("x"), minipy.ErrNoFiles)
	assert.ErrorIs(t, ns.Rename("x", "y"), minipy.ErrNoFiles)
	_, err := ns.Stat("x")
	assert.ErrorIs(t, err, minipy.ErrNoFiles)
}
