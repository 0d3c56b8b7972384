package session

// Sessions that outlive their process (-state-store, -state-dir): a Store keeps what a
// front saves of a session (its Meta and its namespace's, or namespaces',
// minipy.Namespace.Save) in a backend, a directory (dir://PATH) or Redis
// (redis://host:port/db), each save whole: a reader sees the previous one or the new one.
// Saves are named by a hash of their id (a secret of its client's, for MCP) and their kind.
// They expire TTL after their last save.
//
// Replicas may share the store. One of them holds a session at a time, by a lease (the
// holder, its user, until when) that it renews while the session lives there (KeepUp) and
// gives up once it has saved it; another replica waits for a held lease up to LeaseWait
// (asking the holder to let go: a want mark), and takes an expired one (its holder died
// without draining: what ran since its last save is lost). A save is fenced by the lease:
// a replica whose lease another has taken cannot write over the newer save (ErrFenced).

import (
	"bytes"
	"context"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
)

const (
	// DefaultLease is how long a lease lasts unless renewed (StoreOptions.Lease): a replica
	// renews its leases every third of it, and one killed hard lets its sessions go after
	// it at the latest.
	DefaultLease = 10 * time.Second
	// LeaseWait is how long a request for a session that another replica holds waits for
	// it to be given up (the other one drains, or hands it over, or its lease expires)
	// before it is refused: longer than DefaultLease.
	LeaseWait = 15 * time.Second
	// wantEvery is how often a replica looks for the sessions others want of it.
	wantEvery = 200 * time.Millisecond
)

// The kinds of what a store keeps: a front's sessions are apart from another's even under
// the same id.
const (
	KindSession    = ".session"     // an MCP session or session handle
	KindSandbox    = ".paused"      // a paused E2B sandbox
	KindSnapshot   = ".snapshot"    // an E2B snapshot
	KindRunning    = ".running"     // an E2B sandbox running on a replica: its lease alone, the holder's (Holder)
	KindReplica    = ".replica"     // a replica's address of its E2B API, for the others to forward to (Advertise)
	KindReplicaMCP = ".replica-mcp" // ... of its MCP endpoint
)

var kinds = []string{KindSession, KindSandbox, KindSnapshot, KindReplica, KindReplicaMCP, KindRunning}

// Meta is what is kept of a session beside its namespace.
type Meta struct {
	// User is the user who opened it (-tokens NAME; "" without tokens): only that user's
	// requests find it.
	User string `json:"user"`
	// Init is what its front needs to bring it back: MCP's initialize request's params, an
	// E2B sandbox's description.
	Init json.RawMessage `json:"init"`
	// Saved is when; the save sets it.
	Saved time.Time `json:"saved"`
	// ID is the session's id, as the save sets it: a save read under another id is
	// another session's (moved), and not found.
	ID string `json:"id"`
	// Format is how the blob is sealed: blobSegmented (seal.go), or 0, whole (saves made
	// before the segments).
	Format int `json:"format,omitempty"`
}

// Saved is a save that List found: its meta and its size in bytes.
type Saved struct {
	Meta
	Size int64
}

// lease is who holds a session.
type lease struct {
	Owner string    `json:"owner"`
	User  string    `json:"user"` // the session's
	Until time.Time `json:"until"`
}

// ErrFenced: the save was refused, because another replica holds the session's lease.
var ErrFenced = errors.New("another replica holds this session now: its save is newer")

// ErrTooLarge: the save is larger than the store takes (-state-max-bytes).
var ErrTooLarge = errors.New("the saved state is larger than the store takes")

