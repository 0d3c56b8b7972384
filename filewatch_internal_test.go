package minipy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// BenchmarkFileWatchWalk: the end of a run of a capped namespace (past its bound on
// watches), which walks walkLimit entries: files in directories without a watch, whose
// ctime is read, or in a watched one, whose events name them.
func BenchmarkFileWatchWalk(b *testing.B) {
	for _, watched := range []bool{false, true} {
		b.Run(map[bool]string{false: "unwatched", true: "watched"}[watched], func(b *testing.B) {
			e, err := NewIsolated(IsolatedConfig{})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			ns := e.NewNamespace()
			defer ns.Close()
			const dirs = 200
			for i := range walkLimit - dirs - 1 {
				name := filepath.Join("d"+strconv.Itoa(i%dirs), "f"+strconv.Itoa(i))
				if watched {
					name = "f" + strconv.Itoa(i)
				}
				if err := ns.WriteFile(name, nil); err != nil {
					b.Fatal(err)
				}
			}
			for i := range dirs {
				if err := os.MkdirAll(filepath.Join(ns.WorkDir(), "d"+strconv.Itoa(i)), 0o777); err != nil {
					b.Fatal(err)
				}
			}
			e.watch.mu.Lock()
			e.watch.nsLimit = 1 // the working directory
			e.watch.mu.Unlock()
			bind := bindingOf(ns)
			e.watch.end(e.watch.begin(bind)) // the watches
			// Past the slack: a file written less than fileClockSlack before a run's begin
			// counts as changed, and a fast machine makes the files and the watches within it.
			time.Sleep(5 * fileClockSlack)
			var before, after syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &before) //nolint:errcheck
			for b.Loop() {
				if files, more := e.watch.end(e.watch.begin(bind)); len(files) != 0 || more != 0 {
					b.Fatal(files, more)
				}
			}
			syscall.Getrusage(syscall.RUSAGE_SELF, &after) //nolint:errcheck
			cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
			// The process's CPU time, not the wall's: a loaded machine shares its cores.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/walkLimit, "cpu-ns/entry")
		})
	}
}

// An engine's bound on watches leaves three quarters of the host user's budget to the rest.
func TestEngineWatches(t *testing.T) {
	assert.Equal(t, engineWatchLimit, engineWatches(192530))
	assert.Equal(t, 2048, engineWatches(8192), "an old kernel's default")
	assert.Equal(t, 1, engineWatches(1))
	assert.Equal(t, engineWatchLimit, engineWatches(-1), "unread")
}

// The docs state the bounds on watches and walks as they are.
func TestFileWatchBoundsDocumented(t *testing.T) {
	comma := func(n int) string { return fmt.Sprintf("%d,%03d", n/1000, n%1000) }
	for _, doc := range []string{"docs/isolated.md", "docs/protocol.md"} {
		b, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, n := range []int{nsWatchLimit, engineWatchLimit, walkLimit, listLimit} {
			assert.True(t, strings.Contains(string(b), comma(n)), "%s does not say %s", doc, comma(n))
		}
	}
}

// BenchmarkFileWatchSetup: a run's setting up of its namespace's watches anew (its first,
// or after lost events), per directory entry listed: a folder of files, and folders.
func BenchmarkFileWatchSetup(b *testing.B) {
	const n = 20000
	e, err := NewIsolated(IsolatedConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	ns := e.NewNamespace()
	defer ns.Close()
	if _, err := e.Minipy(fmt.Sprintf(`import os
os.mkdir("flat")
for i in range(%d): open("flat/%%d" %% i, "w").close()
for i in range(100): os.makedirs("d/%%d" %% i)`, n), &Options{Globals: ns}); err != nil {
		b.Fatal(err)
	}
	bind := bindingOf(ns)
	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before) //nolint:errcheck
	for b.Loop() {
		e.watch.mu.Lock()
		e.watch.spaces[bind].whole = false
		e.watch.mu.Unlock()
		e.watch.end(e.watch.begin(bind))
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &after) //nolint:errcheck
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/(n+102), "cpu-ns/entry")
}
