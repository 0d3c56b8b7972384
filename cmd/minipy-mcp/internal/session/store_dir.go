package session

// A store in a directory (dir://PATH, -state-dir): a save is NAME (its kind the
// extension), written through a temporary file, synced and renamed; a lease NAME.lease
// (JSON), written the same way; a want mark NAME.want. Replicas share it through a file
// system they all mount. A lease is checked and taken (or given up) under the directory's
// lock (DIR/.lock, flock): of replicas that race for it, one takes it; the fence of a save
// is a check of the lease before it (not atomic with the write: Redis's is).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type dirBackend struct{ dir string }

// openDir opens (making it) the directory; makeKey: read its key (DIR/.key), made with a
// random one when missing.
func openDir(dir string, makeKey bool) (backend, []byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("-state-dir: %w", err)
	}
	if !makeKey {
		return &dirBackend{dir: dir}, nil, nil
	}
	keyFile := filepath.Join(dir, ".key")
	f, err := os.OpenFile(keyFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, err = f.Write(newKey())
		err = errors.Join(err, f.Close())
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, nil, fmt.Errorf("-state-dir: making its key: %w", err)
	}
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("the state key: %w", err)
	}
	return &dirBackend{dir: dir}, key, nil
}

func (d *dirBackend) path(name string) string { return filepath.Join(d.dir, name) }

// side is the file beside save name with extension ext (.lease, .want): an MCP session's
// are named by the hash alone, as before kinds (replicas of both versions share a
// directory while they are upgraded one at a time).
func (d *dirBackend) side(name, ext string) string {
	return d.path(strings.TrimSuffix(name, KindSession) + ext)
}

// writeWhole writes what parts read, one after another, as the file name, through a
// temporary file and a rename: a part's error leaves the file as it was.
func (d *dirBackend) writeWhole(name, temp string, sync bool, parts ...io.Reader) error {
	f, err := os.CreateTemp(d.dir, temp)
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // (gone after the rename)
	for _, r := range parts {
		if err == nil {
			_, err = io.Copy(f, r)
		}
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	return os.Rename(f.Name(), d.path(name))
}

func (d *dirBackend) put(name, owner string, head []byte, blob io.Reader, _ time.Duration) error {
	if l, ok := d.readLease(name); ok && l.Owner != owner && time.Now().Before(l.Until) {
		return ErrFenced
	}
	return d.writeWhole(name, ".saving-*", true, bytes.NewReader(head), blob)
}

func (d *dirBackend) get(name string) (io.ReadCloser, error) { return os.Open(d.path(name)) }

func (d *dirBackend) head(name string) ([]byte, int64, error) {
	f, err := os.Open(d.path(name))
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	head, err := readHead(f)
	return head, info.Size(), err
}

// readHead reads a save's header (the meta's length and JSON), at most 1 MiB of it.
func readHead(r io.Reader) ([]byte, error) {
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, errors.New("cut short")
	}
	n := int(head[0]) | int(head[1])<<8 | int(head[2])<<16 | int(head[3])<<24
	if n < 0 || n > 1<<20 {
		return nil, errors.New("a meta past 1 MiB")
	}
	head = append(head, make([]byte, n)...)
	if _, err := io.ReadFull(r, head[4:]); err != nil {
		return nil, errors.New("cut short")
	}
	return head, nil
}

func (d *dirBackend) list(kind string) []listed {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil
	}
	var out []listed
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), kind) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if head, size, err := d.head(e.Name()); err == nil {
			out = append(out, listed{name: e.Name(), head: head, size: size})
		}
	}
	return out
}

func (d *dirBackend) remove(name string) { os.Remove(d.path(name)) }

// tryLease checks the lease and writes this replica's under the directory's lease lock:
// of replicas that race for a free or expired lease, one takes it. (Without the lock, each
// read the lease free, wrote its own and read it back, and two replicas held one sandbox.)
func (d *dirBackend) tryLease(name, owner, user string, length time.Duration) bool {
	unlock, err := d.leaseLock()
	if err != nil {
		return false
	}
	defer unlock()
	if l, ok := d.readLease(name); ok && l.Owner != owner && time.Now().Before(l.Until) {
		return false
	}
	js, _ := json.Marshal(lease{Owner: owner, User: user, Until: time.Now().Add(length)})
	if d.writeWhole(filepath.Base(d.side(name, ".lease")), ".lease-*", false, bytes.NewReader(js)) != nil {
		return false
	}
	l, ok := d.readLease(name)
	return ok && l.Owner == owner
}

// leaseLock takes the directory's lease lock (flock of DIR/.lock, which every replica
// sharing the directory takes: across processes, and across machines where the file
// system's lock manager gives flock, as NFS 4's does); its func gives it up.
func (d *dirBackend) leaseLock() (unlock func(), err error) {
	f, err := os.OpenFile(d.path(".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil // (the lock goes with the file)
}

func (d *dirBackend) readLease(name string) (lease, bool) {
	var l lease
	data, err := os.ReadFile(d.side(name, ".lease"))
	return l, err == nil && json.Unmarshal(data, &l) == nil
}

func (d *dirBackend) releaseLease(name, owner string) {
	unlock, err := d.leaseLock()
	if err != nil {
		return // (it expires)
	}
	defer unlock()
	if l, ok := d.readLease(name); ok && l.Owner == owner {
		os.Remove(d.side(name, ".lease"))
	}
}

func (d *dirBackend) want(name, owner string) bool {
	return os.WriteFile(d.side(name, ".want"), []byte(owner), 0o600) == nil
}

func (d *dirBackend) unwant(name string) { os.Remove(d.side(name, ".want")) }

func (d *dirBackend) wanted(name string) bool {
	_, err := os.Stat(d.side(name, ".want"))
	return err == nil
}

// sweep removes the saves that expired, and leases that ended long ago.
func (d *dirBackend) sweep(ttl, lease time.Duration) {
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
		n := e.Name()
		saved := false
		for _, kind := range kinds {
			saved = saved || strings.HasSuffix(n, kind)
		}
		switch {
		case saved && ttl > 0 && old > ttl,
			strings.HasSuffix(n, ".lease") && old > lease+ttl,
			strings.HasSuffix(n, ".want") && old > time.Hour,
			strings.HasPrefix(n, ".saving-") && old > time.Hour,
			strings.HasPrefix(n, ".lease-") && old > time.Hour:
			os.Remove(d.path(n))
		}
	}
}

func (d *dirBackend) ping(context.Context) error {
	_, err := os.Stat(d.dir)
	return err
}

func (d *dirBackend) close() error { return nil }