// backend is where a Store keeps its saves, leases and want marks. A save is its meta's
// header (headerOf) followed by its blob.
type backend interface {
	// put writes a save, its head then what blob reads, unless another owner than owner
	// holds its lease (ErrFenced); ttl (0: none) is how long it is kept. Whole or not at
	// all: an error of blob's leaves the save before it.
	put(name, owner string, head []byte, blob io.Reader, ttl time.Duration) error
	// get reads a save, as a stream: its head, then its blob; head its header only, and
	// its size (fs.ErrNotExist: none).
	get(name string) (io.ReadCloser, error)
	head(name string) ([]byte, int64, error)
	// list reads the header and size of each save whose name ends with kind.
	list(kind string) []listed
	remove(name string)
	// tryLease makes owner the holder of name's lease (for user, for lease) if it is free,
	// expired or owner's already; readLease reads it; releaseLease removes it if owner holds it.
	tryLease(name, owner, user string, lease time.Duration) bool
	readLease(name string) (lease, bool)
	releaseLease(name, owner string)
	// want marks name as wanted by another replica (until unwant); wanted reads the mark.
	want(name, owner string) bool
	unwant(name string)
	wanted(name string) bool
	// sweep removes what expired that the backend does not expire itself.
	sweep(ttl, lease time.Duration)
	// ping reports whether the backend answers.
	ping(ctx context.Context) error
	close() error
}

// listed is one save in a backend's list.
type listed struct {
	name string
	head []byte
	size int64
}

// Store is the store of saved sessions. Its methods are safe from any goroutine.
type Store struct {
	b     backend
	o     StoreOptions
	owner string      // this replica, in its leases
	key   []byte      // the state key (Derive)
	aead  cipher.AEAD // the saves' seal (seal.go)
}

// StoreOptions are a store's: the zero value keeps saves for ever, of any size, with
// leases of DefaultLease, and the store's own state key.
type StoreOptions struct {
	// TTL is how long a save is kept after it (0: for ever).
	TTL time.Duration
	// KeyFile is the file of the state key; "": the store's own, made with a random key
	// when missing, so that replicas sharing the store share it.
	KeyFile string
	// MaxBytes is the largest save the store takes (0: any).
	MaxBytes int64
	// Lease is how long a lease lasts unless renewed (0: DefaultLease).
	Lease time.Duration
	// Prefix keeps a deployment's saves apart from another's in a store they share
	// (-state-prefix): its own names, its own Redis keys, and seals that open in no other.
	Prefix string
}

// Open opens the store at url: dir://PATH or a plain path (a directory, made if missing),
// redis://[user:pass@]host:port/db or rediss:// (TLS). It sets minipy's state key (o.KeyFile
// or the store's).
func Open(url string, o StoreOptions) (*Store, error) {
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Prefix != "" && !prefixName.MatchString(o.Prefix) {
		return nil, fmt.Errorf("-state-prefix %q: 1-64 letters, digits or ._- (it names the deployment's keys)", o.Prefix)
	}
	keyFile := o.KeyFile
	var b backend
	var key []byte
	var err error
	switch {
	case strings.HasPrefix(url, "redis://"), strings.HasPrefix(url, "rediss://"):
		b, key, err = openRedis(url, o.Prefix, keyFile == "")
	case strings.Contains(url, "://") && !strings.HasPrefix(url, "dir://"):
		return nil, fmt.Errorf("-state-store %s: a store is dir://PATH, redis://HOST:PORT/DB or rediss://...",
			strings.SplitN(url, "://", 2)[0]+"://...")
	default:
		b, key, err = openDir(strings.TrimPrefix(url, "dir://"), keyFile == "")
	}
	if err != nil {
		return nil, err
	}
	if keyFile != "" {
		if key, err = os.ReadFile(keyFile); err != nil {
			b.close()
			return nil, fmt.Errorf("the state key: %w", err)
		}
	}
	if err := minipy.SetStateKey(bytes.TrimSpace(key)); err != nil {
		b.close()
		return nil, fmt.Errorf("the state key (%s): %w", keyFile, err)
	}
	var r [8]byte
	rand.Read(r[:]) //nolint:errcheck // crypto/rand.Read does not fail
	host, _ := os.Hostname()
	d := &Store{b: b, o: o, owner: host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(r[:]),
		key: bytes.TrimSpace(key)}
	if d.aead, err = newSeal(d.Derive("the saves' seal")); err != nil {
		b.close()
		return nil, err
	}
	return d, nil
}

