package minipy

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy/internal/worker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// BenchmarkWorkDirMake is what making and removing a working directory costs (each
// spare's start makes one, off NewNamespace's path): "tmpfs" has the template mount one (WorkSize, a
// round trip to it), "disk" makes a directory only.
func BenchmarkWorkDirMake(b *testing.B) {
	for _, c := range []struct {
		name string
		size int64
	}{{"tmpfs", 0}, {"disk", -1}} {
		b.Run(c.name, func(b *testing.B) {
			e, err := NewIsolated(IsolatedConfig{WorkSize: c.size})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			for b.Loop() {
				d := e.newDirs()
				if d.err != nil {
					b.Fatal(d.err)
				}
				e.releaseDirs(d)
			}
		})
	}
}

// The template's loop in C mounts working directories' tmpfs, and leaves to template.py
// what it does not take on (a bad name or size, a directory that is not there), which
// refuses it with the reason; the template goes on serving either way.
func TestTemplateMountRequests(t *testing.T) {
	e, err := NewIsolated(IsolatedConfig{Spares: -1})
	require.NoError(t, err)
	defer e.Close()
	ns := e.NewNamespace()
	defer ns.Close()
	_, err = e.Run(context.Background(), "1+1", &Options{Globals: ns})
	require.NoError(t, err)
	d := e.newDirs() // (the template's loop mounts its tree's tmpfs and its working directory's)
	require.NoError(t, d.err)
	defer e.releaseDirs(d)
	e.tmplMu.Lock()
	tmpl := e.tmpl
	e.tmplMu.Unlock()
	require.NotNil(t, tmpl)
	ask := func(tree, name string, size int64) (int, error) {
		return e.work.AskMount(tmpl, tree, name, size, 20*time.Second)
	}
	dev := func(fd int) uint64 {
		var st syscall.Stat_t
		require.NoError(t, syscall.Fstat(fd, &st))
		return st.Dev
	}
	a, err := ask(d.tree.Name, "", e.work.TreeSize())
	require.NoError(t, err, "the tree's tmpfs, mounted already: its root again")
	b, err := ask(d.tree.Name, "", e.work.TreeSize())
	require.NoError(t, err)
	assert.Equal(t, dev(a), dev(b))
	require.NoError(t, os.Mkdir(filepath.Join(e.work.TreeRoot(d.tree.Tree), "other"), 0o755))
	c, err := ask(d.tree.Name, "other", 1<<20)
	require.NoError(t, err, "a working directory's")
	assert.NotEqual(t, dev(a), dev(c))
	for _, fd := range []int{a, b, c} {
		syscall.Close(fd)
	}
	for _, bad := range []struct {
		tree, name string
		size       int64
		why        string
	}{
		{d.tree.Name, "", 0, "bad size 0"},
		{d.tree.Name, "x", -5, "bad size -5"},
		{"..", "", 4096, "bad working directory names"},
		{d.tree.Name, "a/b", 4096, "bad working directory names"},
		{d.tree.Name, "missing", 4096, "No such file or directory"},
		{"missing", "", 4096, "No such file or directory"},
	} {
		_, err := ask(bad.tree, bad.name, bad.size)
		require.Error(t, err, "%+v", bad)
		assert.NotErrorIs(t, err, worker.ErrTemplateGone)
		assert.Contains(t, err.Error(), bad.why, "%+v: refused by template.py, with the reason", bad)
	}
	other := e.NewNamespace() // (the loop in C again)
	defer other.Close()
	_, err = e.Run(context.Background(), "1+1", &Options{Globals: other})
	require.NoError(t, err)
}
