package session

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// savePath is the file of a save in a directory store; sidePath the file beside it (.lease).
func savePath(dir, kind, id string) string { return filepath.Join(dir, name(kind, id)) }

func sidePath(dir, kind, id, ext string) string {
	return (&dirBackend{dir: dir}).side(name(kind, id), ext)
}

// saves lists the saves in dir.
func saves(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	for _, kind := range kinds {
		found, err := filepath.Glob(filepath.Join(dir, "*"+kind))
		require.NoError(t, err)
		names = append(names, found...)
	}
	sort.Strings(names)
	return names
}

// Leases: one replica holds a session at a time; it renews and gives up its own; another
// takes an expired one, and a free one.
func TestStoreLeases(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenStore(dir, time.Hour, "")
	require.NoError(t, err)
	b, err := OpenStore(dir, time.Hour, "")
	require.NoError(t, err)
	key, err := os.ReadFile(filepath.Join(dir, ".key"))
	require.NoError(t, err)
	assert.Len(t, strings.TrimSpace(string(key)), 64, "a random key, made once, shared")

	require.True(t, a.TryLease(KindSession, "s1", "u"))
	assert.True(t, a.TryLease(KindSession, "s1", "u"), "its own")
	assert.False(t, b.TryLease(KindSession, "s1", "u"), "held by a")
	assert.True(t, b.TryLease(KindSandbox, "s1", "u"), "another kind's s1 is another session")
	ctx := context.Background()
	assert.False(t, b.TakeLease(ctx, KindSession, "s1", "u", 300*time.Millisecond), "a keeps holding it")
	a.ReleaseLease(KindSession, "s1")
	assert.True(t, b.TryLease(KindSession, "s1", "u"), "given up")
	b.ReleaseLease(KindSession, "s1")

	expired, _ := json.Marshal(lease{Owner: "a dead replica", Until: time.Now().Add(-time.Second)})
	require.NoError(t, os.WriteFile(sidePath(dir, KindSession, "s2", ".lease"), expired, 0o600))
	assert.True(t, b.TryLease(KindSession, "s2", "u"), "an expired lease is taken over")
	b.ReleaseLease(KindSession, "s2")
	a.ReleaseLease(KindSession, "s2") // not a's: stays b's... and b gave it up
	_, err = os.Stat(sidePath(dir, KindSession, "s2", ".lease"))
	assert.True(t, os.IsNotExist(err))
}

