package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
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
)

var chaosLong = flag.Bool("chaos-long", false,
	"TestChaos at the size of issue 39's trials: 20 sessions of 150 calls, a kill every 300 ms (make soak)")

// chaosPlan is the size of a TestChaos trial.
type chaosPlan struct {
	sessions, calls int
	every           time.Duration // between kills
	kills           int           // at most (then the calls go on undisturbed)
}

// A bad day for an operator: sessions of the real server over HTTP run calls with known
// answers while random descendants of the server (workers, guardians, the template,
// snapshots, spares) are SIGKILLed. No call may return a wrong value or a transport error;
// a call may fail only as docs/isolated.md says a kill makes it fail (rolled back to before
// the run, its variables lost, or ErrStartKilled); /healthz answers throughout; a session opened after the
// kills works first time; and nothing of the server outlives it (startServer checks).
func TestChaos(t *testing.T) {
	plan := chaosPlan{sessions: 6, calls: 40, every: 200 * time.Millisecond, kills: 50}
	if *chaosLong {
		plan = chaosPlan{sessions: 20, calls: 150, every: 300 * time.Millisecond, kills: 200}
	}
	s := startServer(t, "-backend", "isolated", "-max-sessions", "100")
	url := s.base + "/mcp"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var ok, rolledBack, lost, startKilled, kills atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < plan.sessions; i++ {
		cs := connectClient(t, &mcp.StreamableClientTransport{Endpoint: url})
		wg.Add(1)
		go func() {
			defer wg.Done()
			// n counts the runs the namespace kept: a run rolled back leaves it as it was, a
			// loss starts it again at 1. The product checks the value of each call.
			want := 1
			for c := 1; c <= plan.calls && ctx.Err() == nil; c++ {
				code := fmt.Sprintf("try:\n    n += 1\nexcept NameError:\n    n = 1\n(n, %d * %d)", c, c)
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: minipy.ToolName, Arguments: map[string]any{"code": code}})
				if !assert.NoError(t, err, "a transport error") {
					return
				}
				text := res.Content[0].(*mcp.TextContent).Text
				switch {
				case !res.IsError:
					ok.Add(1)
					assert.Equal(t, fmt.Sprintf("[value]\n(%d, %d)\n", want, c*c), text, "a wrong value")
					want++
				case strings.Contains(text, "the namespace was rolled back to before this run"):
					rolledBack.Add(1)
				case strings.Contains(text, "the namespace's variables are lost"):
					lost.Add(1)
					want = 1
				case strings.Contains(text, minipy.ErrStartKilled.Error()):
					startKilled.Add(1) // (the loss of its variables comes with the next answer)
				default:
					t.Errorf("a failure of a kind the docs do not name:\n%s", text)
				}
			}
		}()
	}
	sessionsDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(sessionsDone)
	}()

	pid := s.cmd.Process.Pid
	tick := time.NewTicker(plan.every)
	defer tick.Stop()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 39))
	targets := map[string]int{}
killing:
	for {
		select {
		case <-sessionsDone:
			break killing
		case <-ctx.Done():
			t.Fatal("the sessions did not finish in time")
		case <-tick.C:
		}
		if ps := descendantsOf(pid); len(ps) > 0 && kills.Load() < int64(plan.kills) {
			victim := ps[r.IntN(len(ps))]
			targets[role(victim)]++
			if syscall.Kill(victim, syscall.SIGKILL) == nil {
				kills.Add(1)
			}
		}
		assert.Equal(t, http.StatusOK, get(t, s.base+"/healthz"), "/healthz during the kills")
	}
	t.Logf("%d kills (%v); calls: %d answered, %d rolled back, %d lost their variables, %d found every start "+
		"of a worker killed", kills.Load(), targets, ok.Load(), rolledBack.Load(), lost.Load(), startKilled.Load())
	assert.GreaterOrEqual(t, kills.Load(), int64(5), "enough kills to mean something")

	assert.Equal(t, http.StatusOK, get(t, s.base+"/healthz"), "/healthz after the kills")
	fresh := connectClient(t, &mcp.StreamableClientTransport{Endpoint: url})
	text, isError := run(t, fresh, map[string]any{"code": "1 + 1"})
	assert.False(t, isError, "a session opened after the kills works first time: %s", text)
	assert.Equal(t, "[value]\n2\n", text)
	resp, err := http.Get(s.base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(metrics), `minipy_worker_idle_deaths_total{state="kept"}`)
	if t.Failed() {
		t.Logf("the server's log:\n%s", s.log)
	}
}

// get is the status of a GET of url.
func get(t *testing.T, url string) int {
	resp, err := http.Get(url)
	if !assert.NoError(t, err) {
		return 0
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the status matters
	resp.Body.Close()
	return resp.StatusCode
}

// role names what process pid is, for the log: its command's name.
func role(pid int) string {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return "gone"
	}
	return strings.TrimSpace(string(comm))
}
