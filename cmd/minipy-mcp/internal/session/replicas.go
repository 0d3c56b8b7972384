package session

import (
	"encoding/json"
	"errors"
	"time"
)

// Replicas that share a store find each other through it: each says where it is reached
// (Advertise, renewed while it runs), and holds a lease on what it runs (TryLease of
// KindRunning), which tells the others where to forward (Holder, ReplicaAddr). A replica's
// address is a sealed save: one who may write the store but has not its key cannot make a
// replica forward anywhere but to another replica's address.

// Owner is this replica's id in its leases.
func (d *Store) Owner() string { return d.owner }

// Holder is the replica that holds the lease of id of kind, if one other than this one
// does and it has not expired.
func (d *Store) Holder(kind, id string) (owner string, ok bool) {
	l, ok := d.b.readLease(d.name(kind, id))
	if !ok || l.Owner == d.owner || !time.Now().Before(l.Until) {
		return "", false
	}
	return l.Owner, true
}

// replicaInit is what a replica's save says.
type replicaInit struct {
	Addr string `json:"addr"`
}

// Advertise saves this replica's address (a URL the others reach it at): until it is saved
// again within a lease, it is current (ReplicaAddr).
func (d *Store) Advertise(addr string) error {
	init, _ := json.Marshal(replicaInit{Addr: addr})
	return d.Save(KindReplica, d.owner, Meta{Init: init}, nil)
}

// Withdraw removes this replica's address (it is closing).
func (d *Store) Withdraw() { d.Remove(KindReplica, d.owner) }

// errStale: a replica's address not saved again within a lease (it stopped, or died).
var errStale = errors.New("the replica's address is stale")

// ReplicaAddr is the address of replica owner, saved within a lease (Advertise).
func (d *Store) ReplicaAddr(owner string) (string, error) {
	meta, err := d.Stat(KindReplica, owner)
	if err != nil {
		return "", err
	}
	return d.addrOf(meta)
}

// Replicas are the current addresses of the other replicas, by owner.
func (d *Store) Replicas() map[string]string {
	out := map[string]string{}
	for _, one := range d.List(KindReplica) {
		if one.ID == d.owner {
			continue
		}
		if addr, err := d.addrOf(one.Meta); err == nil {
			out[one.ID] = addr
		}
	}
	return out
}

// addrOf is the address a replica's save holds, if it is current.
func (d *Store) addrOf(meta Meta) (string, error) {
	if time.Since(meta.Saved) > d.o.Lease {
		return "", errStale
	}
	var ri replicaInit
	if err := json.Unmarshal(meta.Init, &ri); err != nil || ri.Addr == "" {
		return "", errDamaged
	}
	return ri.Addr, nil
}

// LeaseLength is how long a lease lasts unless renewed (StoreOptions.Lease).
func (d *Store) LeaseLength() time.Duration { return d.o.Lease }
