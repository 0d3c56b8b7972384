package main

// Serving over HTTP: the MCP endpoint behind tokens and caps, the health endpoints and the
// metrics, and the drain at SIGTERM.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpConfig is how the HTTP server serves an MCP server.
type httpConfig struct {
	idle    time.Duration // close a session idle this long (0: never)
	tokens  *tokens       // nil: no authentication
	gate    *gate         // sessions' caps and the drain; nil: none
	metrics *metrics      // nil: no /metrics
	// ready reports whether a new session's worker can start (the isolated engine's Ready);
	// nil: always.
	ready func(context.Context) error
	// state saves sessions and brings them back (-state-dir), with the server's sessions;
	// nil: none.
	state    *stateDir
	sessions *sessions
}

// readyTimeout bounds /readyz's check of the engine.
const readyTimeout = 5 * time.Second

// httpHandler serves server's Streamable HTTP transport at /mcp (and /), with sessions
// closed after cfg.idle without a request, behind cfg's tokens and caps; /healthz, /readyz
// and /metrics beside it, without a token (they tell nothing of a session).
func httpHandler(server *mcp.Server, cfg httpConfig) http.Handler {
	getServer := func(*http.Request) *mcp.Server { return server }
	var endpoint http.Handler = byRevision(
		mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{SessionTimeout: cfg.idle}),
		mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{Stateless: true}))
	if cfg.gate != nil {
		endpoint = cfg.gate.admit(endpoint)
	}
	if cfg.state != nil {
		endpoint = cfg.state.bringBack(cfg.sessions, endpoint) // (after the tokens: it needs the user)
	}
	if cfg.tokens != nil {
		var unauthed func()
		if cfg.metrics != nil {
			unauthed = cfg.metrics.unauthed.Inc
		}
		endpoint = requireTokens(cfg.tokens, endpoint, unauthed)
	}
	mux := opsHandler(cfg)
	mux.Handle("/", endpoint)
	return mux
}

// opsHandler serves /healthz, /readyz and /metrics (when cfg has metrics), without a token:
// they tell nothing of a session.
func opsHandler(cfg httpConfig) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok") // serving: while the process answers, even as it drains
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if cfg.gate != nil {
			if _, draining := cfg.gate.state(); draining {
				http.Error(w, "draining: no new sessions", http.StatusServiceUnavailable)
				return
			}
		}
		if cfg.ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			if err := cfg.ready(ctx); err != nil {
				http.Error(w, "no worker can start: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	if cfg.metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.metrics.registry, promhttp.HandlerOpts{}))
	}
	return mux
}

// sessionlessRevision is the first MCP revision without protocol sessions (SEP-2567).
const sessionlessRevision = "2026-07-28"

// byRevision serves the requests of a revision without protocol sessions (their
// MCP-Protocol-Version header says so, and they name no session) with the SDK's stateless
// handler, which alone speaks it, and the others with the stateful one, which keeps a
// session per client: the spec lets a server serve both eras on one endpoint. A client of
// the new revision keeps its variables through session handles (handles.go).
func byRevision(stateful, stateless http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" &&
			r.Header.Get("Mcp-Protocol-Version") >= sessionlessRevision {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}

// serveHTTP serves handler on ln until ctx ends (SIGTERM, SIGINT), then drains: the gate
// refuses new sessions and calls, the running calls get up to drainTimeout to finish, then
// the sessions close and serveHTTP returns. A SIGHUP reloads the tokens.
func serveHTTP(ctx context.Context, server *mcp.Server, ln net.Listener, cfg httpConfig, drainTimeout time.Duration) error {
	srv := &http.Server{Handler: httpHandler(server, cfg), ReadHeaderTimeout: 10 * time.Second}
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
	if cfg.gate != nil {
		if n := cfg.gate.drain(drainCtx); n > 0 {
			log.Printf("minipy-mcp: -drain-timeout %v passed with %d calls running: they are stopped", drainTimeout, n)
			cfg.gate.stopCalls()
		}
	}
	// The sessions' streams (a GET's event stream lasts as long as its session) would keep
	// Shutdown waiting: close the sessions first.
	for ss := range server.Sessions() {
		ss.Close() //nolint:errcheck // closing anyway
	}
	if cfg.sessions != nil {
		cfg.sessions.closeHandles(-1) // saved first, with -state-dir
	}
	if cfg.state != nil {
		cfg.sessions.awaitSaves(drainTimeout) // each is saved as it closes
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

// isLoopback reports whether addr (host:port) listens on this machine only.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false // ":8080" is every interface
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
