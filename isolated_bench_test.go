package minipy_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
)

// BenchmarkIsolatedRoundTrip is a warm `1+1` on one worker: frame out, dispatch, frame back.
func BenchmarkIsolatedRoundTrip(b *testing.B) {
	e := newIsolated(b, minipy.IsolatedConfig{})
	if _, err := e.Minipy("1+1", nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.Minipy("1+1", nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIsolatedWorkerStart is NewIsolated (one sandboxed worker) until its first run
// (1+1) has answered, plus Close.
func BenchmarkIsolatedWorkerStart(b *testing.B) {
	for b.Loop() {
		e, err := minipy.NewIsolated(minipy.IsolatedConfig{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.Minipy("1+1", nil); err != nil {
			b.Fatal(err)
		}
		e.Close()
	}
}

// BenchmarkIsolatedHardKill reports how long after deadline + grace a run stuck in a C loop
// returns (the worker's process tree killed and reaped).
func BenchmarkIsolatedHardKill(b *testing.B) {
	e := newIsolated(b, minipy.IsolatedConfig{})
	const timeout = 50 * time.Millisecond
	const grace = 500 * time.Millisecond // abandonAfter in timeout.go
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
