package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
)

// stores runs f with two stores (two replicas) sharing a directory, and with two sharing
// a Redis.
func stores(t *testing.T, f func(t *testing.T, a, b *Store)) {
	t.Run("dir", func(t *testing.T) {
		dir := t.TempDir()
		a, err := Open("dir://"+dir, StoreOptions{TTL: time.Hour})
		require.NoError(t, err)
		b, err := Open(dir, StoreOptions{TTL: time.Hour})
		require.NoError(t, err)
		f(t, a, b)
	})
	t.Run("redis", func(t *testing.T) {
		r := redistest.Start(t)
		a, err := Open(r.URL(), StoreOptions{TTL: time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { a.Close() })
		b, err := Open(r.URL(), StoreOptions{TTL: time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { b.Close() })
		f(t, a, b)
	})
}

// Both backends: saves whole, by kind, listed, removed; leases and their fence; a claim
// for its user only.
func TestStoreBackends(t *testing.T) {
	stores(t, func(t *testing.T, a, b *Store) {
		big := make([]byte, 3*chunkSize+12345)
		for i := range big {
			big[i] = byte(i * 7)
		}
		require.NoError(t, a.Save(KindSandbox, "sb", Meta{User: "ann", Init: []byte(`{"id":"sb"}`)}, big))
		require.NoError(t, a.Save(KindSession, "s", Meta{User: "bob"}, []byte("small")))
		meta, blob, err := b.Load(KindSandbox, "sb")
		require.NoError(t, err)
		assert.Equal(t, "ann", meta.User)
		assert.JSONEq(t, `{"id":"sb"}`, string(meta.Init))
		assert.Equal(t, big, blob, "read back whole, by another replica")
		stat, err := b.Stat(KindSandbox, "sb")
		require.NoError(t, err)
		assert.Equal(t, meta.User, stat.User)
		_, err = b.Stat(KindSession, "sb")
		assert.ErrorIs(t, err, fs.ErrNotExist, "another kind's")
		list := b.List(KindSandbox)
		require.Len(t, list, 1)
		assert.Greater(t, list[0].Size, int64(len(big)))
		assert.Len(t, b.List(KindSession), 1)

		// A second save replaces the first whole.
		require.NoError(t, b.Save(KindSandbox, "sb", Meta{User: "ann"}, []byte("second")))
		_, blob, err = a.Load(KindSandbox, "sb")
		require.NoError(t, err)
		assert.Equal(t, "second", string(blob))

		// The fence: while a holds the lease, b's save is refused; a's goes through.
		require.True(t, a.TryLease(KindSandbox, "sb", "ann"))
		assert.False(t, b.TryLease(KindSandbox, "sb", "ann"))
		assert.ErrorIs(t, b.Save(KindSandbox, "sb", Meta{User: "ann"}, []byte("stale")), ErrFenced)
		require.NoError(t, a.Save(KindSandbox, "sb", Meta{User: "ann"}, []byte("newer")))
		_, _, err = b.Claim(context.Background(), KindSandbox, "sb", "bob")
		assert.ErrorIs(t, err, fs.ErrNotExist, "another user's")
		a.ReleaseLease(KindSandbox, "sb")
		_, blob, err = b.Claim(context.Background(), KindSandbox, "sb", "ann")
		require.NoError(t, err)
		assert.Equal(t, "newer", string(blob))
		assert.False(t, a.TryLease(KindSandbox, "sb", "ann"), "b holds it now")
		b.ReleaseLease(KindSandbox, "sb")

		b.Remove(KindSandbox, "sb")
		_, _, err = a.Load(KindSandbox, "sb")
		assert.ErrorIs(t, err, fs.ErrNotExist)
		assert.Empty(t, a.List(KindSandbox))
	})
}

// A claim asks the holder to let go (the want mark KeepUp sees), and waits for it.
func TestStoreClaimAsksTheHolder(t *testing.T) {
	stores(t, func(t *testing.T, a, b *Store) {
		require.NoError(t, a.Save(KindSession, "s", Meta{User: "ann"}, []byte("v1")))
		require.True(t, a.TryLease(KindSession, "s", "ann"))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		gaveUp := make(chan string, 1)
		go a.KeepUp(ctx, KindSession, func() map[string]string { return map[string]string{"s": "ann"} }, func(id string) {
			a.Save(KindSession, id, Meta{User: "ann"}, []byte("v2")) //nolint:errcheck // checked by the claim's read
			a.ReleaseLease(KindSession, id)
			select {
			case gaveUp <- id:
			default:
			}
		})
		_, blob, err := b.Claim(context.Background(), KindSession, "s", "ann")
		require.NoError(t, err)
		assert.Equal(t, "v2", string(blob), "saved by the holder as it let go")
		assert.Equal(t, "s", <-gaveUp)
	})
}

// A store takes saves up to its most (-state-max-bytes).
func TestStoreMaxBytes(t *testing.T) {
	st, err := Open(t.TempDir(), StoreOptions{TTL: time.Hour, MaxBytes: 300}) // (a sealed head is ~150 bytes)
	require.NoError(t, err)
	require.NoError(t, st.Save(KindSession, "s", Meta{}, make([]byte, 10)))
	err = st.Save(KindSession, "s", Meta{}, make([]byte, 300))
	assert.ErrorIs(t, err, ErrTooLarge)
	_, blob, err := st.Load(KindSession, "s")
	require.NoError(t, err)
	assert.Len(t, blob, 10, "the previous save stays")
}

// Redis: a save leaves no chunk of the one it replaced; saves expire (Redis's TTL); the
// state key is made once and shared; what was saved outlives a restart of Redis; while it
// is down, the store's calls fail at once (not hang) and Ready says why.
func TestStoreRedis(t *testing.T) {
	r := redistest.Start(t)
	st, err := Open(r.URL(), StoreOptions{TTL: time.Hour})
	require.NoError(t, err)
	defer st.Close()
	c := r.Client()
	ctx := context.Background()
	key, err := c.Get(ctx, "minipy:key").Result()
	require.NoError(t, err)
	assert.Len(t, strings.TrimSpace(key), 64)

	chunks := func() int {
		keys, err := c.Keys(ctx, "minipy:{*}:c:*").Result()
		require.NoError(t, err)
		return len(keys)
	}
	require.NoError(t, st.Save(KindSession, "s", Meta{User: "u"}, make([]byte, 2*chunkSize+1)))
	assert.Equal(t, 3, chunks())
	require.NoError(t, st.Save(KindSession, "s", Meta{User: "u"}, make([]byte, chunkSize-1024))) // (and its seal: 12 bytes, 21 a segment of 64 KiB)
	assert.Equal(t, 1, chunks(), "the replaced save's chunks are gone")

	short, err := Open(r.URL(), StoreOptions{TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	defer short.Close()
	require.NoError(t, short.Save(KindSandbox, "gone", Meta{User: "u"}, []byte("x")))
	require.Eventually(t, func() bool {
		_, err := short.Stat(KindSandbox, "gone")
		return errors.Is(err, fs.ErrNotExist)
	}, 5*time.Second, 20*time.Millisecond)
	assert.Empty(t, short.List(KindSandbox))

	r.Restart()
	_, blob, err := st.Load(KindSession, "s")
	require.NoError(t, err, "kept across Redis's restart")
	assert.Equal(t, chunkSize-1024, len(blob))

	r.Stop()
	start := time.Now()
	err = st.Save(KindSession, "s", Meta{User: "u"}, []byte("while down"))
	require.Error(t, err)
	assert.Less(t, time.Since(start), opTimeout+time.Second)
	assert.Error(t, st.Ready(ctx))
	r.Start()
	require.Eventually(t, func() bool { return st.Ready(ctx) == nil }, 10*time.Second, 50*time.Millisecond)
	require.NoError(t, st.Save(KindSession, "s", Meta{User: "u"}, []byte("back")))
	_, blob, err = st.Load(KindSession, "s")
	require.NoError(t, err)
	assert.Equal(t, "back", string(blob))
}

// A store URL that cannot be reached fails Open with the address.
func TestStoreRedisUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	_, err = Open("redis://"+addr+"/0", StoreOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), addr)
	_, err = Open("redis://:bad url", StoreOptions{})
	assert.Error(t, err)
	_, err = Open("s3://bucket/x", StoreOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "a store is dir://PATH")
}

// A replica that dies holding a lease (no renewal) lets its session go after the lease's
// length: another one's claim waits for that, then takes the session.
func TestStoreLeaseBound(t *testing.T) {
	stores(t, func(t *testing.T, a, b *Store) {
		a.o.Lease, b.o.Lease = 400*time.Millisecond, 400*time.Millisecond
		require.NoError(t, a.Save(KindSession, "s", Meta{User: "ann"}, []byte("saved")))
		require.True(t, a.TryLease(KindSession, "s", "ann")) // and a dies: nobody renews it
		start := time.Now()
		_, blob, err := b.Claim(context.Background(), KindSession, "s", "ann")
		require.NoError(t, err)
		assert.Equal(t, "saved", string(blob))
		assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "it waited for the lease")
		assert.ErrorIs(t, a.Save(KindSession, "s", Meta{User: "ann"}, []byte("stale")), ErrFenced,
			"the replica that lost its lease cannot write over b's session")
	})
}

// Replicas racing for one session in Redis: exactly one takes its lease, and only its
// saves go through.
func TestStoreRedisRace(t *testing.T) {
	r := redistest.Start(t)
	var replicas []*Store
	for range 4 {
		st, err := Open(r.URL(), StoreOptions{TTL: time.Hour})
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		replicas = append(replicas, st)
	}
	for round := range 20 {
		id := fmt.Sprintf("s%d", round)
		won := make(chan *Store, 8)
		var wg sync.WaitGroup
		for _, st := range replicas {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if st.TryLease(KindSession, id, "u") {
						won <- st
					}
				}()
			}
		}
		wg.Wait()
		close(won)
		owners := map[*Store]bool{}
		for st := range won {
			owners[st] = true
		}
		require.Len(t, owners, 1, "round %d: one replica holds the lease", round)
		for _, st := range replicas {
			err := st.Save(KindSession, id, Meta{User: "u"}, []byte("x"))
			if owners[st] {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrFenced)
			}
		}
	}
}

