package minipy_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A local "internet" for the egress tests: nothing leaves this machine. Its servers listen
// on 127.0.0.2 (the address rule refuses loopback; the tests' policies allow that one
// address through AllowNets), names resolve through a test resolver, and the dialer records
// every address it is asked for and dials only loopback: a test fails if a refused address
// ever reaches it.
type internet struct {
	names  map[string][]netip.Addr
	mu     sync.Mutex
	dialed []string
	http   *httptest.Server // plain HTTP, on 127.0.0.2
	https  *httptest.Server // HTTPS, a certificate for every name, from a CA made here
	caDir  string           // holds ca.pem, mounted at /ca
	host   *httptest.Server // "the host's own service", on 127.0.0.1: never reachable
}

var testNet = netip.MustParsePrefix("127.0.0.2/32")

func newInternet(t *testing.T) *internet {
	t.Helper()
	in := &internet{names: map[string][]netip.Addr{}}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s from the internet", r.Method, r.URL.Path)
	})
	listen := func(addr string) net.Listener {
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		return l
	}
	in.http = &httptest.Server{Listener: listen("127.0.0.2:0"), Config: &http.Server{Handler: handler}}
	in.http.Start()
	t.Cleanup(in.http.Close)
	ca, leaf := testCertificates(t, "example.test", "*.example.test")
	in.https = &httptest.Server{Listener: listen("127.0.0.2:0"), Config: &http.Server{Handler: handler},
		TLS: &tls.Config{Certificates: []tls.Certificate{leaf}}}
	in.https.StartTLS()
	t.Cleanup(in.https.Close)
	in.host = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "the host's secret")
	}))
	t.Cleanup(in.host.Close)
	in.caDir = t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(in.caDir, "ca.pem"),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o644))
	require.NoError(t, os.Chmod(in.caDir, 0o755))
	in.names["example.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	in.names["files.example.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	in.names["evil.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	in.names["localhost.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	in.names["metadata.test"] = []netip.Addr{netip.MustParseAddr("169.254.169.254")}
	in.names["intranet.test"] = []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	// IPv6 addresses that carry a refused IPv4 address to it (issue 48's finding 1).
	in.names["nat64.test"] = []netip.Addr{netip.MustParseAddr("64:ff9b::a9fe:a9fe")}
	in.names["siit.test"] = []netip.Addr{netip.MustParseAddr("::ffff:0:a00:1")}
	in.names["compat.test"] = []netip.Addr{netip.MustParseAddr("::7f00:1")}
	in.names["6to4.test"] = []netip.Addr{netip.MustParseAddr("2002:a9fe:a9fe::1")}
	return in
}

// testCertificates makes a CA and a certificate it signs for names.
func testCertificates(t *testing.T, names ...string) (*x509.Certificate, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "minipy test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return ca, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (in *internet) lookup(_ context.Context, host string) ([]netip.Addr, error) {
	if a, ok := in.names[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (in *internet) dial(ctx context.Context, network, address string) (net.Conn, error) {
	in.mu.Lock()
	in.dialed = append(in.dialed, address)
	in.mu.Unlock()
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !ap.Addr().IsLoopback() {
		return nil, fmt.Errorf("the test's dialer dials only loopback, not %s", address)
	}
	return (&net.Dialer{}).DialContext(ctx, network, address)
}

// requireDialedOnly checks that every address dialed is the test internet's.
func (in *internet) requireDialedOnly(t *testing.T) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, a := range in.dialed {
		assert.True(t, strings.HasPrefix(a, "127.0.0.2:"), "a refused address reached the dialer: %s", a)
	}
}

func (in *internet) port(s *httptest.Server) string {
	_, p, _ := net.SplitHostPort(s.Listener.Addr().String())
	return p
}

// engine is an isolated engine whose egress policy allows allow on the test internet.
func (in *internet) engine(t *testing.T, eg minipy.Egress, events chan<- minipy.EgressEvent) *minipy.Isolated {
	eg.Lookup, eg.Dial = in.lookup, in.dial
	eg.AllowNets = append(eg.AllowNets, testNet)
	cfg := minipy.IsolatedConfig{Egress: &eg, Mounts: []minipy.Mount{{Source: in.caDir, Target: "/ca"}},
		Env: []string{"SSL_CERT_FILE=/ca/ca.pem", "PIP_CERT=/ca/ca.pem", "REQUESTS_CA_BUNDLE=/ca/ca.pem"}}
	if events != nil {
		cfg.OnEgress = func(ev minipy.EgressEvent) { events <- ev }
	}
	return newIsolated(t, cfg)
}

func TestEgressAllowsWhatThePolicyAllows(t *testing.T) {
	in := newInternet(t)
	events := make(chan minipy.EgressEvent, 64)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test:" + in.port(in.http),
		"*.example.test:" + in.port(in.https)}}, events)
	ns := e.NewNamespace()
	defer ns.Close()
	// Plain HTTP through urllib, HTTPS through CONNECT (the test's CA), both by name.
	v := valueIn(t, e, ns, fmt.Sprintf(`import urllib.request
a = urllib.request.urlopen("http://example.test:%s/plain").read().decode()
b = urllib.request.urlopen("https://files.example.test:%s/tls").read().decode()
[a, b]`, in.port(in.http), in.port(in.https)))
	assert.Equal(t, []any{"GET /plain from the internet", "GET /tls from the internet"}, v)
	ev := <-events
	assert.True(t, ev.Allowed)
	assert.Equal(t, "example.test", ev.Host)
	assert.Equal(t, "GET", ev.Method)
	assert.Equal(t, netip.MustParseAddr("127.0.0.2"), ev.Addr)
	assert.Positive(t, ev.Received)
	ev = <-events
	assert.True(t, ev.Allowed)
	assert.Equal(t, "CONNECT", ev.Method)
	assert.Equal(t, "files.example.test", ev.Host)
	in.requireDialedOnly(t)
}

