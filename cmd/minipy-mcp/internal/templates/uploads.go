package templates

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
)

// Uploads holds the files that builds' COPY steps take (the SDK's tar of them, by their
// hash), each user's apart, in the server's memory, bounded: one at most Max bytes, a
// user's at most PerUser (their least recently used go first), all at most Total (past it
// an upload is refused). One unused for UploadTTL is forgotten. A build asks for its
// files by hash, and the SDK uploads those that are not held (E2B's upload cache), to a
// URL that Sign signs: the SDK puts the files there without its API key, as to E2B's
// presigned storage URLs. Its methods are safe from any goroutine.
type Uploads struct {
	Max, PerUser, Total int64

	key    []byte
	mu     sync.Mutex
	files  map[uploadKey]*upload
	total  int64
	byUser map[string]int64
}

// UploadTTL is how long an upload is kept unused; UploadURLTTL how long a signed upload
// URL serves.
const (
	UploadTTL    = time.Hour
	UploadURLTTL = 15 * time.Minute
)

// ErrUploadTooLarge and ErrUploadsFull are Put's refusals.
var (
	ErrUploadTooLarge = errors.New("the upload is larger than the server takes")
	ErrUploadsFull    = errors.New("the server holds as many uploads as it may")
)

type uploadKey struct{ user, hash string }

type upload struct {
	data []byte
	used time.Time
}

// NewUploads is an empty store of uploads with those bounds, and a key of its own for
// the URLs it signs.
func NewUploads(max, perUser, total int64) *Uploads {
	key := make([]byte, 32)
	rand.Read(key) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24)
	return &Uploads{Max: max, PerUser: perUser, Total: total, key: key, files: map[uploadKey]*upload{},
		byUser: map[string]int64{}}
}

// Has reports whether user's files of hash are held.
func (u *Uploads) Has(user, hash string) bool {
	_, ok := u.Get(user, hash)
	return ok
}

// Get is user's files of hash, if held.
func (u *Uploads) Get(user, hash string) ([]byte, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.expire(time.Now())
	f := u.files[uploadKey{user, hash}]
	if f == nil {
		return nil, false
	}
	f.used = time.Now()
	return f.data, true
}

// Put keeps r's bytes as user's files of hash (replacing those held).
func (u *Uploads) Put(user, hash string, r io.Reader) error {
	most := min(u.Max, u.PerUser)
	data, err := io.ReadAll(io.LimitReader(r, most+1))
	if err != nil {
		return err
	}
	if int64(len(data)) > most {
		return fmt.Errorf("%w: at most %d bytes", ErrUploadTooLarge, most)
	}
	n := int64(len(data))
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	u.expire(now)
	u.drop(uploadKey{user, hash})
	for u.byUser[user]+n > u.PerUser {
		u.drop(u.oldest(user))
	}
	if u.total+n > u.Total {
		return fmt.Errorf("%w: %d bytes in all", ErrUploadsFull, u.Total)
	}
	u.files[uploadKey{user, hash}] = &upload{data: data, used: now}
	u.total += n
	u.byUser[user] += n
	return nil
}

// oldest is user's least recently used upload.
func (u *Uploads) oldest(user string) uploadKey {
	var out uploadKey
	var at time.Time
	for k, f := range u.files {
		if k.user == user && (at.IsZero() || f.used.Before(at)) {
			out, at = k, f.used
		}
	}
	return out
}

// drop forgets the upload k, if held.
func (u *Uploads) drop(k uploadKey) {
	if f := u.files[k]; f != nil {
		delete(u.files, k)
		u.total -= int64(len(f.data))
		u.byUser[k.user] -= int64(len(f.data))
		if u.byUser[k.user] == 0 {
			delete(u.byUser, k.user)
		}
	}
}

// expire forgets the uploads unused for UploadTTL.
func (u *Uploads) expire(now time.Time) {
	for k, f := range u.files {
		if now.Sub(f.used) > UploadTTL {
			u.drop(k)
		}
	}
}

// Forget forgets all of user's uploads.
func (u *Uploads) Forget(user string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k := range u.files {
		if k.user == user {
			u.drop(k)
		}
	}
}

// Sign is the query (expires and signature) of a URL that takes the files of hash for the
// template templateID until UploadURLTTL from now.
func (u *Uploads) Sign(templateID, hash string) string {
	expires := strconv.FormatInt(time.Now().Add(UploadURLTTL).Unix(), 10)
	return "expires=" + expires + "&signature=" + u.signature(templateID, hash, expires)
}

// Check reports whether signature signs an upload of the files of hash for templateID,
// and expires has not passed.
func (u *Uploads) Check(templateID, hash, expires, signature string) bool {
	at, err := strconv.ParseInt(expires, 10, 64)
	if err != nil || time.Now().Unix() > at {
		return false
	}
	return hmac.Equal([]byte(signature), []byte(u.signature(templateID, hash, expires)))
}

func (u *Uploads) signature(templateID, hash, expires string) string {
	mac := hmac.New(sha256.New, u.key)
	mac.Write([]byte(templateID + "\x00" + hash + "\x00" + expires))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}
