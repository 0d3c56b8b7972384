// Package loopguard is the one rule that both of minipy-mcp's HTTP fronts (MCP and E2B's
// API) hold against web pages on the user's own machine: DNS rebinding and cross-site
// requests.
//
// A server on loopback is reachable by every web page the user's browser opens. A page
// cannot read a cross-origin answer, but it can send a "simple" request (a POST of
// text/plain), and a page whose name it rebinds to 127.0.0.1 is same-origin to the server
// as far as the browser knows. What gives such a page away is what the browser sends: the
// Host header names the page's host, not loopback, and a cross-origin request has an Origin
// of the page's.
//
// The rule: a request that came in on a loopback address must name a loopback host (Host:
// localhost, a name under .localhost, which browsers resolve to loopback themselves, or a
// loopback IP), whatever the server's tokens; and on a server without tokens (anyone who
// reaches it runs code), a request that carries an Origin must come from a loopback origin.
// With tokens a page has no token to send, and a browser app of another origin that has one
// is a legitimate client.
package loopguard

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// The refusals, as Check returns them (wrapped with the header's value).
var (
	ErrHost   = errors.New("a request to a server on loopback must name a loopback host (DNS rebinding)")
	ErrOrigin = errors.New("a server without -tokens takes no cross-origin request from a web page")
)

// maxEcho bounds what a refusal repeats of the header it refused.
const maxEcho = 100

// Check applies the rule to r, on a server with tokens or without (anonymous).
func Check(r *http.Request, anonymous bool) error {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || local == nil || !loopbackAddr(local.String()) {
		return nil // (a server beyond loopback needs tokens, or -allow-anonymous, to start)
	}
	if !LoopbackHost(r.Host) {
		return fmt.Errorf("%w: Host %q", ErrHost, echo(r.Host))
	}
	if o, ok := r.Header["Origin"]; ok && anonymous {
		u, err := url.Parse(strings.Join(o, ","))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "" || !LoopbackHost(u.Host) {
			return fmt.Errorf("%w: Origin %q", ErrOrigin, echo(strings.Join(o, ",")))
		}
	}
	return nil
}

// Handler refuses with 403 what Check refuses, and serves the rest with next.
func Handler(next http.Handler, anonymous bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Check(r, anonymous); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			json.NewEncoder(w).Encode(map[string]any{"code": http.StatusForbidden, "message": err.Error()}) //nolint:errcheck // the client went away
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LoopbackHost reports whether a Host (with or without its port) names this machine only:
// localhost, a name under .localhost, or a loopback IP.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return loopbackAddr(host)
}

// loopbackAddr reports whether an address (an IP, with or without a port) is loopback.
func loopbackAddr(addr string) bool {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		addr = h
	}
	ip, err := netip.ParseAddr(strings.Trim(addr, "[]"))
	return err == nil && ip.Unmap().IsLoopback()
}

// echo is at most maxEcho bytes of a header's value, for an error.
func echo(s string) string {
	if len(s) > maxEcho {
		return s[:maxEcho] + "..."
	}
	return s
}
