package minipy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Egress is a network policy for an isolated engine's sandboxed workers
// (IsolatedConfig.Egress): the sandbox keeps a network namespace of its own, with nothing
// but loopback, and its one way out is an HTTP proxy that the host runs in Go, listening on
// 127.0.0.1:3128 inside the sandbox. HTTP_PROXY, HTTPS_PROXY and ALL_PROXY point there, so
// requests, urllib, httpx, pip, curl and wget work unchanged; anything else finds no route.
// The proxy takes CONNECT (HTTPS and any TLS) and absolute-form plain HTTP.
//
// A destination passes when its name matches Allow and not Deny, and every address the
// proxy dials for it passes the address rule: the proxy resolves the name itself and dials
// the address it checked, so DNS rebinding gains nothing. Loopback, private (RFC 1918, IPv6
// ULA), link-local (the cloud metadata address), shared (CGNAT), multicast, unspecified and
// reserved addresses are refused unless AllowNets lists them. A refused request gets HTTP
// 403 with one line the model can read: "minipy: egress to HOST:PORT is not allowed (...)".
type Egress struct {
	// Allow lists the destinations: a host name ("pypi.org"), every name under a domain
	// ("*.example.com", not example.com itself), an IP address, each optionally with a
	// port ("host:8443"); without one, ports 80 and 443.
	Allow []string
	// Deny lists destinations refused even when Allow matches, in the same forms.
	Deny []string
	// AllowNets lists addresses that the address rule refuses and that are allowed anyway
	// (an internal mirror at 10.1.2.3/32).
	AllowNets []netip.Prefix
	// Methods lists the plain-HTTP methods allowed (nil: all); HTTPS is opaque to the proxy.
	Methods []string
	// MaxConnections caps the connections a sandbox has open through the proxy at once
	// (0: DefaultEgressConnections; Unlimited: none).
	MaxConnections int
	// MaxBytes caps the bytes a sandbox moves through the proxy, both ways, in one run,
	// every byte between the code and the proxy: headers, bodies, tunnels
	// (0: DefaultEgressBytes; Unlimited: none). Past it, its connections are closed and new
	// ones are refused until the next run.
	MaxBytes int64
	// Lookup and Dial replace the proxy's name lookup and its dialer (nil: the system's):
	// for an upstream proxy, custom DNS, and tests.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	Dial   func(ctx context.Context, network, address string) (net.Conn, error)
}

// The defaults of an Egress policy's caps.
const (
	DefaultEgressConnections = 32
	DefaultEgressBytes       = 1 << 30
)

// EgressEvent is one connection or request through a sandbox's egress proxy, allowed or not
// (IsolatedConfig.OnEgress).
type EgressEvent struct {
	Host    string     // as the code asked for it
	Port    int        // likewise
	Method  string     // CONNECT, or the plain-HTTP method
	Addr    netip.Addr // the address dialed (zero: none was)
	Allowed bool
	// Refusal says why it was refused (the 403's line), or why it was cut (a cap).
	Refusal string
	// Sent and Received are the bytes from the code and to it (bodies, for plain HTTP).
	Sent, Received int64
	Duration       time.Duration
}

// egressPolicy is an Egress, parsed.
type egressPolicy struct {
	cfg     Egress
	allow   []destination
	deny    []destination
	methods map[string]bool
	allowed string // the allowlist as the refusals show it
}

// destination is one entry of Allow or Deny.
type destination struct {
	name  string // lower case, without a trailing dot; "*.d" matches names under d
	ports []int  // nil: 80 and 443
}

func (d destination) matches(host string, port int) bool {
	if !d.matchesName(host) {
		return false
	}
	if d.ports == nil {
		return port == 80 || port == 443
	}
	return slices.Contains(d.ports, port)
}

// matchesName reports whether host (lower case, without a trailing dot) is d's name, or
// one under its domain for "*.d".
func (d destination) matchesName(host string) bool {
	if wild, ok := strings.CutPrefix(d.name, "*."); ok {
		return strings.HasSuffix(host, "."+wild)
	}
	return host == d.name
}

// parseDestination reads an entry of Allow or Deny.
func parseDestination(s string) (destination, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	host, port := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, port = h, p
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if host == "" || host == "*" || strings.Contains(host[1:], "*") || strings.ContainsAny(host, "/ ") {
		return destination{}, fmt.Errorf("minipy: Egress: %q is no destination (a name, *.domain or an address, "+
			"with an optional :port)", s)
	}
	d := destination{name: host}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return destination{}, fmt.Errorf("minipy: Egress: %q has no valid port", s)
		}
		d.ports = []int{n}
	}
	return d, nil
}

