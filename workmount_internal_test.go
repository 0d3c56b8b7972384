package minipy

import (
	"testing"
)

// BenchmarkWorkDirMake is what making and removing a working directory costs (each
// spare's start makes one, off NewNamespace's path): "tmpfs" has the template mount one (WorkSize, a
// round trip to it), "disk" makes a directory only.
func BenchmarkWorkDirMake(b *testing.B) {
	for _, c := range []struct {
		name string
		size int64
	}{{"tmpfs", 0}, {"disk", -1}} {
		b.Run(c.name, func(b *testing.B) {
			e, err := NewIsolated(IsolatedConfig{WorkSize: c.size})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			for b.Loop() {
				d := e.newDirs()
				if d.err != nil {
					b.Fatal(d.err)
				}
				e.releaseDirs(d)
			}
		})
	}
}
