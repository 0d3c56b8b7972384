package minipy_test

import (
	"context"
	"io"
	"testing"

	"github.com/minipy-go/minipy"
)

// BenchmarkLiveOutput is the cost of live output: a run that prints 1,000 short lines, with
// no writer (captured only) and with a writer (io.Discard) on each engine.
func BenchmarkLiveOutput(b *testing.B) {
	const code = "for i in range(1000):\n    print('line', i)"
	for _, eng := range []struct {
		name string
		e    minipy.Engine
	}{{"inprocess", minipy.InProcess()}, {"isolated", newIsolated(b, minipy.IsolatedConfig{})}} {
		for _, live := range []bool{false, true} {
			name := eng.name + "/captured"
			opts := &minipy.Options{}
			if live {
				name = eng.name + "/live"
				opts.Stdout = io.Discard
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					if _, err := eng.e.Run(context.Background(), code, opts); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