// newEgressPolicy checks and parses cfg.
func newEgressPolicy(cfg Egress) (*egressPolicy, error) {
	p := &egressPolicy{cfg: cfg}
	for _, s := range cfg.Allow {
		d, err := parseDestination(s)
		if err != nil {
			return nil, err
		}
		p.allow = append(p.allow, d)
	}
	for _, s := range cfg.Deny {
		d, err := parseDestination(s)
		if err != nil {
			return nil, err
		}
		p.deny = append(p.deny, d)
	}
	if cfg.Methods != nil {
		p.methods = map[string]bool{}
		for _, m := range cfg.Methods {
			p.methods[strings.ToUpper(m)] = true
		}
	}
	if cfg.MaxConnections == 0 {
		p.cfg.MaxConnections = DefaultEgressConnections
	}
	if cfg.MaxBytes == 0 {
		p.cfg.MaxBytes = DefaultEgressBytes
	}
	if p.cfg.MaxConnections < Unlimited || p.cfg.MaxBytes < Unlimited {
		return nil, errors.New("minipy: Egress: MaxConnections and MaxBytes take a count, 0 or Unlimited")
	}
	names := cfg.Allow
	if len(names) > 8 {
		names = append(slices.Clone(names[:8]), fmt.Sprintf("and %d more", len(cfg.Allow)-8))
	}
	p.allowed = "allowed: " + strings.Join(names, ", ")
	if len(cfg.Allow) == 0 {
		p.allowed = "nothing is allowed"
	}
	return p, nil
}

// refusal is why the policy refuses a destination: the 403's line.
type refusal struct{ line string }

func (r *refusal) Error() string { return r.line }

func (p *egressPolicy) refuse(host string, port int, why string) *refusal {
	if why != "" {
		why += "; "
	}
	return &refusal{fmt.Sprintf("minipy: egress to %s is not allowed (%s%s)",
		net.JoinHostPort(host, strconv.Itoa(port)), why, p.allowed)}
}

// admitName judges host:port by name (Allow, Deny).
func (p *egressPolicy) admitName(host string, port int) *refusal {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	for _, d := range p.deny {
		if d.matches(h, port) {
			return p.refuse(host, port, "denied")
		}
	}
	for _, d := range p.allow {
		if d.matches(h, port) {
			return nil
		}
	}
	return p.refuse(host, port, "")
}

// addressClass says why the address rule refuses a, or "" when it does not.
func addressClass(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return "link-local"
	case a.IsMulticast() || a.IsInterfaceLocalMulticast():
		return "multicast"
	case a.IsUnspecified():
		return "unspecified"
	}
	for _, r := range reservedNets {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	return ""
}

var reservedNets = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (CGNAT)"},
	{netip.MustParsePrefix("0.0.0.0/8"), "reserved"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "reserved"},
	{netip.MustParsePrefix("2001::/23"), "reserved"},
}

