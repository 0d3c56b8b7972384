package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// Any replica answers for any sandbox (Config.Advertise). The replica that runs a sandbox
// holds its lease in the store (session.KindRunning), taken when it starts or resumes
// there and renewed while it is there; each replica saves its address in the store. A
// request for a sandbox that is not here, whose lease another replica holds, is forwarded
// to that replica's address: the API's calls for it (kill, pause, timeout, connect, fork,
// snapshots, metrics...), envd's and the interpreter's, streamed both ways (connect
// streams, NDJSON, uploads and downloads, a port's WebSocket), the client's cancellation
// passed on. A list asks every replica for the caller's sandboxes there.
//
// The holder checks a forwarded request as any other: the API key or access token are the
// client's own. The forward's mark (forwardHeader: an HMAC of the request under a key
// derived from the store's, and the time) says only that another replica sent it, so that
// it is not forwarded again; a mark that does not verify is refused (403), so a client
// cannot pass as a replica. What must hold: a replica forwards only to an address a replica
// saved, sealed, in the store (session.Store.ReplicaAddr), so one who can write the store
// but has not its key cannot have a client's key sent elsewhere.

// replicaListPath is where a replica lists the caller's sandboxes it has in memory, for
// another replica's list (forwarded requests only).
const replicaListPath = "/.minipy/replica/sandboxes"

// replicaSignedPath is where a replica finds, for another, the sandbox of its own that
// signed a file URL (forwarded requests only): the URL's query, and its method.
const replicaSignedPath = "/.minipy/replica/signed"

// forwarder forwards requests to the replicas that hold their sandboxes.
type forwarder struct {
	store  *session.Store
	addrs  sync.Map // owner -> replicaAddr: each replica's address, read from the store a while ago
	proxy  *httputil.ReverseProxy
	client *http.Client
	stop   context.CancelFunc
	done   sync.WaitGroup
}

type (
	targetKey    struct{}
	forwardedKey struct{}
	tryKey       struct{}
)

// forwardTry is a forward's: whether the request can be served here instead when its
// holder is found dead (replayable: no body, or one held whole), and whether it was
// (unreached: its holder refused a connection after the forward failed).
type forwardTry struct {
	target                *url.URL
	owner                 string // the replica it is for (forwardToHeader)
	replayable, unreached bool
}

// forwardToHeader names the replica a forward is for: another process at its address (it
// died and another started there) answers 421 with misdirectedHeader set, and the
// forward is then as a holder found dead.
const (
	forwardToHeader    = "Minipy-Forward-To"
	misdirectedHeader  = "Minipy-Misdirected"
	misdirectedMessage = "this replica is not the one the request was forwarded to (that one is gone)"
)

// errMisdirected: a forward reached another process than its holder, at the holder's address.
var errMisdirected = errors.New(misdirectedMessage)

// maxReplay is the largest body a forward holds whole, so that the request can still be
// served here when the holder turns out dead (an execution's code, a connect call); a
// larger one (an upload) streams through, and fails with its holder.
const maxReplay = 1<<20 + 64

// newForwarder starts holding s's sandboxes in the store and advertising addr there.
func newForwarder(s *Server, addr string) *forwarder {
	store := s.cfg.Store
	tr := session.ReplicaTransport()
	f := &forwarder{store: store, client: &http.Client{Transport: tr}}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(targetKey{}).(*url.URL))
			pr.Out.Host = pr.In.Host // (PORT-ID.domain routes it there too)
			pr.SetXForwarded()
			if try, ok := pr.In.Context().Value(tryKey{}).(*forwardTry); ok {
				pr.Out.Header.Set(forwardToHeader, try.owner)
			}
			store.Mark(pr.Out)
		},
		ModifyResponse: func(res *http.Response) error {
			if res.StatusCode == http.StatusMisdirectedRequest && res.Header.Get(misdirectedHeader) != "" {
				return errMisdirected // (it did not take the request)
			}
			return nil
		},
		Transport:     tr,
		FlushInterval: -1, // (streams: each write goes on at once)
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if try, ok := r.Context().Value(tryKey{}).(*forwardTry); ok && try.replayable && r.Context().Err() == nil &&
				(errors.Is(err, errMisdirected) || !reachable(try.target)) {
				try.unreached = true // (answered by forward)
				return
			}
			if r.Context().Err() == nil {
				writeError(w, http.StatusBadGateway, "the replica that runs the sandbox did not answer: "+err.Error())
			}
		},
	}
	unadvertise := store.KeepAdvertised(session.KindReplica, addr)
	ctx, stop := context.WithCancel(context.Background())
	f.stop = func() { stop(); unadvertise() }
	f.done.Add(1)
	go func() {
		defer f.done.Done()
		store.KeepUp(ctx, session.KindRunning, s.heldHere, func(string) {})
	}()
	return f
}

