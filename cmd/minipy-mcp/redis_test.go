package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
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
}

// Past one machine, with Redis: two replicas behind HAProxy share a real Redis
// (-state-store). Each in turn is killed hard (SIGKILL: no drain, no save at its end) 2 s
// after the session's last call, which -state-idle 1s saved; the session goes on on the
// other replica, once the dead one's lease has expired (-state-lease, 10 s), with its
// variables, functions and files; the dead replica is started again for the next round.
func TestServeRedisReplicasKilled(t *testing.T) {
	r := redistest.Start(t)
	bl := startBalanced(t, "-state-store", r.URL(), "-state-idle", "1s")
	for round := range 2 {
		time.Sleep(2 * time.Second) // saved after 1 s idle
		holder, port := &bl.a, bl.pa
		if !holds(bl.a) {
			holder, port = &bl.b, bl.pb
		}
		require.True(t, holds(*holder), "round %d: a replica holds the session", round)
		(*holder).kill(t)
		start := time.Now()
		text, isError := runText(t, bl.cs, map[string]any{"code": fmt.Sprintf(
			"open('log.txt', 'a').write('round %d\\n')\nbump(), open('log.txt').read()", round)})
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