func TestEgressRefusesWithALineTheModelReads(t *testing.T) {
	in := newInternet(t)
	events := make(chan minipy.EgressEvent, 64)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test:" + in.port(in.http), "localhost.test:" + in.port(in.host),
		"metadata.test:80", "intranet.test:80", "127.0.0.1:" + in.port(in.host), "169.254.169.254:80", "10.0.0.1:80",
		"nat64.test:80", "siit.test:80", "compat.test:80", "6to4.test:80"},
		Deny: []string{"evil.test:" + in.port(in.http)}}, events)
	ns := e.NewNamespace()
	defer ns.Close()
	// (Straight to the proxy: a client bypasses it for 127.0.0.1, NO_PROXY, and finds nothing there.)
	get := `import http.client
def get(url):
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
    c.request("GET", url)
    r = c.getresponse()
    return r.status, r.read().decode().strip()
`
	valueIn(t, e, ns, get)
	_, hostPort, _ := net.SplitHostPort(in.host.Listener.Addr().String())
	for _, c := range []struct{ url, why string }{
		{"http://unlisted.test/", "(allowed: "},
		{"http://evil.test:" + in.port(in.http) + "/", "(denied; allowed: "},
		{"http://localhost.test:" + hostPort + "/", "127.0.0.1 is a loopback address"},
		{"http://127.0.0.1:" + hostPort + "/", "127.0.0.1 is a loopback address"},
		{"http://metadata.test/", "169.254.169.254 is a link-local address"},
		{"http://169.254.169.254/", "169.254.169.254 is a link-local address"},
		{"http://intranet.test/", "10.0.0.1 is a private address"},
		{"http://10.0.0.1/", "10.0.0.1 is a private address"},
		{"http://nat64.test/", "64:ff9b::a9fe:a9fe carries 169.254.169.254, a link-local address"},
		{"http://siit.test/", "::ffff:0:a00:1 carries 10.0.0.1, a private address"},
		{"http://compat.test/", "::7f00:1 carries 127.0.0.1, a loopback address"},
		{"http://6to4.test/", "2002:a9fe:a9fe::1 carries 169.254.169.254, a link-local address"},
	} {
		v := valueIn(t, e, ns, fmt.Sprintf("get(%q)", c.url)).([]any)
		assert.Equal(t, int64(403), v[0], c.url)
		assert.Contains(t, v[1], "minipy: egress to ", c.url)
		assert.Contains(t, v[1], c.why, c.url)
		ev := <-events
		assert.False(t, ev.Allowed)
		assert.Equal(t, v[1], ev.Refusal)
	}
	in.requireDialedOnly(t)
}

