package minipy_test

import (
	"fmt"
	"testing"

	"github.com/minipy-go/minipy"
)

// snippet30 is the kind of cell a model writes: imports, a helper, a loop, output and a
// final expression, 30 lines.
const snippet30 = `import math
import statistics

data = [3.2, 4.8, 1.9, 7.4, 5.5, 6.1, 2.2, 8.9, 4.4, 5.0]

def summarize(values):
    """Mean, spread and extremes of a sample."""
    mean = statistics.fmean(values)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {
        "n": len(values),
        "mean": round(mean, 3),
        "std": round(spread, 3),
        "min": min(values),
        "max": max(values),
    }

buckets = {}
for v in data:
    key = "high" if v > 5 else "low"
    buckets.setdefault(key, []).append(v)

report = {name: summarize(vals) for name, vals in buckets.items()}
for name, stats in sorted(report.items()):
    print(f"{name:>5}: n={stats['n']} mean={stats['mean']}")

total = sum(len(v) for v in buckets.values())
assert total == len(data)
report["high"]["mean"] - report["low"]["mean"]
`

var benchCells = []struct{ name, code string }{
	{"1+1", "1+1"},
	{"30-lines", snippet30},
}

// BenchmarkMinipy is a whole run from Go: hand-off to the interpreter thread, ast tail,
// exec, capture, repr, value conversion and the reply.
func BenchmarkMinipy(b *testing.B) {
	for _, c := range benchCells {
		b.Run(c.name, func(b *testing.B) {
			ns := minipy.NewNamespace()
			defer ns.Close()
			opts := &minipy.Options{Globals: ns}
			if _, err := minipy.Minipy(c.code, opts); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := minipy.Minipy(c.code, opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPythonSide is the same work measured inside Python (the runtime's run() called
// in a loop, no Go in between): the floor BenchmarkMinipy is compared with. It reports
// python-ns/op; ns/op is meaningless here.
func BenchmarkPythonSide(b *testing.B) {
	for _, c := range benchCells {
		b.Run(c.name, func(b *testing.B) {
			ns := minipy.NewNamespace()
			defer ns.Close()
			if err := ns.Set("cell", c.code); err != nil {
				b.Fatal(err)
			}
			r, err := minipy.Minipy(fmt.Sprintf(`import sys, time
rt = sys.modules["_minipy_runtime"]
gid = next(k for k, v in rt._spaces.items() if v is globals())
rt.run(gid, 0, 65536, 0, cell)
n = %d
t = time.perf_counter()
for _ in range(n):
    rt.run(gid, 0, 65536, 0, cell)
(time.perf_counter() - t) / n * 1e9`, max(b.N, 200)), &minipy.Options{Globals: ns})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(r.Value.(float64), "python-ns/op")
		})
	}
}
