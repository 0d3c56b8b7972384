package main

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/minipy-go/minipy/internal/procstat"
)

// BenchmarkE2BScale is issue 70's density through the unmodified SDK (scale.mjs): N
// sandboxes (MINIPY_SCALE, 200 by default; 10000 for the measure) created 8 at a
// time, each running `x = list(range(1000))`, against minipy-mcp -e2b -e2b-sleep-idle 1s
// -max-sessions 250 (idle sandboxes sleep, and a full server puts its idlest to sleep to
// make room); then each answers `len(x)`, live or woken. It reports creations a second,
// the server's whole process tree's PSS (the server, its template, the sandboxes awake)
// after the calls, in all and per sandbox, the processes, and the sleeps and wakes.
func BenchmarkE2BScale(b *testing.B) {
	n := 200
	if v := os.Getenv("MINIPY_SCALE"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("MINIPY_SCALE=%q: a number of sandboxes", v)
		}
	}
	for b.Loop() {
		s := startE2B(b, "-e2b-sleep-idle", "1s", "-max-sessions", "250")
		start := time.Now()
		got := runE2BScript(b, s, "scale.mjs", "SCALE_N="+strconv.Itoa(n))
		took := time.Since(start)
		if got["created"] != float64(n) || got["answered"] != float64(n) {
			b.Fatalf("%d sandboxes: %v\n%s", n, got, s.log)
		}
		tree := append([]int{s.cmd.Process.Pid}, descendantsOf(s.cmd.Process.Pid)...)
		var pss int64
		for _, p := range tree {
			pss += procstat.PSS(p)
		}
		b.ReportMetric(float64(n)/got["createSeconds"].(float64), "creations/s")
		b.ReportMetric(got["callSeconds"].(float64)*1e3/float64(n), "ms/call")
		b.ReportMetric(float64(pss)/(1<<30), "GiB-tree-PSS")
		b.ReportMetric(float64(pss)/float64(n)/(1<<20), "MiB-tree-PSS/sandbox")
		b.ReportMetric(float64(len(tree)), "processes")
		b.ReportMetric(float64(metric(b, s.base, "minipy_e2b_sandboxes_asleep")), "asleep")
		b.ReportMetric(float64(metric(b, s.base, "minipy_e2b_sandboxes_woken_total")), "woken")
		b.ReportMetric(float64(metric(b, s.base, "minipy_e2b_sandboxes_slept_for_room_total")), "slept-for-room")
		b.Logf("%d sandboxes in %v: %v", n, took.Round(time.Millisecond), got)
		s.stop(b)
	}
}
