package mcpfront

// MCP sessions that outlive their process (-state-dir, a session.Store). A session's
// namespace (its variables, functions, classes and files: minipy's Namespace.Save) is saved
// in the directory when it has been idle for -state-idle after a call, and when it closes: the client's idle timeout
// (-session-timeout), the server's drain at SIGTERM. A request that names a session this
// process does not know (Mcp-Session-Id) but the directory holds, for the same user, brings
// it back under the same id: the handler replays the session's initialize request to the
// SDK with that id (ServerOptions.GetSessionID), restores the namespace and passes the
// request on. The client sees its session continue.
//
// Replicas may share the directory: one of them holds a session at a time, by a lease
// (session.Store); a request for a session that another holds asks it to let go, and
// waits for that up to session.LeaseWait.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// stateDir is -state-dir for MCP: the store, and the id that the SDK gives the session
// being brought back.
type stateDir struct {
	*session.Store

	fwd *forwarder // to the replicas that hold their sessions (Config.Advertise); nil: none

	mu     sync.Mutex
	forced string // the id GetSessionID gives the session being brought back
	// bringing serializes bringing a session back (which forces the next session id)
	// against the requests that may make a new session (RLock).
	bringing sync.RWMutex
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

// bringBack wraps the MCP handler next: a request naming a session that live does not know
// but the directory holds for the request's user brings it back first (s.restore); a
// request of another user, or for a session another replica keeps holding, is answered as
// the SDK answers an unknown session (404), or 503. Requests that may make a new session
// hold bringing for reading, so that none takes the id forced for one brought back.
func (d *stateDir) bringBack(s *sessions, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		if h := r.Header.Get("Mcp-Param-Session"); id == "" && h != "" && !s.liveHandle(h) && d.fwd.forward(w, r, h) {
			return // (a session handle another live replica holds)
		}
		if id == "" {
			if r.Header.Get("Mcp-Protocol-Version") < SessionlessRevision { // (may be an initialize)
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
		if d.fwd.forward(w, r, id) {
			return // (another live replica holds it)
		}
		user := ""
		if info := auth.TokenInfoFromContext(r.Context()); info != nil {
			user = info.UserID
		}
		if r.Method == http.MethodDelete {
			if meta, err := d.Stat(session.KindSession, id); err == nil && meta.User == user &&
				d.TakeLease(r.Context(), session.KindSession, id, user, session.LeaseWait) {
				d.Remove(session.KindSession, id)
				d.ReleaseLease(session.KindSession, id)
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
	meta, blob, err := d.ClaimOpen(r.Context(), session.KindSession, id, user)
	if err != nil {
		return err
	}
	defer blob.Close()
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
		d.ReleaseLease(session.KindSession, id)
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