// Past the proxy there is nothing: a raw socket finds no route, and no name resolves.
func TestEgressIsTheOnlyWayOut(t *testing.T) {
	in := newInternet(t)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test"}}, nil)
	v := valueIn(t, e, e.NewNamespace(), fmt.Sprintf(`import socket, errno
out = []
for addr in [("127.0.0.2", %s), ("%s", %s), ("1.1.1.1", 53)]:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(addr)
        out.append("connected")
    except OSError as e:
        out.append(errno.errorcode.get(e.errno, str(e)))
    finally:
        s.close()
out`, in.port(in.http), "127.0.0.1", strings.TrimPrefix(in.host.Listener.Addr().String(), "127.0.0.1:"))).([]any)
	for _, got := range v {
		assert.NotEqual(t, "connected", got)
	}
}

// The usual clients take the proxy from the environment: requests, curl and wget (HTTPS
// with the test's CA), in a worker forked from the template and in one started on its own.
func TestEgressUsualClients(t *testing.T) {
	in := newInternet(t)
	for _, noTemplate := range []bool{false, true} {
		eg := minipy.Egress{Allow: []string{"*.example.test:" + in.port(in.https)}, Lookup: in.lookup, Dial: in.dial,
			AllowNets: []netip.Prefix{testNet}}
		e := newIsolated(t, minipy.IsolatedConfig{Egress: &eg, NoTemplate: noTemplate,
			Mounts: []minipy.Mount{{Source: in.caDir, Target: "/ca"}},
			Env:    []string{"SSL_CERT_FILE=/ca/ca.pem", "REQUESTS_CA_BUNDLE=/ca/ca.pem", "CURL_CA_BUNDLE=/ca/ca.pem"}})
		url := "https://files.example.test:" + in.port(in.https)
		// (requests where the worker's Python has it: the system's does, .ci/deps installs
		// it; a CPython built for make compat does not.)
		v := valueIn(t, e, e.NewNamespace(), fmt.Sprintf(`import importlib.util, subprocess
[importlib.util.find_spec("requests") and __import__("requests").get(%[1]q + "/requests").text,
 subprocess.run(["curl", "-sS", %[1]q + "/curl"], capture_output=True, text=True).stdout,
 subprocess.run(["wget", "-qO-", "--ca-certificate=/ca/ca.pem", %[1]q + "/wget"], capture_output=True, text=True).stdout]`, url)).([]any)
		if v[0] != nil || minipy.LinkedPython() == "/usr/bin/python3."+strings.TrimPrefix(minipy.LinkedVersion(), "3.") {
			assert.Equal(t, "GET /requests from the internet", v[0], "NoTemplate %v", noTemplate)
		}
		assert.Equal(t, []any{"GET /curl from the internet", "GET /wget from the internet"}, v[1:], "NoTemplate %v", noTemplate)
	}
	in.requireDialedOnly(t)
}

