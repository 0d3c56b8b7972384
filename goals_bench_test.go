package minipy_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
)

// BenchmarkGoals measures the speed goals of docs/benchmarks.md ("Speed against a floor"),
// each against its floor in the same run, alternating blocks of the two so that a noisy
// machine slows both alike. Each reports both medians and their ratio (x-floor):
//
//   - new-namespace: NewNamespace, numpy preloaded, to its first answer (`import numpy`),
//     in bursts of 5 back to back, against a bare `python3 -c pass` of the workers' Python;
//     new-namespace-burst the same in bursts of 20; new-namespace-no-spare in bursts of 5
//     with no pool (IsolatedConfig.Spares -1), each a sandbox's start;
//   - host-call: one in-process host call of an Inline function, add(a=i, b=1), made
//     1,000 times in a run, against a whole in-process run of `1+1`; host-call-served
//     the same for a function that is not Inline (served by a goroutine);
//   - rollback-paced: a warm `1+1` on the default isolated engine (rollback on), runs 5 ms
//     apart, against the same engine with NoRollback; rollback-back-to-back without the pause;
//   - round-trip: a warm `1+1` on an isolated engine with NoRollback, against a Go <->
//     Python pipe echo of a frame the size of that run's request.
//
// The ratios are the goals; the floors say how fast this machine is today.
func BenchmarkGoals(b *testing.B) {
	for _, c := range []struct {
		name   string
		spares int
		burst  int
	}{{"new-namespace", 0, 5}, {"new-namespace-burst", 0, 20}, {"new-namespace-no-spare", -1, 5}} {
		b.Run(c.name, func(b *testing.B) { benchNewNamespaces(b, c.spares, c.burst) })
	}
	for _, inline := range []bool{true, false} {
		name := "host-call"
		if !inline {
			name = "host-call-served"
		}
		b.Run(name, func(b *testing.B) {
			eng := minipy.InProcess()
			ns := eng.NewNamespace()
			b.Cleanup(func() { ns.Close() })
			add := addFunction
			add.Inline = inline
			if err := ns.Register(add); err != nil {
				b.Fatal(err)
			}
			opts := &minipy.Options{Globals: ns, Timeout: time.Minute}
			const calls = 1000
			calling := "for i in range(1000): add(a=i, b=1)"
			var floor, took []time.Duration
			for b.Loop() {
				for range 20 {
					start := time.Now()
					if _, err := eng.Run(context.Background(), "1+1", opts); err != nil {
						b.Fatal(err)
					}
					floor = append(floor, time.Since(start))
				}
				start := time.Now()
				if _, err := eng.Run(context.Background(), calling, opts); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start)/calls)
			}
			reportAgainst(b, took, floor)
		})
	}
	for _, paced := range []bool{true, false} {
		name := "rollback-paced"
		if !paced {
			name = "rollback-back-to-back"
		}
		b.Run(name, func(b *testing.B) {
			def := newIsolated(b, minipy.IsolatedConfig{})
			bare := newIsolated(b, minipy.IsolatedConfig{NoRollback: true})
			var floor, took []time.Duration
			run := func(e *minipy.Isolated, into *[]time.Duration) {
				if paced {
					time.Sleep(5 * time.Millisecond)
				}
				start := time.Now()
				if _, err := e.Minipy("1+1", nil); err != nil {
					b.Fatal(err)
				}
				*into = append(*into, time.Since(start))
			}
			run(def, &took)
			run(bare, &floor)
			took, floor = took[:0], floor[:0]
			for b.Loop() {
				for range 10 {
					run(def, &took)
				}
				for range 10 {
					run(bare, &floor)
				}
			}
			reportAgainst(b, took, floor)
		})
	}
	b.Run("round-trip", func(b *testing.B) {
		e := newIsolated(b, minipy.IsolatedConfig{NoRollback: true})
		echo := startEcho(b, workerPython(b, e))
		frame := make([]byte, 4+64) // a length and about what a `1+1` request carries
		binary.LittleEndian.PutUint32(frame, 64)
		var floor, took []time.Duration
		for b.Loop() {
			for range 20 {
				start := time.Now()
				echo.roundTrip(b, frame)
				floor = append(floor, time.Since(start))
			}
			for range 20 {
				start := time.Now()
				if _, err := e.Minipy("1+1", nil); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
		}
		reportAgainst(b, took, floor)
	})
}

// reportAgainst reports the medians of took and floor (in us) and their ratio.
func reportAgainst(b *testing.B, took, floor []time.Duration) {
	t, f := median(took), median(floor)
	b.ReportMetric(float64(t.Nanoseconds())/1e3, "us-median")
	b.ReportMetric(float64(f.Nanoseconds())/1e3, "us-floor")
	b.ReportMetric(float64(t)/float64(f), "x-floor")
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// workerPython is the executable e's workers run.
func workerPython(b *testing.B, e *minipy.Isolated) string {
	r, err := e.Minipy("import sys; sys.executable", nil)
	if err != nil {
		b.Fatal(err)
	}
	return r.Value.(string)
}

// echoProcess is a Python process that writes back each frame (u32 length, body) it reads:
// the floor of any Go <-> Python exchange over pipes.
type echoProcess struct {
	in  io.Writer
	out *bufio.Reader
	pid int
}

func startEcho(b *testing.B, python string) *echoProcess {
	const src = `import os, struct
rin = os.fdopen(0, "rb", buffering=1 << 16)
while True:
    head = rin.read(4)
    if len(head) < 4:
        break
    body = rin.read(struct.unpack("<I", head)[0])
    os.write(1, head + body)
`
	cmd := exec.Command(python, "-c", src)
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	return &echoProcess{in: in, out: bufio.NewReader(out), pid: cmd.Process.Pid}
}

func (p *echoProcess) roundTrip(b *testing.B, frame []byte) {
	if _, err := p.in.Write(frame); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(p.out, frame); err != nil {
		b.Fatal(err)
	}
}

// benchNewNamespaces is BenchmarkGoals' new-namespace with IsolatedConfig.Spares spares:
// bursts of burst NewNamespace calls back to back, each to the end of its first run. The
// first burst, untimed, is the one the adaptive pool learns its size from; each timed one
// starts once the pool has grown back (its starts would slow the floor's python too).
func benchNewNamespaces(b *testing.B, spares, burst int) {
	e := newIsolated(b, minipy.IsolatedConfig{Preload: []string{"numpy"}, Spares: spares})
	python := workerPython(b, e)
	var floor, took []time.Duration
	run := func(into *[]time.Duration) {
		var made []*minipy.Namespace
		for range burst {
			start := time.Now()
			ns := e.NewNamespace()
			if _, err := e.Run(context.Background(), "import numpy", &minipy.Options{Globals: ns}); err != nil {
				b.Fatal(err)
			}
			if into != nil {
				*into = append(*into, time.Since(start))
			}
			made = append(made, ns)
		}
		for _, ns := range made {
			ns.Close()
		}
	}
	run(nil)
	for b.Loop() {
		for minipy.ReadySpares(e) < minipy.SpareTarget(e) { // (at most the pool's ceiling)
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // (the last closes end)
		for range 5 {
			start := time.Now()
			if err := exec.Command(python, "-c", "pass").Run(); err != nil {
				b.Fatal(err)
			}
			floor = append(floor, time.Since(start))
		}
		run(&took)
	}
	reportAgainst(b, took, floor)
}