// embedded is the IPv4 address that IPv6 address a carries to an IPv4 host, by the
// prefixes that translate or tunnel to one: NAT64 (64:ff9b::/96, the RFC 6052 well-known
// prefix: on an IPv6-only network 64:ff9b::a9fe:a9fe is the metadata service), SIIT's
// IPv4-translated (::ffff:0:0:0/96), the deprecated IPv4-compatible (::/96) and 6to4
// (2002::/16, its bits 16-47). (Teredo's 2001::/32 is refused whole, as reserved; IPv4-mapped
// addresses are unmapped before anything.) false for any other address.
func embedded(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() || a.Is4In6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	for _, p := range embeddingNets {
		if p.Contains(a) {
			return netip.AddrFrom4([4]byte(b[12:16])), true
		}
	}
	if sixToFour.Contains(a) {
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

var (
	embeddingNets = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("::ffff:0:0:0/96"),
		netip.MustParsePrefix("::/96")}
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// admitAddr judges an address the proxy would dial, and the IPv4 address embedded in it
// (embedded): "" if it may be dialed, else why not ("169.254.169.254 is a link-local
// address", "64:ff9b::a9fe:a9fe carries 169.254.169.254, a link-local address").
func (p *egressPolicy) admitAddr(a netip.Addr) string {
	v4, ok := embedded(a.Unmap())
	for _, n := range p.cfg.AllowNets {
		if n.Contains(a.Unmap()) || ok && n.Contains(v4) {
			return ""
		}
	}
	if c := addressClass(a); c != "" {
		return fmt.Sprintf("%s is a %s address", a, c)
	}
	if ok {
		if c := addressClass(v4); c != "" {
			return fmt.Sprintf("%s carries %s, a %s address", a, v4, c)
		}
	}
	return ""
}

// egressProxy is the proxy of one sandbox: it serves the socket the sandbox listens on
// (worker.EgressListener), until the sandbox ends.
type egressProxy struct {
	e      *Isolated
	ln     net.Listener
	srv    *http.Server
	tr     *http.Transport
	open   atomic.Int64 // connections the code has open to the proxy
	used   atomic.Int64 // bytes both ways between the code and the proxy in this run, headers included
	mu     sync.Mutex
	tunnel map[net.Conn]struct{}        // hijacked connections (CONNECT), closed at a cap or the end
	policy atomic.Pointer[egressPolicy] // the policy its pooled upstream connections were judged by
	rules  *atomic.Pointer[egressRules] // its sandbox's rules (Namespace.SetEgressRules), read at each dial; nil: none
	judged atomic.Pointer[egressRules]  // the rules its pooled upstream connections were judged by
}

// egressIdleConns bounds the idle upstream connections of one sandbox's proxy (its pool);
// the ones in use are bounded by MaxConnections, each serving a connection of the code's.
const egressIdleConns = 4

// startEgressProxy serves the proxy on f, the sandbox's listening socket.
func (e *Isolated) startEgressProxy(f *os.File, rules *atomic.Pointer[egressRules]) (*egressProxy, error) {
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("minipy: the sandbox's egress listener: %w", err)
	}
	p := &egressProxy{e: e, ln: ln, tunnel: map[net.Conn]struct{}{}, rules: rules}
	p.tr = &http.Transport{
		Proxy:       nil, // (never the host's own proxy settings: Egress.Dial is the way to one)
		DialContext: p.dialChecked,
		// The idle upstream connections the host keeps for a sandbox, whatever the hosts: 400
		// distinct allowed names once left 400 open (805 descriptors) until the engine closed.
		MaxIdleConns:          egressIdleConns,
		MaxIdleConnsPerHost:   egressIdleConns,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	// (The headers of the code's requests are held in the host: 64 KiB each, at most
	// MaxConnections at once per sandbox.)
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second, MaxHeaderBytes: 64 << 10,
		ErrorLog: log.New(io.Discard, "", 0)}
	go p.srv.Serve(capListener{p}) //nolint:errcheck // ends with close
	return p, nil
}

// sandboxRules are the rules of the proxy's sandbox now, or nil.
func (p *egressProxy) sandboxRules() *egressRules {
	if p.rules == nil {
		return nil
	}
	return p.rules.Load()
}

// close stops the proxy: the listener, every connection, the idle upstream ones.
func (p *egressProxy) close() {
	p.srv.Close()
	p.mu.Lock()
	for c := range p.tunnel {
		c.Close()
	}
	p.mu.Unlock()
	p.tr.CloseIdleConnections()
}

// newRun starts the byte count of a run.
func (p *egressProxy) newRun() { p.used.Store(0) }

// capListener enforces MaxConnections at accept: past it, the connection gets a 429.
type capListener struct{ p *egressProxy }

func (l capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.p.ln.Accept()
		if err != nil {
			return nil, err
		}
		max := l.p.e.egress.Load().cfg.MaxConnections
		if n := l.p.open.Add(1); max > 0 && n > int64(max) {
			l.p.open.Add(-1)
			line := fmt.Sprintf("minipy: egress refused: %d connections are open, the most a sandbox may have at once "+
				"(Egress.MaxConnections)", max)
			writeRefusal(c, http.StatusTooManyRequests, line)
			c.Close()
			l.p.e.egressEvent(EgressEvent{Refusal: line})
			continue
		}
		return &countedConn{Conn: c, p: l.p}, nil
	}
}

func (l capListener) Close() error   { return l.p.ln.Close() }
func (l capListener) Addr() net.Addr { return l.p.ln.Addr() }

// countedConn is a connection of the code's, counted open until closed.
type countedConn struct {
	net.Conn
	p    *egressProxy
	once sync.Once
}

// Read and Write count every byte between the code and the proxy into the run's total
// (Egress.MaxBytes): request and response headers and CONNECT's bytes as well as bodies. The
// cap is enforced where a refusal can still be said (ServeHTTP, before a request) or a
// transfer cut (countedReader).
func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.p.used.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.p.used.Add(int64(n))
	return n, err
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.p.open.Add(-1) })
	return c.Conn.Close()
}

