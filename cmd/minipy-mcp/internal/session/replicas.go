package session

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
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

// Advertise saves this replica's address of kind (KindReplica: its E2B API's,
// KindReplicaMCP: its MCP endpoint's; a URL the others reach it at): until it is saved
// again within a lease, it is current (ReplicaAddr).
func (d *Store) Advertise(kind, addr string) error {
	init, _ := json.Marshal(replicaInit{Addr: addr})
	return d.Save(kind, d.owner, Meta{Init: init}, nil)
}

// Withdraw removes this replica's address of kind (it is closing).
func (d *Store) Withdraw(kind string) { d.Remove(kind, d.owner) }

// errStale: a replica's address not saved again within a lease (it stopped, or died).
var errStale = errors.New("the replica's address is stale")

// ReplicaAddr is the address of kind of replica owner, saved within a lease (Advertise).
func (d *Store) ReplicaAddr(kind, owner string) (string, error) {
	meta, err := d.Stat(kind, owner)
	if err != nil {
		return "", err
	}
	return d.addrOf(meta)
}

// Replicas are the current addresses of kind of the other replicas, by owner.
func (d *Store) Replicas(kind string) map[string]string {
	out := map[string]string{}
	for _, one := range d.List(kind) {
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

// The forward's mark: a request a replica forwards to another carries MarkHeader, "OWNER
// UNIXTIME MAC", the MAC an HMAC of the owner, the time, the method, the host and the
// request URI under a key derived from the store's. It says only that a replica of this
// store sent it (so that it is not forwarded again); the client's credentials in it are
// checked as any request's.
const MarkHeader = "Minipy-Forward"

// markSkew is how far a mark's time may be from the receiver's clock.
const markSkew = time.Minute

// ErrBadMark: a forward's mark that does not verify.
var ErrBadMark = errors.New("the request's " + MarkHeader + " mark is not a replica's of this server's store")

// markMAC is the MAC of r's mark, sent by owner at unix time ts.
func (d *Store) markMAC(owner, ts string, r *http.Request) []byte {
	m := hmac.New(sha256.New, d.Derive("replica-forward"))
	fmt.Fprintf(m, "%s\n%s\n%s\n%s\n%s", owner, ts, r.Method, r.Host, r.URL.RequestURI())
	return m.Sum(nil)
}

// Mark marks r as forwarded by this replica, now.
func (d *Store) Mark(r *http.Request) { d.MarkAt(r, time.Now()) }

// MarkAt marks r as forwarded by this replica at the time at (which VerifyMark refuses
// past a minute from its clock).
func (d *Store) MarkAt(r *http.Request, at time.Time) {
	ts := strconv.FormatInt(at.Unix(), 10)
	r.Header.Set(MarkHeader, d.owner+" "+ts+" "+base64.RawURLEncoding.EncodeToString(d.markMAC(d.owner, ts, r)))
}

// VerifyMark checks r's mark: ErrBadMark unless a replica of this store made it for this
// request (its method, host and URI) within a minute of now.
func (d *Store) VerifyMark(r *http.Request) error {
	parts := strings.Fields(r.Header.Get(MarkHeader))
	if len(parts) != 3 {
		return ErrBadMark
	}
	sec, err := strconv.ParseInt(parts[1], 10, 64)
	got, err2 := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || err2 != nil || time.Since(time.Unix(sec, 0)).Abs() > markSkew ||
		!hmac.Equal(got, d.markMAC(parts[0], parts[1], r)) {
		return ErrBadMark
	}
	return nil
}

// KeepAdvertised advertises addr as this replica's address of kind now, before it returns
// (the other replicas forward to it from its first request on), and again every third of
// a lease until stop; stop withdraws it.
func (d *Store) KeepAdvertised(kind, addr string) (stop func()) {
	d.Advertise(kind, addr) //nolint:errcheck // (again at the next tick if the store is away)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d.o.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				d.Advertise(kind, addr) //nolint:errcheck
			}
		}
	}()
	return func() {
		cancel()
		<-done
		d.Withdraw(kind)
	}
}

// ReplicaTransport is the transport a replica forwards to the others with: no proxy from
// the environment (they are reached directly), a connection in 5 s, connections kept.
func ReplicaTransport() *http.Transport {
	return &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
}

// StateLost reports a run's (or a save's) error whose namespace's process tree ended
// with nothing to roll back to (its sandbox's pid 1 died): its variables are gone
// (minipy.ErrStateLost); idle says it ended between runs, so that the run did not start
// (minipy.WorkerLostError's Idle).
func StateLost(err error) (idle, lost bool) {
	var wl *minipy.WorkerLostError
	if !errors.Is(err, minipy.ErrStateLost) || !errors.As(err, &wl) {
		return false, false
	}
	return wl.Idle, true
}
