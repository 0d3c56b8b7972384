// Package session is minipy-mcp's core, which its fronts (MCP, E2B) share: who a caller
// is (Tokens), how many sessions each may hold and the server's drain (Gate), and sessions
// saved beyond their process (Store, -state-dir).
package session

// Bearer tokens (-tokens FILE): one NAME:TOKEN per line. A front asks User for the user a
// token belongs to; each front keeps its users' sessions apart.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
)

// minTokenLength is the shortest token the file may hold: 16 characters, which `openssl
// rand -hex 16` (32) and a UUID (36) pass.
const minTokenLength = 16

// userName is what NAME may be: it shows in the log.
var userName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$`)

// tokenEntry is one line of the file: the user and the SHA-256 of the token (only the sum
// is kept in memory).
type tokenEntry struct {
	user string
	sum  [sha256.Size]byte
}

// Tokens is the token file (-tokens FILE), read at start and again on SIGHUP.
type Tokens struct {
	path string
	mu   sync.RWMutex
	list []tokenEntry
}

// LoadTokens reads the token file at path.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the file again; on an error the tokens stay as they were. It returns the
// users that had a token before and have none now: revoked, whose sessions and sandboxes
// the fronts end (docs/deploy.md, "Revoking a key").
func (t *Tokens) Reload() (revoked []string, err error) {
	data, err := os.ReadFile(t.path)
	if err != nil {
		return nil, err
	}
	list, err := parseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.path, err)
	}
	now := map[string]bool{}
	for _, e := range list {
		now[e.user] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[string]bool{}
	for _, e := range t.list {
		if !now[e.user] && !seen[e.user] {
			seen[e.user] = true
			revoked = append(revoked, e.user)
		}
	}
	t.list = list
	return revoked, nil
}

// Has reports whether user has a token now: a session or sandbox of a user without one
// serves nothing more, whatever else its client holds (an E2B access token).
func (t *Tokens) Has(user string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, e := range t.list {
		if e.user == user {
			return true
		}
	}
	return false
}

// parseTokens reads NAME:TOKEN lines; blank lines and lines starting with # are skipped. A
// user may have several tokens (to rotate them); a token may belong to one user only. Its
// errors name lines, never a token.
func parseTokens(data []byte) ([]tokenEntry, error) {
	var list []tokenEntry
	owner := map[[sha256.Size]byte]int{} // token sum -> line
	lines := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; lines.Scan(); n++ {
		line := strings.TrimSpace(lines.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, token, ok := strings.Cut(line, ":")
		name, token = strings.TrimSpace(name), strings.TrimSpace(token)
		switch {
		case !ok:
			return nil, fmt.Errorf("line %d is not NAME:TOKEN", n)
		case !userName.MatchString(name):
			return nil, fmt.Errorf("line %d: the name must be 1-64 letters, digits or ._@+- (starting with a letter or digit)", n)
		case len(token) < minTokenLength:
			return nil, fmt.Errorf("line %d: the token is shorter than %d characters (make one with: openssl rand -hex 16)",
				n, minTokenLength)
		case strings.ContainsAny(token, " \t"):
			return nil, fmt.Errorf("line %d: the token holds a space", n)
		}
		sum := sha256.Sum256([]byte(token))
		if first, dup := owner[sum]; dup {
			return nil, fmt.Errorf("lines %d and %d give the same token", first, n)
		}
		owner[sum] = n
		list = append(list, tokenEntry{user: name, sum: sum})
	}
	if err := lines.Err(); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, errors.New("no NAME:TOKEN line")
	}
	return list, nil
}

// Users counts the tokens and the distinct users.
func (t *Tokens) Users() (tokens, users int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	seen := map[string]bool{}
	for _, e := range t.list {
		seen[e.user] = true
	}
	return len(t.list), len(seen)
}

// User is the user token belongs to, if any. It compares the token's sum with every
// entry's, each in constant time and without stopping at a match, so that the time taken
// says nothing of which token, or how much of one, matched.
func (t *Tokens) User(token string) (user string, ok bool) {
	sum := sha256.Sum256([]byte(token))
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, e := range t.list {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			user = e.user
		}
	}
	return user, user != ""
}
