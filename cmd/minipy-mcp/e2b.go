package main

// -e2b: E2B's API and sandboxes (internal/e2b) on an address of their own, under the
// server's tokens, caps and drain.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// checkE2B refuses an engine whose namespaces are not sandboxes of their own: an E2B
// sandbox's code sets its environment, its working directory, its processes, which the
// in-process engine and packed workers (-workers) share between users.
func checkE2B(eng minipy.Engine, workers int) error {
	if _, ok := eng.(*minipy.Isolated); !ok {
		return errors.New("-e2b needs -backend isolated: each E2B sandbox is a sandboxed process of its own")
	}
	if workers > 0 {
		return errors.New("-e2b needs a worker process per sandbox (-workers 0): packed workers share their " +
			"environment and working directory between sandboxes")
	}
	return nil
}

// checkAdvertise refuses an -advertise or -advertise-http (flag) that is no URL a replica
// can reach, or one without a store for the replicas to share.
func checkAdvertise(flag, addr string, store *session.Store) error {
	if addr == "" {
		return nil
	}
	if store == nil {
		return fmt.Errorf("%s needs -state-dir or -state-store: the replicas find each other's sandboxes and "+
			"sessions there", flag)
	}
	u, err := url.Parse(addr)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Path != "" && u.Path != "/" ||
		u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("%s %q: an http(s)://HOST:PORT URL, which the other replicas reach", flag, addr)
	}
	return nil
}

// e2bConfig is the E2B server's configuration from the flags.
func (f *flags) e2bConfig(eng minipy.Engine, toks *session.Tokens, g *session.Gate, cfg minipy.IsolatedConfig) e2b.Config {
	c := e2b.Config{Engine: eng, Timeout: f.timeout, MaxOutput: f.maxOutput, MaxTimeout: f.e2bMaxTimeout, SleepIdle: f.e2bSleepIdle,
		CPUCount: runtime.NumCPU(), Logf: log.Printf,
		Admit: func(user string) (func(), string) {
			if refusal := g.Hold(user); refusal != "" {
				return nil, refusal
			}
			return func() { g.Release(user) }, ""
		},
		HoldPaused: g.HoldUser, Full: g.Full, RootUser: cfg.RootUser}
	if cfg.MemoryLimit > 0 {
		c.MemoryMB = int(cfg.MemoryLimit >> 20)
	}
	if cfg.WorkSize > 0 {
		c.DiskMB = int(cfg.WorkSize >> 20)
	}
	if toks != nil {
		c.Authenticate, c.HasUser = toks.User, toks.Has
	}
	return c
}

// serveE2B serves srv on ln until ctx ends, then drains: no new sandbox (nor session of
// g's), the running requests (executions) get drainTimeout to finish, then every sandbox
// is killed.
func serveE2B(ctx context.Context, srv *e2b.Server, g *session.Gate, ln net.Listener, drainTimeout, connIdle time.Duration) error {
	hs := session.HTTPServer(srv, connIdle)
	log.Printf("minipy-mcp: serving E2B's API and sandboxes at http://%s (E2B_API_URL and E2B_SANDBOX_URL)", ln.Addr())
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		srv.Close()
		return err
	case <-ctx.Done():
	}
	srv.Drain()
	drainCtx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	g.Drain(drainCtx) // (/readyz says so; the MCP side's calls, if any, are its own drain's)
	if err := hs.Shutdown(drainCtx); err != nil {
		log.Printf("minipy-mcp: -drain-timeout %v passed with E2B requests running: they are stopped", drainTimeout)
		hs.Close() //nolint:errcheck // what Shutdown did not end
	}
	srv.Close()
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
