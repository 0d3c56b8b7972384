package minipy_test

import (
	"testing"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A file's attributes under a prefix: set by the host and read by the code, set by the code
// and read by the host; setting them again replaces those under the prefix only; a
// symbolic link has none to give.
func TestFileAttrs(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.WriteFile("a.txt", []byte("a")))
	err := ns.SetFileAttrs("a.txt", "e2b.", map[string]string{"author": "mish", "purpose": "upload"})
	if assert.NoError(t, err) {
		assert.Equal(t, "mish", valueIn(t, e, ns, "import os\nos.getxattr('a.txt', 'user.e2b.author').decode()"))
		valueIn(t, e, ns, "os.setxattr('a.txt', 'user.e2b.added', b'by code')\nos.setxattr('a.txt', 'user.other', b'kept')")
		got, err := ns.FileAttrs("a.txt", "e2b.")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"author": "mish", "purpose": "upload", "added": "by code"}, got)

		require.NoError(t, ns.SetFileAttrs("a.txt", "e2b.", map[string]string{"author": "ann"}))
		got, err = ns.FileAttrs("a.txt", "e2b.")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"author": "ann"}, got, "the others under the prefix go")
		require.NoError(t, ns.SetFileAttrs("a.txt", "e2b.", nil))
		got, err = ns.FileAttrs("a.txt", "e2b.")
		require.NoError(t, err)
		assert.Empty(t, got)
		all, err := ns.FileAttrs("a.txt", "")
		require.NoError(t, err)
		assert.Equal(t, map[string]string{"other": "kept"}, all, "what is not under the prefix stays")
	}
	valueIn(t, e, ns, "import os\nos.symlink('a.txt', 'link')")
	_, err = ns.FileAttrs("link", "e2b.")
	assert.Error(t, err, "a link's are not read through it")
	assert.Error(t, ns.SetFileAttrs("a.txt", "e2b.", map[string]string{"": "x"}))

	in := minipy.NewNamespace()
	defer in.Close()
	_, err = in.FileAttrs("a.txt", "")
	assert.ErrorIs(t, err, minipy.ErrNoFiles)
}
