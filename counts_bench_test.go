package minipy_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/internal/opcount"
	"github.com/minipy-go/minipy/internal/procstat"
)

// BenchmarkCounts measures issue 37's goals in what no VM can blur: the context switches,
// page faults, system calls and forks of one operation, counted by the kernel over the
// whole process tree (this process, the template, guardians, workers, snapshots; those
// that exited too: internal/opcount), each beside its time and a floor counted and timed
// the same way in the same run (docs/benchmarks.md, "Counts"):
//
//   - round-trip: a warm `1+1` on an isolated engine with NoRollback, back to back, against
//     a Go <-> Python pipe echo of a frame (counts; echo-us its median time) and the echo
//     plus an in-process `1+1` (time; inprocess-us the run's median, back to back too);
//   - rollback-cycle: a state-changing run (`x = i`) on the default engine (rollback on),
//     20 ms apart, with the snapshot that follows it (a block of 10 ends with a request
//     that changes nothing, answered once the last snapshot is made); the floor is the same
//     tree idle for as long, which the cycle's counts leave out; ahead: the pages the worker
//     copied ahead while it waited (no fault counter sees them), copies: faults + ahead;
//   - new-namespace: NewNamespace (numpy preloaded) from a spare that had time to start
//     (IsolatedConfig.Spares 1), to its first answer, with the start of the spare that
//     replaces it (given 0.5 s); counted less the tree idle for as long;
//   - new-namespace-no-spare: the same with no pool (IsolatedConfig.Spares -1), back to
//     back: each a whole sandbox start on the caller's path; -no-cgroup with NoCgroup.
//
// Metrics: us (median time of the operation), cs, faults, syscalls and forks per
// operation; the same with "floor-" before them; x-floor the time's ratio to its floor.
// Counts the kernel does not let this process keep (not root, no tracefs) are left out,
// and the log says which and the fix.
func BenchmarkCounts(b *testing.B) {
	b.Run("round-trip", func(b *testing.B) {
		m := meter(b)
		e := newIsolated(b, minipy.IsolatedConfig{NoRollback: true})
		echo := startEcho(b, workerPython(b, e))
		inproc := minipy.InProcess()
		frame := make([]byte, 4+64) // a length and about what a `1+1` request carries
		binary.LittleEndian.PutUint32(frame, 64)
		const block = 50
		var took, echoed, inProcess []time.Duration
		var counts, floorCounts opcount.Counts
		var hostCPU, sandboxCPU time.Duration
		ops := 0
		for b.Loop() {
			for range block {
				start := time.Now()
				if _, err := inproc.Run(context.Background(), "1+1", nil); err != nil {
					b.Fatal(err)
				}
				inProcess = append(inProcess, time.Since(start))
			}
			before := m.read()
			for range block {
				start := time.Now()
				echo.roundTrip(b, frame)
				echoed = append(echoed, time.Since(start))
			}
			floorCounts = floorCounts.Add(m.since(before))
			host, sandbox := treeCPU(echo.pid)
			before = m.read()
			for range block {
				start := time.Now()
				if _, err := e.Minipy("1+1", nil); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			counts = counts.Add(m.since(before))
			host2, sandbox2 := treeCPU(echo.pid)
			hostCPU, sandboxCPU = hostCPU+host2-host, sandboxCPU+sandbox2-sandbox
			ops += block
		}
		b.ReportMetric(float64(hostCPU.Nanoseconds())/1e3/float64(ops), "host-cpu-us/op")
		b.ReportMetric(float64(sandboxCPU.Nanoseconds())/1e3/float64(ops), "sandbox-cpu-us/op")
		b.ReportMetric(float64(median(echoed).Nanoseconds())/1e3, "echo-us")
		b.ReportMetric(float64(median(inProcess).Nanoseconds())/1e3, "inprocess-us")
		floor := []time.Duration{median(echoed) + median(inProcess)}
		report(b, m, took, floor, counts.Per(ops), floorCounts.Per(ops))
	})
	b.Run("rollback-cycle", func(b *testing.B) {
		m := meter(b)
		e := newIsolated(b, minipy.IsolatedConfig{})
		ns := e.NewNamespace()
		b.Cleanup(func() { ns.Close() })
		opts := &minipy.Options{Globals: ns}
		const pace, block = 20 * time.Millisecond, 10
		if _, err := e.Minipy("x = 0", opts); err != nil { // the worker's warm-up done
			b.Fatal(err)
		}
		time.Sleep(pace)
		var took []time.Duration
		var counts, idle opcount.Counts
		ops := 0
		aheadBefore := copiedAhead(b, e, ns)
		for b.Loop() {
			before := m.read()
			for range block {
				time.Sleep(pace)
			}
			idle = idle.Add(m.since(before))
			before = m.read()
			for i := range block {
				start := time.Now()
				if _, err := e.Minipy(fmt.Sprintf("x = %d", i), opts); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
				time.Sleep(pace - time.Since(start)) // (the snapshot is made meanwhile)
			}
			// The last run's snapshot is in the counts too: a request that changes nothing
			// is answered once it is made (one round trip per block).
			if _, err := ns.Get("x"); err != nil {
				b.Fatal(err)
			}
			counts = counts.Add(m.since(before))
			ops += block
		}
		per := counts.Sub(idle).Per(ops)
		report(b, m, took, nil, per, idle.Per(ops))
		// Pages the worker copied ahead while it waited are copies too, which no fault
		// counter sees (MADV_POPULATE_WRITE: the kernel counts no page-faults event).
		ahead := float64(copiedAhead(b, e, ns)-aheadBefore) / float64(ops)
		b.ReportMetric(ahead, "ahead/op")
		if m.m != nil && m.m.Counting(opcount.PageFaults) {
			b.ReportMetric(per.PageFaults+ahead, "copies/op")
		}
	})
	b.Run("new-namespace", func(b *testing.B) {
		m := meter(b)
		// One spare, so that each op starts exactly one (the adaptive pool would grow with
		// the calls, and count the growth in the op).
		e := newIsolated(b, minipy.IsolatedConfig{Preload: []string{"numpy"}, Spares: 1})
		const settle, block = 500 * time.Millisecond, 4
		time.Sleep(settle) // (the spare starts)
		var took []time.Duration
		var counts, idle opcount.Counts
		ops, windows := 0, 0
		for b.Loop() {
			var made []*minipy.Namespace
			for range block {
				before := m.read()
				start := time.Now()
				ns := e.NewNamespace()
				if _, err := e.Run(context.Background(), "1+1", &minipy.Options{Globals: ns}); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
				time.Sleep(settle - time.Since(start))
				counts = counts.Add(m.since(before))
				made = append(made, ns)
			}
			before := m.read() // (the spare ready, the namespaces idle)
			time.Sleep(settle)
			idle = idle.Add(m.since(before))
			windows++
			for _, ns := range made {
				ns.Close()
			}
			time.Sleep(settle / 5) // (their ends out of the next block's counts)
			ops += block
		}
		report(b, m, took, nil, minus(counts.Per(ops), idle.Per(windows)), idle.Per(windows))
	})
	for _, cg := range []bool{true, false} {
		name := "new-namespace-no-spare"
		if !cg {
			name += "-no-cgroup"
		}
		b.Run(name, func(b *testing.B) { benchStartNoSpare(b, cg) })
	}
}

// benchStartNoSpare is BenchmarkCounts' new-namespace-no-spare: NewNamespace (numpy
// preloaded) with no pool (Spares -1), to the end of its first run, back to back in blocks
// of 4: each op is a whole sandbox start on the caller's path (the template's fork, the
// sandbox's namespaces, mounts and cgroup, its pid 1, the worker's start and warm-up, the
// snapshot after its first run). The floor is the tree idle for as long as a block took, left out.
func benchStartNoSpare(b *testing.B, cgroup bool) {
	m := meter(b)
	e := newIsolated(b, minipy.IsolatedConfig{Preload: []string{"numpy"}, Spares: -1, NoCgroup: !cgroup})
	const block = 4
	var took []time.Duration
	var counts, idle opcount.Counts
	ops := 0
	for b.Loop() {
		var made []*minipy.Namespace
		before := m.read()
		start := time.Now()
		for range block {
			at := time.Now()
			ns := e.NewNamespace()
			if _, err := e.Run(context.Background(), "1+1", &minipy.Options{Globals: ns}); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(at))
			made = append(made, ns)
		}
		// (each start's last snapshot is made after its answer: given time, then counted)
		time.Sleep(100 * time.Millisecond)
		counts = counts.Add(m.since(before))
		spent := time.Since(start)
		before = m.read()
		time.Sleep(spent)
		idle = idle.Add(m.since(before))
		for _, ns := range made {
			ns.Close()
		}
		time.Sleep(200 * time.Millisecond) // (their ends out of the next block's counts)
		ops += block
	}
	report(b, m, took, nil, counts.Sub(idle).Per(ops), idle.Per(ops))
}

