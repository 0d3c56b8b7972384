package minipy_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
)

// addFunction is the host function of the benchmarks and tests: add(a: int, b: int) -> int.
var addFunction = minipy.Function{
	Name:        "add",
	Description: "Add two integers.",
	InputSchema: map[string]any{
		"type": "object",
		"properties": map[string]any{
			"a": map[string]any{"type": "integer"},
			"b": map[string]any{"type": "integer"},
		},
		"required": []any{"a", "b"},
	},
	Call: func(_ context.Context, args map[string]any) (any, error) {
		return args["a"].(int64) + args["b"].(int64), nil
	},
}

// BenchmarkHostCall is one call from Python into a Go function and back, add(1, 2), made
// 1,000 times in a run; ns/call is the cost of one.
func BenchmarkHostCall(b *testing.B) {
	for _, e := range benchEngines(b) {
		b.Run(e.name, func(b *testing.B) {
			opts := addNamespace(b, e.eng)
			const code = "for _ in range(1000): add(1, 2)"
			if _, err := e.eng.Run(context.Background(), code, opts); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := e.eng.Run(context.Background(), code, opts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/call")
		})
	}
}

// BenchmarkHostCallMemory makes 10,000 host calls per run: the Go heap, the RSS of the
// process that runs the code (this one in-process, the worker otherwise) and Python's
// allocated blocks stay flat (reported as growth per run; near zero means none).
func BenchmarkHostCallMemory(b *testing.B) {
	for _, e := range benchEngines(b) {
		b.Run(e.name, func(b *testing.B) {
			opts := addNamespace(b, e.eng)
			const code = "import sys, os\nfor _ in range(10000): add(1, 2)\n" +
				"[sys.getallocatedblocks(), int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')]"
			var rss int64
			blocks := func() int64 {
				r, err := e.eng.Run(context.Background(), code, opts)
				if err != nil {
					b.Fatal(err)
				}
				v := r.Value.([]any)
				rss = v[1].(int64)
				return v[0].(int64)
			}
			heap := func() uint64 {
				runtime.GC()
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				return m.HeapAlloc
			}
			blocks() // warm up
			b0, h0 := blocks(), heap()
			r0 := rss
			var b1 int64
			for b.Loop() {
				b1 = blocks()
			}
			h1 := heap()
			b.ReportMetric(float64(b1-b0)/float64(b.N), "pyblocks/run")
			b.ReportMetric((float64(h1)-float64(h0))/float64(b.N), "heapB/run")
			b.ReportMetric(float64(rss-r0)/float64(b.N), "rssB/run")
		})
	}
}

// addNamespace is the Options of a namespace of eng with add registered.
func addNamespace(b *testing.B, eng minipy.Engine) *minipy.Options {
	ns := eng.NewNamespace()
	b.Cleanup(func() { ns.Close() })
	if err := ns.Register(addFunction); err != nil {
		b.Fatal(err)
	}
	return &minipy.Options{Globals: ns, Timeout: time.Minute}
}

func benchEngines(b *testing.B) []struct {
	name string
	eng  minipy.Engine
} {
	iso, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { iso.Close() })
	return []struct {
		name string
		eng  minipy.Engine
	}{{"inprocess", minipy.InProcess()}, {"isolated", iso}}
}