// close stops advertising this replica (its sandboxes' leases go with their ends).
func (f *forwarder) close() {
	f.stop() // (withdrawn)
	f.done.Wait()
	f.client.CloseIdleConnections()
}

// replicaAddr is a replica's address as read from the store at a time.
type replicaAddr struct {
	url *url.URL
	at  time.Time
}

// addrOf is the address of replica owner, read from the store at most a third of a lease
// ago (as often as the replica saves it again): a forward reads the sandbox's lease each
// time, for a sandbox moves, but not where its holder is, which does not.
func (f *forwarder) addrOf(owner string) (*url.URL, error) {
	if v, ok := f.addrs.Load(owner); ok && time.Since(v.(replicaAddr).at) < f.store.LeaseLength()/3 {
		return v.(replicaAddr).url, nil
	}
	addr, err := f.store.ReplicaAddr(session.KindReplica, owner)
	if err != nil {
		f.addrs.Delete(owner)
		return nil, err
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, err
	}
	f.addrs.Store(owner, replicaAddr{url: u, at: time.Now()})
	return u, nil
}

// fromReplica checks r's forward mark, if it has one, and says whether it was forwarded
// (in its context). False with an error: a mark that does not verify.
func (s *Server) fromReplica(r *http.Request) (*http.Request, error) {
	if r.Header.Get(session.MarkHeader) == "" {
		return r, nil
	}
	if s.fwd == nil {
		return r, session.ErrBadMark
	}
	if err := s.cfg.Store.VerifyMark(r); err != nil {
		return r, err
	}
	if to := r.Header.Get(forwardToHeader); to != "" && to != s.cfg.Store.Owner() {
		return r, errMisdirected
	}
	r.Header.Del(session.MarkHeader)
	r.Header.Del(forwardToHeader)
	return r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true)), nil
}

// checkReplica answers a request whose forward mark does not verify (403) or that was
// forwarded to another replica than this one (421, misdirectedHeader): false. Else it
// gives r, noted as forwarded if it was.
func (s *Server) checkReplica(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	r, err := s.fromReplica(r)
	switch {
	case errors.Is(err, errMisdirected):
		w.Header().Set(misdirectedHeader, "1")
		writeError(w, http.StatusMisdirectedRequest, err.Error())
		return r, false
	case err != nil:
		s.cfg.Metrics.Unauthorized()
		writeError(w, http.StatusForbidden, err.Error())
		return r, false
	}
	return r, true
}

// forwarded reports whether r came from another replica.
func forwarded(r *http.Request) bool { v, _ := r.Context().Value(forwardedKey{}).(bool); return v }

// forward sends r, for sandbox id, to the replica that holds it, and answers with its
// answer: true when it did (a forwarded request is never forwarded again).
func (s *Server) forward(w http.ResponseWriter, r *http.Request, id string) bool {
	if s.fwd == nil || forwarded(r) {
		return false
	}
	owner, ok := s.cfg.Store.Holder(session.KindRunning, id)
	if !ok {
		return false
	}
	target, err := s.fwd.addrOf(owner)
	if err != nil {
		return false // (its holder stopped renewing its address: it died, and its lease goes next)
	}
	try := &forwardTry{target: target, owner: owner, replayable: true}
	out := r.WithContext(context.WithValue(context.WithValue(r.Context(), targetKey{}, target), tryKey{}, try))
	if r.Body != nil && r.Body != http.NoBody {
		if r.ContentLength >= 0 && r.ContentLength <= maxReplay {
			body, err := io.ReadAll(io.LimitReader(r.Body, maxReplay+1))
			if err != nil {
				writeError(w, http.StatusBadRequest, "the request's body: "+err.Error())
				return true
			}
			r.Body = io.NopCloser(bytes.NewReader(body)) // (for this replica, if the holder is dead)
			out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		} else {
			try.replayable = false
		}
	}
	s.fwd.proxy.ServeHTTP(w, out)
	if !try.unreached {
		s.count(&s.stats.Forwarded)
		return true
	}
	// Its replica does not answer: dead (killed hard, its node lost) unless it renews its
	// lease. Once the lease has expired, the caller brings the sandbox back here from its
	// idle save (recoverRunning), and the client's request goes on, later.
	s.fwd.addrs.Delete(owner)
	if s.awaitNoHolder(r.Context(), id) {
		return false
	}
	writeError(w, http.StatusBadGateway, "the replica that runs the sandbox does not answer, and still holds it")
	return true
}

