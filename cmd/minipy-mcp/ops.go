package main

// What the server answers beside its fronts: /healthz, /readyz and /metrics on each of
// -http's and -e2b's addresses, and SIGHUP's reload of the tokens.

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// readyTimeout bounds /readyz's check of the engine.
const readyTimeout = 5 * time.Second

// opsHandler serves /healthz, /readyz (not while g drains, nor while ready, if given,
// fails: no worker can start) and /metrics (m's), without a token: they tell nothing of a
// session. A store (-state-store) that does not answer leaves the server ready, since
// every replica shares it and the live sessions go on without it, and /readyz says so.
func opsHandler(g *session.Gate, m *session.Metrics, ready func(context.Context) error, store *session.Store) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok") // serving: while the process answers, even as it drains
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if _, draining := g.State(); draining {
			http.Error(w, "draining: no new sessions", http.StatusServiceUnavailable)
			return
		}
		if ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			if err := ready(ctx); err != nil {
				http.Error(w, "no worker can start: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		if store != nil {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			if err := store.Ready(ctx); err != nil {
				fmt.Fprintf(w, "ready; but the state store does not answer, sessions are not saved until it does: %v\n", err)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{}))
	return mux
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

// reloadTokensOnHUP reads the -tokens file again at each SIGHUP until ctx ends; a file
// that went bad leaves the tokens as they were. A user left without a token is cut off at
// once: endUser ends their sessions and sandboxes (saved or paused into the store first,
// where there is one).
func reloadTokensOnHUP(ctx context.Context, t *session.Tokens, endUser func(user string)) {
	onHUP(ctx, func() {
		revoked, err := t.Reload()
		if err != nil {
			log.Printf("minipy-mcp: -tokens: reading it again failed, the tokens stay as they were: %v", err)
			return
		}
		n, users := t.Users()
		log.Printf("minipy-mcp: -tokens: read again: %d tokens of %d users", n, users)
		for _, user := range revoked {
			log.Printf("minipy-mcp: -tokens: user %q has no token now: their sessions and sandboxes end", user)
			endUser(user)
		}
	})
}

// countE2B adds the E2B server's counts to the metrics.
func countE2B(m *session.Metrics, srv *e2b.Server) {
	for _, c := range []struct {
		name, help string
		get        func(e2b.Stats) int
		gauge      bool
	}{
		{"minipy_e2b_sandboxes", "E2B sandboxes running.", func(s e2b.Stats) int { return s.Running }, true},
		{"minipy_e2b_sandboxes_paused", "E2B sandboxes paused (in the server's memory, or in -state-dir).",
			func(s e2b.Stats) int { return s.Paused }, true},
		{"minipy_e2b_sandboxes_created_total", "E2B sandboxes created.", func(s e2b.Stats) int { return s.Created }, false},
		{"minipy_e2b_sandboxes_expired_total", "E2B sandboxes killed when their time ended.",
			func(s e2b.Stats) int { return s.Expired }, false},
		{"minipy_e2b_sandboxes_killed_total", "E2B sandboxes killed through the API.",
			func(s e2b.Stats) int { return s.Killed }, false},
		{"minipy_e2b_executions_total", "E2B executions (runCode).", func(s e2b.Stats) int { return s.Executed }, false},
		{"minipy_e2b_template_spares", "E2B templates' warm sandboxes ready now.",
			func(s e2b.Stats) int { return s.Spares }, true},
		{"minipy_e2b_sandboxes_from_spares_total", "E2B sandboxes created from a template's warm sandbox.",
			func(s e2b.Stats) int { return s.FromSpare }, false},
		{"minipy_e2b_forwarded_total", "E2B requests forwarded to the replica that runs their sandbox (-advertise).",
			func(s e2b.Stats) int { return s.Forwarded }, false},
		{"minipy_e2b_sandboxes_recovered_total", "E2B sandboxes brought back from their idle saves, their replica dead (-advertise).",
			func(s e2b.Stats) int { return s.Recovered }, false},
		{"minipy_e2b_sandboxes_asleep", "E2B sandboxes asleep (-e2b-sleep-idle): running for their clients, their processes freed.",
			func(s e2b.Stats) int { return s.Asleep }, true},
		{"minipy_e2b_sandboxes_slept_total", "E2B sandboxes put to sleep (-e2b-sleep-idle).",
			func(s e2b.Stats) int { return s.Slept }, false},
		{"minipy_e2b_sandboxes_slept_for_room_total", "E2B sandboxes put to sleep before their time to make room for another under -max-sessions (-e2b-sleep-idle).",
			func(s e2b.Stats) int { return s.SleptForRoom }, false},
		{"minipy_e2b_sandboxes_woken_total", "E2B sandboxes woken from a sleep, or by autoResume.",
			func(s e2b.Stats) int { return s.Woken }, false},
		{"minipy_e2b_contexts_restored_total", "E2B code contexts brought back from their sandbox's idle save, their processes dead (-advertise).",
			func(s e2b.Stats) int { return s.Restored }, false},
	} {
		value := func() float64 { return float64(c.get(srv.Stats())) }
		if c.gauge {
			m.Registry().MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: c.name, Help: c.help}, value))
		} else {
			m.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help}, value))
		}
	}
	m.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "minipy_e2b_wake_seconds_total",
		Help: "The time E2B sandboxes' wakes took, in all (divided by minipy_e2b_sandboxes_woken_total: a wake's mean)."},
		func() float64 { return srv.Stats().WakeTime.Seconds() }))
}

// countStore adds the state store's health to the metrics: minipy_state_store_up.
func countStore(m *session.Metrics, store *session.Store) {
	m.Registry().MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "minipy_state_store_up",
		Help: "1 while the state store (-state-dir, -state-store) answers; saves wait for it otherwise."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if store.Ready(ctx) != nil {
				return 0
			}
			return 1
		}))
}
