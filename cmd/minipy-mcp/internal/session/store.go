package session

// Sessions that outlive their process (-state-dir): a Store keeps what a front saves of a
// session (its Meta and its namespace's, or namespaces', minipy.Namespace.Save) in a
// directory, each whole (a temporary file and a rename), named by a hash of its id (a
// secret of its client's, for MCP) and its kind. Saved sessions expire TTL after their
// last save.
//
// Replicas may share the directory. One of them holds a session at a time, by a lease
// (NAME.lease: the holder and until when) that it renews while the session lives there
// (KeepUp) and gives up once it has saved it; another replica waits for a held lease up to
// LeaseWait (asking the holder to let go: a .want file), and takes an expired one (its
// holder died without draining: what ran since its last save is lost).

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
)

const (
	// leaseFor is how long a lease lasts unless renewed; a replica renews its leases every
	// leaseFor/3.
	leaseFor = 30 * time.Second
	// LeaseWait is how long a request for a session that another replica holds waits for
	// it to be given up (the other one drains, or hands it over) before it is refused.
	LeaseWait = 15 * time.Second
	// wantEvery is how often a replica looks for the sessions others want of it.
	wantEvery = 200 * time.Millisecond
)

// The kinds of what a store keeps, each the extension of its files: a front's sessions
// are apart from another's even under the same id.
const (
	KindSession = ".session" // an MCP session or session handle
	KindSandbox = ".paused"  // a paused E2B sandbox
)

var kinds = []string{KindSession, KindSandbox}

// Store is the directory of saved sessions. Its methods are safe from any goroutine.
type Store struct {
	dir   string
	ttl   time.Duration
	owner string // this replica, in its leases
}

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
}

// OpenStore opens (making it) the directory of saved sessions, which keeps each for ttl
// after its last save (0: for ever), and sets minipy's state key: the file keyFile's
// content, else DIR/.key, made with a random key when missing, so that replicas sharing
// the directory share it.
func OpenStore(dir string, ttl time.Duration, keyFile string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("-state-dir: %w", err)
	}
	if keyFile == "" {
		keyFile = filepath.Join(dir, ".key")
		key := make([]byte, 32)
		rand.Read(key) //nolint:errcheck // crypto/rand.Read does not fail
		f, err := os.OpenFile(keyFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, err = f.WriteString(hex.EncodeToString(key) + "\n")
			err = errors.Join(err, f.Close())
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("-state-dir: making its key: %w", err)
		}
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("the state key: %w", err)
	}
	if err := minipy.SetStateKey(bytes.TrimSpace(key)); err != nil {
		return nil, fmt.Errorf("the state key in %s: %w", keyFile, err)
	}
	var b [8]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read does not fail
	host, _ := os.Hostname()
	return &Store{dir: dir, ttl: ttl, owner: host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])}, nil
}

// Dir is the store's directory.
func (d *Store) Dir() string { return d.dir }

// TTL is how long a save is kept (0: for ever).
func (d *Store) TTL() time.Duration { return d.ttl }

// Path is the file of session id of kind with extension ext (kind itself: its save).
// MCP's sessions are named by their id alone, as before kinds.
func (d *Store) Path(kind, id, ext string) string {
	name := id
	if kind != KindSession {
		name = kind + "\x00" + id
	}
	h := sha256.Sum256([]byte(name))
	return filepath.Join(d.dir, hex.EncodeToString(h[:16])+ext)
}

// SaveNamespace saves ns as session id of kind with meta.
func (d *Store) SaveNamespace(kind, id string, meta Meta, ns *minipy.Namespace) (minipy.SaveInfo, error) {
	var blob bytes.Buffer
	info, err := ns.Save(&blob)
	if err != nil {
		return info, err
	}
	return info, d.Save(kind, id, meta, blob.Bytes())
}

// Save writes session id of kind, its meta and blob, whole: a save that fails leaves the
// previous one.
func (d *Store) Save(kind, id string, meta Meta, blob []byte) error {
	meta.Saved = time.Now()
	js, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(d.dir, ".saving-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // (gone after the rename)
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(js)))
	_, err = f.Write(append(append(n[:], js...), blob...))
	if err == nil {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	return os.Rename(f.Name(), d.Path(kind, id, kind))
}

