package minipy_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/internal/opcount"
)

// stateBenchCell fills a namespace as issue 23 measures it: a 10 MB numpy array and 100
// variables (numbers, strings, lists, dicts, a function and a class among them).
const stateBenchCell = `
import numpy as np
big = np.random.default_rng(1).random(10 * 2**20 // 8)
def f(x):
    return x + 1
class C:
    def __init__(self, i):
        self.i = i
for i in range(100):
    globals()["v%d" % i] = [i, "s" * i, {"k": i / 3}, C(i)] if i % 2 else f
`

// stateSmallCell is a session's usual state: a few numbers, strings and a small dict.
const stateSmallCell = "x = 1\nname = 'run'\nrows = {i: str(i) for i in range(20)}\n"

// BenchmarkSaveRestore measures Namespace.Save and Restore of stateBenchCell's namespace
// in each engine, back to back: save; restore into one namespace of the same engine; and,
// for the isolated engine, restore-new: a new namespace and a Restore into it (what a
// paused E2B sandbox's resume and a saved session's bring-back do), with the start of the
// spare that replaces it, and restore-new-small, the same with stateSmallCell's namespace. Metrics: us (the median), the saved size, and the counts per
// operation over the whole process tree (docs/benchmarks.md, "Counts").
func BenchmarkSaveRestore(b *testing.B) {
	// Counted from before the engine starts: the kernel counts only the processes started
	// after the count began (its template, and the workers and snapshots forked from it).
	m := meter(b)
	iso, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer iso.Close()
	for _, c := range []struct {
		name   string
		engine minipy.Engine
		newNS  func() *minipy.Namespace
	}{
		{"in-process", minipy.InProcess(), minipy.NewNamespace},
		{"isolated", iso, iso.NewNamespace},
	} {
		ns := c.newNS()
		if _, err := c.engine.Run(context.Background(), stateBenchCell, &minipy.Options{Globals: ns}); err != nil {
			b.Fatal(err)
		}
		var saved bytes.Buffer
		b.Run(c.name+"/save", func(b *testing.B) {
			countOps(b, m, func() {
				saved.Reset()
				if _, err := ns.Save(&saved); err != nil {
					b.Fatal(err)
				}
			})
			b.ReportMetric(float64(saved.Len())/(1<<20), "MB")
		})
		target := c.newNS()
		b.Run(c.name+"/restore", func(b *testing.B) {
			countOps(b, m, func() {
				if err := target.Restore(bytes.NewReader(saved.Bytes())); err != nil {
					b.Fatal(err)
				}
			})
		})
		if c.engine == iso {
			b.Run(c.name+"/restore-new", func(b *testing.B) { restoreNew(b, m, c.newNS, saved.Bytes()) })
			small := c.newNS()
			var blob bytes.Buffer
			if _, err := c.engine.Run(context.Background(), stateSmallCell, &minipy.Options{Globals: small}); err != nil {
				b.Fatal(err)
			}
			if _, err := small.Save(&blob); err != nil {
				b.Fatal(err)
			}
			small.Close()
			b.Run(c.name+"/restore-new-small", func(b *testing.B) { restoreNew(b, m, c.newNS, blob.Bytes()) })
		}
		ns.Close()
		target.Close()
	}
}

// restoreNew restores blob into a new namespace of newNS for each iteration.
func restoreNew(b *testing.B, m countMeter, newNS func() *minipy.Namespace, blob []byte) {
	countOps(b, m, func() {
		fresh := newNS()
		defer fresh.Close()
		if err := fresh.Restore(bytes.NewReader(blob)); err != nil {
			b.Fatal(err)
		}
	})
}

// countOps runs op back to back for the benchmark's loop and reports its median time and
// its counts per operation by m (no floor).
func countOps(b *testing.B, m countMeter, op func()) {
	var took []time.Duration
	before := m.read()
	for b.Loop() {
		start := time.Now()
		op()
		took = append(took, time.Since(start))
	}
	report(b, m, took, nil, m.since(before).Per(len(took)), opcount.PerOp{})
}