// writeRefusal writes a whole HTTP response whose body is line, and asks to close.
func writeRefusal(w io.Writer, status int, line string) {
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"+
		"Connection: close\r\n\r\n%s\n", status, http.StatusText(status), len(line)+1, line)
}

// hostPort splits the request's target into host and port (default: the scheme's).
func hostPort(target, scheme string) (string, int, error) {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		host, port = target, "80"
		if scheme == "https" {
			port = "443"
		}
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || host == "" {
		return "", 0, fmt.Errorf("bad target %q", target)
	}
	return strings.Trim(host, "[]"), n, nil
}

type dialedAddr struct{}

// dialChecked resolves address's host, keeps the addresses the policy allows, and dials
// them in turn: the address judged is the address dialed. A refusal is a *refusal. The
// address dialed is stored in the context's *netip.Addr, when it has one.
func (p *egressProxy) dialChecked(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := hostPort(address, "")
	if err != nil {
		return nil, err
	}
	policy := p.e.egress.Load()
	if r := policy.admitName(host, port); r != nil {
		return nil, r
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if policy.cfg.Lookup != nil {
		addrs, err = policy.cfg.Lookup(ctx, host)
		if err != nil {
			return nil, err
		}
	} else if addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, err
	}
	var ok []netip.Addr
	var why string
	for _, a := range addrs {
		if c := policy.admitAddr(a); c != "" {
			why = c
			continue
		}
		ok = append(ok, a)
	}
	if rules := p.sandboxRules(); rules != nil && len(ok) > 0 {
		if ok = rules.judge(host, ok); len(ok) == 0 {
			why = rules.why()
		}
	}
	if len(ok) == 0 {
		if why == "" {
			why = "no address"
		}
		return nil, policy.refuse(host, port, why)
	}
	dial := policy.cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second}).DialContext
	}
	var last error
	for _, a := range ok {
		c, err := dial(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			if slot, _ := ctx.Value(dialedAddr{}).(*netip.Addr); slot != nil {
				*slot = a
			}
			return c, nil
		}
		last = err
	}
	return nil, last
}

// ServeHTTP serves one request of the code's: a CONNECT tunnel, or a plain-HTTP request in
// absolute form.
func (p *egressProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ev := EgressEvent{Method: r.Method}
	var dialed netip.Addr
	ctx := context.WithValue(r.Context(), dialedAddr{}, &dialed)
	defer func() {
		ev.Addr, ev.Duration = dialed, time.Since(start)
		p.e.egressEvent(ev)
	}()
	refuse := func(status int, line string) {
		ev.Refusal = line
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		w.WriteHeader(status)
		io.WriteString(w, line+"\n") //nolint:errcheck // the code hung up
	}
	scheme := "http"
	target := r.URL.Host
	if r.Method == http.MethodConnect {
		scheme, target = "https", r.Host
	} else if !r.URL.IsAbs() || r.URL.Scheme != "http" {
		refuse(http.StatusBadRequest, "minipy: this is the sandbox's egress proxy: ask it for http:// URLs in "+
			"absolute form, or CONNECT for anything else")
		return
	}
	host, port, err := hostPort(target, scheme)
	ev.Host, ev.Port = host, port
	if err != nil {
		refuse(http.StatusBadRequest, "minipy: egress: "+err.Error())
		return
	}
	if status, line := p.admit(r.Method, host, port); status != 0 {
		refuse(status, line)
		return
	}
	if r.Method == http.MethodConnect {
		p.tunnelTo(ctx, w, host, port, &ev, refuse)
		return
	}
	out := r.Clone(ctx)
	out.RequestURI = ""
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Connection",
		"Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		out.Header.Del(h)
	}
	if out.Body != nil {
		out.Body = &countedReader{r: out.Body, n: &ev.Sent, p: p}
	}
	resp, err := p.tr.RoundTrip(out)
	var denied *refusal
	switch {
	case errors.As(err, &denied):
		refuse(http.StatusForbidden, denied.line)
		return
	case err != nil:
		refuse(http.StatusBadGateway, "minipy: egress: "+err.Error())
		return
	}
	defer resp.Body.Close()
	ev.Allowed = true
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, &countedReader{r: resp.Body, n: &ev.Received, p: p}); errors.Is(err, errEgressBytes) {
		ev.Refusal = err.Error()
	}
}