// countMeter is an opcount.Meter, or nothing where the kernel lets us count nothing.
type countMeter struct{ m *opcount.Meter }

// meter counts what the kernel lets it; where that is not all four, the benchmark's log
// says which are missing, why and the fix, and report leaves their metrics out.
func meter(b *testing.B) countMeter {
	m, err := opcount.Start()
	if err != nil {
		b.Logf("counting less: %v", err)
	}
	if m == nil {
		return countMeter{}
	}
	b.Cleanup(m.Close)
	return countMeter{m}
}

func (c countMeter) read() opcount.Counts {
	if c.m == nil {
		return opcount.Counts{}
	}
	return c.m.Read()
}

func (c countMeter) since(before opcount.Counts) opcount.Counts {
	if c.m == nil {
		return opcount.Counts{}
	}
	return c.m.Since(before)
}

func minus(a, b opcount.PerOp) opcount.PerOp {
	return opcount.PerOp{ContextSwitches: a.ContextSwitches - b.ContextSwitches,
		PageFaults: a.PageFaults - b.PageFaults, Syscalls: a.Syscalls - b.Syscalls, Forks: a.Forks - b.Forks}
}

// report reports the median of took (and of floor, and their ratio, when there is one) and
// the counts per operation (with the floor's, unless it is zero: none was counted).
// copiedAhead is how many pages ns's worker has copied ahead after its snapshots' forks
// (worker.py's _ServeLoop), all told: 0 where its loop is Python's.
func copiedAhead(b *testing.B, e *minipy.Isolated, ns *minipy.Namespace) int64 {
	r, err := e.Minipy(`import sys
_loop = sys.modules["_minipy_runtime"].call_host.__self__.serve_loop
_loop.copied_ahead() if _loop else 0`, &minipy.Options{Globals: ns})
	if err != nil {
		b.Fatal(err)
	}
	return r.Value.(int64)
}

