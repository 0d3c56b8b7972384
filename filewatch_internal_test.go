package minipy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A file the host's WriteFile wrote, closed during a run by a worker that inherited the
// host's descriptor (here: opened and closed for writing by the test itself, as the child's
// exec would), is not the run's change, even when its ctime falls within the run's window.
func TestFileWatchHostWrites(t *testing.T) {
	e, err := NewIsolated(IsolatedConfig{})
	require.NoError(t, err)
	defer e.Close()
	ns := e.NewNamespace()
	defer ns.Close()
	_, err = e.Minipy("1", &Options{Globals: ns}) // the watches are set up
	require.NoError(t, err)
	require.NoError(t, ns.WriteFile("host.txt", []byte("h")))
	b := bindingOf(ns)
	for _, hostWrote := range []bool{true, false} {
		if !hostWrote {
			e.watch.mu.Lock()
			e.watch.spaces[b].host = nil // as if the host had not said so
			e.watch.mu.Unlock()
		}
		track := e.watch.begin(b)
		track.since = track.since.Add(-time.Hour) // the write is within the window either way
		f, err := os.OpenFile(filepath.Join(ns.WorkDir(), "host.txt"), os.O_WRONLY, 0)
		require.NoError(t, err)
		require.NoError(t, f.Close()) // IN_CLOSE_WRITE, and nothing else
		files, _ := e.watch.end(track)
		if hostWrote {
			assert.Empty(t, files, "the host's own write")
		} else {
			require.Len(t, files, 1, "without hostWrote the close counts: the test can fail")
			assert.Equal(t, "host.txt", files[0].Name)
		}
	}
}

// BenchmarkFileWatchRun: what Result.Files adds to each run that writes nothing (begin and
// end around it), whatever the size of the tree.
func BenchmarkFileWatchRun(b *testing.B) {
	e, err := NewIsolated(IsolatedConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	ns := e.NewNamespace()
	defer ns.Close()
	for i := range 2000 {
		if err := ns.WriteFile(filepath.Join("d", string(rune('a'+i%20)), "f"+time.Duration(i).String()), nil); err != nil {
			b.Fatal(err)
		}
	}
	bind := bindingOf(ns)
	e.watch.end(e.watch.begin(bind)) // the watches
	for b.Loop() {
		if files, _ := e.watch.end(e.watch.begin(bind)); len(files) != 0 {
			b.Fatal(files)
		}
	}
}
