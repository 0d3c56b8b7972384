package mcpfront

// Bearer tokens (-tokens FILE, session.Tokens) for MCP: a client sends "Authorization:
// Bearer TOKEN"; the MCP SDK's auth.RequireBearerToken asks verify, which names the user
// (TokenInfo.UserID), and the SDK then serves a session only to the user who opened it
// (another user's Mcp-Session-Id gets 403).

import (
	"context"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// verify is the MCP SDK's auth.TokenVerifier over the -tokens file.
func verify(t *session.Tokens) auth.TokenVerifier {
	return func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		user, ok := t.User(token)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: user}, nil // no expiry: a token lasts until the file drops it (SIGHUP)
	}
}

// requireTokens wraps next: requests without a valid token get 401 (with
// "WWW-Authenticate: Bearer"), counted in unauthed; the others reach next with the user in
// their context (auth.TokenInfoFromContext).
func requireTokens(t *session.Tokens, next http.Handler, unauthed func()) http.Handler {
	checked := auth.RequireBearerToken(verify(t), &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(next)
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
