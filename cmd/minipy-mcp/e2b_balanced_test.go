package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/minipy-go/minipy/internal/testproc"
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
func metric(t testing.TB, base, name string) int {
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\d+)`).FindStringSubmatch(string(b))
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

// haproxyChaos is haproxyChecked for E2B's API, and the same for MCP's endpoint (the
// replicas' -http), in round robin too.
const haproxyChaos = haproxyChecked + `frontend mcp
    bind 127.0.0.1:%d
    default_backend mcp
backend mcp
    balance roundrobin
    option redispatch
    retries 3
    option httpchk
    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    server a 127.0.0.1:%d check inter 200ms fall 1 rise 1
    server b 127.0.0.1:%d check inter 200ms fall 1 rise 1
    server c 127.0.0.1:%d check inter 200ms fall 1 rise 1
`

// Chaos past one machine, E2B's and MCP's clients together: three replicas share Redis
// behind HAProxy in round robin, both fronts (-advertise, -advertise-http, -state-idle
// 150ms, -state-lease 2s), while four sandboxes and two MCP sessions count their calls;
// every 1.5-3 s a replica is killed hard (SIGKILL) and started again at its addresses, or
// a sandbox's pid 1 is killed. A counter's value that a save held (the idle save after the
// call, seen in the store before the kill) never comes back smaller; a counter never runs
// ahead of the calls made (no call counted twice, no two copies of a sandbox or session);
// every sandbox and session ends with its calls answered.
func TestChaosE2BReplicas(t *testing.T) {
	const sandboxes, sessions, calls, kills = 4, 2, 20, 6
	r := redistest.Start(t)
	ports := []int{freePort(t), freePort(t), freePort(t)}
	mcpPorts := []int{freePort(t), freePort(t), freePort(t)}
	tokens := tokenFile(t, "alice:"+aliceKey, "alice:"+tokenAlice) // (E2B's key and MCP's token, one user)
	start := func(i int) *serverProc {
		addr, mcpAddr := "127.0.0.1:"+strconv.Itoa(ports[i]), "127.0.0.1:"+strconv.Itoa(mcpPorts[i])
		return startE2BAt(t, addr, "-state-store", r.URL(), "-advertise", "http://"+addr, "-state-idle", "150ms",
			"-state-lease", "2s", "-http", mcpAddr, "-advertise-http", "http://"+mcpAddr, "-tokens", tokens)
	}
	replicas := []*serverProc{start(0), start(1), start(2)}
	var logs []*lockedBuffer // (every replica's, the killed ones' too)
	for _, s := range replicas {
		logs = append(logs, s.log)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, l := range logs {
				t.Logf("replica log %d:\n%s", i, l)
			}
		}
	})
	front, stats, mcpFront := freePort(t), freePort(t), freePort(t)
	startHAProxy(t, fmt.Sprintf(haproxyChaos, front, ports[0], ports[1], ports[2], stats, mcpFront, mcpPorts[0],
		mcpPorts[1], mcpPorts[2]), front)
	allUp := func() bool {
		up := upServers(stats)
		return up["a"] && up["b"] && up["c"] && up["mcp/a"] && up["mcp/b"] && up["mcp/c"]
	}
	require.Eventually(t, allUp, 10*time.Second, 50*time.Millisecond, "haproxy sees the replicas")
	store, err := session.Open(r.URL(), session.StoreOptions{}) // (to see the saves)
	require.NoError(t, err)
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var wg, started sync.WaitGroup
	var failed, answered, killed atomic.Int64
	markers := make([]string, sandboxes)
	for i := range sandboxes {
		c := &e2bClient{t: t, base: "http://127.0.0.1:" + strconv.Itoa(front), key: aliceKey}
		sb := c.create(map[string]any{"timeout": 600})
		markers[i] = fmt.Sprintf("chaos-%d-%d", i, time.Now().UnixNano())
		c.execute(sb, "open('/tmp/"+markers[i]+"', 'w').close()")
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			defer once.Do(started.Done)
			chaosSandbox(t, ctx, c, sb, store, i, calls, kills, &killed, &failed, &answered, func() { once.Do(started.Done) })
		}()
	}
	for i := range sessions {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "minipy-chaos-e2b", Version: "0"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", mcpFront),
				HTTPClient: &http.Client{Transport: bearer{token: tokenAlice}}}, legacy)
		require.NoError(t, err)
		t.Cleanup(func() { cs.Close() })
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			defer once.Do(started.Done)
			chaosSession(t, ctx, cs, store, sandboxes+i, calls, kills, &killed, &failed, &answered, func() { once.Do(started.Done) })
		}()
	}
	started.Wait() // each saved once: before that, a kill loses it whole, as documented
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for turn := 0; ; turn++ {
		select {
		case <-done:
			t.Logf("%d kills; %d calls answered, %d failed and tried again", killed.Load(), answered.Load(), failed.Load())
			assert.Equal(t, int64(kills), killed.Load())
			assert.GreaterOrEqual(t, answered.Load(), int64((sandboxes+sessions)*calls))
			return
		case <-ctx.Done():
			t.Fatal("the sandboxes did not finish in time")
		case <-time.After(time.Duration(1500+rand.IntN(1500)) * time.Millisecond):
		}
		if killed.Load() == kills {
			continue // (the sandboxes end their calls)
		}
		killed.Add(1)    // (before: a save that a sandbox counts on must have come before it)
		if turn%3 == 2 { // a sandbox's pid 1
			if pid := testproc.SandboxPidOne(markers[rand.IntN(sandboxes)]); pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // (it may have gone with its replica)
			}
			continue
		}
		i := rand.IntN(len(replicas))
		replicas[i].kill(t)
		replicas[i] = start(i)
		logs = append(logs, replicas[i].log)
		require.Eventually(t, allUp, 20*time.Second, 50*time.Millisecond, "haproxy sees the replica again")
	}
}

// chaosSandbox makes TestChaosE2BReplicas's calls in sandbox sb, at least calls of them and
// until kills kills have been made; started is called once its first answer has been saved
// (seen in the store).
func chaosSandbox(t *testing.T, ctx context.Context, c *e2bClient, sb e2bSandbox, store *session.Store, i, calls,
	kills int, killed, failed, answered *atomic.Int64, started func()) {
	rng := rand.New(rand.NewPCG(uint64(i), 69))
	last, saved, tries := 0, 0, 0 // (as chaosSession's)
	isStarted := false
	for done := 0; (done < calls || killed.Load() < int64(kills)) && ctx.Err() == nil; {
		tries++
		before := killed.Load()
		v, why := countCall(c, sb)
		answeredAt := time.Now()
		if why != "" {
			if failed.Add(1) < 40 {
				t.Logf("sandbox %d: a call failed: %s", i, why)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		assert.Greater(t, v, saved, "sandbox %d: a saved value was lost (last %d, saved %d)", i, last, saved)
		assert.LessOrEqual(t, v, last+tries, "sandbox %d: counted ahead of its calls (last %d, tries %d)", i, last, tries)
		last, tries = v, 0
		done++
		answered.Add(1)
		if !isStarted || rng.IntN(3) == 0 {
			if sandboxSavedSince(store, sb.SandboxID, answeredAt, 5*time.Second) && killed.Load() == before {
				saved = v
				if !isStarted {
					isStarted = true
					started()
				}
			}
		} else {
			time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		}
	}
}

// countCall runs the chaos tests' counter in sb and returns its value, or why the call
// failed (an error, or no value).
func countCall(c *e2bClient, sb e2bSandbox) (int, string) {
	body, _ := json.Marshal(map[string]any{"code": "try:\n    c += 1\nexcept NameError:\n    c = 1\nc"})
	req := c.sandboxRequest(sb, sb.EnvdAccessToken, 49999, "POST", "/execute", bytes.NewReader(body))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Sprintf("%s %v %.300s", resp.Status, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["type"] == "result" {
			if text, ok := m["text"].(string); ok {
				if v, err := strconv.Atoi(text); err == nil {
					return v, ""
				}
			}
		}
	}
	return 0, fmt.Sprintf("no value: %.300s", out)
}

// sandboxSavedSince waits (up to within) for an idle save of sandbox id made after since.
func sandboxSavedSince(store *session.Store, id string, since time.Time, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if meta, err := store.Stat(session.KindRunning, id); err == nil && meta.Saved.After(since) {
			return true
		}
	}
	return false
}
