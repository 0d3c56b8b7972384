package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
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
// after the calls, in all and per sandbox, the processes, and the sleeps and wakes. Beside
// the creations a second, the CPU each took, the machine's (machine-cpu-ms/creation) and
// the client's alone (client-cpu-ms/creation), and the floor's, measured in the same run
// (testdata/floor/floor.c: a process as big as the template cloning one process a sandbox
// into the same namespaces, which writes floorCOW pages and exits, NumCPU at a time):
// floor-creations/s, floor-cpu-ms/creation and the rate's ratio to the floor's.
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
		floor := runFloor(b, templateAnonMiB(b, s.cmd.Process.Pid), min(n, 1000))
		rate := float64(n) / got["createSeconds"].(float64)
		b.ReportMetric(got["createMachineCPU"].(float64)*1e3/float64(n), "machine-cpu-ms/creation")
		b.ReportMetric(got["createClientCPU"].(float64)*1e3/float64(n), "client-cpu-ms/creation")
		b.ReportMetric(floor.PerSecond, "floor-creations/s")
		b.ReportMetric(floor.CPUMsEach, "floor-cpu-ms/creation")
		b.ReportMetric(floor.PerSecond/rate, "x-floor")
		tree := append([]int{s.cmd.Process.Pid}, descendantsOf(s.cmd.Process.Pid)...)
		var pss int64
		for _, p := range tree {
			pss += procstat.PSS(p)
		}
		b.ReportMetric(rate, "creations/s")
		b.ReportMetric(got["callSeconds"].(float64)*1e3/float64(n), "ms/call")
		b.ReportMetric(float64(pss)/(1<<30), "GiB-tree-PSS")
		b.ReportMetric(float64(pss)/float64(n)/(1<<20), "MiB-tree-PSS/sandbox")
		b.ReportMetric(float64(len(tree)), "processes")
		b.ReportMetric(float64(metric(b, s.base, "minipy_e2b_sandboxes_asleep")), "asleep")
		b.ReportMetric(float64(metric(b, s.base, "minipy_e2b_sandboxes_woken_total")), "woken")
		b.ReportMetric(float64(metric(b, s.base, "minipy_e2b_sandboxes_slept_for_room_total")), "slept-for-room")
		b.ReportMetric(float64(metric(b, s.base, `minipy_cgroups_total{how="made"}`)), "cgroups-made")
		b.ReportMetric(float64(metric(b, s.base, `minipy_cgroups_total{how="reused"}`)), "cgroups-reused")
		b.Logf("%d sandboxes in %v: %v", n, took.Round(time.Millisecond), got)
		s.stop(b)
	}
}

// floorCOW is the pages the floor's sandbox writes: about what a worker writes of the
// template's from its fork through its first run on CPython 3.11 (~610; ~360 on 3.13),
// found by comparing its pages with the template's (/proc/PID/pagemap).
const floorCOW = 600

// floorResult is what testdata/floor/floor.c prints.
type floorResult struct {
	PerSecond float64 `json:"perSecond"`
	CPUMsEach float64 `json:"cpuMsEach"`
}

// runFloor builds and runs testdata/floor/floor.c: n sandboxes, NumCPU at a time, from a
// process with mib MiB of anonymous memory.
func runFloor(b *testing.B, mib, n int) floorResult {
	b.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	bin := filepath.Join(b.TempDir(), "floor")
	if out, err := exec.Command(cc, "-O2", "-o", bin, filepath.Join("testdata", "floor", "floor.c")).CombinedOutput(); err != nil {
		b.Fatalf("building the floor: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, strconv.Itoa(mib), strconv.Itoa(n), strconv.Itoa(runtime.NumCPU()),
		strconv.Itoa(floorCOW)).Output()
	if err != nil {
		b.Fatalf("the floor: %v", err)
	}
	var r floorResult
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("the floor said %q: %v", out, err)
	}
	return r
}

// templateAnonMiB is the anonymous memory of the server's template (the largest of its
// children's), in MiB.
func templateAnonMiB(b *testing.B, server int) int {
	b.Helper()
	most := 0
	for _, p := range procstat.Children(server) {
		status, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/status")
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "RssAnon:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
				most = max(most, kb)
			}
		}
	}
	if most == 0 {
		b.Fatal("the server's template was not found")
	}
	return (most + 1023) / 1024
}
