package e2b

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// sleepIdle is the tests' Config.SleepIdle: short, so that the tests wait little for a
// sleep (each waits until the sleep has happened, however long that takes).
const sleepIdle = 200 * time.Millisecond

// asleepSoon waits until s has n sandboxes asleep.
func asleepSoon(t *testing.T, s *Server, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return s.Stats().Asleep == n }, time.Minute, 10*time.Millisecond,
		"%d asleep", n)
}

// An idle sandbox sleeps (its processes freed) and stays running for its client; its next
// request wakes it with its variables and files, once however many requests come at once;
// an API call on it but info wakes it first.
func TestSleepAndWake(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		s, base := pauseServer(t, Config{SleepIdle: sleepIdle})
		sleepAndWake(t, s, base)
	})
	t.Run("dir", func(t *testing.T) {
		s, base := storeServer(t, t.TempDir(), Config{SleepIdle: sleepIdle})
		sleepAndWake(t, s, base)
	})
}

func sleepAndWake(t *testing.T, s *Server, base string) {
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{"timeout": 600, "metadata": {"k": "v"}}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	require.Equal(t, "", run(t, base, sb, "x = 41\n_ = open('f.txt', 'w').write('hi')"))
	asleepSoon(t, s, 1)
	st := s.Stats()
	assert.Equal(t, 1, st.Running, "running, for its client")
	assert.Zero(t, st.Paused)
	assert.Equal(t, 1, st.Slept)
	s.mu.Lock()
	live := s.sandboxes[id]
	s.mu.Unlock()
	if s.cfg.Store == nil {
		live.mu.Lock()
		assert.Empty(t, live.contexts, "its namespaces closed")
		live.mu.Unlock()
	} else {
		assert.Len(t, s.cfg.Store.List(session.KindSandbox), 1, "its save is in the store")
	}
	code, info := callAs(t, "ann", "GET", base+"/sandboxes/"+id, "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "running", info["state"])
	assert.Equal(t, map[string]string{id: "running"}, listAs(t, "ann", base))
	assert.Zero(t, s.Stats().Woken, "info and list do not wake it")

	// Requests at once: one wake, each answered.
	var wg sync.WaitGroup
	outs := make([]string, 6)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = run(t, base, sb, "x + 1, open('f.txt').read()")
		}()
	}
	wg.Wait()
	for _, out := range outs {
		assert.Equal(t, "(42, 'hi')", out)
	}
	st = s.Stats()
	assert.Equal(t, 1, st.Woken)
	assert.Positive(t, st.WakeTime)
	assert.Zero(t, st.Asleep)
	if s.cfg.Store != nil {
		assert.Empty(t, s.cfg.Store.List(session.KindSandbox), "out of the store")
	}

	// Asleep again, an API call wakes it (pause: it is paused then, as a running one).
	asleepSoon(t, s, 1)
	code, body := callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/pause", "")
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	assert.Equal(t, 2, s.Stats().Woken)
	assert.Equal(t, map[string]string{id: "paused"}, listAs(t, "ann", base))
	code, sb = callAs(t, "ann", "POST", base+"/v2/sandboxes/"+id+"/connect", `{"timeout": 600}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	assert.Equal(t, "(42, 'hi')", run(t, base, sb, "x + 1, open('f.txt').read()"))
	code, _ = callAs(t, "ann", "DELETE", base+"/sandboxes/"+id, "")
	assert.Equal(t, http.StatusNoContent, code)
}

// A sandbox that would lose something by a sleep stays up: a value its save would skip (a
// thread held in a variable), a command running, a request in progress.
func TestSleepless(t *testing.T) {
	s, base := pauseServer(t, Config{SleepIdle: time.Hour}) // (the test puts them to sleep itself)
	sandboxOf := func() (*sandbox, map[string]any) {
		code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, code, "%v", sb)
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.sandboxes[sb["sandboxID"].(string)], sb
	}
	threaded, sb := sandboxOf()
	require.Equal(t, "", run(t, base, sb,
		"import threading\nev = threading.Event()\nth = threading.Thread(target=ev.wait, daemon=True)\nth.start()"))
	s.sleep(threaded)
	assert.True(t, threaded.running(), "a thread held in a variable: no sleep")
	assert.Equal(t, "True", run(t, base, sb, "th.is_alive()"))
	require.Equal(t, "", run(t, base, sb, "ev.set(); th.join(); del th, ev"))
	s.sleep(threaded)
	assert.False(t, threaded.running(), "nothing unsaved now: asleep")
	assert.Equal(t, "2", run(t, base, sb, "1 + 1"))

	commanded, _ := sandboxOf()
	commanded.cmds.add(1, &command{})
	s.sleep(commanded)
	assert.True(t, commanded.running(), "a command running: no sleep")
	commanded.cmds.remove(1)

	busy, _ := sandboxOf()
	busy.inflight <- struct{}{}
	s.sleep(busy)
	assert.True(t, busy.running(), "a request in progress: no sleep")
	<-busy.inflight
	s.sleep(busy)
	assert.False(t, busy.running())
	assert.Equal(t, 2, s.Stats().Slept)
}

// A sandbox whose time ends asleep is killed, or with autoPause paused; autoResume wakes
// a sandbox its time's end paused at the next request to its ports, and its info says so.
func TestSleepEndsAndAutoResume(t *testing.T) {
	s, base := pauseServer(t, Config{SleepIdle: sleepIdle})
	// endNow ends sandbox id's time now (its timeout, as if it had been that short).
	endNow := func(id string) {
		s.mu.Lock()
		sb := s.sandboxes[id]
		s.mu.Unlock()
		sb.mu.Lock()
		sb.end = time.Now()
		sb.timer.Reset(0)
		sb.mu.Unlock()
	}
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{"timeout": 600}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	killed := sb["sandboxID"].(string)
	code, sb = call(t, "POST", base+"/v2/sandboxes", `{"timeout": 600, "autoPause": true}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	paused := sb["sandboxID"].(string)
	asleepSoon(t, s, 2)
	endNow(killed)
	endNow(paused)
	require.Eventually(t, func() bool {
		code, _ := call(t, "GET", base+"/sandboxes/"+killed, "")
		return code == http.StatusNotFound
	}, time.Minute, 10*time.Millisecond, "killed at its time's end, asleep")
	require.Eventually(t, func() bool {
		_, info := call(t, "GET", base+"/sandboxes/"+paused, "")
		return info["state"] == "paused"
	}, time.Minute, 10*time.Millisecond, "paused at its time's end, asleep")
	assert.True(t, strings.HasPrefix(run(t, base, sb, "1"), "HTTP 502"), "paused without autoResume: not woken")
	assert.Equal(t, 1, s.Stats().Expired)

	code, sb = call(t, "POST", base+"/v2/sandboxes",
		`{"timeout": 600, "autoPause": true, "autoResume": {"enabled": true}}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	_, info := call(t, "GET", base+"/sandboxes/"+id, "")
	assert.Equal(t, map[string]any{"autoResume": true, "onTimeout": "pause"}, info["lifecycle"])
	require.Equal(t, "", run(t, base, sb, "y = 7"))
	endNow(id)
	require.Eventually(t, func() bool {
		_, info := call(t, "GET", base+"/sandboxes/"+id, "")
		return info["state"] == "paused"
	}, time.Minute, 10*time.Millisecond)
	woken := s.Stats().Woken
	assert.Equal(t, "8", run(t, base, sb, "y + 1"), "woken by its traffic")
	assert.Equal(t, woken+1, s.Stats().Woken)
	_, info = call(t, "GET", base+"/sandboxes/"+id, "")
	assert.Equal(t, "running", info["state"])

	for _, body := range []string{`{"autoResume": {"enabled": true}}`,
		`{"autoPause": true, "autoPauseMemory": false, "autoResume": {"enabled": true}}`} {
		code, _ = call(t, "POST", base+"/v2/sandboxes", body)
		assert.Equal(t, http.StatusBadRequest, code, body)
	}
}

// Asleep in a store, a sandbox outlives its server: another server sharing the store lists
// it running and wakes it at its next request, with its variables and files.
func TestSleepOutlivesServer(t *testing.T) {
	t.Run("dir", func(t *testing.T) { sleepOutlivesServer(t, t.TempDir()) })
	t.Run("redis", func(t *testing.T) { sleepOutlivesServer(t, redistest.Start(t).URL()) })
}

func sleepOutlivesServer(t *testing.T, url string) {
	a, baseA := storeServer(t, url, Config{SleepIdle: sleepIdle})
	code, sb := callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{"timeout": 600}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	require.Equal(t, "", run(t, baseA, sb, "x = 41\n_ = open('/tmp/f.txt', 'w').write('hi')"))
	asleepSoon(t, a, 1)
	a.Close()
	b, baseB := storeServer(t, url, Config{SleepIdle: time.Hour})
	assert.Equal(t, map[string]string{id: "running"}, listAs(t, "ann", baseB))
	assert.Equal(t, 1, b.Stats().Asleep)
	req, err := http.NewRequest("GET", baseB+"/health", nil)
	require.NoError(t, err)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "without its token: no wake")
	assert.Zero(t, b.Stats().Woken)
	assert.Equal(t, "(42, 'hi')", run(t, baseB, sb, "x + 1, open('/tmp/f.txt').read()"))
	assert.Equal(t, 1, b.Stats().Woken)
	assert.Empty(t, b.cfg.Store.List(session.KindSandbox))
}

// With the server's cap full, a new sandbox (or a wake) puts the idlest one that loses
// nothing by it to sleep to make room; a user's cap full makes no room from others.
func TestSleepMakesRoom(t *testing.T) {
	gated := func(g *session.Gate) Config {
		return Config{SleepIdle: time.Hour, Full: g.Full, HoldPaused: g.HoldUser,
			Admit: func(user string) (func(), string) {
				if refusal := g.Hold(user); refusal != "" {
					return nil, refusal
				}
				return func() { g.Release(user) }, ""
			}}
	}
	s, base := pauseServer(t, gated(session.NewGate(2, 0)))
	var sbs []map[string]any
	for i := range 3 {
		code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, code, "%v", sb)
		require.Equal(t, "", run(t, base, sb, fmt.Sprintf("x = %d", i)))
		sbs = append(sbs, sb)
	}
	st := s.Stats()
	assert.Equal(t, 1, st.SleptForRoom, "the first slept for the third")
	assert.Equal(t, 1, st.Asleep)
	assert.Equal(t, 3, st.Running)
	assert.Equal(t, "0", run(t, base, sbs[0], "x"), "woken: the second sleeps for it")
	assert.Equal(t, 2, s.Stats().SleptForRoom)
	assert.Equal(t, "1", run(t, base, sbs[1], "x"))
	assert.Equal(t, "2", run(t, base, sbs[2], "x"))

	_, base = pauseServer(t, gated(session.NewGate(0, 2)))
	for range 2 {
		code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, code, "%v", sb)
	}
	code, _ := call(t, "POST", base+"/v2/sandboxes", `{}`)
	assert.Equal(t, http.StatusTooManyRequests, code, "a user's cap: no sleep makes room")
}

// A request to one of an asleep sandbox's own ports wakes it without its token when its
// ports are public (any request reaches them), and only with it when they are private.
func TestWakeByPortNeedsTokenWhenPrivate(t *testing.T) {
	s, base := pauseServer(t, Config{SleepIdle: sleepIdle})
	toPort := func(sb map[string]any, token bool) {
		req, err := http.NewRequest("GET", base+"/", nil)
		require.NoError(t, err)
		req.Header.Set("E2b-Sandbox-Id", sb["sandboxID"].(string))
		req.Header.Set("E2b-Sandbox-Port", "8000")
		if token {
			req.Header.Set("E2B-Traffic-Access-Token", sb["envdAccessToken"].(string))
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	code, private := call(t, "POST", base+"/v2/sandboxes", `{"network": {"allowPublicTraffic": false}}`)
	require.Equal(t, http.StatusCreated, code, "%v", private)
	code, public := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", public)
	asleepSoon(t, s, 2)
	toPort(private, false)
	assert.Zero(t, s.Stats().Woken, "private ports: no token, no wake")
	toPort(public, false)
	assert.Equal(t, 1, s.Stats().Woken, "public ports: any request wakes it")
	toPort(private, true)
	assert.Equal(t, 2, s.Stats().Woken, "private ports: its token wakes it")
}

// A sandbox asleep in the store that two replicas are asked to wake at once wakes once, on
// one of them, and the other forwards its request there (a run, or an API call that wakes
// it): both requests are answered, by the same sandbox. (Before, the replica that lost the
// claim answered 404 or 409; and with a directory store both replicas could take the
// save's lease, and both woke it: two copies of one sandbox, each running one request.)
func TestWakeOnTwoReplicasAtOnce(t *testing.T) {
	t.Run("dir", func(t *testing.T) { wakeOnTwoReplicas(t, t.TempDir()) })
	t.Run("redis", func(t *testing.T) { wakeOnTwoReplicas(t, redistest.Start(t).URL()) })
}

func wakeOnTwoReplicas(t *testing.T, url string) {
	a, baseA, _ := replicaOf(t, url, 0, Config{SleepIdle: sleepIdle})
	b, baseB, _ := replicaOf(t, url, 0, Config{SleepIdle: sleepIdle})
	for i := range 4 {
		code, sb := callAs(t, "ann", "POST", baseA+"/v2/sandboxes", `{"timeout": 600}`)
		require.Equal(t, http.StatusCreated, code, "%v", sb)
		id := sb["sandboxID"].(string)
		require.Equal(t, "", run(t, baseA, sb, fmt.Sprintf("x = %d", i)))
		asleepSoon(t, a, 1)
		got := make([]string, 2)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			got[0] = run(t, baseA, sb, "x += 1; x")
		}()
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				got[1] = run(t, baseB, sb, "x += 1; x")
				return
			}
			code, body := callAs(t, "ann", "POST", baseB+"/sandboxes/"+id+"/timeout", `{"timeout": 600}`)
			got[1] = fmt.Sprint(code, body)
		}()
		wg.Wait()
		if i%2 == 0 {
			assert.ElementsMatch(t, []string{fmt.Sprint(i + 1), fmt.Sprint(i + 2)}, got, "one sandbox, woken once, ran both")
		} else {
			assert.Equal(t, []string{fmt.Sprint(i + 1), "204 map[]"}, got, "woken once: the run and the API call")
			assert.Equal(t, fmt.Sprint(i+1), run(t, baseB, sb, "x"))
		}
		// (The values say one copy ran both: two would each have added 1 to the same x. It
		// may sleep and wake again after them: 200 ms idle.)
		assert.GreaterOrEqual(t, a.Stats().Woken+b.Stats().Woken, i+1)
		code, _ = callAs(t, "ann", "DELETE", baseA+"/sandboxes/"+id, "")
		require.Equal(t, http.StatusNoContent, code)
	}
}
