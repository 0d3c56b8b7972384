package minipy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// Spares: N keeps N sandboxes started from NewIsolated on; each NewNamespace takes one
// whose worker is up (a hit) and the pool starts its replacement. The namespaces made
// from spares are each a sandbox of their own.
func TestSparesFixed(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Spares: 3})
	require.Eventually(t, func() bool { return minipy.ReadySpares(e) == 3 }, 60*time.Second, 10*time.Millisecond,
		"three spares before any NewNamespace")
	st := e.Stats()
	assert.Equal(t, 3, st.Spares)
	assert.Equal(t, 1+3, st.Workers, "the default namespace's worker and the spares")
	var made []*minipy.Namespace
	for i := range 3 {
		ns := e.NewNamespace()
		t.Cleanup(func() { ns.Close() })
		_, err := e.Run(t.Context(), fmt.Sprintf("x = %d", i), &minipy.Options{Globals: ns})
		require.NoError(t, err)
		made = append(made, ns)
	}
	st = e.Stats()
	assert.Equal(t, uint64(3), st.SpareHits, "each took a ready spare")
	assert.Zero(t, st.SpareMisses)
	sandboxes := map[string]bool{}
	for i, ns := range made {
		r, err := e.Run(t.Context(), "import os; (x, 'y' in globals(), os.readlink('/proc/self/ns/pid'))",
			&minipy.Options{Globals: ns})
		require.NoError(t, err)
		v := r.Value.([]any)
		assert.Equal(t, []any{int64(i), false}, v[:2], "its own variables")
		sandboxes[v[2].(string)] = true
		_, err = e.Run(t.Context(), "y = 1", &minipy.Options{Globals: ns})
		require.NoError(t, err)
	}
	assert.Len(t, sandboxes, 3, "a pid namespace each")
	require.Eventually(t, func() bool { return minipy.ReadySpares(e) == 3 }, 60*time.Second, 10*time.Millisecond,
		"the pool back to three")
	assert.Equal(t, 1+3+3, e.Stats().Workers)
}

// Spares < 0 keeps none: each NewNamespace starts its own worker (a miss).
func TestSparesNone(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{Spares: -1})
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"))
	assert.Never(t, func() bool { return e.Stats().Spares > 0 }, 500*time.Millisecond, 20*time.Millisecond)
	st := e.Stats()
	assert.Equal(t, uint64(1), st.SpareMisses)
	assert.Zero(t, st.SpareHits)
	assert.Equal(t, 2, st.Workers, "the default namespace's and this one's")
}

// The default pool adapts: none before the first NewNamespace; after a burst as many
// spares as the burst's calls, which the next burst takes ready; back to one once the
// calls age out of the window.
func TestSparesAdaptive(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	assert.Never(t, func() bool { return e.Stats().Spares > 0 }, 300*time.Millisecond, 20*time.Millisecond,
		"no idle worker before a NewNamespace")
	minipy.SetSpareWindow(e, time.Minute) // (a loaded machine's starts are slow)
	burst := func() {
		for range 4 {
			ns := e.NewNamespace()
			t.Cleanup(func() { ns.Close() })
			assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"))
		}
	}
	burst()
	require.Eventually(t, func() bool { return minipy.ReadySpares(e) == 4 }, 60*time.Second, 10*time.Millisecond,
		"a spare for each call of the burst")
	before := e.Stats()
	burst()
	after := e.Stats()
	assert.Equal(t, before.SpareHits+4, after.SpareHits, "the next burst served from the pool")
	assert.Equal(t, before.SpareMisses, after.SpareMisses)
	minipy.SetSpareWindow(e, 50*time.Millisecond)
	require.Eventually(t, func() bool { return e.Stats().Spares == 1 }, 30*time.Second, 20*time.Millisecond,
		"one spare once the calls age out")
}

func TestSparesNeedAWorkerPerNamespace(t *testing.T) {
	_, err := minipy.NewIsolated(minipy.IsolatedConfig{Workers: 2, Spares: 1})
	require.Error(t, err)
}

// A spare whose start fails is dropped, and the pool waits before it starts another (a
// broken Python must not become a loop of failing starts); it refills once starts work.
func TestSparesStartFailure(t *testing.T) {
	dir := sandboxReadableDir(t)
	python := filepath.Join(dir, "python3")
	require.NoError(t, os.Symlink(minipy.LinkedPython(), python))
	e := newIsolated(t, minipy.IsolatedConfig{Python: python, NoTemplate: true, Spares: 2})
	require.Eventually(t, func() bool { return minipy.ReadySpares(e) == 2 }, 60*time.Second, 10*time.Millisecond)

	require.NoError(t, os.Remove(python)) // workers cannot start now
	failed := e.Stats().StartFailures
	for range 2 {
		ns := e.NewNamespace()
		t.Cleanup(func() { ns.Close() })
		assert.Equal(t, int64(2), valueIn(t, e, ns, "1 + 1"), "a spare started before")
	}
	time.Sleep(1500 * time.Millisecond)
	st := e.Stats()
	assert.LessOrEqual(t, st.StartFailures-failed, uint64(4), "the pool waits after a failed start")
	assert.Zero(t, minipy.ReadySpares(e))

	require.NoError(t, os.Symlink(minipy.LinkedPython(), python))
	require.Eventually(t, func() bool { return minipy.ReadySpares(e) == 2 }, 60*time.Second, 10*time.Millisecond,
		"the pool refills once starts work again")
}
