package e2b

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/minipy-go/minipy"
)

// A sandbox's other ports (E2B's getHost(port): PORT-ID.domain, or E2b-Sandbox-Port): a
// server the code or a command started in the sandbox, reached through
// Namespace.DialPort, HTTP and WebSocket alike, streamed both ways. As E2B's, they are
// public by default (a browser opens getHost's URL, which carries no token; the sandbox's
// id, 20 random characters, is the capability); a sandbox created with
// network.allowPublicTraffic false answers them only to its traffic access token
// (E2B-Traffic-Access-Token). Neither token is passed on to the code's server, nor the
// headers that route the request here; network.maskRequestHost sets the Host it sees
// ("${PORT}" replaced by the port).

// portRules are a sandbox's create-time rules for its ports (E2B's network options).
type portRules struct {
	Private  bool   `json:"private,omitempty"`  // allowPublicTraffic false: the traffic token is needed
	MaskHost string `json:"maskHost,omitempty"` // maskRequestHost
}

// networkRequest is the part of E2B's create request's network options that is served:
// the ports' (here) and the egress rules' (network.go).
type networkRequest struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
	MaskRequestHost    string   `json:"maskRequestHost"`
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
}

// egress is the create request's egress rules (network.go).
func (req *createRequest) egress() *minipy.EgressRules {
	if req.Network == nil {
		return egressOf(req.AllowInternetAccess, nil, nil)
	}
	return egressOf(req.AllowInternetAccess, req.Network.AllowOut, req.Network.DenyOut)
}

func (n *networkRequest) rules() portRules {
	if n == nil {
		return portRules{}
	}
	return portRules{Private: n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic, MaskHost: n.MaskRequestHost}
}

// portHeaders are the request's headers that are the server's business, not the code's.
var portHeaders = []string{"X-Access-Token", "E2b-Traffic-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port"}

// servePort proxies r to port of sb's sandbox.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, sb *sandbox, port int) {
	ns := sb.namespace()
	if ns == nil {
		writeError(w, http.StatusBadGateway, "the sandbox is not running")
		return
	}
	rules := sb.portRules()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "127.0.0.1:"+strconv.Itoa(port)
			pr.Out.Host = r.Host
			if rules.MaskHost != "" {
				pr.Out.Host = strings.ReplaceAll(rules.MaskHost, "${PORT}", strconv.Itoa(port))
			}
			for _, h := range portHeaders {
				pr.Out.Header.Del(h)
			}
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				return ns.DialPort(ctx, port)
			},
			DisableKeepAlives: true, // (a connection is one request's: none outlives it)
		},
		FlushInterval: -1, // streamed as the server writes
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			msg := "port " + strconv.Itoa(port) + " of the sandbox: " + err.Error()
			if errors.Is(err, syscall.ECONNREFUSED) {
				msg = "The sandbox is running but port is not open" // (E2B's proxy's words)
			}
			writeError(w, http.StatusBadGateway, msg)
		},
	}
	rp.ServeHTTP(w, r)
}

// userPort reports whether port is one of a sandbox's own (not envd's or the interpreter's),
// and which.
func userPort(port string) (int, bool) {
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n > 65535 || n == EnvdPort || n == InterpreterPort {
		return 0, false
	}
	return n, true
}

func (sb *sandbox) portRules() portRules {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.ports
}
