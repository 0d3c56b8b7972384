package minipy

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// BenchmarkWatchdog measures what a deadline costs a run that does not time out. Each
// iteration makes the same short run three ways, back to back (in rotating order) so that
// machine noise hits all three alike: with no deadline at all, with Options.Timeout, and with a context
// deadline (which also registers a context.AfterFunc). The added-ns metrics are the
// watchdog's cost per run.
func BenchmarkWatchdog(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cases := [3]struct {
		ctx   context.Context
		opts  *Options
		total time.Duration
	}{
		{ctx: context.Background(), opts: &Options{Timeout: -1}},
		{ctx: context.Background(), opts: &Options{Timeout: time.Minute}},
		{ctx: ctx, opts: &Options{Timeout: -1}},
	}
	n := 0
	for b.Loop() {
		for k := range cases {
			// Rotate which goes first: the first run of a round was measured slower.
			c := &cases[(n+k)%len(cases)]
			start := time.Now()
			if _, err := Run(c.ctx, "x = 1", c.opts); err != nil {
				b.Fatal(err)
			}
			c.total += time.Since(start)
		}
		n++
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	b.ReportMetric(per(cases[0].total), "ns-no-deadline")
	b.ReportMetric(per(cases[1].total-cases[0].total), "added-ns-timeout")
	b.ReportMetric(per(cases[2].total-cases[0].total), "added-ns-ctx-deadline")
}

// finished is a runHandle whose run is already over: supervising it costs only the
// watchdog's own work.
type finished struct{}

func (finished) wait(time.Duration) bool { return true }
func (finished) kick(int)                {}
func (finished) wake()                   {}

// BenchmarkSupervise is the watchdog alone, without the interpreter's noise: working out
// the deadline and supervising a run that finishes before it.
func BenchmarkSupervise(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cases := []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
	}{
		{"none", context.Background(), -1},
		{"timeout", context.Background(), time.Minute},
		{"ctx-deadline", ctx, -1},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				dl := runDeadline(c.ctx, time.Now(), c.timeout)
				if s := supervise(c.ctx, finished{}, dl); s.cause != nil {
					b.Fatal(s.cause)
				}
			}
		})
	}
}

// deadlineCases are the latency table of docs/benchmarks.md: code that blocks or spins until stopped.
var deadlineCases = []struct{ name, code string }{
	{"busy loop", "while True:\n    pass\n"},
	{"time.sleep", "import time\ntime.sleep(10)\n"},
	{"Event.wait", "import threading\nthreading.Event().wait()\n"},
	{"input", "import os, sys\nr, w = os.pipe()\nsys.stdin = open(r)\ntry:\n    input()\nfinally:\n    os.close(w)\n    sys.stdin.close()\n"},
	{"socket.recv", "import socket\na, b = socket.socketpair()\nwith a, b:\n    a.recv(1)\n"},
	{"join busy worker", "import threading\ndef spin():\n    while True:\n        pass\nt = threading.Thread(target=spin)\nt.start()\nt.join()\n"},
	{"subprocess.run", "import subprocess\nsubprocess.run(['sleep', '10'])\n"},
	{"except Exception loop", "while True:\n    try:\n        n = 0\n        while True:\n            n += 1\n    except Exception:\n        pass\n"},
	{"bare except loop", "while True:\n    try:\n        n = 0\n        while True:\n            n += 1\n    except:\n        pass\n"},
}

// BenchmarkDeadlineToReturn measures, per kind of code, how long after its deadline a run
// returns: the median (ms-late-p50) and the worst (ms-late-max) of the iterations.
func BenchmarkDeadlineToReturn(b *testing.B) {
	const timeout = 50 * time.Millisecond
	for _, c := range deadlineCases {
		b.Run(c.name, func(b *testing.B) {
			var lates []time.Duration
			for b.Loop() {
				start := time.Now()
				_, err := Run(context.Background(), c.code, &Options{Timeout: timeout})
				lates = append(lates, time.Since(start)-timeout)
				if !errors.Is(err, ErrTimeout) {
					b.Fatalf("not a timeout: %v", err)
				}
			}
			slices.Sort(lates)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(lates[len(lates)/2]), "ms-late-p50")
			b.ReportMetric(ms(lates[len(lates)-1]), "ms-late-max")
		})
	}
}
