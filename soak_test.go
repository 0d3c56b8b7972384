package minipy_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// soakCells mixes what a session does: values, output, errors, syntax errors, namespace
// churn and big reprs, so a leak in any path of a run shows.
var soakCells = []string{
	"1+1",
	"x = [i * i for i in range(50)]\nsum(x)",
	"print('line', x[3])",
	"1/0",
	"def f(:",
	"{'k': list(range(20)), 's': 'text' * 10}",
	"import sys; sys.stderr.write('warn\\n'); None",
	"'y' * 5000",
	"object()",
	"x;",
}

func rssBytes(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	require.NoError(t, err)
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	require.NoError(t, err)
	return pages * int64(os.Getpagesize())
}

// TestSoak does 100,000 runs and checks that memory does not grow: Python's allocated
// blocks, Go's heap in use and (without -race) the process's RSS under 5 MB.
//
// Under -race a run costs several times more and RSS is not meaningful, so the race build
// does 10,000 runs; `make test` also runs the full soak without -race.
func TestSoak(t *testing.T) {
	runs := 100_000
	if raceEnabled {
		runs = 10_000
	}
	ns := minipy.NewNamespace()
	defer ns.Close()
	opts := &minipy.Options{Globals: ns, MaxOutput: 1000}
	blocks := func() int64 {
		r, err := minipy.Minipy("import sys, gc; gc.collect(); sys.getallocatedblocks()", opts)
		require.NoError(t, err)
		return r.Value.(int64)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	churn := func(n int) {
		for i := 0; i < n; i++ {
			cell := soakCells[i%len(soakCells)]
			minipy.Minipy(cell, opts) //nolint:errcheck // errors are part of the mix
			if i%1000 == 0 {
				tmp := minipy.NewNamespace()
				require.NoError(t, tmp.Set("v", []any{1, "a", map[string]any{"b": 2.5}}))
				_, err := tmp.Get("v")
				require.NoError(t, err)
				require.NoError(t, tmp.Close())
			}
		}
	}
	churn(5_000) // warm caches: linecache, imports, free lists
	rss0, blocks0, heap0 := rssBytes(t), blocks(), heap()
	churn(runs)
	rss1, blocks1, heap1 := rssBytes(t), blocks(), heap()
	t.Logf("after %d runs: RSS %+d KB, Python blocks %+d, Go heap in use %+d KB",
		runs, (rss1-rss0)/1024, blocks1-blocks0, (int64(heap1)-int64(heap0))/1024)
	assert.Less(t, int64(heap1)-int64(heap0), int64(2<<20), "Go heap grows")
	if minipy.FreeThreaded() && minipy.LinkedVersion() == "3.13" {
		// 3.13's free-threaded build makes code objects, functions, classes and modules
		// immortal once a second thread has started in the process (gh-117783; 3.14 dropped
		// it), so every compiled cell stays in memory: no bound on Python's memory holds.
		t.Skipf("3.13t keeps every compiled cell once a thread has started (gh-117783): Python blocks %+d, RSS %+d KB",
			blocks1-blocks0, (rss1-rss0)/1024)
	}
	assert.Less(t, blocks1-blocks0, int64(2000), "Python objects leak")
	if !raceEnabled {
		assert.Less(t, rss1-rss0, int64(5<<20), fmt.Sprintf("RSS grew %d KB", (rss1-rss0)/1024))
	}
}
