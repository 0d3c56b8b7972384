package cpython

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakePython puts a real ELF executable (a copy of true) at dir/bin/name.
func fakePython(t *testing.T, dir, name string) string {
	t.Helper()
	elf, err := os.ReadFile("/bin/true")
	require.NoError(t, err)
	p := filepath.Join(dir, "bin", name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, elf, 0o755))
	return p
}

func TestFindPythonBesideTheLibrary(t *testing.T) {
	const name = "python3.99" // no such python exists in /usr/bin or on PATH
	root := t.TempDir()
	t.Setenv("PATH", "")

	prefix := filepath.Join(root, "opt", "py")
	want := fakePython(t, prefix, name)
	lib := filepath.Join(prefix, "lib", "libpython3.99.so.1.0")
	require.NoError(t, os.MkdirAll(filepath.Dir(lib), 0o755))
	require.NoError(t, os.WriteFile(lib, nil, 0o644))
	assert.Equal(t, want, findPython(lib, name), "a --enable-shared build: PREFIX/lib gives PREFIX/bin")

	link := filepath.Join(root, "elsewhere", "libpython3.99.so")
	require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
	require.NoError(t, os.Symlink(lib, link))
	assert.Equal(t, want, findPython(link, name), "the library's real file decides, not a symlink to it")

	usr := filepath.Join(root, "usr")
	want = fakePython(t, usr, name)
	multiarch := filepath.Join(usr, "lib", "x86_64-linux-gnu", "libpython3.99.so.1.0")
	assert.Equal(t, want, findPython(multiarch, name), "Debian's multiarch directory is two levels below the prefix")
}

func TestFindPythonSkipsShims(t *testing.T) {
	const name = "python3.99"
	root := t.TempDir()
	shims := filepath.Join(root, "shims")
	require.NoError(t, os.MkdirAll(shims, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(shims, name), []byte("#!/bin/sh\nexec pyenv exec python \"$@\"\n"), 0o755))
	t.Setenv("PATH", shims)
	assert.Equal(t, "", findPython("", name), "a pyenv shim runs whichever Python pyenv selects")

	real := fakePython(t, filepath.Join(root, "real"), name)
	t.Setenv("PATH", shims+string(os.PathListSeparator)+filepath.Dir(real))
	assert.Equal(t, real, findPython("", name), "a statically linked libpython falls back to a real binary on PATH")
	assert.Equal(t, real, findPython(filepath.Join(root, "nowhere", "lib", "libpython3.99.so"), name))
}
