package session

import (
	"context"
	"github.com/redis/go-redis/v9"
	"testing"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/internal/opcount"
)

// BenchmarkStore times a save and its load back (what a session's move between replicas
// costs the store), of 64 KiB and of 8 MiB, in a directory (a file written, synced and
// renamed) and in a real Redis on loopback (appendfsync always: each write synced too),
// with counts over the whole process tree (this process and redis-server's threads are
// not one tree: Redis's own work is not counted). The floor, "redis-raw", is one SET and
// one GET of the same bytes as one value, with the same client.
func BenchmarkStore(b *testing.B) {
	for _, backend := range []string{"dir", "redis", "redis-raw"} {
		for _, size := range []int{64 << 10, 8 << 20} {
			b.Run(backend+"/"+map[int]string{64 << 10: "64KiB", 8 << 20: "8MiB"}[size], func(b *testing.B) {
				url := b.TempDir()
				var raw *redis.Client
				if backend != "dir" {
					r := redistest.Start(b)
					url, raw = r.URL(), r.Client()
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
					if backend == "redis-raw" {
						if err := raw.Set(context.Background(), "raw", blob, 0).Err(); err != nil {
							b.Fatal(err)
						}
						if err := raw.Get(context.Background(), "raw").Err(); err != nil {
							b.Fatal(err)
						}
						continue
					}
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
