package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// kill ends the server with SIGKILL (no drain, no save), and then whatever of its
// processes would outlive it.
func (s *serverProc) kill(t *testing.T) {
	pids := descendantsOf(s.cmd.Process.Pid)
	s.cmd.Process.Signal(syscall.SIGKILL) //nolint:errcheck // may have exited
	<-s.done
	assert.Eventually(t, func() bool { return len(alive(pids)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the sandboxes of a replica killed hard end with it: %v", alive(pids))
	for _, p := range alive(pids) {
		syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck // nothing may outlive the test
	}
	removeCgroupsOf(t, s.cmd.Process.Pid)
}

// Past one machine, with Redis: two replicas behind HAProxy share a real Redis
// (-state-store). Each in turn is killed hard (SIGKILL: no drain, no save at its end) 2 s
// after the session's last call, which -state-idle 1s saved; the session goes on on the
// other replica, once the dead one's lease has expired (-state-lease, 10 s), with its
// variables, functions and files; the dead replica is started again for the next round.
func TestServeRedisReplicasKilled(t *testing.T) {
	r := redistest.Start(t)
	bl := startBalanced(t, "-state-store", r.URL(), "-state-idle", "1s")
	store, err := session.Open(r.URL(), session.StoreOptions{}) // (to see the saves)
	require.NoError(t, err)
	defer store.Close()
	lastCall := time.Now() // (startBalanced's call answered before)
	for round := range 2 {
		// Saved after 1 s idle: the kill comes once the save is in the store, however long
		// a loaded machine takes to make it.
		require.True(t, savedSince(store, bl.cs.ID(), lastCall, 30*time.Second), "round %d: the idle save", round)
		holder, port := &bl.a, bl.pa
		if !holds(bl.a) {
			holder, port = &bl.b, bl.pb
		}
		require.True(t, holds(*holder), "round %d: a replica holds the session", round)
		(*holder).kill(t)
		start := time.Now()
		text, isError := runText(t, bl.cs, map[string]any{"code": fmt.Sprintf(
			"open('log.txt', 'a').write('round %d\\n')\nbump(), open('log.txt').read()", round)})
		lastCall = time.Now()
		require.False(t, isError, "round %d: %s", round, text)
		want := "start\\n"
		for i := range round + 1 {
			want += fmt.Sprintf("round %d\\n", i)
		}
		assert.Equal(t, fmt.Sprintf("[value]\n(%d, '%s')\n", round+2, want), text, "round %d", round)
		assert.Less(t, time.Since(start), 30*time.Second, "within the dead replica's lease, and then some")
		*holder = bl.replica(t, port)
		require.Eventually(t, bl.bothUp, 10*time.Second, 50*time.Millisecond, "haproxy sees the replica again")
	}
}

// holds reports whether s has a session's namespace (minipy_namespaces on its /metrics).
func holds(s *serverProc) bool {
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(body), "\nminipy_namespaces 1\n")
}

// Redis away: the live sessions' calls go on, /readyz stays ready and says why, the
// saves wait and are made once Redis is back, and nothing saved is lost: the replica then
// killed hard, another brings the session back from Redis with the call made while Redis
// was away.
func TestServeRedisAway(t *testing.T) {
	r := redistest.Start(t)
	tokens := tokenFile(t, "alice:"+tokenAlice)
	args := []string{"-backend", "isolated", "-tokens", tokens, "-state-store", r.URL(), "-state-idle", "200ms",
		"-state-lease", "2s"}
	a := startServer(t, args...)
	lb := &switchable{token: tokenAlice}
	lb.send(a)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "minipy-redis-test", Version: "0"}, nil).Connect(
		context.Background(), &mcp.StreamableClientTransport{Endpoint: a.base + "/mcp",
			HTTPClient: &http.Client{Transport: lb}}, legacy)
	require.NoError(t, err)
	defer cs.Close()
	text, isError := runText(t, cs, map[string]any{"code": "x = 1"})
	require.False(t, isError, text)
	rc := r.Client()
	// savedHead is the meta of the session's save in Redis ("": none), which each save
	// changes (its time).
	savedHead := func() string {
		names := rc.SMembers(context.Background(), "minipy:index:.session").Val()
		if len(names) != 1 {
			return ""
		}
		return rc.HGet(context.Background(), "minipy:{"+names[0]+"}:save", "head").Val()
	}
	require.Eventually(t, func() bool { return savedHead() != "" }, 10*time.Second, 20*time.Millisecond,
		"saved in Redis")
	first := savedHead()

	r.Stop()
	text, isError = runText(t, cs, map[string]any{"code": "x = 2\nfruit = 'kiwi'\nx"})
	require.False(t, isError, "a live session's calls go on: %s", text)
	code, body := a.get(t, "/readyz")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "the state store does not answer")
	assert.Contains(t, scrapeText(t, a), "\nminipy_state_store_up 0\n")
	require.Eventually(t, func() bool { return strings.Contains(a.log.String(), "saving a session") }, 10*time.Second,
		20*time.Millisecond, "the save failed")

	r.Start()
	require.Eventually(t, func() bool {
		_, body := a.get(t, "/readyz")
		return body == "ready\n"
	}, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { head := savedHead(); return head != "" && head != first }, 40*time.Second, 100*time.Millisecond, "the save is tried again once Redis is back")
	a.kill(t)

	b := startServer(t, args...)
	lb.send(b)
	text, isError = runText(t, cs, map[string]any{"code": "x, fruit"})
	require.False(t, isError, "%s\nB's log:\n%s", text, b.log)
	assert.Equal(t, "[value]\n(2, 'kiwi')\n", text)
}