// Replicas that race for a free lease (or an expired one): one of them takes it, however
// their reads and writes interleave (a directory's once gave it to two, each reading its
// own write back, and both woke the same sandbox from its save).
func TestStoreDirLeaseRace(t *testing.T) {
	dir := t.TempDir()
	var stores []*Store
	for range 6 {
		s, err := OpenStore(dir, time.Hour, "")
		require.NoError(t, err)
		stores = append(stores, s)
	}
	for round := range 150 {
		id := fmt.Sprint("s", round)
		if round%2 == 1 { // (an expired lease of a replica that died)
			expired, _ := json.Marshal(lease{Owner: "a dead replica", Until: time.Now().Add(-time.Second)})
			require.NoError(t, os.WriteFile(sidePath(dir, KindSandbox, id, ".lease"), expired, 0o600))
		}
		var won atomic.Int32
		var ready, done sync.WaitGroup
		ready.Add(len(stores))
		start := make(chan struct{})
		for _, s := range stores {
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				if s.TryLease(KindSandbox, id, "u") {
					won.Add(1)
				}
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()
		require.Equal(t, int32(1), won.Load(), "round %d: one replica holds the lease", round)
	}
}

// Saves expire after the TTL: a load finds none, and the sweep removes old files.
func TestStoreExpires(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenStore(dir, 200*time.Millisecond, "")
	require.NoError(t, err)
	write := func(id string) { require.NoError(t, d.Save(KindSession, id, Meta{User: "u"}, nil)) }
	write("s")
	meta, _, err := d.Load(KindSession, "s")
	require.NoError(t, err)
	assert.Equal(t, "u", meta.User)
	time.Sleep(300 * time.Millisecond)
	_, _, err = d.Load(KindSession, "s")
	require.ErrorIs(t, err, os.ErrNotExist, "expired")
	assert.Empty(t, saves(t, dir), "and removed")

	write("old")
	past := time.Now().Add(-time.Hour)
	require.NoError(t, os.Chtimes(savePath(dir, KindSession, "old"), past, past))
	write("new")
	d.Sweep()
	assert.Equal(t, []string{savePath(dir, KindSession, "new")}, saves(t, dir))
}

// A save is read back whole, by its kind only; List reads the metas of one kind; a file
// cut short is an error, not a crash.
func TestStoreSaveLoadList(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenStore(dir, time.Hour, "")
	require.NoError(t, err)
	require.NoError(t, d.Save(KindSandbox, "sb1", Meta{User: "ann", Init: json.RawMessage(`{"id":"sb1"}`)}, []byte("blob one")))
	require.NoError(t, d.Save(KindSandbox, "sb2", Meta{User: "bob", Init: json.RawMessage(`{"id":"sb2"}`)}, bytes.Repeat([]byte("x"), 5000)))
	require.NoError(t, d.Save(KindSession, "s", Meta{User: "ann"}, []byte("mcp")))

	meta, blob, err := d.Load(KindSandbox, "sb1")
	require.NoError(t, err)
	assert.Equal(t, "ann", meta.User)
	assert.JSONEq(t, `{"id":"sb1"}`, string(meta.Init))
	assert.WithinDuration(t, time.Now(), meta.Saved, time.Minute)
	assert.Equal(t, "blob one", string(blob))
	_, _, err = d.Load(KindSession, "sb1")
	assert.ErrorIs(t, err, fs.ErrNotExist, "another kind")
	stat, err := d.Stat(KindSandbox, "sb1")
	require.NoError(t, err)
	assert.Equal(t, meta, stat)
	_, err = d.Stat(KindSandbox, "sb3")
	assert.ErrorIs(t, err, fs.ErrNotExist)

	list := d.List(KindSandbox)
	require.Len(t, list, 2)
	users := []string{list[0].User, list[1].User}
	sort.Strings(users)
	assert.Equal(t, []string{"ann", "bob"}, users)
	for _, s := range list {
		if s.User == "bob" {
			assert.Greater(t, s.Size, int64(5000))
		}
	}
	assert.Len(t, d.List(KindSession), 1)

	require.NoError(t, os.WriteFile(savePath(dir, KindSandbox, "cut"), []byte{200, 0, 0, 0, '{'}, 0o600))
	_, _, err = d.Load(KindSandbox, "cut")
	require.Error(t, err)
	assert.NotErrorIs(t, err, fs.ErrNotExist)
	assert.Len(t, d.List(KindSandbox), 2, "a broken save is left out")

	d.Remove(KindSandbox, "sb1")
	_, _, err = d.Load(KindSandbox, "sb1")
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

// Claim finds a save for its user only, and takes its lease.
func TestStoreClaim(t *testing.T) {
	dir := t.TempDir()
	a, err := OpenStore(dir, time.Hour, "")
	require.NoError(t, err)
	b, err := OpenStore(dir, time.Hour, "")
	require.NoError(t, err)
	require.NoError(t, a.Save(KindSandbox, "sb", Meta{User: "ann"}, []byte("state")))
	ctx := context.Background()
	_, _, err = b.Claim(ctx, KindSandbox, "sb", "bob")
	assert.ErrorIs(t, err, fs.ErrNotExist, "another user's")
	_, _, err = b.Claim(ctx, KindSession, "sb", "ann")
	assert.ErrorIs(t, err, fs.ErrNotExist, "another kind's")
	_, blob, err := b.Claim(ctx, KindSandbox, "sb", "ann")
	require.NoError(t, err)
	assert.Equal(t, "state", string(blob))
	assert.False(t, a.TryLease(KindSandbox, "sb", "ann"), "b holds it")
	b.ReleaseLease(KindSandbox, "sb")
	assert.True(t, a.TryLease(KindSandbox, "sb", "ann"))
}

// Saves are sealed (issue 66): nothing of them is in clear on disk, and someone who can
// write the store but does not hold the key cannot move a save to another session, user,
// kind or deployment, nor change a byte of it: it does not open, and a resume never trusts
// it. (The save of one user's paused sandbox, copied over another's with its metadata
// rewritten, once resumed there and ran its planted function.)
func TestStoreSeals(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600))
	d, err := Open(dir, StoreOptions{KeyFile: keyFile})
	require.NoError(t, err)
	require.NoError(t, d.Save(KindSandbox, "ann-sb", Meta{User: "ann", Init: json.RawMessage(`{"env":"ann-secret-env"}`)},
		[]byte("ann's variables: ann-secret-value")))
	require.NoError(t, d.Save(KindSandbox, "bob-sb", Meta{User: "bob", Init: json.RawMessage(`{}`)},
		[]byte("bob's planted function")))
	for _, f := range saves(t, dir) {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.NotContains(t, string(raw), "secret", "in clear on disk: %s", f)
		assert.NotContains(t, string(raw), "planted", "in clear on disk: %s", f)
		assert.NotContains(t, string(raw), `"user"`, "the meta in clear on disk: %s", f)
	}
	copyOver := func(from, to string) {
		raw, err := os.ReadFile(savePath(dir, KindSandbox, from))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(savePath(dir, KindSandbox, to), raw, 0o600))
	}

	copyOver("bob-sb", "ann-sb") // (the attack: bob's save in ann's sandbox's place)
	_, _, err = d.Load(KindSandbox, "ann-sb")
	assert.ErrorIs(t, err, errDamaged, "another session's save")
	_, err = d.Stat(KindSandbox, "ann-sb")
	assert.ErrorIs(t, err, errDamaged)
	_, _, err = d.Claim(context.Background(), KindSandbox, "ann-sb", "ann")
	assert.Error(t, err)

	require.NoError(t, d.Save(KindSandbox, "ann-sb", Meta{User: "ann"}, []byte("ann's variables")))
	for i := range []int{4, 40, -20, -1} {
		raw, err := os.ReadFile(savePath(dir, KindSandbox, "ann-sb"))
		require.NoError(t, err)
		at := []int{4, 40, len(raw) - 20, len(raw) - 1}[i]
		raw[at] ^= 1
		require.NoError(t, os.WriteFile(savePath(dir, KindSandbox, "ann-sb"), raw, 0o600))
		_, _, err = d.Load(KindSandbox, "ann-sb")
		assert.Error(t, err, "a byte changed at %d", at)
		raw[at] ^= 1
		require.NoError(t, os.WriteFile(savePath(dir, KindSandbox, "ann-sb"), raw, 0o600))
	}
	meta, blob, err := d.Load(KindSandbox, "ann-sb")
	require.NoError(t, err)
	assert.Equal(t, "ann", meta.User)
	assert.Equal(t, "ann's variables", string(blob))
	_, _, err = d.Load(KindSession, "ann-sb")
	assert.ErrorIs(t, err, fs.ErrNotExist, "another kind's")

	// Another deployment (-state-prefix) on the same directory and key: its own names, and
	// seals that open in no other.
	other, err := Open(dir, StoreOptions{KeyFile: keyFile, Prefix: "staging"})
	require.NoError(t, err)
	_, _, err = other.Load(KindSandbox, "ann-sb")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Empty(t, other.List(KindSandbox), "another deployment's saves")
	require.NoError(t, other.Save(KindSandbox, "ann-sb", Meta{User: "ann"}, []byte("staging's")))
	raw, err := os.ReadFile(savePath(dir, KindSandbox, "ann-sb"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(other.b.(*dirBackend).path(other.name(KindSandbox, "ann-sb")), raw, 0o600))
	_, _, err = other.Load(KindSandbox, "ann-sb")
	assert.ErrorIs(t, err, errDamaged, "production's save in staging's place")
	assert.Len(t, d.List(KindSandbox), 2, "production lists its own two")
	_, err = Open(dir, StoreOptions{Prefix: "no/slash"})
	assert.Error(t, err)
}
