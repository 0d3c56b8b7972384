package e2b

import (
	"errors"
	"net/http"

	"github.com/minipy-go/minipy"
)

// A sandbox's network rules (E2B's allowInternetAccess, network.allowOut and denyOut, at
// create and with updateNetwork): Namespace.SetEgressRules on each of its contexts'
// namespaces, which the server's -egress-allow policy still bounds (a sandbox can narrow
// it, never widen it, and never reach what its address rule refuses: the host's, private
// and metadata addresses). A server without an egress policy gives sandboxes no way out at
// all: the rules are kept, and narrow nothing.

// egressOf is the rules of allowInternetAccess and the network options (nil: none).
func egressOf(allowInternet *bool, allowOut, denyOut []string) *minipy.EgressRules {
	r := &minipy.EgressRules{Allow: allowOut, Deny: denyOut}
	if allowInternet != nil && !*allowInternet {
		r.Deny = append(append([]string(nil), r.Deny...), "0.0.0.0/0") // (E2B: the same as denying all traffic)
	}
	if len(r.Allow) == 0 && len(r.Deny) == 0 {
		return nil
	}
	return r
}

// checkEgress says why rules are refused, or "".
func checkEgress(r *minipy.EgressRules) string {
	if r == nil {
		return ""
	}
	if err := r.Check(); err != nil {
		return "network: " + err.Error()
	}
	return ""
}

// narrow gives ns the rules of sb (a context's new namespace).
func narrow(sb *sandbox, ns *minipy.Namespace) error {
	sb.mu.Lock()
	r := sb.egress
	sb.mu.Unlock()
	if err := ns.SetEgressRules(r); err != nil && !errors.Is(err, minipy.ErrNoEgress) {
		return err
	}
	return nil
}

// networkUpdate is E2B's SandboxNetworkUpdateConfig: the rules that replace the sandbox's
// (a field left out is cleared).
type networkUpdate struct {
	AllowInternetAccess *bool    `json:"allow_internet_access"`
	AllowOut            []string `json:"allowOut"`
	DenyOut             []string `json:"denyOut"`
}

// updateNetwork serves PUT /sandboxes/{id}/network: the sandbox's rules, replaced, for its
// next connections (a paused sandbox's at its resume).
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req networkUpdate
	if !readJSON(w, r, maxAPIBody, &req) {
		return
	}
	rules := egressOf(req.AllowInternetAccess, req.AllowOut, req.DenyOut)
	if why := checkEgress(rules); why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	sb.mu.Lock()
	sb.egress = rules
	contexts := append([]*codeContext(nil), sb.contexts...)
	sb.mu.Unlock()
	for _, cc := range contexts {
		if ns := cc.ns.Load(); ns != nil {
			if err := narrow(sb, ns); err != nil {
				writeError(w, http.StatusInternalServerError, "the sandbox's network rules: "+err.Error())
				return
			}
		}
	}
	w.WriteHeader(http.StatusNoContent)
}