// A name that resolves first to an allowed address, then to a private one: the proxy
// dials the address it judged, every time.
func TestEgressDNSRebinding(t *testing.T) {
	in := newInternet(t)
	var mu sync.Mutex
	answers := 0
	eg := minipy.Egress{Allow: []string{"rebind.test:" + in.port(in.http)}, Dial: in.dial, AllowNets: []netip.Prefix{testNet},
		Lookup: func(_ context.Context, host string) ([]netip.Addr, error) {
			mu.Lock()
			defer mu.Unlock()
			answers++
			if answers == 1 {
				return []netip.Addr{netip.MustParseAddr("127.0.0.2")}, nil
			}
			return []netip.Addr{netip.MustParseAddr("10.0.0.1")}, nil
		}}
	e := newIsolated(t, minipy.IsolatedConfig{Egress: &eg})
	v := valueIn(t, e, e.NewNamespace(), fmt.Sprintf(`import urllib.request, urllib.error
out = []
for i in range(2):
    try:
        out.append(urllib.request.urlopen("http://rebind.test:%s/").read().decode())
    except urllib.error.HTTPError as e:
        out.append(e.read().decode().strip())
out`, in.port(in.http))).([]any)
	assert.Equal(t, "GET / from the internet", v[0])
	assert.Contains(t, v[1], "10.0.0.1 is a private address")
	in.requireDialedOnly(t)
}

// Methods limits plain HTTP; the byte cap cuts a run's transfers and resets with the next
// run; the connection cap refuses what is past it.
func TestEgressCaps(t *testing.T) {
	in := newInternet(t)
	big := strings.Repeat("x", 300<<10)
	release := make(chan struct{})
	var slow atomic.Int32 // the /slow requests that reached the server
	in.http.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			fmt.Fprint(w, big)
			return
		}
		if r.URL.Path == "/slow" {
			slow.Add(1)
			select { // (held until the third was refused, or the test ended)
			case <-release:
			case <-time.After(time.Minute):
			}
		}
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
	})
	events := make(chan minipy.EgressEvent, 64)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test:" + in.port(in.http)}, Methods: []string{"GET", "HEAD"},
		MaxBytes: 500 << 10, MaxConnections: 2}, events)
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, fmt.Sprintf(`import http.client
import time
def fetch_once(method, path):
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=20)
    try:
        c.request(method, "http://example.test:%s" + path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()
def fetch(method, path):  # (past a connection of before that the proxy has not seen close yet)
    for _ in range(500):
        status, body = fetch_once(method, path)
        if status != 429 or b"MaxConnections" not in body:
            return status, len(body)
        time.sleep(0.01)
`, in.port(in.http)))
	v := valueIn(t, e, ns, `[fetch("GET", "/ok"), fetch("POST", "/no")]`).([]any)
	assert.Equal(t, []any{int64(200), int64(7)}, v[0]) // "GET /ok"
	assert.Equal(t, int64(403), v[1].([]any)[0], "POST is not in Methods")

	// 300 KiB, then 300 more: past the 500 KiB of a run, the second is cut, the third refused.
	v = valueIn(t, e, ns, `out = []
for i in range(3):
    try:
        out.append(fetch("GET", "/big"))
    except Exception as e:
        out.append(type(e).__name__)
out`).([]any)
	assert.Equal(t, []any{int64(200), int64(300 << 10)}, v[0])
	assert.NotEqual(t, []any{int64(200), int64(300 << 10)}, v[1], "cut")
	assert.Equal(t, int64(429), v[2].([]any)[0])
	assert.Equal(t, []any{int64(200), int64(300 << 10)}, valueIn(t, e, ns, `fetch("GET", "/big")`), "a new run, a new count")

	// Two slow requests hold the two connections; a third gets 429 at once. The code sends
	// the third once the two have reached the server (the test says so with a file "go"),
	// and the two are released once the proxy has refused it (its event), whatever a
	// loaded machine's pace. (The proxy accepts one connection after another, each refusal's
	// event sent before the next: once the two are in, the refusals before them are in the
	// channel, and drained.)
	refused := make(chan string, 1)
	go func() {
		defer close(release)
		for end := time.Now().Add(time.Minute); slow.Load() < 2 && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		for len(events) > 0 {
			<-events
		}
		assert.NoError(t, os.WriteFile(filepath.Join(ns.WorkDir(), "go"), nil, 0o644))
		for {
			select {
			case ev := <-events:
				if strings.Contains(ev.Refusal, "MaxConnections") {
					refused <- ev.Refusal
					return
				}
			case <-time.After(time.Minute):
				refused <- "no refusal"
				return
			}
		}
	}()
	v = valueIn(t, e, ns, `import os, threading, time
held = []
def hold():
    held.append(fetch("GET", "/slow"))
ts = [threading.Thread(target=hold) for _ in range(2)]
for t in ts: t.start()
for _ in range(6000):
    if os.path.exists("go"):
        break
    time.sleep(0.01)
third = fetch_once("GET", "/ok")
for t in ts: t.join()
[third[0], sorted(held)]`).([]any)
	assert.Equal(t, int64(429), v[0])
	assert.Equal(t, []any{[]any{int64(200), int64(9)}, []any{int64(200), int64(9)}}, v[1], "both held to the end")
	assert.Contains(t, <-refused, "2 connections are open")
	in.requireDialedOnly(t)
}

