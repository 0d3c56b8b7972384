package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
)

// haproxyRoundRobin balances three E2B replicas in round robin, request by request, with
// no stick table: what a Kubernetes Service without affinity does.
const haproxyRoundRobin = `global
    maxconn 200
defaults
    mode http
    timeout connect 5s
    timeout client 2m
    timeout server 2m
    timeout tunnel 2m
frontend e2b
    bind 127.0.0.1:%d
    default_backend minipy
backend minipy
    balance roundrobin
    server a 127.0.0.1:%d
    server b 127.0.0.1:%d
    server c 127.0.0.1:%d
`

// Past one machine with E2B's API: three replicas share a real Redis behind HAProxy in
// round robin, each advertising its address (-advertise). The unmodified SDKs create
// sandboxes, run code (streams, errors, figures), read and write files, run commands (a
// terminal, background commands), pause, resume, list and kill, every call landing where
// the balancer sends it: each replica forwards what another runs.
func TestE2BRoundRobinReplicas(t *testing.T) {
	r := redistest.Start(t)
	ports := []int{freePort(t), freePort(t), freePort(t)}
	var replicas []*serverProc
	for _, port := range ports {
		addr := "127.0.0.1:" + strconv.Itoa(port)
		replicas = append(replicas, startE2BAt(t, addr, "-state-store", r.URL(), "-advertise", "http://"+addr))
	}
	front := freePort(t)
	startHAProxy(t, fmt.Sprintf(haproxyRoundRobin, front, ports[0], ports[1], ports[2]), front)
	through := &serverProc{base: "http://127.0.0.1:" + strconv.Itoa(front), log: &lockedBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			for i, s := range replicas {
				t.Logf("replica %d:\n%s", i, s.log)
			}
		}
	})
	checkClientScript(t, through)
	checkBaseScript(t, through)
	forwarded := 0
	for _, s := range replicas {
		n := metric(t, s.base, "minipy_e2b_forwarded_total")
		assert.Positive(t, n, "every replica forwarded some of the calls")
		forwarded += n
	}
	t.Logf("forwarded: %d", forwarded)
}

// startE2BAt is startE2B listening at addr.
func startE2BAt(t *testing.T, addr string, args ...string) *serverProc {
	return startE2B(t, append([]string{"-e2b", addr}, args...)...)
}

// metric reads a counter of the server at base's /metrics.
func metric(t *testing.T, base, name string) int {
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^` + name + ` (\d+)`).FindStringSubmatch(string(b))
	require.NotNil(t, m, "%s in:\n%s", name, strings.TrimSpace(string(b)))
	n, _ := strconv.Atoi(m[1])
	return n
}
