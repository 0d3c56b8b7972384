package minipy_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/internal/procstat"
)

// BenchmarkIsolatedRoundTrip is a warm `1+1` on one worker: frame out, dispatch, frame back;
// with the rollback snapshot the worker forks after each answer (the default), and without.
// "rollback-paced" leaves the fork time between runs, as a model's turns do.
func BenchmarkIsolatedRoundTrip(b *testing.B) {
	for _, c := range []struct {
		name  string
		cfg   minipy.IsolatedConfig
		paced bool
	}{{"rollback", minipy.IsolatedConfig{}, false}, {"rollback-paced", minipy.IsolatedConfig{}, true},
		{"no-rollback", minipy.IsolatedConfig{NoRollback: true}, false}} {
		b.Run(c.name, func(b *testing.B) {
			e := newIsolated(b, c.cfg)
			if _, err := e.Minipy("1+1", nil); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if c.paced {
					b.StopTimer()
					time.Sleep(5 * time.Millisecond)
					b.StartTimer()
				}
				if _, err := e.Minipy("1+1", nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkIsolatedWorkerStart is NewIsolated (one sandboxed worker: with the template, the
// template and a worker forked from it) until its first run (1+1) has answered, plus Close.
func BenchmarkIsolatedWorkerStart(b *testing.B) {
	for _, noTemplate := range []bool{false, true} {
		name := "template"
		if noTemplate {
			name = "no-template"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				e, err := minipy.NewIsolated(minipy.IsolatedConfig{NoTemplate: noTemplate})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := e.Minipy("1+1", nil); err != nil {
					b.Fatal(err)
				}
				e.Close()
			}
		})
	}
}

// BenchmarkIsolatedHardKill reports how long after deadline + grace a run stuck in a C loop
// returns (the worker's process tree killed and reaped).
func BenchmarkIsolatedHardKill(b *testing.B) {
	e := newIsolated(b, minipy.IsolatedConfig{})
	const timeout = 50 * time.Millisecond
	const grace = minipy.AbandonAfter // (the benchmark wants an idle machine: no wait for a CPU to add)
	var late time.Duration
	for b.Loop() {
		b.StopTimer()
		if _, err := e.Minipy("1", nil); err != nil { // wait for the replacement worker
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		_, err := e.Minipy("sum(range(10**12))", &minipy.Options{Timeout: timeout})
		late += time.Since(start) - timeout - grace
		if err == nil {
			b.Fatal("the C loop finished")
		}
	}
	b.ReportMetric(float64(late.Microseconds())/float64(b.N)/1000, "ms-after-deadline+grace")
}

// BenchmarkIsolatedThroughput runs a small CPU-bound cell from as many goroutines as there
// are workers, each on a namespace of its own worker.
func BenchmarkIsolatedThroughput(b *testing.B) {
	for _, n := range []int{1, 2, 8} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			e := newIsolated(b, minipy.IsolatedConfig{Workers: n})
			spaces := make([]*minipy.Namespace, n)
			for i := range spaces {
				spaces[i] = e.NewNamespace()
				if _, err := e.Minipy("1", &minipy.Options{Globals: spaces[i]}); err != nil {
					b.Fatal(err)
				}
			}
			const code = "sum(i * i for i in range(20000))"
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range spaces {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := i; j < b.N; j += n {
						if _, err := e.Minipy(code, &minipy.Options{Globals: spaces[i]}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
		})
	}
}

// BenchmarkIsolatedWorkerRestart is a worker crash (os._exit) and the next run, which waits
// for the replacement worker (it loads the runtime as the first worker compiled it).
func BenchmarkIsolatedWorkerRestart(b *testing.B) {
	e := newIsolated(b, minipy.IsolatedConfig{})
	for b.Loop() {
		if _, err := e.Minipy("import os; os._exit(0)", nil); err == nil {
			b.Fatal("the worker did not exit")
		}
		if _, err := e.Minipy("1", nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIsolatedNewNamespace is NewNamespace until its first run (`import numpy`, numpy
// preloaded) has answered, reported as the median too (ms-median); Close is not timed.
// "spare" pauses between namespaces (not timed), so the spare worker is ready;
// "back-to-back" does not (bound by worker starts). Each with workers forked from the
// template (the default, whose working directories are a tmpfs each: WorkSize), the same
// with working directories on the disk, and without the template.
func BenchmarkIsolatedNewNamespace(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  minipy.IsolatedConfig
	}{{"template", minipy.IsolatedConfig{}}, {"template-disk", minipy.IsolatedConfig{WorkSize: -1}},
		{"no-template", minipy.IsolatedConfig{NoTemplate: true}}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := c.cfg
			cfg.Preload = []string{"numpy"}
			e := newIsolated(b, cfg)
			for _, pause := range []time.Duration{150 * time.Millisecond, 0} {
				name := "spare"
				if pause == 0 {
					name = "back-to-back"
				}
				b.Run(name, func(b *testing.B) {
					var took []time.Duration
					for b.Loop() {
						b.StopTimer()
						time.Sleep(pause)
						b.StartTimer()
						start := time.Now()
						ns := e.NewNamespace()
						if _, err := e.Run(context.Background(), "import numpy", &minipy.Options{Globals: ns}); err != nil {
							b.Fatal(err)
						}
						took = append(took, time.Since(start))
						b.StopTimer()
						ns.Close()
						b.StartTimer()
					}
					slices.Sort(took)
					b.ReportMetric(float64(took[len(took)/2])/1e6, "ms-median")
				})
			}
		})
	}
}

// BenchmarkIsolatedFork measures Namespace.Fork of a namespace that has imported numpy
// and holds an 8 MB array, the copy's first run, and its Close.
func BenchmarkIsolatedFork(b *testing.B) {
	e := newIsolated(b, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	if _, err := e.Run(context.Background(), "import numpy\nA = numpy.ones(1 << 20)", &minipy.Options{Globals: ns}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		cp, err := ns.Fork()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.Run(context.Background(), "A.sum()", &minipy.Options{Globals: cp}); err != nil {
			b.Fatal(err)
		}
		cp.Close()
	}
	runtime.KeepAlive(ns)
}

// BenchmarkIsolatedIdleNamespaces reports the memory (sum of PSS over the engine's
// processes) of 50 namespaces that have each run a line, numpy preloaded: one worker per
// namespace (the default) forked from the template, the same without the template, packed
// into 2 workers, and one namespace with 49 forks of it (copy-on-write).
func BenchmarkIsolatedIdleNamespaces(b *testing.B) {
	for _, variant := range []struct {
		name   string
		cfg    minipy.IsolatedConfig
		forked bool
	}{
		{"template", minipy.IsolatedConfig{}, false},
		{"no-template", minipy.IsolatedConfig{NoTemplate: true}, false},
		{"workers=2", minipy.IsolatedConfig{Workers: 2}, false},
		{"forked", minipy.IsolatedConfig{}, true},
	} {
		b.Run(variant.name, func(b *testing.B) {
			cfg := variant.cfg
			cfg.Preload = []string{"numpy"}
			for b.Loop() {
				e, err := minipy.NewIsolated(cfg)
				if err != nil {
					b.Fatal(err)
				}
				var spaces []*minipy.Namespace // kept: a collected namespace is closed
				for i := 0; i < 50; i++ {
					var ns *minipy.Namespace
					if variant.forked && i > 0 {
						if ns, err = spaces[0].Fork(); err != nil {
							b.Fatal(err)
						}
					} else {
						ns = e.NewNamespace()
					}
					spaces = append(spaces, ns)
					if _, err := e.Run(context.Background(), "x = list(range(1000))", &minipy.Options{Globals: ns}); err != nil {
						b.Fatal(err)
					}
				}
				kb, procs := pssUnder(os.Getpid())
				runtime.KeepAlive(spaces)
				b.ReportMetric(float64(kb)/1024, "MB-PSS")
				b.ReportMetric(float64(procs), "processes")
				e.Close()
			}
		})
	}
}

// pssUnder sums the PSS (kB) of root's descendants, and counts them.
func pssUnder(root int) (kb, n int) {
	for _, pid := range procstat.Tree(root)[1:] {
		if pss := procstat.PSS(pid); pss > 0 {
			kb += int(pss >> 10)
			n++
		}
	}
	return kb, n
}

// BenchmarkIsolatedStats is Stats (a /proc walk and each process's smaps_rollup) of an
// engine with 100 namespaces that have run code, as a /metrics scrape of minipy-mcp does.
func BenchmarkIsolatedStats(b *testing.B) {
	e := newIsolated(b, minipy.IsolatedConfig{})
	for range 100 {
		ns := e.NewNamespace()
		b.Cleanup(func() { ns.Close() })
		if _, err := e.Run(context.Background(), "x = 1", &minipy.Options{Globals: ns}); err != nil {
			b.Fatal(err)
		}
	}
	var st minipy.IsolatedStats
	for b.Loop() {
		st = e.Stats()
	}
	b.ReportMetric(float64(st.Processes), "processes")
	b.ReportMetric(float64(st.MemoryBytes)/(1<<20), "PSS-MB")
}

// BenchmarkRunFiles: what Result.Files costs a run. A run that writes nothing pays two empty
// reads of the engine's inotify queue, however big the namespace's tree (compare "empty"
// with "20k-files"); a run that writes a file pays for its events and one stat. Without
// rollback, whose snapshot fork would dwarf the difference.
func BenchmarkRunFiles(b *testing.B) {
	for _, c := range []struct {
		name  string
		files int
		code  string
	}{{"empty", 0, "1"}, {"20k-files", 20000, "1"}, {"20k-files-write-one", 20000, "open('out.txt', 'w').write('x')"}} {
		b.Run(c.name, func(b *testing.B) {
			e := newIsolated(b, minipy.IsolatedConfig{NoRollback: true})
			ns := e.NewNamespace()
			defer ns.Close()
			for i := range c.files {
				if err := ns.WriteFile(fmt.Sprintf("d%03d/f%05d.txt", i%200, i), []byte("x")); err != nil {
					b.Fatal(err)
				}
			}
			opts := &minipy.Options{Globals: ns}
			if _, err := e.Minipy("1", opts); err != nil { // sets up the watches
				b.Fatal(err)
			}
			for b.Loop() {
				r, err := e.Minipy(c.code, opts)
				if err != nil || len(r.Files) != strings.Count(c.code, "open(") {
					b.Fatal(err, r.Files)
				}
			}
		})
	}
}
