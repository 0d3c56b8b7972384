package main

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
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

// haproxyChecked is haproxyRoundRobin with health checks: a replica that died is taken
// out once its check fails, and a request it refused goes to another (redispatch).
const haproxyChecked = `global
    maxconn 200
defaults
    mode http
    timeout connect 5s
    timeout client 2m
    timeout server 2m
    option redispatch
    retries 3
frontend e2b
    bind 127.0.0.1:%d
    default_backend minipy
backend minipy
    balance roundrobin
    option httpchk
    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    server a 127.0.0.1:%d check inter 200ms fall 1 rise 1
    server b 127.0.0.1:%d check inter 200ms fall 1 rise 1
    server c 127.0.0.1:%d check inter 200ms fall 1 rise 1
listen stats
    bind 127.0.0.1:%d
    stats enable
    stats uri /stats
`

// A replica's hard death costs at most the last idle moment: three replicas share Redis
// behind HAProxy in round robin (-state-idle 1s, -state-lease 2s). A sandbox's replica is
// killed (SIGKILL) 2 s after its last call, and then the next one's: each time the sandbox
// goes on on a replica left, with its variables and files, under the same id and access
// token, the client's call waiting for the dead replica's lease to expire.
func TestE2BReplicasKilledInTurn(t *testing.T) {
	r := redistest.Start(t)
	ports := []int{freePort(t), freePort(t), freePort(t)}
	var replicas []*serverProc
	for _, port := range ports {
		addr := "127.0.0.1:" + strconv.Itoa(port)
		replicas = append(replicas, startE2BAt(t, addr, "-state-store", r.URL(), "-advertise", "http://"+addr,
			"-state-idle", "1s", "-state-lease", "2s"))
	}
	front, stats := freePort(t), freePort(t)
	startHAProxy(t, fmt.Sprintf(haproxyChecked, front, ports[0], ports[1], ports[2], stats), front)
	require.Eventually(t, func() bool { up := upServers(stats); return up["a"] && up["b"] && up["c"] },
		10*time.Second, 50*time.Millisecond, "haproxy sees the replicas")
	t.Cleanup(func() {
		if t.Failed() {
			for i, s := range replicas {
				t.Logf("replica %d:\n%s", i, s.log)
			}
		}
	})
	store, err := session.Open(r.URL(), session.StoreOptions{}) // (to see the saves)
	require.NoError(t, err)
	defer store.Close()
	c := &e2bClient{t: t, base: "http://127.0.0.1:" + strconv.Itoa(front), key: aliceKey}
	sb := c.create(map[string]any{"timeout": 600})
	c.execute(sb, "n = 1\n_ = open('log.txt', 'w').write('start\\n')")
	lastCall := time.Now()
	alive := map[int]bool{0: true, 1: true, 2: true}
	for round := range 2 {
		// Saved after 1 s idle: the kill comes 2 s after the last call, and once the save is
		// in the store, however long a loaded machine takes to make it.
		require.Eventually(t, func() bool {
			meta, err := store.Stat(session.KindRunning, sb.SandboxID)
			return err == nil && meta.Saved.After(lastCall) && time.Since(lastCall) > 2*time.Second
		}, 30*time.Second, 50*time.Millisecond, "round %d: the idle save", round)
		holder := -1
		for i := range alive {
			if metric(t, replicas[i].base, "minipy_e2b_sandboxes") == 1 {
				holder = i
			}
		}
		require.GreaterOrEqual(t, holder, 0, "round %d: a replica runs the sandbox", round)
		replicas[holder].kill(t)
		delete(alive, holder)
		start := time.Now()
		msgs := c.execute(sb, fmt.Sprintf("n += 1\n_ = open('log.txt', 'a').write('round %d\\n')\nn, open('log.txt').read()", round))
		lastCall = time.Now()
		want := "start\\n"
		for i := range round + 1 {
			want += fmt.Sprintf("round %d\\n", i)
		}
		assert.Contains(t, fmt.Sprint(msgs), fmt.Sprintf("(%d, '%s')", round+2, want), "round %d", round)
		assert.Less(t, time.Since(start), 30*time.Second, "round %d: within the dead replica's lease, and then some", round)
	}
	recovered := 0
	for i := range alive {
		recovered += metric(t, replicas[i].base, "minipy_e2b_sandboxes_recovered_total")
	}
	assert.GreaterOrEqual(t, recovered, 1, "brought back on the replica left")
	code, _ := c.api("DELETE", "/sandboxes/"+sb.SandboxID, nil)
	assert.Equal(t, http.StatusNoContent, code)
}
