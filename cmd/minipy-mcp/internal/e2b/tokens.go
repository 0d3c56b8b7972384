package e2b

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"net/http"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// accessTokens makes a sandbox's access token and tells, for a sandbox that does not run,
// whether a token is one the server made for its id: the token is a random part and a MAC
// of it and the id, under a key of the server's (of the store's, with one: replicas sharing
// it know each other's tokens). A sandbox keeps its token in memory and compares it whole;
// the MAC only says "this client had this sandbox" once it has gone, so that it gets the
// 502 that E2B's SDKs read as "not running", and anyone else a 401 whatever the id.
type accessTokens struct{ key []byte }

func newAccessTokens(store *session.Store) accessTokens {
	if store != nil {
		return accessTokens{key: store.Derive("e2b access tokens")}
	}
	key := make([]byte, 32)
	rand.Read(key) //nolint:errcheck // crypto/rand.Read does not fail
	return accessTokens{key: key}
}

var tokenText = base32.StdEncoding.WithPadding(base32.NoPadding)

// make is a new access token of sandbox id: 16 random characters, then 16 of the MAC.
func (a accessTokens) make(id string) string {
	random := rand.Text()[:16]
	return random + a.mac(id, random)
}

func (a accessTokens) mac(id, random string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(id + "\x00" + random)) //nolint:errcheck // a hash does not fail
	return tokenText.EncodeToString(m.Sum(nil))[:16]
}

// made reports whether r carries a token made for sandbox id (in either of its headers).
func (a accessTokens) made(id string, r *http.Request) bool {
	return a.isFor(id, r.Header.Get("X-Access-Token")) || a.isFor(id, r.Header.Get("E2B-Traffic-Access-Token"))
}

// isFor reports whether t is a token made for sandbox id.
func (a accessTokens) isFor(id, t string) bool {
	return len(t) == 32 && hmac.Equal([]byte(t[16:]), []byte(a.mac(id, t[:16])))
}