// Issue 48, finding 3: MaxBytes counts every byte between the code and the proxy, headers
// too: with 256 KiB a run, 4.7 MiB of request headers went through (bodies were all it
// counted). Requests of ~60 KiB of headers each now get 429 once the run has moved its cap.
func TestEgressMaxBytesCountsHeaders(t *testing.T) {
	in := newInternet(t)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test:" + in.port(in.http)}, MaxBytes: 256 << 10}, nil)
	ns := e.NewNamespace()
	defer ns.Close()
	v := valueIn(t, e, ns, fmt.Sprintf(`import http.client
codes = []
for i in range(80):
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=20)
    try:
        c.request("GET", "http://example.test:%s/ok", headers={"X-Pad-%%d" %% j: "x" * 7000 for j in range(8)})
        codes.append(c.getresponse().status)
    except Exception as e:
        codes.append(type(e).__name__)
    c.close()
[codes.count(200), codes.count(429), len(codes)]`, in.port(in.http))).([]any)
	t.Logf("200s, 429s, requests: %v", v)
	assert.LessOrEqual(t, v[0], int64(6), "about 256 KiB of ~56 KiB headers went through, no more")
	assert.GreaterOrEqual(t, v[1], int64(70), "then refused, saying why")
}

// Issue 48, finding 4: after SetEgress stopped allowing a name, a request on a new
// connection of the code's still got 200 for 30 s, through an upstream connection pooled
// under the old policy. Every request is judged by the policy of its time, and no pooled
// connection outlives a change of policy.
func TestEgressPolicyChangeReachesPooledConnections(t *testing.T) {
	in := newInternet(t)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test:" + in.port(in.http)}}, nil)
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, fmt.Sprintf(`import http.client
def get():
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=20)
    c.request("GET", "http://example.test:%s/ok")
    r = c.getresponse()
    out = r.status, r.read().decode().strip()
    c.close()
    return out
`, in.port(in.http)))
	assert.Equal(t, int64(200), valueIn(t, e, ns, "get()").([]any)[0])
	before := upstreamConns(t, in)
	assert.Equal(t, 1, before, "one upstream connection pooled")
	require.NoError(t, e.SetEgress(minipy.Egress{Allow: []string{"files.example.test:" + in.port(in.http)},
		Lookup: in.lookup, Dial: in.dial, AllowNets: []netip.Prefix{testNet}}))
	v := valueIn(t, e, ns, "get()").([]any)
	assert.Equal(t, int64(403), v[0], "refused at once: %v", v)
	assert.Contains(t, v[1], "minipy: egress to example.test")
	assert.Eventually(t, func() bool { return upstreamConns(t, in) == 0 }, 5*time.Second, 20*time.Millisecond,
		"the pooled connection closed")
}

