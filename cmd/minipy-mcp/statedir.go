package main

// Sessions that outlive their process (-state-dir). A session's namespace (its variables,
// functions, classes and files: minipy's Namespace.Save) is saved in the directory when it
// has been idle for -state-idle after a call, and when it closes: the client's idle timeout
// (-session-timeout), the server's drain at SIGTERM. A request that names a session this
// process does not know (Mcp-Session-Id) but the directory holds, for the same user, brings
// it back under the same id: the handler replays the session's initialize request to the
// SDK with that id (ServerOptions.GetSessionID), restores the namespace and passes the
// request on. The client sees its session continue.
//
// Replicas may share the directory. One of them holds a session at a time, by a lease
// (NAME.lease: the holder and until when) that it renews while the session lives here and
// gives up once it has saved it at its close; another replica waits for a held lease up to
// leaseWait, and takes an expired one (its holder died without draining: the runs since
// its last save are lost). Saved sessions expire -state-ttl after their last save. Files
// are named by a hash of the session id, which is a secret of its client's; each is written
// whole, through a temporary file and a rename.

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
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/minipy-go/minipy"
)

const (
	// leaseFor is how long a lease lasts unless renewed; a replica renews its leases every
	// leaseFor/3.
	leaseFor = 30 * time.Second
	// leaseWait is how long a request for a session that another replica holds waits for
	// it to be given up (the other one drains, or hands it over) before it is refused.
	leaseWait = 15 * time.Second
	// wantEvery is how often a replica looks for the sessions others want of it.
	wantEvery = 200 * time.Millisecond
)

// stateDir is the directory of saved sessions.
type stateDir struct {
	dir   string
	ttl   time.Duration
	owner string // this replica, in its leases

	mu     sync.Mutex
	forced string // the id GetSessionID gives the session being brought back
	// bringing serializes bringing a session back (which forces the next session id)
	// against the requests that may make a new session (RLock).
	bringing sync.RWMutex
}

// savedMeta is what is kept of a session beside its namespace.
type savedMeta struct {
	User  string          `json:"user"`  // the user who opened it (-tokens NAME; "" without tokens)
	Init  json.RawMessage `json:"init"`  // its initialize request's params, replayed to bring it back
	Saved time.Time       `json:"saved"` // when
}

// openStateDir opens (making it) the directory of saved sessions and sets minipy's state
// key: the file keyFile's content, else DIR/.key, made with a random key when missing,
// so that replicas sharing the directory share it.
func openStateDir(dir string, ttl time.Duration, keyFile string) (*stateDir, error) {
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
	return &stateDir{dir: dir, ttl: ttl, owner: host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(b[:])}, nil
}

// path is the file of session id with extension ext.
func (d *stateDir) path(id, ext string) string {
	h := sha256.Sum256([]byte(id))
	return filepath.Join(d.dir, hex.EncodeToString(h[:16])+ext)
}

// newSessionID is the server's GetSessionID: the id of the session being brought back, if
// one is, else a fresh random one.
func (d *stateDir) newSessionID() string {
	d.mu.Lock()
	forced := d.forced
	d.mu.Unlock()
	if forced != "" {
		return forced
	}
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read does not fail
	return hex.EncodeToString(b[:])
}

// save writes session id's namespace and meta, whole.
func (d *stateDir) save(id string, meta savedMeta, ns *minipy.Namespace) (minipy.SaveInfo, error) {
	var blob bytes.Buffer
	info, err := ns.Save(&blob)
	if err != nil {
		return info, err
	}
	meta.Saved = time.Now()
	js, err := json.Marshal(meta)
	if err != nil {
		return info, err
	}
	f, err := os.CreateTemp(d.dir, ".saving-*")
	if err != nil {
		return info, err
	}
	defer os.Remove(f.Name()) // (gone after the rename)
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(js)))
	_, err = f.Write(append(append(n[:], js...), blob.Bytes()...))
	if err == nil {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return info, err
	}
	return info, os.Rename(f.Name(), d.path(id, ".session"))
}

// load reads session id's meta and saved namespace: fs.ErrNotExist when there is none, or
// it has expired (then it is removed).
func (d *stateDir) load(id string) (savedMeta, []byte, error) {
	var meta savedMeta
	data, err := os.ReadFile(d.path(id, ".session"))
	if err != nil {
		return meta, nil, err
	}
	if len(data) < 4 || int(binary.LittleEndian.Uint32(data)) > len(data)-4 {
		return meta, nil, fmt.Errorf("%s: cut short", d.path(id, ".session"))
	}
	n := int(binary.LittleEndian.Uint32(data))
	if err := json.Unmarshal(data[4:4+n], &meta); err != nil {
		return meta, nil, fmt.Errorf("%s: %w", d.path(id, ".session"), err)
	}
	if d.ttl > 0 && time.Since(meta.Saved) > d.ttl {
		d.remove(id)
		return meta, nil, fs.ErrNotExist
	}
	return meta, data[4+n:], nil
}

