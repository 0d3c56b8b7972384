package mcpfront

// Serving over HTTP: the MCP endpoint behind tokens and caps, and the drain at SIGTERM.

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/loopguard"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// Handler serves the server's Streamable HTTP transport, with sessions closed after
// Config.Idle without a request: behind loopguard's rule (403), the tokens (401), a saved session brought back
// (-state-dir), a new session admitted under the caps (503), and the SDK.
func (f *Front) Handler() http.Handler {
	getServer := func(*http.Request) *mcp.Server { return f.server }
	// (The SDK's own Host check is loopguard's first half: one rule for both fronts.)
	var endpoint http.Handler = byRevision(
		mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{SessionTimeout: f.cfg.Idle,
			DisableLocalhostProtection: true}),
		mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{Stateless: true, DisableLocalhostProtection: true}))
	if f.cfg.Gate != nil {
		endpoint = admit(f.cfg.Gate, endpoint)
	}
	if f.state != nil {
		endpoint = f.state.bringBack(f.sessions, endpoint) // (after the tokens: it needs the user)
	}
	if f.cfg.Tokens != nil {
		endpoint = requireTokens(f.cfg.Tokens, endpoint, f.cfg.Metrics.Unauthorized)
	}
	return loopguard.Handler(f.fromReplicas(endpoint), f.cfg.Tokens == nil)
}

// fromReplicas refuses a request whose forward mark does not verify (403: a client cannot
// pass as a replica), and passes the others on, a forwarded one noted (forward.go).
func (f *Front) fromReplicas(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, ok := f.fwd.fromReplica(r)
		if !ok {
			f.cfg.Metrics.Unauthorized()
			http.Error(w, "minipy-mcp: "+session.ErrBadMark.Error(), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// SessionlessRevision is the first MCP revision without protocol sessions (SEP-2567).
const SessionlessRevision = "2026-07-28"

// byRevision serves the requests of a revision without protocol sessions (their
// MCP-Protocol-Version header says so, and they name no session) with the SDK's stateless
// handler, which alone speaks it, and the others with the stateful one, which keeps a
// session per client: the spec lets a server serve both eras on one endpoint. A client of
// the new revision keeps its variables through session handles (handles.go).
func byRevision(stateful, stateless http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" &&
			r.Header.Get("Mcp-Protocol-Version") >= SessionlessRevision {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}

// Serve serves the MCP endpoint (Handler) on ln, under mux's other paths (the server's
// /healthz, /readyz, /metrics), until ctx ends (SIGTERM, SIGINT), then drains: the gate
// refuses new sessions and calls, the running calls get up to drainTimeout to finish, then
// the sessions close (saved first, with a store) and Serve returns. The front's handles
// idle out, and with a store its sessions' leases are kept, meanwhile.
func (f *Front) Serve(ctx context.Context, ln net.Listener, mux *http.ServeMux, drainTimeout time.Duration) error {
	if f.state != nil && f.cfg.Advertise != "" {
		f.fwd = newForwarder(f.state.Store, f.cfg.Advertise)
		f.state.fwd = f.fwd
		defer f.fwd.close()
	}
	mux.Handle("/", f.Handler())
	go f.sessions.expireHandles(ctx, f.cfg.Idle)
	if f.state != nil {
		go f.state.KeepUp(ctx, session.KindSession, f.sessions.keptIDs, f.sessions.giveUp)
	}
	srv := session.HTTPServer(mux, f.cfg.ConnIdle)
	log.Printf("minipy-mcp: serving MCP over HTTP at http://%s/mcp", ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Printf("minipy-mcp: draining (up to %v): no new sessions; running calls finish", drainTimeout)
	drainCtx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if g := f.cfg.Gate; g != nil {
		if n := g.Drain(drainCtx); n > 0 {
			log.Printf("minipy-mcp: -drain-timeout %v passed with %d calls running: they are stopped", drainTimeout, n)
			g.StopCalls()
		}
	}
	// The sessions' streams (a GET's event stream lasts as long as its session) would keep
	// Shutdown waiting: close the sessions first.
	for ss := range f.server.Sessions() {
		ss.Close() //nolint:errcheck // closing anyway
	}
	f.sessions.closeHandles(-1) // saved first, with -state-dir
	if f.state != nil {
		f.sessions.awaitSaves(drainTimeout) // each is saved as it closes
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShutdown()
	if err := srv.Shutdown(shutdown); err != nil {
		srv.Close() //nolint:errcheck // what Shutdown did not end
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Printf("minipy-mcp: drained")
	return nil
}