// treeCPU is the CPU time this process has had (host) and its descendants but skip
// (sandbox: the engine's template, guardians and workers) have had: procstat.CPU.
func treeCPU(skip int) (host, sandbox time.Duration) {
	self := os.Getpid()
	for _, pid := range procstat.Tree(self) {
		switch pid {
		case self:
			host = procstat.CPU(pid)
		case skip:
		default:
			sandbox += procstat.CPU(pid)
		}
	}
	return host, sandbox
}

func report(b *testing.B, m countMeter, took, floor []time.Duration, per, floorPer opcount.PerOp) {
	b.ReportMetric(float64(median(took).Nanoseconds())/1e3, "us")
	if floor != nil {
		b.ReportMetric(float64(median(floor).Nanoseconds())/1e3, "floor-us")
		b.ReportMetric(float64(median(took))/float64(median(floor)), "x-floor")
	}
	if m.m == nil {
		return
	}
	for _, c := range []struct {
		ev        opcount.Event
		name      string
		op, floor float64
	}{
		{opcount.ContextSwitches, "cs", per.ContextSwitches, floorPer.ContextSwitches},
		{opcount.PageFaults, "faults", per.PageFaults, floorPer.PageFaults},
		{opcount.Syscalls, "syscalls", per.Syscalls, floorPer.Syscalls},
		{opcount.Forks, "forks", per.Forks, floorPer.Forks},
	} {
		if !m.m.Counting(c.ev) {
			continue
		}
		b.ReportMetric(c.op, c.name+"/op")
		if floorPer != (opcount.PerOp{}) { // (none counted)
			b.ReportMetric(c.floor, "floor-"+c.name+"/op")
		}
	}
}