// remove forgets session id's saved state.
func (d *stateDir) remove(id string) {
	os.Remove(d.path(id, ".session"))
}

// lease is the content of a lease file.
type lease struct {
	Owner string    `json:"owner"`
	User  string    `json:"user"` // the session's
	Until time.Time `json:"until"`
}

// takeLease makes this replica the holder of session id, waiting up to wait for another
// holder to give it up or for its lease to expire; false if it is still held. While it
// waits, a want file asks the holder to give the session up (keepUp): it saves it and
// lets go, so a session whose requests reach another replica moves there.
func (d *stateDir) takeLease(ctx context.Context, id, user string, wait time.Duration) bool {
	end := time.Now().Add(wait)
	wanted := false
	defer func() {
		if wanted {
			os.Remove(d.path(id, ".want"))
		}
	}()
	for {
		if d.tryLease(id, user) {
			return true
		}
		if !wanted {
			wanted = os.WriteFile(d.path(id, ".want"), []byte(d.owner), 0o600) == nil
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

// tryLease takes session id's lease if it is free, expired or this replica's already. Two
// replicas that race for an expired one both write theirs; the one whose write is read
// back wins.
func (d *stateDir) tryLease(id, user string) bool {
	path := d.path(id, ".lease")
	if data, err := os.ReadFile(path); err == nil {
		var l lease
		if json.Unmarshal(data, &l) == nil && l.Owner != d.owner && time.Now().Before(l.Until) {
			return false
		}
	}
	if d.writeLease(id, user) != nil {
		return false
	}
	data, err := os.ReadFile(path)
	var l lease
	return err == nil && json.Unmarshal(data, &l) == nil && l.Owner == d.owner
}

func (d *stateDir) writeLease(id, user string) error {
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
	return os.Rename(f.Name(), d.path(id, ".lease"))
}

// errHeld: another replica holds the session and did not let go of it within leaseWait.
var errHeld = errors.New("another replica holds this session and did not let go of it; retry in a moment")

// claim makes this replica the holder of session id for user and returns what is saved of
// it. A replica that holds it is asked to let go (it saves it first: the session may be
// newer than its last save), and claim waits for that. fs.ErrNotExist: neither a holder
// nor a save has it for user.
func (d *stateDir) claim(ctx context.Context, id, user string) (savedMeta, []byte, error) {
	if l, ok := d.readLease(id); ok && l.Owner != d.owner && time.Now().Before(l.Until) {
		if l.User != user {
			return savedMeta{}, nil, fs.ErrNotExist
		}
	} else if meta, _, err := d.load(id); err != nil {
		return meta, nil, err
	} else if meta.User != user {
		return meta, nil, fs.ErrNotExist
	}
	if !d.takeLease(ctx, id, user, leaseWait) {
		return savedMeta{}, nil, errHeld
	}
	meta, blob, err := d.load(id)
	if err == nil && meta.User != user {
		err = fs.ErrNotExist
	}
	if err != nil {
		d.releaseLease(id)
	}
	return meta, blob, err
}

// readLease reads session id's lease, if it has one.
func (d *stateDir) readLease(id string) (lease, bool) {
	var l lease
	data, err := os.ReadFile(d.path(id, ".lease"))
	return l, err == nil && json.Unmarshal(data, &l) == nil
}

// releaseLease gives up session id's lease if this replica holds it.
func (d *stateDir) releaseLease(id string) {
	path := d.path(id, ".lease")
	data, err := os.ReadFile(path)
	var l lease
	if err == nil && json.Unmarshal(data, &l) == nil && l.Owner == d.owner {
		os.Remove(path)
	}
}

// sweep removes the saved sessions that expired, and leases that ended long ago.
func (d *stateDir) sweep() {
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
		switch {
		case strings.HasSuffix(e.Name(), ".session") && d.ttl > 0 && old > d.ttl,
			strings.HasSuffix(e.Name(), ".lease") && old > leaseFor+d.ttl,
			strings.HasSuffix(e.Name(), ".want") && old > time.Hour,
			strings.HasPrefix(e.Name(), ".saving-") && old > time.Hour,
			strings.HasPrefix(e.Name(), ".lease-") && old > time.Hour:
			os.Remove(filepath.Join(d.dir, e.Name()))
		}
	}
}

// keepUp renews this replica's leases (of the sessions that held ids) every leaseFor/3,
// gives up (giveUp) those another replica wants (checked every wantEvery), and sweeps the
// directory every -state-ttl/10 (at most hourly), until ctx ends.
func (d *stateDir) keepUp(ctx context.Context, held func() map[string]string, giveUp func(id string)) {
	renew := time.NewTicker(leaseFor / 3)
	defer renew.Stop()
	wanted := time.NewTicker(wantEvery)
	defer wanted.Stop()
	every := min(time.Hour, max(d.ttl/10, time.Minute))
	sweep := time.NewTicker(every)
	defer sweep.Stop()
	d.sweep()
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			for id, user := range held() {
				d.writeLease(id, user) //nolint:errcheck // renewed at the next tick
			}
		case <-wanted.C:
			for id := range held() {
				if _, err := os.Stat(d.path(id, ".want")); err == nil {
					go giveUp(id)
				}
			}
		case <-sweep.C:
			d.sweep()
		}
	}
}