// Issue 48, finding 2: 400 requests to distinct allowed names, each on a connection the code
// closed, left the host holding 400 upstream connections until Close. A sandbox's pool is
// bounded (egressIdleConns).
func TestEgressBoundsUpstreamConnections(t *testing.T) {
	in := newInternet(t)
	for i := range 100 {
		in.names[fmt.Sprintf("n%d.example.test", i)] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	}
	e := in.engine(t, minipy.Egress{Allow: []string{"*.example.test:" + in.port(in.http)}}, nil)
	ns := e.NewNamespace()
	defer ns.Close()
	assert.Equal(t, int64(100), valueIn(t, e, ns, fmt.Sprintf(`import http.client
ok = 0
for i in range(100):
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=20)
    c.request("GET", "http://n%%d.example.test:%s/ok" %% i)
    ok += c.getresponse().status == 200
    c.close()
ok`, in.port(in.http))))
	// (A connection the pool let go is closed as the next one is pooled: on a loaded machine
	// its close may not have been seen yet when the runs end, so the bound is what it holds
	// once they have.)
	assert.Eventually(t, func() bool { return upstreamConns(t, in) <= 4 }, 10*time.Second, 20*time.Millisecond,
		"the pool's bound: %d upstream connections held", upstreamConns(t, in))
}

// upstreamConns counts the established TCP connections to in's HTTP server, from its side
// (the host's network namespace: the proxies' upstream connections).
func upstreamConns(t *testing.T, in *internet) int {
	t.Helper()
	_, port, err := net.SplitHostPort(in.http.Listener.Addr().String())
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	local := fmt.Sprintf("0200007F:%04X", p) // 127.0.0.2, as /proc/net/tcp writes it
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 3 && f[1] == local && f[3] == "01" {
			n++
		}
	}
	return n
}

// The proxy belongs to the sandbox: a rollback keeps it, a Fork copy shares it, and the
// engine counts what went through.
func TestEgressSurvivesRollbackAndFork(t *testing.T) {
	in := newInternet(t)
	e := in.engine(t, minipy.Egress{Allow: []string{"example.test:" + in.port(in.http)}}, nil)
	ns := e.NewNamespace()
	defer ns.Close()
	get := fmt.Sprintf(`urllib.request.urlopen("http://example.test:%s/x").read().decode()`, in.port(in.http))
	assert.Equal(t, "GET /x from the internet", valueIn(t, e, ns, "import urllib.request\n"+get))
	_, err := runIn(t, e, ns, "import os; os._exit(3)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	require.True(t, lost.RolledBack)
	assert.Equal(t, "GET /x from the internet", valueIn(t, e, ns, get), "after a rollback")
	b, err := ns.Fork()
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, "GET /x from the internet", valueIn(t, e, b, get), "in a Fork copy")
	st := e.Stats()
	assert.Equal(t, int64(3), st.EgressAllowed)
	assert.Zero(t, st.EgressRefused)
	assert.Positive(t, st.EgressBytes)
}

func TestEgressConfigErrors(t *testing.T) {
	for _, cfg := range []minipy.IsolatedConfig{
		{Egress: &minipy.Egress{}, Network: true},
		{Egress: &minipy.Egress{Allow: []string{"*"}}},
		{Egress: &minipy.Egress{Allow: []string{"a.test:99999"}}},
		{Egress: &minipy.Egress{Allow: []string{"a.*.test"}}},
		{Egress: &minipy.Egress{MaxBytes: -5}},
	} {
		_, err := minipy.NewIsolated(cfg)
		assert.Error(t, err, "%+v", cfg.Egress)
	}
}

// The same as an unprivileged host: the sandbox brings its loopback up and hands over its
// listener with the capabilities of its own user namespace alone.
func TestEgressAsUser(t *testing.T) {
	out := rerunAsNobody(t, "^(TestEgressAllowsWhatThePolicyAllows|TestEgressUsualClients)$")
	assert.Contains(t, out, "--- PASS: TestEgressUsualClients")
}

// testWheel is a pure-Python wheel of minipytest-pkg 1.0 (import minipytest_pkg; VALUE is
// 42), as a build backend would write it.
func testWheel(t *testing.T) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{"minipytest_pkg/__init__.py", "VALUE = 42\n"},
		{"minipytest_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: minipytest-pkg\nVersion: 1.0\n"},
		{"minipytest_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: minipy-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := z.Create(f.name)
		require.NoError(t, err)
		_, err = io.WriteString(w, f.body)
		require.NoError(t, err)
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("minipytest_pkg-1.0.dist-info/RECORD,,\n")
	w, err := z.Create("minipytest_pkg-1.0.dist-info/RECORD")
	require.NoError(t, err)
	_, err = io.WriteString(w, record.String())
	require.NoError(t, err)
	require.NoError(t, z.Close())
	return buf.Bytes()
}