// Derive is a secret of the store's for purpose, the same in every replica that shares the
// store's key, and apart from the key itself and from any other purpose's.
func (d *Store) Derive(purpose string) []byte {
	m := hmac.New(sha256.New, d.key)
	m.Write([]byte("minipy-mcp derived key\x00" + purpose)) //nolint:errcheck // a hash does not fail
	return m.Sum(nil)
}

// prefixName is what StoreOptions.Prefix may be.
var prefixName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// newKey is a fresh state key, as a store keeps it.
func newKey() []byte {
	key := make([]byte, 32)
	rand.Read(key) //nolint:errcheck // crypto/rand.Read does not fail
	return []byte(hex.EncodeToString(key) + "\n")
}

// OpenStore opens a directory's store (Open's dir://) keeping saves for ttl.
func OpenStore(dir string, ttl time.Duration, keyFile string) (*Store, error) {
	return Open("dir://"+dir, StoreOptions{TTL: ttl, KeyFile: keyFile})
}

// Close closes the store's connections.
func (d *Store) Close() error { return d.b.close() }

// TTL is how long a save is kept (0: for ever).
func (d *Store) TTL() time.Duration { return d.o.TTL }

// Ready reports whether the store answers (/readyz).
func (d *Store) Ready(ctx context.Context) error { return d.b.ping(ctx) }

// name is the backend's name of session id of kind in this store's deployment (Prefix).
func (d *Store) name(kind, id string) string {
	if d.o.Prefix != "" {
		return name(kind, d.o.Prefix+"\x00"+id)
	}
	return name(kind, id)
}

// name is the backend's name of session id of kind: a hash, with the kind as its
// extension. MCP's sessions are named by their id alone, as before kinds.
func name(kind, id string) string {
	n := id
	if kind != KindSession {
		n = kind + "\x00" + id
	}
	h := sha256.Sum256([]byte(n))
	return hex.EncodeToString(h[:16]) + kind
}

// SaveNamespace saves ns as session id of kind with meta, streamed (SaveFrom).
func (d *Store) SaveNamespace(kind, id string, meta Meta, ns *minipy.Namespace) (minipy.SaveInfo, error) {
	var info minipy.SaveInfo
	err := d.SaveFrom(kind, id, meta, func(w io.Writer) error {
		var err error
		info, err = ns.Save(w)
		return err
	})
	return info, err
}

// Save writes session id of kind, its meta and blob, whole and sealed: a save that fails
// leaves the previous one. ErrFenced: another replica holds the session's lease.
func (d *Store) Save(kind, id string, meta Meta, blob []byte) error {
	return d.SaveFrom(kind, id, meta, func(w io.Writer) error {
		_, err := w.Write(blob)
		return err
	})
}

// SaveFrom is Save of the blob that write writes, sealed and stored as it is written: the
// store holds a segment of it at a time, not the blob. An error of write's (its own, or
// ErrTooLarge past StoreOptions.MaxBytes, which stops it there) leaves the previous save.
func (d *Store) SaveFrom(kind, id string, meta Meta, write func(io.Writer) error) error {
	meta.Saved, meta.ID, meta.Format = time.Now(), id, blobSegmented
	head, nonce, err := d.sealHead(kind, meta)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	wrote := make(chan error, 1)
	go func() {
		cw := &capped{w: pw, n: int64(len(head)), max: d.o.MaxBytes}
		sw := d.sealWriter(cw, d.blobAAD(kind, id, meta.User, nonce))
		err := write(sw)
		if err == nil {
			err = sw.Close()
		}
		if err == nil {
			err = cw.err // (a write's error the writer did not return)
		}
		pw.CloseWithError(err) // (nil: EOF for put)
		wrote <- err
	}()
	err = d.b.put(d.name(kind, id), d.owner, head, pr, d.o.TTL)
	pr.CloseWithError(errPutEnded) // (a put that ended early: the writer's next write fails)
	if werr := <-wrote; werr != nil && !errors.Is(werr, errPutEnded) {
		return werr
	}
	return err
}

var errPutEnded = errors.New("the store ended the save")

// capped passes writes to w while they total at most max bytes (0: any), then fails with
// ErrTooLarge.
type capped struct {
	w      io.Writer
	n, max int64
	err    error
}

