package e2b

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// gateServer serves sandboxes under g's caps, as minipy-mcp does.
func gateServer(t *testing.T, g *session.Gate, cfg Config) (*Server, string) {
	cfg.Authenticate = func(key string) (string, bool) { return key, key != "" }
	cfg.Admit = func(user string) (func(), string) {
		if refusal := g.Hold(user); refusal != "" {
			return nil, refusal
		}
		return func() { g.Release(user) }, ""
	}
	cfg.HoldPaused = g.HoldUser
	return pauseServer(t, cfg)
}

// onPort calls a port of sandbox id (with its token) with body: the status, and the
// answer's JSON object, if it is one.
func onPort(t *testing.T, base, id, token string, port, method, path, body string) (int, map[string]any) {
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	req.Header.Set("X-Access-Token", token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m) //nolint:errcheck // not every answer is an object
	return resp.StatusCode, m
}

// A paused sandbox holds a place under its user's cap: a user capped at 3 once held 5,
// pausing each before making the next. Resuming takes the contexts' places back, and a
// kill gives every place back.
func TestPausedSandboxesCount(t *testing.T) {
	g := session.NewGate(0, 3)
	_, base := gateServer(t, g, Config{})
	var ids []string
	for range 3 {
		code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, code, "%v", sb)
		ids = append(ids, sb["sandboxID"].(string))
		code, body := callAs(t, "ann", "POST", base+"/sandboxes/"+ids[len(ids)-1]+"/pause", "")
		require.Equal(t, http.StatusNoContent, code, "%v", body)
	}
	code, body := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	assert.Equal(t, http.StatusTooManyRequests, code, "a fourth beside three paused: %v", body)
	assert.Equal(t, 3, g.Held("ann"))
	open, _ := g.State()
	assert.Zero(t, open, "paused sandboxes hold no session of the server's")
	code, body = callAs(t, "ann", "POST", base+"/v2/sandboxes/"+ids[0]+"/connect", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", body)
	assert.Equal(t, 3, g.Held("ann"), "resumed: its context's place for its paused one")
	for _, id := range ids {
		code, body := callAs(t, "ann", "DELETE", base+"/sandboxes/"+id, "")
		require.Equal(t, http.StatusNoContent, code, "%v", body)
	}
	assert.Zero(t, g.Held("ann"))
	code, _ = callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	assert.Equal(t, http.StatusCreated, code)
}

// One user's paused sandboxes hold at most their share of the paused bytes (a quarter by
// default): another user's pause still fits.
func TestPausedBytesShared(t *testing.T) {
	g := session.NewGate(0, 0)
	_, base := gateServer(t, g, Config{MaxPausedBytes: 64 << 10, MaxPausedBytesPerUser: 32 << 10})
	pause := func(user, code string) int {
		status, sb := callAs(t, user, "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, status, "%v", sb)
		require.Equal(t, "", run(t, base, sb, code))
		status, _ = callAs(t, user, "POST", base+"/sandboxes/"+sb["sandboxID"].(string)+"/pause", "")
		return status
	}
	assert.Equal(t, http.StatusNoContent, pause("ann", "x = 'a' * 20000"))
	assert.Equal(t, http.StatusInsufficientStorage, pause("ann", "x = 'b' * 20000"), "past ann's share")
	assert.Equal(t, http.StatusNoContent, pause("bob", "x = 'c' * 20000"), "bob's pause fits")
}

// Create, pause, resume, kill, new contexts and restarts, raced on a user's sandboxes:
// once every sandbox is killed, every place is back (a context made while its sandbox
// paused once kept its place for good).
func TestPlacesRaced(t *testing.T) {
	g := session.NewGate(0, 6)
	_, base := gateServer(t, g, Config{})
	type box struct{ id, token string }
	var mu sync.Mutex
	var boxes []box
	create := func() {
		code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
		if code == http.StatusCreated {
			mu.Lock()
			boxes = append(boxes, box{sb["sandboxID"].(string), sb["envdAccessToken"].(string)})
			mu.Unlock()
		}
	}
	for range 3 {
		create()
	}
	pick := func(r *rand.Rand) (box, bool) {
		mu.Lock()
		defer mu.Unlock()
		if len(boxes) == 0 {
			return box{}, false
		}
		return boxes[r.IntN(len(boxes))], true
	}
	var wg sync.WaitGroup
	var statuses sync.Map // "op status" -> *atomic.Int64: the race ran each path
	count := func(op string, code int) {
		n, _ := statuses.LoadOrStore(fmt.Sprintf("%s %d", op, code), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 66))
			for range 40 {
				b, ok := pick(r)
				if !ok {
					create()
					continue
				}
				switch r.IntN(5) {
				case 0:
					code, _ := callAs(t, "ann", "POST", base+"/sandboxes/"+b.id+"/pause", "")
					count("pause", code)
				case 1:
					code, _ := callAs(t, "ann", "POST", base+"/v2/sandboxes/"+b.id+"/connect", `{}`)
					count("resume", code)
				case 2, 3:
					code, cc := onPort(t, base, b.id, b.token, "49999", "POST", "/contexts", `{}`)
					count("context", code)
					if id, ok := cc["id"].(string); ok && r.IntN(2) == 0 {
						code, _ = onPort(t, base, b.id, b.token, "49999", "POST", "/contexts/"+id+"/restart", ``)
						count("restart", code)
					}
				case 4:
					code, _ := callAs(t, "ann", "DELETE", base+"/sandboxes/"+b.id, "")
					count("kill", code)
					mu.Lock()
					boxes = slices.DeleteFunc(boxes, func(o box) bool { return o == b })
					mu.Unlock()
					create()
				}
			}
		}()
	}
	wg.Wait()
	var ran []string
	statuses.Range(func(k, v any) bool {
		ran = append(ran, fmt.Sprintf("%s: %d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(ran)
	t.Logf("the race's calls by status: %v", ran)
	for id := range listAs(t, "ann", base) {
		code, body := callAs(t, "ann", "DELETE", base+"/sandboxes/"+id, "")
		require.Equal(t, http.StatusNoContent, code, "%v", body)
	}
	assert.Zero(t, g.Held("ann"), "places left after every sandbox was killed")
	open, _ := g.State()
	assert.Zero(t, open)
}

// A code context whose making (its cwd's run) overlaps its sandbox's pause is closed, not
// kept: it once held its place for good, the pause having saved and closed the others.
func TestContextMadeWhilePausing(t *testing.T) {
	g := session.NewGate(0, 0)
	_, base := gateServer(t, g, Config{})
	refused := 0
	for range 12 {
		code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, code, "%v", sb)
		id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
		made := make(chan int)
		go func() {
			code, _ := onPort(t, base, id, token, "49999", "POST", "/contexts", `{"cwd": "/tmp"}`)
			made <- code
		}()
		callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/pause", "")
		if <-made != http.StatusOK {
			refused++
		}
		code, body := callAs(t, "ann", "DELETE", base+"/sandboxes/"+id, "")
		require.Equal(t, http.StatusNoContent, code, "%v", body)
		require.Zero(t, g.Held("ann"), "a place outlived its sandbox")
	}
	t.Logf("%d of 12 contexts were refused as their sandbox paused", refused)
}
