package session

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A replica's address is current while it is advertised, stale a lease after its last
// save, and gone when it withdraws; another replica sees it, itself does not list itself.
func TestKeepAdvertised(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(dir, StoreOptions{Lease: 300 * time.Millisecond})
	require.NoError(t, err)
	defer a.Close()
	b, err := Open(dir, StoreOptions{Lease: 300 * time.Millisecond})
	require.NoError(t, err)
	defer b.Close()
	stop := a.KeepAdvertised(KindReplica, "http://10.0.0.5:8081")
	_, err = b.ReplicaAddr(KindReplica, a.Owner())
	require.NoError(t, err, "advertised before KeepAdvertised returns")
	first, err := b.Stat(KindReplica, a.Owner())
	require.NoError(t, err)
	var addr string
	require.Eventually(t, func() bool { // (saved again, past its first lease: still current)
		meta, err := b.Stat(KindReplica, a.Owner())
		var current error
		addr, current = b.ReplicaAddr(KindReplica, a.Owner())
		return err == nil && meta.Saved.After(first.Saved.Add(300*time.Millisecond)) && current == nil &&
			len(b.Replicas(KindReplica)) == 1
	}, 10*time.Second, 10*time.Millisecond, "renewed every third of a lease, listed by the other")
	assert.Equal(t, "http://10.0.0.5:8081", addr)
	assert.Empty(t, a.Replicas(KindReplica), "not itself")
	_, err = b.ReplicaAddr(KindReplicaMCP, a.Owner())
	assert.Error(t, err, "another kind's address is another")
	stop()
	_, err = b.ReplicaAddr(KindReplica, a.Owner())
	assert.Error(t, err, "withdrawn")
}