func (c *capped) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.n += int64(len(p)); c.max > 0 && c.n > c.max {
		c.err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, c.max)
		return 0, c.err
	}
	n, err := c.w.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

// Load reads session id's meta and saved namespace: fs.ErrNotExist when there is none, or
// it has expired (then it is removed); an error when it does not open (errDamaged).
func (d *Store) Load(kind, id string) (Meta, []byte, error) {
	meta, r, err := d.Open(kind, id)
	if err != nil {
		return meta, nil, err
	}
	defer r.Close()
	blob, err := io.ReadAll(r)
	if err != nil {
		return Meta{}, nil, err
	}
	return meta, blob, nil
}

// Open is Load of the blob as a stream, opened as it is read: a Read's error says when
// what follows does not open (errDamaged: changed, cut). Close it.
func (d *Store) Open(kind, id string) (Meta, io.ReadCloser, error) {
	name := d.name(kind, id)
	data, err := d.b.get(name)
	if err != nil {
		return Meta{}, nil, err
	}
	damaged := func(err error) (Meta, io.ReadCloser, error) {
		data.Close()
		return Meta{}, nil, fmt.Errorf("the save of %s: %w", name, err)
	}
	head, err := readHead(data)
	if err != nil {
		return damaged(err)
	}
	meta, _, nonce, err := d.openHead(kind, head)
	if err == nil && meta.ID != id {
		err = errDamaged
	}
	if err != nil {
		return damaged(err)
	}
	if d.expired(meta) {
		data.Close()
		d.Remove(kind, id)
		return meta, nil, fs.ErrNotExist
	}
	aad := d.blobAAD(kind, id, meta.User, nonce)
	if meta.Format == blobSegmented {
		return meta, &blobReader{r: &savedBlob{name: name, r: d.openReader(data, aad)}, c: data}, nil
	}
	sealed, err := io.ReadAll(data) // (a save of before the segments: sealed whole)
	if err != nil {
		return damaged(err)
	}
	blob, _, err := d.open(sealed, aad)
	if err != nil {
		return damaged(err)
	}
	data.Close()
	return meta, io.NopCloser(bytes.NewReader(blob)), nil
}

// savedBlob names the save in its reader's errors.
type savedBlob struct {
	name string
	r    io.Reader
}

func (s *savedBlob) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("the save of %s: %w", s.name, err)
	}
	return n, err
}

type blobReader struct {
	r io.Reader
	c io.Closer
}

func (b *blobReader) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *blobReader) Close() error               { return b.c.Close() }

// Stat reads session id's meta only: fs.ErrNotExist when there is no save, or it has
// expired; an error when its head does not open.
func (d *Store) Stat(kind, id string) (Meta, error) {
	head, _, err := d.b.head(d.name(kind, id))
	if err != nil {
		return Meta{}, err
	}
	meta, _, _, err := d.openHead(kind, head)
	if err == nil && meta.ID != id {
		err = errDamaged
	}
	if err != nil {
		return Meta{}, fmt.Errorf("the save of %s: %w", d.name(kind, id), err)
	}
	if d.expired(meta) {
		return meta, fs.ErrNotExist
	}
	return meta, nil
}

func (d *Store) expired(meta Meta) bool { return d.o.TTL > 0 && time.Since(meta.Saved) > d.o.TTL }

// List reads the meta of every unexpired save of kind (not their namespaces).
func (d *Store) List(kind string) []Saved {
	var list []Saved
	for _, l := range d.b.list(kind) {
		// (Another deployment's, a damaged one, or one under another's name: left out.)
		meta, _, _, err := d.openHead(kind, l.head)
		if err == nil && l.name == d.name(kind, meta.ID) && !d.expired(meta) {
			list = append(list, Saved{Meta: meta, Size: l.size})
		}
	}
	return list
}

// Remove forgets session id's save.
func (d *Store) Remove(kind, id string) { d.b.remove(d.name(kind, id)) }

