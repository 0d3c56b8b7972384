package session

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// peakHeap is the most the Go heap held (HeapInuse, sampled each millisecond) while f
// ran, above what it held before.
func peakHeap(f func()) uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base, peak := m.HeapInuse, m.HeapInuse
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	f()
	close(done)
	<-sampled
	return peak - base
}

// stream is n bytes that are hard to compress and cost no memory: a hash chain.
type stream struct {
	n     int64
	block [sha256.Size]byte
	rest  []byte
}

func (s *stream) Read(p []byte) (int, error) {
	if s.n == 0 {
		return 0, io.EOF
	}
	if len(s.rest) == 0 {
		s.block = sha256.Sum256(s.block[:])
		s.rest = s.block[:]
	}
	k := copy(p[:min(int64(len(p)), s.n)], s.rest)
	s.rest, s.n = s.rest[k:], s.n-int64(k)
	return k, nil
}

// A save streams into the store and out of it, sealed a segment at a time: the store's
// memory holds a segment (the directory) or a chunk (Redis), not the save. 64 MiB saved
// and read back, the heap's peak stays under 20 MiB.
func TestStoreStreams(t *testing.T) {
	const size = 64 << 20
	want := sha256.New()
	io.Copy(want, &stream{n: size}) //nolint:errcheck // a hash does not fail
	dir, err := Open(t.TempDir(), StoreOptions{})
	require.NoError(t, err)
	r := redistest.Start(t)
	red, err := Open(r.URL(), StoreOptions{})
	require.NoError(t, err)
	defer red.Close()
	for name, st := range map[string]*Store{"dir": dir, "redis": red} {
		t.Run(name, func(t *testing.T) {
			saving := peakHeap(func() {
				err = st.SaveFrom(KindSession, "big", Meta{User: "u"}, func(w io.Writer) error {
					_, err := io.Copy(w, &stream{n: size})
					return err
				})
			})
			require.NoError(t, err)
			got := sha256.New()
			loading := peakHeap(func() {
				meta, r, err := st.Open(KindSession, "big")
				require.NoError(t, err)
				assert.Equal(t, "u", meta.User)
				n, err := io.Copy(got, r)
				require.NoError(t, err)
				assert.Equal(t, int64(size), n)
				r.Close()
			})
			assert.Equal(t, want.Sum(nil), got.Sum(nil), "read back as written")
			assert.Less(t, saving, uint64(20<<20), "the heap grew by %d bytes to store 64 MiB", saving)
			assert.Less(t, loading, uint64(20<<20), "the heap grew by %d bytes to read 64 MiB back", loading)
			t.Logf("%s: 64 MiB stored, the heap's peak %d bytes above its start; read back, %d", name, saving, loading)
		})
	}
}

// A segmented save whose segments are cut, moved, dropped or followed by more bytes does
// not open: the reader fails at the damage (errDamaged), never gives what follows it.
func TestStoreSegmentsDamaged(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(dir, StoreOptions{})
	require.NoError(t, err)
	data := make([]byte, 3*segmentSize+100)
	rand.Read(data) //nolint:errcheck // crypto/rand.Read does not fail
	require.NoError(t, st.Save(KindSession, "s", Meta{User: "u"}, data))
	path := savePath(dir, KindSession, "s")
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	// The layout: the head, the base nonce, then segments (flag, length, sealed).
	start := 4 + int(binary.LittleEndian.Uint32(good)) + 12
	var segs [][]byte
	for rest := good[start:]; len(rest) > 0; {
		n := 5 + int(binary.LittleEndian.Uint32(rest[1:]))
		segs, rest = append(segs, rest[:n]), rest[n:]
	}
	require.Len(t, segs, 4)
	assert.Equal(t, []byte{0, 0, 0, 1}, []byte{segs[0][0], segs[1][0], segs[2][0], segs[3][0]}, "the last is marked")
	with := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{good[:start]}, parts...), nil) }
	lastEarly := bytes.Clone(segs[1])
	lastEarly[0] = 1
	for what, bad := range map[string][]byte{
		"moved":          with(segs[0], segs[2], segs[1], segs[3]),
		"dropped":        with(segs[0], segs[1], segs[3]),
		"cut at the end": with(segs[0], segs[1], segs[2]),
		"made the last":  with(segs[0], lastEarly),
		"cut inside":     good[:len(good)-10],
		"bytes after":    append(bytes.Clone(good), 0),
	} {
		require.NoError(t, os.WriteFile(path, bad, 0o600))
		_, _, err := st.Load(KindSession, "s")
		assert.ErrorIs(t, err, errDamaged, what)
	}
	require.NoError(t, os.WriteFile(path, good, 0o600))
	_, got, err := st.Load(KindSession, "s")
	require.NoError(t, err)
	assert.Equal(t, data, got)
}

// A save made before the segments (its blob sealed whole, no format in its meta) still
// opens.
func TestStoreOpensWholeSeals(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(dir, StoreOptions{})
	require.NoError(t, err)
	meta := Meta{User: "u", ID: "old"}
	head, nonce, err := st.sealHead(KindSession, meta)
	require.NoError(t, err)
	blob := st.seal([]byte("the old way"), st.blobAAD(KindSession, "old", "u", nonce))
	require.NoError(t, os.WriteFile(savePath(dir, KindSession, "old"), append(head, blob...), 0o600))
	got, data, err := st.Load(KindSession, "old")
	require.NoError(t, err)
	assert.Equal(t, "u", got.User)
	assert.Equal(t, "the old way", string(data))
}

// A save past MaxBytes is stopped as it is written, and leaves the previous one.
func TestStoreStreamTooLarge(t *testing.T) {
	st, err := Open(t.TempDir(), StoreOptions{MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.NoError(t, st.Save(KindSession, "s", Meta{User: "u"}, []byte("small")))
	wrote := 0
	err = st.SaveFrom(KindSession, "s", Meta{User: "u"}, func(w io.Writer) error {
		for range 64 {
			n, err := w.Write(make([]byte, 64<<10))
			wrote += n
			if err != nil {
				return err
			}
		}
		return nil
	})
	assert.ErrorIs(t, err, ErrTooLarge)
	assert.Less(t, wrote, 2<<20, "stopped near the cap, not at the end")
	_, got, err := st.Load(KindSession, "s")
	require.NoError(t, err)
	assert.Equal(t, "small", string(got), "the previous save stays")
}