// admit judges a request of method to host:port by the policy of its time, before anything
// is dialed: its status and line if refused, 0 if not.
func (p *egressProxy) admit(method, host string, port int) (int, string) {
	policy, rules := p.e.egress.Load(), p.sandboxRules()
	if p.policy.Swap(policy) != policy || p.judged.Swap(rules) != rules {
		// An upstream connection in the pool was judged by another policy (SetEgress) or
		// other rules of the sandbox's (SetEgressRules): none is reused under these.
		p.tr.CloseIdleConnections()
	}
	if denied := policy.admitName(host, port); denied != nil {
		return http.StatusForbidden, denied.line // (every request: a pooled connection is not dialed again)
	}
	if max := policy.cfg.MaxBytes; max > 0 && p.used.Load() >= max {
		return http.StatusTooManyRequests, fmt.Sprintf("minipy: egress refused: this run has moved %d bytes, "+
			"the most a run may (Egress.MaxBytes)", max)
	}
	if method != http.MethodConnect && policy.methods != nil && !policy.methods[method] {
		return http.StatusForbidden, fmt.Sprintf("minipy: egress: the method %s is not allowed (allowed: %s)",
			method, strings.Join(policy.cfg.Methods, ", "))
	}
	return 0, ""
}

// tunnelTo serves a CONNECT: dial, 200, then bytes both ways until either side closes or
// the run's byte cap is reached.
func (p *egressProxy) tunnelTo(ctx context.Context, w http.ResponseWriter, host string, port int, ev *EgressEvent,
	refuse func(int, string)) {
	upstream, err := p.dialChecked(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	var denied *refusal
	switch {
	case errors.As(err, &denied):
		refuse(http.StatusForbidden, denied.line)
		return
	case err != nil:
		refuse(http.StatusBadGateway, "minipy: egress: "+err.Error())
		return
	}
	defer upstream.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		refuse(http.StatusInternalServerError, "minipy: egress: no tunnel")
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer client.Close()
	ev.Allowed = true
	p.mu.Lock()
	p.tunnel[client] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.tunnel, client)
		p.mu.Unlock()
	}()
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(upstream, &countedReader{r: buf.Reader, n: &ev.Sent, p: p})
		if cw, ok := upstream.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite() //nolint:errcheck // the code's side is done sending
		}
		done <- err
	}()
	go func() {
		_, err := io.Copy(client, &countedReader{r: bufio.NewReader(upstream), n: &ev.Received, p: p})
		done <- err
	}()
	for i := 0; i < 2; i++ {
		if err := <-done; errors.Is(err, errEgressBytes) {
			ev.Refusal = err.Error()
			client.Close()
			upstream.Close()
		} else if i == 0 && err != nil {
			client.Close()
			upstream.Close()
		}
	}
}

var errEgressBytes = errors.New("minipy: egress cut: the run moved the most bytes a run may (Egress.MaxBytes)")

// countedReader counts what is read into n (the event's), and fails once the run's total
// (which the code's connection counts: countedConn) is past the cap.
type countedReader struct {
	r io.Reader
	n *int64
	p *egressProxy
}

func (c *countedReader) Read(b []byte) (int, error) {
	if max := c.p.e.egress.Load().cfg.MaxBytes; max > 0 && c.p.used.Load() > max {
		return 0, errEgressBytes
	}
	n, err := c.r.Read(b)
	atomic.AddInt64(c.n, int64(n))
	return n, err
}

func (c *countedReader) Close() error {
	if rc, ok := c.r.(io.Closer); ok {
		return rc.Close()
	}
	return nil
}

// egressEvent counts an event of a proxy and tells the engine's observer.
func (e *Isolated) egressEvent(ev EgressEvent) {
	if ev.Allowed && ev.Refusal == "" {
		e.egressAllowed.Add(1)
	} else {
		e.egressDenied.Add(1)
	}
	e.egressBytes.Add(ev.Sent + ev.Received)
	if f := e.cfg.OnEgress; f != nil {
		f(ev)
	}
}

// SetEgress replaces the egress policy of an engine made with one (IsolatedConfig.Egress):
// every sandbox's proxy judges the connections and requests that come after by it, the
// ones open are left alone (minipy-mcp re-reads its allowlist at SIGHUP). An engine made
// without a policy has no proxy to give one: that is an error, as is a bad policy.
func (e *Isolated) SetEgress(eg Egress) error {
	if e.egress.Load() == nil {
		return errors.New("minipy: SetEgress: the engine was made without IsolatedConfig.Egress, so its sandboxes " +
			"have no proxy")
	}
	p, err := newEgressPolicy(eg)
	if err != nil {
		return err
	}
	e.egress.Store(p)
	return nil
}