// servePackageIndex makes the test internet's HTTPS server a PEP 503 simple index holding
// the test wheel, and returns the index's URL.
func (in *internet) servePackageIndex(t *testing.T) string {
	wheel := testWheel(t)
	sum := sha256.Sum256(wheel)
	const file = "minipytest_pkg-1.0-py3-none-any.whl"
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/minipytest-pkg/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s#sha256=%x">%s</a></body></html>`, file, sum, file)
	})
	mux.HandleFunc("/files/"+file, func(w http.ResponseWriter, r *http.Request) { w.Write(wheel) }) //nolint:errcheck
	in.https.Config.Handler = mux
	return "https://files.example.test:" + in.port(in.https) + "/simple"
}

// %pip install through the egress proxy, from a package index, into the namespace's own
// site in its working directory: importable in the next run, kept by a rollback, carried by
// Fork and by Save/Restore.
func TestEgressPipInstall(t *testing.T) {
	if out, err := exec.Command(minipy.LinkedPython(), "-m", "pip", "--version").CombinedOutput(); err != nil {
		// A CPython that make compat built --without-ensurepip: %pip says so (notebook
		// tests); this is tested on the system's Python, which .ci/deps gives pip.
		t.Skipf("the workers' Python %s has no pip: %s", minipy.LinkedPython(), out)
	}
	in := newInternet(t)
	index := in.servePackageIndex(t)
	eg := minipy.Egress{Allow: []string{"files.example.test:" + in.port(in.https)}, Lookup: in.lookup, Dial: in.dial,
		AllowNets: []netip.Prefix{testNet}}
	e := newIsolated(t, minipy.IsolatedConfig{Egress: &eg, Mounts: []minipy.Mount{{Source: in.caDir, Target: "/ca"}},
		Env: []string{"PIP_INDEX_URL=" + index, "PIP_CERT=/ca/ca.pem"}})
	ns := e.NewNamespace()
	defer ns.Close()
	r, err := runIn(t, e, ns, "%pip install minipytest-pkg")
	require.NoError(t, err)
	assert.Contains(t, r.Stdout, "Successfully installed minipytest-pkg-1.0", r.Stdout+r.Stderr)
	assert.Empty(t, r.Files, "the site is a hidden folder of the working directory: %v", r.Files)
	assert.Equal(t, int64(42), valueIn(t, e, ns, "import minipytest_pkg\nminipytest_pkg.VALUE"))
	assert.Equal(t, "/work/.local/lib/python", valueIn(t, e, ns, "minipytest_pkg.__file__[:23]"))

	_, err = runIn(t, e, ns, "import os; os._exit(1)")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost)
	require.True(t, lost.RolledBack)
	assert.Equal(t, int64(42), valueIn(t, e, ns, "import minipytest_pkg\nminipytest_pkg.VALUE"), "after a rollback")

	b, err := ns.Fork()
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, int64(42), valueIn(t, e, b, "import minipytest_pkg\nminipytest_pkg.VALUE"), "in a Fork copy")

	var saved bytes.Buffer
	_, err = ns.Save(&saved)
	require.NoError(t, err)
	fresh := e.NewNamespace()
	defer fresh.Close()
	require.NoError(t, fresh.Restore(&saved))
	assert.Equal(t, int64(42), valueIn(t, e, fresh, "import minipytest_pkg\nminipytest_pkg.VALUE"), "after Save/Restore")

	// pip in a shell line, and the import in the same cell. (The worker's own pip: the
	// pip command on PATH is the system's Python's, another one in a compat run.)
	other := e.NewNamespace()
	defer other.Close()
	assert.Equal(t, int64(42), valueIn(t, e, other, "import sys\n!{sys.executable} -m pip install -q minipytest-pkg\n"+
		"import minipytest_pkg\nminipytest_pkg.VALUE"))
	in.requireDialedOnly(t)
}
