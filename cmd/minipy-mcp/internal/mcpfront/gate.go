package mcpfront

// The MCP side of the gate (session.Gate, the caps and the drain). A session is counted
// from the HTTP request that opens it (a POST without Mcp-Session-Id that carries an
// initialize request, which the SDK answers by making one) until it ends (the client
// deletes it, it idles out, the server closes it). The request carries a ticket in a header
// of ours; the server's receiving middleware sees it in the initialize request
// (RequestExtra.Header), binds it to the session, and releases it when the session ends. A
// request that made no session returns its ticket when it returns.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// ticketHeader carries a new session's ticket from the HTTP handler to the MCP middleware.
// Whatever a client sends in it is dropped.
const ticketHeader = "Minipy-Session-Ticket"

// maxSessionlessBody bounds the body of a POST without a session: an initialize request is
// small.
const maxSessionlessBody = 1 << 20

// initializes reports whether a POST's body (a JSON-RPC message or a batch) holds an
// initialize request, the only one that leaves a session open.
func initializes(body []byte) bool {
	var one struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &one) == nil {
		return one.Method == "initialize"
	}
	var batch []struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &batch) == nil {
		for _, m := range batch {
			if m.Method == "initialize" {
				return true
			}
		}
	}
	return false
}

// admit wraps the MCP handler: a request that would open a session past a cap, or while
// the server drains, gets 503 with Retry-After and a message naming the limit.
func admit(g *session.Gate, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(ticketHeader)
		if r.Method != http.MethodGet { // (a GET's stream lasts as long as its session)
			defer g.EnterRequest()()
		}
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
			next.ServeHTTP(w, r)
			return
		}
		user := ""
		if info := auth.TokenInfoFromContext(r.Context()); info != nil {
			user = info.UserID
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSessionlessBody))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			http.Error(w, "minipy-mcp: the request is too large", http.StatusRequestEntityTooLarge)
			return
		case err != nil:
			http.Error(w, "minipy-mcp: reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !initializes(body) {
			next.ServeHTTP(w, r) // the SDK opens no lasting session for it (server/discover, a bad request)
			return
		}
		id, refusal := g.Take(user)
		if refusal != "" {
			w.Header().Set("Retry-After", strconv.Itoa(session.RetryAfter))
			http.Error(w, refusal, http.StatusServiceUnavailable)
			return
		}
		defer g.ReturnUnbound(id)
		r.Header.Set(ticketHeader, id)
		next.ServeHTTP(w, r)
	})
}

// bindTickets (receiving middleware) binds the ticket of an initialize request to its
// session, which gives its place back when it ends.
func bindTickets(g *session.Gate) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "initialize" {
				if extra := req.GetExtra(); extra != nil && extra.Header != nil {
					bind(g, extra.Header.Get(ticketHeader), req.GetSession())
				}
			}
			return next(ctx, method, req)
		}
	}
}

func bind(g *session.Gate, id string, s mcp.Session) {
	ss, ok := s.(*mcp.ServerSession)
	if id == "" || !ok {
		return
	}
	if user, ok := g.Bind(id); ok {
		go func() {
			ss.Wait() //nolint:errcheck // over either way
			g.Release(user)
		}()
	}
}