// TakeLease makes this replica the holder of session id, waiting up to wait for another
// holder to give it up or for its lease to expire; false if it is still held. While it
// waits, a want mark asks the holder to give the session up (KeepUp): it saves it and
// lets go, so a session whose requests reach another replica moves there.
func (d *Store) TakeLease(ctx context.Context, kind, id, user string, wait time.Duration) bool {
	n := d.name(kind, id)
	end := time.Now().Add(wait)
	wanted := false
	defer func() {
		if wanted {
			d.b.unwant(n)
		}
	}()
	for {
		if d.b.tryLease(n, d.owner, user, d.o.Lease) {
			return true
		}
		if !wanted {
			wanted = d.b.want(n, d.owner)
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return false
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// TryLease takes session id's lease if it is free, expired or this replica's already.
func (d *Store) TryLease(kind, id, user string) bool {
	return d.b.tryLease(d.name(kind, id), d.owner, user, d.o.Lease)
}

// ErrHeld: another replica holds the session and did not let go of it within LeaseWait.
var ErrHeld = errors.New("another replica holds this session and did not let go of it; retry in a moment")

// Claim makes this replica the holder of session id of kind for user and returns what is
// saved of it. A replica that holds it is asked to let go (it saves it first: the session
// may be newer than its last save), and Claim waits for that (ErrHeld if in vain).
// fs.ErrNotExist: neither a holder nor a save has it for user.
func (d *Store) Claim(ctx context.Context, kind, id, user string) (Meta, []byte, error) {
	meta, r, err := d.ClaimOpen(ctx, kind, id, user)
	if err != nil {
		return meta, nil, err
	}
	defer r.Close()
	blob, err := io.ReadAll(r)
	if err != nil {
		d.ReleaseLease(kind, id)
		return Meta{}, nil, err
	}
	return meta, blob, nil
}

// ClaimOpen is Claim whose blob is a stream (Open's). The lease is this replica's when it
// returns no error; a Read's error (the save does not open) is the caller's to give the
// lease back for.
func (d *Store) ClaimOpen(ctx context.Context, kind, id, user string) (Meta, io.ReadCloser, error) {
	if l, ok := d.b.readLease(d.name(kind, id)); ok && l.Owner != d.owner && time.Now().Before(l.Until) {
		if l.User != user {
			return Meta{}, nil, fs.ErrNotExist
		}
	} else if meta, err := d.Stat(kind, id); err != nil {
		return meta, nil, err
	} else if meta.User != user {
		return meta, nil, fs.ErrNotExist
	}
	if !d.TakeLease(ctx, kind, id, user, LeaseWait) {
		return Meta{}, nil, ErrHeld
	}
	meta, blob, err := d.Open(kind, id)
	if err == nil && meta.User != user {
		blob.Close()
		err = fs.ErrNotExist
	}
	if err != nil {
		d.ReleaseLease(kind, id)
		return Meta{}, nil, err
	}
	return meta, blob, nil
}

// ReleaseLease gives up session id's lease if this replica holds it.
func (d *Store) ReleaseLease(kind, id string) { d.b.releaseLease(d.name(kind, id), d.owner) }

// Sweep removes what expired, where the backend does not expire it itself.
func (d *Store) Sweep() { d.b.sweep(d.o.TTL, d.o.Lease) }

// KeepUp renews this replica's leases of kind (of the sessions that held lists, with their
// users) every third of a lease, gives up (giveUp) those another replica wants (checked every
// wantEvery), and sweeps every TTL/10 (at most hourly), until ctx ends.
func (d *Store) KeepUp(ctx context.Context, kind string, held func() map[string]string, giveUp func(id string)) {
	renew := time.NewTicker(d.o.Lease / 3)
	defer renew.Stop()
	wanted := time.NewTicker(wantEvery)
	defer wanted.Stop()
	every := min(time.Hour, max(d.o.TTL/10, time.Minute))
	sweep := time.NewTicker(every)
	defer sweep.Stop()
	d.Sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			for id, user := range held() {
				d.b.tryLease(d.name(kind, id), d.owner, user, d.o.Lease) // (renewed at the next tick if the store is away)
			}
		case <-wanted.C:
			for id := range held() {
				if d.b.wanted(d.name(kind, id)) {
					go giveUp(id)
				}
			}
		case <-sweep.C:
			d.Sweep()
		}
	}
}
