package minipy_test

import (
	"context"
	"io/fs"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// awaitEvent reads ch until an event that want accepts (within 10 s).
func awaitEvent(t *testing.T, ch <-chan minipy.FileEvent, want minipy.FileEvent) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			require.True(t, ok, "the watch ended before %+v", want)
			if ev == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %+v", want)
		}
	}
}

// WatchDir reports what the code and the host do under a directory: made, written,
// removed, moved; with recursive, below it too, in directories made after the watch
// began; it ends with its context, or with the directory.
func TestWatchDir(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.MakeDir("d/sub"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	all, err := ns.WatchDir(ctx, "d", true)
	require.NoError(t, err)
	top, err := ns.WatchDir(ctx, "d", false)
	require.NoError(t, err)

	valueIn(t, e, ns, "open('d/a.txt', 'w').write('a')")
	awaitEvent(t, all, minipy.FileEvent{Name: "a.txt", Op: minipy.FileCreated})
	awaitEvent(t, all, minipy.FileEvent{Name: "a.txt", Op: minipy.FileWritten})
	require.NoError(t, ns.WriteFile("d/sub/b.txt", []byte("b")))
	awaitEvent(t, all, minipy.FileEvent{Name: "sub/b.txt", Op: minipy.FileCreated})
	require.NoError(t, ns.MakeDir("d/new"))
	awaitEvent(t, all, minipy.FileEvent{Name: "new", Op: minipy.FileCreated, IsDir: true})
	valueIn(t, e, ns, "open('d/new/c.txt', 'w').write('c')\nimport os\nos.rename('d/a.txt', 'd/moved.txt')")
	awaitEvent(t, all, minipy.FileEvent{Name: "new/c.txt", Op: minipy.FileWritten})
	awaitEvent(t, all, minipy.FileEvent{Name: "a.txt", Op: minipy.FileRenamed})
	awaitEvent(t, all, minipy.FileEvent{Name: "moved.txt", Op: minipy.FileCreated})
	require.NoError(t, ns.Remove("d/moved.txt"))
	awaitEvent(t, all, minipy.FileEvent{Name: "moved.txt", Op: minipy.FileRemoved})

	// Not recursive: the directory's own entries only.
	awaitEvent(t, top, minipy.FileEvent{Name: "new", Op: minipy.FileCreated, IsDir: true})
	for len(top) > 0 {
		ev := <-top
		assert.NotContains(t, ev.Name, "/", "%+v below the directory", ev)
	}

	cancel()
	for range all {
	}
	_, err = ns.WatchDir(context.Background(), "missing", false)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	require.NoError(t, ns.WriteFile("file.txt", []byte("f")))
	_, err = ns.WatchDir(context.Background(), "file.txt", false)
	assert.ErrorIs(t, err, syscall.ENOTDIR)

	gone, err := ns.WatchDir(context.Background(), "d", true)
	require.NoError(t, err)
	require.NoError(t, ns.Remove("d"))
	done := time.After(10 * time.Second)
	for ended := false; !ended; {
		select {
		case _, ok := <-gone:
			ended = !ok
		case <-done:
			t.Fatal("the watch of a removed directory did not end")
		}
	}
	in := minipy.NewNamespace()
	defer in.Close()
	_, err = in.WatchDir(context.Background(), ".", false)
	assert.ErrorIs(t, err, minipy.ErrNoFiles)
}