// A bad day across replicas: sessions of the legacy revision behind HAProxy make calls
// with known answers (a counter) while the two replicas sharing a real Redis are killed
// hard in turn, at random moments, mid-call or not, and started again. No saved state is
// lost: a counter value that a save had (its session idle past -state-idle, with no kill
// meanwhile) never comes back smaller; a counter never runs ahead of the calls made (no call
// counted twice, no two copies of a session); and every session ends with its calls
// answered.
func TestChaosReplicas(t *testing.T) {
	const sessions, calls, kills = 4, 24, 4
	r := redistest.Start(t)
	bl := startBalanced(t, "-state-store", r.URL(), "-state-idle", "150ms", "-state-lease", "2s")
	store, err := session.Open(r.URL(), session.StoreOptions{}) // (to see the saves)
	require.NoError(t, err)
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var wg, started sync.WaitGroup
	var failed, answered, killed atomic.Int64
	for i := range sessions {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "minipy-chaos-replicas", Version: "0"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", bl.ph)}, legacy)
		require.NoError(t, err)
		t.Cleanup(func() { cs.Close() })
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			defer once.Do(started.Done)
			chaosSession(t, ctx, cs, store, i, calls, kills, &killed, &failed, &answered, func() { once.Do(started.Done) })
		}()
	}
	started.Wait() // each session saved once: before that, a kill loses it whole, as documented
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for turn := 0; ; turn++ {
		select {
		case <-done:
			t.Logf("%d kills; %d calls answered, %d failed and tried again", killed.Load(), answered.Load(), failed.Load())
			assert.Equal(t, int64(kills), killed.Load())
			assert.GreaterOrEqual(t, answered.Load(), int64(sessions*calls))
			return
		case <-ctx.Done():
			t.Fatal("the sessions did not finish in time")
		case <-time.After(time.Duration(1500+rand.IntN(1500)) * time.Millisecond):
		}
		if killed.Load() == kills {
			continue // (the sessions end their calls)
		}
		victim, port := &bl.a, bl.pa
		if turn%2 == 1 {
			victim, port = &bl.b, bl.pb
		}
		killed.Add(1) // (before: a save that a session counts on must have come before it)
		(*victim).kill(t)
		*victim = bl.replica(t, port)
		require.Eventually(t, bl.bothUp, 20*time.Second, 50*time.Millisecond, "haproxy sees the replica again")
	}
}

// chaosSession makes TestChaosReplicas's calls in cs, at least calls of them and until
// kills kills have been made; started is called once its first answer has been saved
// (seen in store).
func chaosSession(t *testing.T, ctx context.Context, cs *mcp.ClientSession, store *session.Store, i, calls, kills int,
	killed, failed, answered *atomic.Int64, started func()) {
	rng := rand.New(rand.NewPCG(uint64(i), 51))
	// last: the counter's last answer; saved: the last answer a save had; tries: the calls
	// made since last (a failed call may have counted, or not).
	last, saved, tries := 0, 0, 0
	isStarted := false
	for done := 0; (done < calls || killed.Load() < int64(kills)) && ctx.Err() == nil; {
		tries++
		before := killed.Load()
		callCtx, cancel := context.WithTimeout(ctx, time.Minute)
		res, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: minipy.ToolName,
			Arguments: map[string]any{"code": "try:\n    c += 1\nexcept NameError:\n    c = 1\nc"}})
		cancel()
		answeredAt := time.Now()
		if err != nil || res.IsError {
			if failed.Add(1) < 40 {
				t.Logf("session %d: %v %v", i, err, res)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		var v int
		if _, err = fmt.Sscanf(res.Content[0].(*mcp.TextContent).Text, "[value]\n%d", &v); !assert.NoError(t, err,
			res.Content[0].(*mcp.TextContent).Text) {
			return
		}
		assert.Greater(t, v, saved, "session %d: a saved value was lost (last %d, saved %d)", i, last, saved)
		assert.LessOrEqual(t, v, last+tries, "session %d: counted ahead of its calls (last %d, tries %d)", i, last, tries)
		last, tries = v, 0
		done++
		answered.Add(1)
		if !isStarted || rng.IntN(3) == 0 {
			// Idle past -state-idle: saved, unless a kill came first (seen in the store).
			if savedSince(store, cs.ID(), answeredAt, 5*time.Second) && killed.Load() == before {
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

// savedSince waits (up to within) for a save of MCP session id made after since.
func savedSince(store *session.Store, id string, since time.Time, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if meta, err := store.Stat(session.KindSession, id); err == nil && meta.Saved.After(since) {
			return true
		}
	}
	return false
}