// bringBack wraps the MCP handler next: a request naming a session that live does not know
// but the directory holds for the request's user brings it back first (s.restore); a
// request of another user, or for a session another replica keeps holding, is answered as
// the SDK answers an unknown session (404), or 503. Requests that may make a new session
// hold bringing for reading, so that none takes the id forced for one brought back.
func (d *stateDir) bringBack(s *sessions, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		if id == "" {
			if r.Header.Get("Mcp-Protocol-Version") < sessionlessRevision { // (may be an initialize)
				d.bringing.RLock()
				defer d.bringing.RUnlock()
			}
			next.ServeHTTP(w, r)
			return
		}
		if s.live(id) {
			if r.Method == http.MethodDelete {
				s.deleted(id) // the client ends it: its saved state goes with it
			}
			next.ServeHTTP(w, r)
			return
		}
		user := ""
		if info := auth.TokenInfoFromContext(r.Context()); info != nil {
			user = info.UserID
		}
		if r.Method == http.MethodDelete {
			if meta, _, err := d.load(id); err == nil && meta.User == user && d.takeLease(r.Context(), id, user, leaseWait) {
				d.remove(id)
				d.releaseLease(id)
				w.WriteHeader(http.StatusNoContent)
				return
			}
			next.ServeHTTP(w, r) // the SDK's answer to an unknown session
			return
		}
		err := d.bringBackOne(r, id, user, s, next)
		if errors.Is(err, fs.ErrNotExist) {
			next.ServeHTTP(w, r) // the SDK's answer to an unknown session: also another user's
			return
		}
		if err != nil {
			log.Printf("minipy-mcp: -state-dir: bringing a session back: %v", err)
			w.Header().Set("Retry-After", "5")
			http.Error(w, "minipy-mcp: the session is saved but cannot be resumed here now: "+err.Error(),
				http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bringBackOne claims session id for user and brings it back: it replays the session's
// initialize request to next with the id forced, and restores its namespace.
func (d *stateDir) bringBackOne(r *http.Request, id, user string, s *sessions, next http.Handler) error {
	meta, blob, err := d.claim(r.Context(), id, user)
	if err != nil {
		return err
	}
	// One at a time, and no new session meanwhile: the id to force is the process's. (Under
	// it still as the namespace is restored: a request that waits finds it restored.)
	d.bringing.Lock()
	defer d.bringing.Unlock()
	if s.live(id) { // brought back by a request that came at the same time
		return nil
	}
	d.mu.Lock()
	d.forced = id
	d.mu.Unlock()
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":"minipy-resume","method":"initialize","params":%s}`, meta.Init)
	code, got := replay(r, next, "", init)
	d.mu.Lock()
	d.forced = ""
	d.mu.Unlock()
	if code != http.StatusOK || got != id {
		d.releaseLease(id)
		return fmt.Errorf("the SDK did not take its initialize request again (HTTP %d)", code)
	}
	replay(r, next, id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return s.restore(id, meta, blob)
}

// replay sends body to next as a POST of r's user (its context, which holds its token) in
// session id ("": none); it returns the status and the session id of the answer.
func replay(r *http.Request, next http.Handler, id, body string) (int, string) {
	req := httptest.NewRequest(http.MethodPost, r.URL.Path, strings.NewReader(body)).WithContext(r.Context())
	req.Host, req.RemoteAddr = r.Host, r.RemoteAddr // (as r came: the SDK checks where requests come from)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if v := r.Header.Get("Mcp-Protocol-Version"); v != "" && id != "" {
		req.Header.Set("Mcp-Protocol-Version", v)
	}
	if id != "" {
		req.Header.Set("Mcp-Session-Id", id)
	}
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, req)
	io.Copy(io.Discard, rec.Result().Body) //nolint:errcheck // read to its end
	return rec.Code, rec.Header().Get("Mcp-Session-Id")
}