// Load reads session id's meta and saved namespace: fs.ErrNotExist when there is none, or
// it has expired (then it is removed).
func (d *Store) Load(kind, id string) (Meta, []byte, error) {
	path := d.Path(kind, id, kind)
	data, err := os.ReadFile(path)
	if err != nil {
		return Meta{}, nil, err
	}
	meta, n, err := readMeta(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return meta, nil, fmt.Errorf("%s: %w", path, err)
	}
	if d.expired(meta) {
		d.Remove(kind, id)
		return meta, nil, fs.ErrNotExist
	}
	return meta, data[n:], nil
}

// readMeta reads the meta at the start of a saved session of size bytes; n is where its
// blob starts.
func readMeta(r io.Reader, size int64) (meta Meta, n int, err error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return meta, 0, errors.New("cut short")
	}
	length := int64(binary.LittleEndian.Uint32(head[:]))
	if length > size-4 {
		return meta, 0, errors.New("cut short")
	}
	js := make([]byte, length)
	if _, err := io.ReadFull(r, js); err != nil {
		return meta, 0, errors.New("cut short")
	}
	if err := json.Unmarshal(js, &meta); err != nil {
		return meta, 0, err
	}
	return meta, 4 + int(length), nil
}

// Stat reads session id's meta only: fs.ErrNotExist when there is no save, or it has
// expired.
func (d *Store) Stat(kind, id string) (Meta, error) {
	f, err := os.Open(d.Path(kind, id, kind))
	if err != nil {
		return Meta{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return Meta{}, err
	}
	meta, _, err := readMeta(f, info.Size())
	if err != nil {
		return meta, fmt.Errorf("%s: %w", f.Name(), err)
	}
	if d.expired(meta) {
		return meta, fs.ErrNotExist
	}
	return meta, nil
}

func (d *Store) expired(meta Meta) bool { return d.ttl > 0 && time.Since(meta.Saved) > d.ttl }

// Saved is a save that List found: its meta and its size in bytes.
type Saved struct {
	Meta
	Size int64
}

// List reads the meta of every unexpired save of kind (not their namespaces).
func (d *Store) List(kind string) []Saved {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil
	}
	var list []Saved
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), kind) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		f, err := os.Open(filepath.Join(d.dir, e.Name()))
		if err != nil {
			continue
		}
		info, err := f.Stat()
		if err == nil {
			var meta Meta
			if meta, _, err = readMeta(f, info.Size()); err == nil && !d.expired(meta) {
				list = append(list, Saved{Meta: meta, Size: info.Size()})
			}
		}
		f.Close()
	}
	return list
}

// Remove forgets session id's save.
func (d *Store) Remove(kind, id string) {
	os.Remove(d.Path(kind, id, kind))
}

// lease is the content of a lease file.
type lease struct {
	Owner string    `json:"owner"`
	User  string    `json:"user"` // the session's
	Until time.Time `json:"until"`
}

