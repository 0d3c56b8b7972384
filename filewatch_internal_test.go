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

	"github.com/minipy-go/minipy/internal/sandboxfs"
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
			e.watch.ForgetHostWrites(b) // as if the host had not said so
		}
		track := e.watch.Begin(b)
		track.Backdate(time.Hour) // the write is within the window either way
		f, err := os.OpenFile(filepath.Join(ns.WorkDir(), "host.txt"), os.O_WRONLY, 0)
		require.NoError(t, err)
		require.NoError(t, f.Close()) // IN_CLOSE_WRITE, and nothing else
		files, _ := e.endFiles(track)
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
	e.endFiles(e.watch.Begin(bind)) // the watches
	for b.Loop() {
		if files, _ := e.endFiles(e.watch.Begin(bind)); len(files) != 0 {
			b.Fatal(files)
		}
	}
}

// BenchmarkFileWatchWalk: the end of a run of a capped namespace (past its bound on
// watches), which walks sandboxfs.WalkLimit entries: files in directories without a watch, whose
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
			for i := range sandboxfs.WalkLimit - dirs - 1 {
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
			e.watch.SetLimits(1, 0, 0, 0) // the working directory
			bind := bindingOf(ns)
			e.endFiles(e.watch.Begin(bind)) // the watches
			// Past the slack: a file written less than sandboxfs.FileClockSlack before a run's begin
			// counts as changed, and a fast machine makes the files and the watches within it.
			time.Sleep(5 * sandboxfs.FileClockSlack)
			var before, after syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &before) //nolint:errcheck
			for b.Loop() {
				if files, more := e.endFiles(e.watch.Begin(bind)); len(files) != 0 || more != 0 {
					b.Fatal(files, more)
				}
			}
			syscall.Getrusage(syscall.RUSAGE_SELF, &after) //nolint:errcheck
			cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
			// The process's CPU time, not the wall's: a loaded machine shares its cores.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/sandboxfs.WalkLimit, "cpu-ns/entry")
		})
	}
}

// The docs state the bounds on watches and walks as they are.
func TestFileWatchBoundsDocumented(t *testing.T) {
	comma := func(n int) string { return fmt.Sprintf("%d,%03d", n/1000, n%1000) }
	for _, doc := range []string{"docs/isolated.md", "docs/protocol.md"} {
		b, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, n := range []int{sandboxfs.NSWatchLimit, sandboxfs.EngineWatchLimit, sandboxfs.WalkLimit, sandboxfs.ListLimit} {
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
		e.watch.Unwatch(bind)
		e.endFiles(e.watch.Begin(bind))
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &after) //nolint:errcheck
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/(n+102), "cpu-ns/entry")
}