// A replica killed mid-save (its chunks written, the save not switched to them) leaves the
// previous save whole; the sweep removes its stray chunks once they are old, and never a
// save's own.
func TestStoreRedisKilledMidSave(t *testing.T) {
	r := redistest.Start(t)
	st, err := Open(r.URL(), StoreOptions{})
	require.NoError(t, err)
	defer st.Close()
	require.NoError(t, st.Save(KindSession, "s", Meta{User: "u"}, []byte("whole")))
	c := r.Client()
	ctx := context.Background()
	n := name(KindSession, "s")
	for _, gen := range []string{newGen(time.Now().Add(-time.Hour)), newGen(time.Now())} { // a dead writer's, one in progress
		require.NoError(t, c.Set(ctx, (&redisBackend{ns: "minipy:"}).chunkKey(n, gen, 0), "half a save", 0).Err())
	}
	_, blob, err := st.Load(KindSession, "s")
	require.NoError(t, err)
	assert.Equal(t, "whole", string(blob))
	st.Sweep()
	keys, err := c.Keys(ctx, "minipy:{*}:c:*").Result()
	require.NoError(t, err)
	assert.Len(t, keys, 2, "the save's own chunk and the one in progress stay: %v", keys)
	_, blob, err = st.Load(KindSession, "s")
	require.NoError(t, err)
	assert.Equal(t, "whole", string(blob))
}

