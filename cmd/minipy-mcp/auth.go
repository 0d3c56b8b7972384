package main

// Bearer tokens (-tokens FILE): one NAME:TOKEN per line. A client sends
// "Authorization: Bearer TOKEN"; the MCP SDK's auth.RequireBearerToken asks tokens.verify,
// which names the user (TokenInfo.UserID), and the SDK then serves a session only to the
// user who opened it (another user's Mcp-Session-Id gets 403).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
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

// tokens is the token file, read at start and again on SIGHUP.
type tokens struct {
	path string
	mu   sync.RWMutex
	list []tokenEntry
}

// loadTokens reads the token file at path.
func loadTokens(path string) (*tokens, error) {
	t := &tokens{path: path}
	if err := t.reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// reload reads the file again; on an error the tokens stay as they were.
func (t *tokens) reload() error {
	data, err := os.ReadFile(t.path)
	if err != nil {
		return err
	}
	list, err := parseTokens(data)
	if err != nil {
		return fmt.Errorf("%s: %w", t.path, err)
	}
	t.mu.Lock()
	t.list = list
	t.mu.Unlock()
	return nil
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

// users counts the distinct users.
func (t *tokens) users() (tokens, users int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	seen := map[string]bool{}
	for _, e := range t.list {
		seen[e.user] = true
	}
	return len(t.list), len(seen)
}

// verify is the auth.TokenVerifier: it compares the token's sum with every entry's, each
// in constant time and without stopping at a match, so that the time taken says nothing of
// which token, or how much of one, matched.
func (t *tokens) verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(token))
	t.mu.RLock()
	user := ""
	for _, e := range t.list {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			user = e.user
		}
	}
	t.mu.RUnlock()
	if user == "" {
		return nil, auth.ErrInvalidToken
	}
	return &auth.TokenInfo{UserID: user}, nil // no expiry: a token lasts until the file drops it (SIGHUP)
}

// requireTokens wraps next: requests without a valid token get 401 (with
// "WWW-Authenticate: Bearer"), counted in unauthed; the others reach next with the user in
// their context (auth.TokenInfoFromContext).
func requireTokens(t *tokens, next http.Handler, unauthed func()) http.Handler {
	checked := auth.RequireBearerToken(t.verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checked.ServeHTTP(&challenge{ResponseWriter: w, unauthed: unauthed}, r)
	})
}

// challenge adds "WWW-Authenticate: Bearer" to a 401 (RFC 6750), which RequireBearerToken
// leaves out when it has no resource metadata to point to.
type challenge struct {
	http.ResponseWriter
	unauthed func()
}

func (c *challenge) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		c.Header().Set("WWW-Authenticate", `Bearer realm="minipy-mcp"`)
		if c.unauthed != nil {
			c.unauthed()
		}
	}
	c.ResponseWriter.WriteHeader(code)
}

// Flush lets the SDK stream (server-sent events) through the wrapper.
func (c *challenge) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the writer underneath.
func (c *challenge) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// reloadTokensOnHUP reads the -tokens file again at each SIGHUP until ctx ends; a file
// that cannot be read leaves the tokens as they were.
func reloadTokensOnHUP(ctx context.Context, t *tokens) {
	onHUP(ctx, func() {
		if err := t.reload(); err != nil {
			log.Printf("minipy-mcp: -tokens: reading it again failed, the tokens stay as they were: %v", err)
			return
		}
		n, users := t.users()
		log.Printf("minipy-mcp: -tokens: read again: %d tokens of %d users", n, users)
	})
}
