package session

import (
	"testing"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/internal/opcount"
)

// BenchmarkStore times a save and its load back (what a session's move between replicas
// costs the store), of 64 KiB and of 8 MiB, in a directory (a file written, synced and
// renamed) and in a real Redis on loopback (appendfsync always: each write synced too),
// with counts over the whole process tree (this process and redis-server's threads are
// not one tree: Redis's own work is not counted).
func BenchmarkStore(b *testing.B) {
	for _, backend := range []string{"dir", "redis"} {
		for _, size := range []int{64 << 10, 8 << 20} {
			b.Run(backend+"/"+map[int]string{64 << 10: "64KiB", 8 << 20: "8MiB"}[size], func(b *testing.B) {
				url := b.TempDir()
				if backend == "redis" {
					url = redistest.Start(b).URL()
				}
				st, err := Open(url, StoreOptions{TTL: time.Hour})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				blob := make([]byte, size)
				m, err := opcount.Start()
				if err != nil {
					b.Logf("no counts: %v", err)
				} else {
					defer m.Close()
				}
				var before opcount.Counts
				if m != nil {
					before = m.Read()
				}
				b.ResetTimer()
				for range b.N {
					if err := st.Save(KindSession, "s", Meta{User: "u"}, blob); err != nil {
						b.Fatal(err)
					}
					if _, _, err := st.Load(KindSession, "s"); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.SetBytes(int64(size))
				if m != nil {
					per := m.Since(before).Per(b.N)
					b.ReportMetric(per.ContextSwitches, "cs/op")
					b.ReportMetric(per.PageFaults, "faults/op")
					b.ReportMetric(per.Syscalls, "syscalls/op")
				}
			})
		}
	}
}