// Two deployments sharing one Redis database (-state-prefix) never meet: each has its own
// keys, its own state key, its own saves for users of the same name.
func TestStoreRedisPrefix(t *testing.T) {
	r := redistest.Start(t)
	a, err := Open(r.URL(), StoreOptions{})
	require.NoError(t, err)
	defer a.Close()
	b, err := Open(r.URL(), StoreOptions{Prefix: "staging"})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, a.Save(KindSession, "s", Meta{User: "u"}, []byte("production's")))
	require.NoError(t, b.Save(KindSession, "s", Meta{User: "u"}, []byte("staging's")))
	for st, want := range map[*Store]string{a: "production's", b: "staging's"} {
		_, blob, err := st.Load(KindSession, "s")
		require.NoError(t, err)
		assert.Equal(t, want, string(blob))
		assert.Len(t, st.List(KindSession), 1)
	}
	c := r.Client()
	ctx := context.Background()
	keyA, err := c.Get(ctx, "minipy:key").Result()
	require.NoError(t, err)
	keyB, err := c.Get(ctx, "minipy:staging:key").Result()
	require.NoError(t, err)
	assert.NotEqual(t, keyA, keyB)
	staging, err := c.Keys(ctx, "minipy:staging:*").Result()
	require.NoError(t, err)
	assert.Len(t, staging, 4, "its key, its index, its save and its chunk: %v", staging)
}