// TakeLease makes this replica the holder of session id, waiting up to wait for another
// holder to give it up or for its lease to expire; false if it is still held. While it
// waits, a want file asks the holder to give the session up (KeepUp): it saves it and
// lets go, so a session whose requests reach another replica moves there.
func (d *Store) TakeLease(ctx context.Context, kind, id, user string, wait time.Duration) bool {
	end := time.Now().Add(wait)
	wanted := false
	defer func() {
		if wanted {
			os.Remove(d.Path(kind, id, ".want"))
		}
	}()
	for {
		if d.TryLease(kind, id, user) {
			return true
		}
		if !wanted {
			wanted = os.WriteFile(d.Path(kind, id, ".want"), []byte(d.owner), 0o600) == nil
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

// TryLease takes session id's lease if it is free, expired or this replica's already. Two
// replicas that race for an expired one both write theirs; the one whose write is read
// back wins.
func (d *Store) TryLease(kind, id, user string) bool {
	path := d.Path(kind, id, ".lease")
	if data, err := os.ReadFile(path); err == nil {
		var l lease
		if json.Unmarshal(data, &l) == nil && l.Owner != d.owner && time.Now().Before(l.Until) {
			return false
		}
	}
	if d.writeLease(kind, id, user) != nil {
		return false
	}
	data, err := os.ReadFile(path)
	var l lease
	return err == nil && json.Unmarshal(data, &l) == nil && l.Owner == d.owner
}

func (d *Store) writeLease(kind, id, user string) error {
	js, _ := json.Marshal(lease{Owner: d.owner, User: user, Until: time.Now().Add(leaseFor)})
	f, err := os.CreateTemp(d.dir, ".lease-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(js)
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	return os.Rename(f.Name(), d.Path(kind, id, ".lease"))
}

// ErrHeld: another replica holds the session and did not let go of it within LeaseWait.
var ErrHeld = errors.New("another replica holds this session and did not let go of it; retry in a moment")

// Claim makes this replica the holder of session id of kind for user and returns what is
// saved of it. A replica that holds it is asked to let go (it saves it first: the session
// may be newer than its last save), and Claim waits for that (ErrHeld if in vain).
// fs.ErrNotExist: neither a holder nor a save has it for user.
func (d *Store) Claim(ctx context.Context, kind, id, user string) (Meta, []byte, error) {
	if l, ok := d.readLease(kind, id); ok && l.Owner != d.owner && time.Now().Before(l.Until) {
		if l.User != user {
			return Meta{}, nil, fs.ErrNotExist
		}
	} else if meta, _, err := d.Load(kind, id); err != nil {
		return meta, nil, err
	} else if meta.User != user {
		return meta, nil, fs.ErrNotExist
	}
	if !d.TakeLease(ctx, kind, id, user, LeaseWait) {
		return Meta{}, nil, ErrHeld
	}
	meta, blob, err := d.Load(kind, id)
	if err == nil && meta.User != user {
		err = fs.ErrNotExist
	}
	if err != nil {
		d.ReleaseLease(kind, id)
	}
	return meta, blob, err
}

// readLease reads session id's lease, if it has one.
func (d *Store) readLease(kind, id string) (lease, bool) {
	var l lease
	data, err := os.ReadFile(d.Path(kind, id, ".lease"))
	return l, err == nil && json.Unmarshal(data, &l) == nil
}

// ReleaseLease gives up session id's lease if this replica holds it.
func (d *Store) ReleaseLease(kind, id string) {
	path := d.Path(kind, id, ".lease")
	data, err := os.ReadFile(path)
	var l lease
	if err == nil && json.Unmarshal(data, &l) == nil && l.Owner == d.owner {
		os.Remove(path)
	}
}

// Sweep removes the saves that expired, and leases that ended long ago.
func (d *Store) Sweep() {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue
		}
		old := time.Since(info.ModTime())
		name := e.Name()
		saved := false
		for _, kind := range kinds {
			saved = saved || strings.HasSuffix(name, kind)
		}
		switch {
		case saved && d.ttl > 0 && old > d.ttl,
			strings.HasSuffix(name, ".lease") && old > leaseFor+d.ttl,
			strings.HasSuffix(name, ".want") && old > time.Hour,
			strings.HasPrefix(name, ".saving-") && old > time.Hour,
			strings.HasPrefix(name, ".lease-") && old > time.Hour:
			os.Remove(filepath.Join(d.dir, name))
		}
	}
}

// KeepUp renews this replica's leases of kind (of the sessions that held lists, with their
// users) every leaseFor/3, gives up (giveUp) those another replica wants (checked every
// wantEvery), and sweeps the directory every TTL/10 (at most hourly), until ctx ends.
func (d *Store) KeepUp(ctx context.Context, kind string, held func() map[string]string, giveUp func(id string)) {
	renew := time.NewTicker(leaseFor / 3)
	defer renew.Stop()
	wanted := time.NewTicker(wantEvery)
	defer wanted.Stop()
	every := min(time.Hour, max(d.ttl/10, time.Minute))
	sweep := time.NewTicker(every)
	defer sweep.Stop()
	d.Sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			for id, user := range held() {
				d.writeLease(kind, id, user) //nolint:errcheck // renewed at the next tick
			}
		case <-wanted.C:
			for id := range held() {
				if _, err := os.Stat(d.Path(kind, id, ".want")); err == nil {
					go giveUp(id)
				}
			}
		case <-sweep.C:
			d.Sweep()
		}
	}
}