// awaitNoHolder waits, up to a lease and a second, until no replica holds sandbox id; false
// if one still does then (or ctx ended).
func (s *Server) awaitNoHolder(ctx context.Context, id string) bool {
	end := time.Now().Add(s.cfg.Store.LeaseLength() + time.Second)
	for {
		if _, held := s.cfg.Store.Holder(session.KindRunning, id); !held {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// hold takes the lease of sb, which now runs here, so that the other replicas forward its
// requests here.
func (s *Server) hold(sb *sandbox) {
	if s.fwd != nil && !s.cfg.Store.TryLease(session.KindRunning, sb.id, sb.user) {
		s.logf("minipy-mcp: E2B sandbox %s: another replica holds its lease", sb.id)
	}
}

// unhold gives up the lease of sb, which ended here or is in the store.
func (s *Server) unhold(sb *sandbox) {
	if s.fwd != nil {
		s.cfg.Store.ReleaseLease(session.KindRunning, sb.id)
	}
}

// heldHere are the sandboxes whose leases this replica holds, with their users: those in
// its memory that are not paused into the store.
func (s *Server) heldHere() map[string]string {
	s.mu.Lock()
	all := make([]*sandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		all = append(all, sb)
	}
	s.mu.Unlock()
	out := make(map[string]string, len(all))
	for _, sb := range all {
		if !sb.storedPaused() {
			out[sb.id] = sb.user
		}
	}
	return out
}

// replicaList answers another replica's list: the caller's sandboxes in this replica's
// memory that are not in the store.
func (s *Server) replicaList(w http.ResponseWriter, r *http.Request) {
	if !forwarded(r) {
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	writeJSON(w, http.StatusOK, s.hereListed(userOf(r)))
}

// peersListed are the caller's sandboxes that the other replicas have in memory, as each
// lists them (replicaList); a replica that does not answer within 5 s is left out.
func (s *Server) peersListed(r *http.Request) []listedSandbox {
	if s.fwd == nil || forwarded(r) {
		return nil
	}
	peers := s.cfg.Store.Replicas(session.KindReplica)
	var mu sync.Mutex
	var all []listedSandbox
	var wg sync.WaitGroup
	for _, addr := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := s.fwd.listAt(r, addr)
			if err != nil {
				s.logf("minipy-mcp: listing the sandboxes of the replica at %s: %v", addr, err)
				return
			}
			mu.Lock()
			all = append(all, got...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

// listAt asks the replica at addr for the sandboxes of r's caller (r's API key).
func (f *forwarder) listAt(r *http.Request, addr string) ([]listedSandbox, error) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(addr, "/")+replicaListPath, nil)
	if err != nil {
		return nil, err
	}
	req.Host = r.Host
	req.Header.Set("X-API-KEY", r.Header.Get("X-API-KEY"))
	f.store.Mark(req)
	res, err := f.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(body))
	}
	var got []listedSandbox
	return got, json.Unmarshal(body, &got)
}

// forwardSigned sends the signed file URL r, which names no sandbox and which no sandbox
// here signed, to the replica whose sandbox did, asking each in turn (replicaSigned): true
// when one did.
func (s *Server) forwardSigned(w http.ResponseWriter, r *http.Request) bool {
	if s.fwd == nil || forwarded(r) {
		return false
	}
	for _, addr := range s.cfg.Store.Replicas(session.KindReplica) {
		id, err := s.fwd.signedAt(r, addr)
		if err != nil || id == "" {
			continue
		}
		target, err := url.Parse(addr)
		if err != nil {
			continue
		}
		r.Header.Set("E2b-Sandbox-Id", id)
		r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
		s.count(&s.stats.Forwarded)
		s.fwd.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, target)))
		return true
	}
	return false
}

// signedAt asks the replica at addr for its sandbox that signed the file URL r: its id, or
// "" if none of its did.
func (f *forwarder) signedAt(r *http.Request, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	q := r.URL.Query()
	q.Set("method", r.Method)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(addr, "/")+replicaSignedPath+"?"+q.Encode(), nil)
	if err != nil {
		return "", err
	}
	req.Host = r.Host
	f.store.Mark(req)
	res, err := f.client.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	var found struct {
		SandboxID string `json:"sandboxID"`
	}
	if res.StatusCode != http.StatusOK {
		return "", nil
	}
	err = json.NewDecoder(io.LimitReader(res.Body, 1<<16)).Decode(&found)
	return found.SandboxID, err
}

// replicaSigned answers another replica's search for the sandbox here that signed a file
// URL (signedAt): its id, or 401. Its searches count as this replica's (rate limited).
func (s *Server) replicaSigned(w http.ResponseWriter, r *http.Request) {
	if !forwarded(r) {
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	q := r.URL.Query()
	method := q.Get("method")
	q.Del("method")
	probe := &http.Request{Method: method, URL: &url.URL{Path: "/files", RawQuery: q.Encode()}}
	sb, status := s.signedSandbox(probe)
	if sb == nil {
		writeError(w, status, "no sandbox here signed it")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"sandboxID": sb.id})
}

// reachable reports whether a connection to target can be made (within 2 s): a forward
// that failed to a replica that accepts none found it dead.
func reachable(target *url.URL) bool {
	port := target.Port()
	if port == "" {
		port = map[bool]string{true: "443", false: "80"}[target.Scheme == "https"]
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(target.Hostname(), port), 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
