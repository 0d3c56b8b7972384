package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// chaosPlan is the size of a TestChaos trial: each session makes at least calls calls, and
// goes on calling until minKills kills have been made, however fast the machine answers
// (six sessions once made their 240 calls in 3 s, before the fifth kill).
type chaosPlan struct {
	sessions, calls int
	every           time.Duration // between kills
	minKills        int           // at least (the sessions call on until they are made)
	kills           int           // at most (then the calls go on undisturbed)
}

// A bad day for an operator: sessions of the real server over HTTP run calls with known
// answers while random descendants of the server (workers, guardians, the template,
// snapshots, spares) are SIGKILLed. No call may return a wrong value or a transport error;
// a call may fail only as docs/isolated.md says a kill makes it fail (rolled back to before
// the run, its variables lost, or ErrStartKilled); /healthz answers throughout; a session opened after the
// kills works first time; and nothing of the server outlives it (startServer checks).
func TestChaos(t *testing.T) {
	plan := chaosPlan{sessions: 6, calls: 40, every: 200 * time.Millisecond, minKills: 10, kills: 50}
	if *chaosLong {
		plan = chaosPlan{sessions: 20, calls: 150, every: 300 * time.Millisecond, minKills: 40, kills: 200}
	}
	s := startServer(t, "-backend", "isolated", "-max-sessions", "100")
	url := s.base + "/mcp"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var ok, rolledBack, lost, startKilled, kills atomic.Int64
	var lostSessions atomic.Int64 // sessions that lost their variables at least once
	var wg sync.WaitGroup
	for i := 0; i < plan.sessions; i++ {
		cs := connectClient(t, &mcp.StreamableClientTransport{Endpoint: url})
		wg.Add(1)
		go func() {
			defer wg.Done()
			// n counts the runs the namespace kept: a run rolled back leaves it as it was, a
			// loss starts it again at 1. The product checks the value of each call.
			want, lostOnce := 1, false
			for c := 1; (c <= plan.calls || kills.Load() < int64(plan.minKills)) && ctx.Err() == nil; c++ {
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
					if !lostOnce {
						lostOnce = true
						lostSessions.Add(1)
					}
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
	sandboxes := map[int]uint64{} // the sandboxes' pid 1s seen, with their start times
killing:
	for {
		select {
		case <-sessionsDone:
			break killing
		case <-ctx.Done():
			t.Fatal("the sessions did not finish in time")
		case <-tick.C:
		}
		if ps := sandboxProcesses(pid, sandboxes); len(ps) > 0 && kills.Load() < int64(plan.kills) {
			pids := slices.Sorted(maps.Keys(ps))
			victim := pids[r.IntN(len(pids))]
			if kills.Load()%10 == 9 { // one kill in ten is the template's, if it has one: a random pick rarely finds it
				for _, p := range pids {
					if ps[p] == "template" {
						victim = p
					}
				}
			}
			kind := ps[victim]
			if syscall.Kill(victim, syscall.SIGKILL) == nil {
				kills.Add(1)
				targets[kind]++
			}
		}
		assert.Equal(t, http.StatusOK, get(t, s.base+"/healthz"), "/healthz during the kills")
	}
	t.Logf("%d kills (%v); calls: %d answered, %d rolled back, %d lost their variables (%d of %d sessions), %d "+
		"found every start of a worker killed", kills.Load(), targets, ok.Load(), rolledBack.Load(), lost.Load(),
		lostSessions.Load(), plan.sessions, startKilled.Load())
	assert.GreaterOrEqual(t, kills.Load(), int64(plan.minKills), "enough kills to mean something")
	// No session loses its state to a process that is not its own (issue 47): the template,
	// spares, other sessions' processes may die at any moment. A session loses it when its
	// sandbox's pid 1 dies (the kernel ends a pid namespace with its init), or its worker and
	// its snapshot both do, which random kills make rare (2 at most).
	assert.LessOrEqual(t, lostSessions.Load(), int64(targets["sandbox"]+2),
		"sessions that lost their variables: only to their own sandbox's pid 1, or to two kills at once")

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
	assert.Contains(t, string(metrics), `minipy_process_deaths_total{kind="sandbox"}`)
	if t.Failed() {
		t.Logf("the server's log:\n%s", s.log)
	}
	// Sandboxes whose template was killed are the server's descendants no longer (stop looks
	// for those): they too end with the server.
	s.stop(t)
	orphans := func() []int {
		var left []int
		for pid, start := range sandboxes {
			if startTime(pid) == start && len(alive([]int{pid})) > 0 { // (a zombie has ended)
				left = append(left, pid)
			}
		}
		return left
	}
	assert.Eventually(t, func() bool { return len(orphans()) == 0 }, 10*time.Second, 20*time.Millisecond,
		"sandboxes outlived the server: %v", orphans())
	for _, pid := range orphans() {
		syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // nothing may outlive the test
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

// sandboxProcesses lists the processes the chaos may kill, each with its kind: the server's
// descendants, and the sandboxes they made, wherever they are now: a sandbox outlives its
// template, and its pid 1 then belongs to whatever reaps orphans above the server.
// sandboxes keeps the pid 1s seen (with their start times, so that a reused number is not
// taken for one). One pass over /proc.
func sandboxProcesses(server int, sandboxes map[int]uint64) map[int]string {
	type proc struct {
		ppid  int
		start uint64
		nspid []string
	}
	procs := map[int]proc{}
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "status"))
		if err != nil {
			continue
		}
		var p proc
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "NSpid:" {
				p.nspid = f[1:]
			} else if len(f) > 1 && f[0] == "PPid:" {
				p.ppid, _ = strconv.Atoi(f[1])
			}
		}
		p.start = startTime(pid)
		procs[pid] = p
		children[p.ppid] = append(children[p.ppid], pid)
	}
	kind := func(pid int) string {
		p := procs[pid]
		switch {
		case len(p.nspid) > 1 && p.nspid[len(p.nspid)-1] == "1":
			return "sandbox"
		case len(p.nspid) > 1:
			return "worker or snapshot"
		case p.ppid == server:
			return "template"
		}
		return "other"
	}
	out := map[int]string{}
	var walk func(int)
	walk = func(pid int) {
		for _, c := range children[pid] {
			if _, ok := out[c]; !ok {
				out[c] = kind(c)
				walk(c)
			}
		}
	}
	walk(server)
	for pid, k := range out {
		if k == "sandbox" {
			sandboxes[pid] = procs[pid].start
		}
	}
	for pid, start := range sandboxes {
		if p, ok := procs[pid]; !ok || p.start != start {
			delete(sandboxes, pid)
			continue
		}
		out[pid] = "sandbox"
		walk(pid)
	}
	return out
}

// startTime is process pid's start time (/proc/PID/stat's 22nd field), 0 if it is gone.
func startTime(pid int) uint64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}
