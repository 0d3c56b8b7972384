package mcpfront

// Any replica answers for any session (Config.Advertise, with a store the replicas share).
// A replica holds the lease of each session it runs (KindSession, as before) and saves its
// MCP address in the store (session.KindReplicaMCP). A request for a session (or a session
// handle: its Mcp-Param-Session header) that another live replica holds is forwarded
// there, streamed both ways (the SSE answers too), rather than the session moving through
// a save and a restore: its calls keep their processes and cost no save. The holder checks
// the request as any other (the client's token); the forward's mark (session.MarkHeader)
// only says that a replica of this store sent it, so that it is not forwarded again, and
// one that does not verify is refused. A holder that does not answer is taken for dead:
// the session then moves as before, once its lease has expired.

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/url"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

type (
	mcpTargetKey    struct{}
	mcpForwardedKey struct{}
	mcpTryKey       struct{}
)

// forwarder forwards MCP requests to the replicas that hold their sessions.
type forwarder struct {
	store *session.Store
	proxy *httputil.ReverseProxy
	stop  func() // stops advertising, and withdraws it
}

// newForwarder advertises addr, this replica's MCP address, in store until close.
func newForwarder(store *session.Store, addr string) *forwarder {
	tr := session.ReplicaTransport()
	f := &forwarder{store: store}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(mcpTargetKey{}).(*url.URL))
			pr.Out.Host = pr.In.Host // (the SDK's and loopguard's view of where the client came)
			pr.SetXForwarded()
			store.Mark(pr.Out)
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if failed, ok := r.Context().Value(mcpTryKey{}).(*bool); ok {
				*failed = true // (answered by forward)
				return
			}
			http.Error(w, "minipy-mcp: the replica that holds the session did not answer: "+err.Error(), http.StatusBadGateway)
		},
	}
	f.stop = store.KeepAdvertised(session.KindReplicaMCP, addr)
	return f
}

// close stops advertising this replica.
func (f *forwarder) close() {
	f.stop() // (withdrawn)
}

// fromReplica checks r's forward mark, if it has one (false: it does not verify), and
// notes in r's context that it was forwarded.
func (f *forwarder) fromReplica(r *http.Request) (*http.Request, bool) {
	if r.Header.Get(session.MarkHeader) == "" {
		return r, true
	}
	if f == nil || f.store.VerifyMark(r) != nil {
		return r, false
	}
	r.Header.Del(session.MarkHeader)
	return r.WithContext(context.WithValue(r.Context(), mcpForwardedKey{}, true)), true
}

// forward sends r, for session id, to the live replica that holds it, and answers with
// its answer: true when it did. A request without a body that finds its holder dead (no
// answer) is not answered: the session moves here as before (false). One with a body
// then gets 502: the client sends it again, and it moves.
func (f *forwarder) forward(w http.ResponseWriter, r *http.Request, id string) bool {
	if f == nil || r.Context().Value(mcpForwardedKey{}) != nil {
		return false
	}
	owner, ok := f.store.Holder(session.KindSession, id)
	if !ok {
		return false
	}
	addr, err := f.store.ReplicaAddr(session.KindReplicaMCP, owner)
	if err != nil {
		return false // (it stopped renewing its address: dead, its lease goes next)
	}
	target, err := url.Parse(addr)
	if err != nil {
		return false
	}
	ctx := context.WithValue(r.Context(), mcpTargetKey{}, target)
	failed := false
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		ctx = context.WithValue(ctx, mcpTryKey{}, &failed)
	}
	f.proxy.ServeHTTP(w, r.WithContext(ctx))
	return !failed
}
