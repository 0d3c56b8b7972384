package e2b

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/redistest"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/minipy-go/minipy/internal/opcount"
)

// BenchmarkCreateToFirstResult times what E2B's users time as a cold start: POST
// /v2/sandboxes, then the first /execute ("1+1") to its result, over HTTP, with the isolated
// engine (numpy preloaded), sessions arriving 300 ms apart. "pool" has the engine's
// default warm pool, "no-pool" starts each sandbox on the caller's path (Spares -1). The
// floor is a bare `python3 -c pass` of the same Python in the same run; the counts are
// over the whole process tree (opcount), the sandbox's kill left out. The anchors' cold
// starts (ComputeSDK's medians: declaw 42 ms, Daytona 186 ms, E2B 491 ms) are in
// docs/benchmarks.md beside the numbers.
func BenchmarkCreateToFirstResult(b *testing.B) {
	for _, c := range []struct {
		name   string
		spares int
	}{{"pool", 0}, {"no-pool", -1}} {
		b.Run(c.name, func(b *testing.B) {
			// Counting from before the engine starts: its template's forks are counted too.
			m, err := opcount.Start()
			if err != nil {
				b.Logf("no counts: %v", err)
			} else {
				defer m.Close()
			}
			root := os.Geteuid() == 0 && os.Getenv("MINIPY_BENCH_NO_ROOT_USER") == "" // (A/B: the root user's cost)
			eng, err := minipy.NewIsolated(minipy.IsolatedConfig{Spares: c.spares, WorkDirPath: Home,
				Preload: []string{"numpy"}, Startup: Startup, RootUser: root}) // (as minipy-mcp -e2b serves)
			if err != nil {
				b.Fatal(err)
			}
			defer eng.Close()
			s := New(Config{Engine: eng, RootUser: root})
			srv := httptest.NewServer(s)
			defer srv.Close()
			defer s.Close()
			createAndRun(b, srv.URL) // the template's start, and the pool's first spare
			time.Sleep(300 * time.Millisecond)
			var took []time.Duration
			var counts opcount.Counts
			b.ResetTimer()
			for range b.N {
				var before opcount.Counts
				if m != nil {
					before = m.Read()
				}
				start := time.Now()
				kill := createAndRun(b, srv.URL)
				took = append(took, time.Since(start))
				if m != nil {
					counts = counts.Add(m.Since(before))
				}
				kill()
				time.Sleep(300 * time.Millisecond)
			}
			b.StopTimer()
			reportCreate(b, m, took, pythonFloor(b, eng), counts.Per(b.N))
		})
	}
}

// createAndRun creates a sandbox and runs 1+1 in it, and returns its kill.
func createAndRun(b *testing.B, base string) (kill func()) {
	sb := benchCall(b, base, "POST", "/v2/sandboxes", `{"templateID": "code-interpreter-v1"}`, http.StatusCreated)
	benchRun(b, base, sb, "1+1", `"text":"2"`)
	return func() {
		req, _ := http.NewRequest("DELETE", base+"/sandboxes/"+sb.SandboxID, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
}

// pythonFloor times five bare starts of the workers' python (sys.executable): -c pass.
func pythonFloor(b *testing.B, eng *minipy.Isolated) []time.Duration {
	r, err := eng.Minipy("import sys; sys.executable", nil)
	if err != nil {
		b.Fatal(err)
	}
	var floor []time.Duration
	for range 5 {
		start := time.Now()
		if err := exec.Command(r.Value.(string), "-c", "pass").Run(); err != nil {
			b.Fatal(err)
		}
		floor = append(floor, time.Since(start))
	}
	return floor
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func reportCreate(b *testing.B, m *opcount.Meter, took, floor []time.Duration, per opcount.PerOp) {
	b.ReportMetric(float64(median(took).Microseconds())/1e3, "ms-median")
	b.ReportMetric(float64(median(floor).Microseconds())/1e3, "ms-floor")
	b.ReportMetric(float64(median(took))/float64(median(floor)), "x-floor")
	if m == nil {
		return
	}
	for _, c := range []struct {
		ev   opcount.Event
		name string
		v    float64
	}{
		{opcount.ContextSwitches, "cs", per.ContextSwitches}, {opcount.PageFaults, "faults", per.PageFaults},
		{opcount.Syscalls, "syscalls", per.Syscalls}, {opcount.Forks, "forks", per.Forks},
	} {
		if m.Counting(c.ev) {
			b.ReportMetric(c.v, c.name+"/op")
		}
	}
}

// BenchmarkPauseResume times a pause and the resume after it (connect), to the result of
// the first run in the resumed sandbox, over HTTP: "memory" keeps the paused sandbox in
// the server, "store" seals it into a store's directory (minipy-mcp's -state-dir: a
// file written whole and synced, then read back and removed). The sandbox holds a list
// of 100,000 ints and a 1 MB file. Counts over the whole process tree, the floor a bare
// `python3 -c pass`, as BenchmarkCreateToFirstResult's.
func BenchmarkPauseResume(b *testing.B) {
	for _, name := range []string{"memory", "store"} {
		b.Run(name, func(b *testing.B) {
			m, eng, _, srv := benchServer(b, name == "store", Config{})
			sb := benchCall(b, srv.URL, "POST", "/v2/sandboxes", `{}`, http.StatusCreated)
			benchRun(b, srv.URL, sb, "x = list(range(100000))\nopen('data.bin', 'wb').write(bytes(1 << 20))", "")
			var took []time.Duration
			var counts opcount.Counts
			b.ResetTimer()
			for range b.N {
				var before opcount.Counts
				if m != nil {
					before = m.Read()
				}
				start := time.Now()
				benchCall(b, srv.URL, "POST", "/sandboxes/"+sb.SandboxID+"/pause", "", http.StatusNoContent)
				sb = benchCall(b, srv.URL, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{}`, http.StatusCreated)
				benchRun(b, srv.URL, sb, "len(x)", `"text":"100000"`)
				took = append(took, time.Since(start))
				if m != nil {
					counts = counts.Add(m.Since(before))
				}
			}
			b.StopTimer()
			reportCreate(b, m, took, pythonFloor(b, eng), counts.Per(b.N))
		})
	}
}

// benchServer serves cfg over httptest with an isolated engine of its own (and a store's
// directory, when stored), counting (opcount) from before the engine starts; the
// benchmark's end ends them all. The meter is nil where the host cannot count.
func benchServer(b *testing.B, stored bool, cfg Config) (*opcount.Meter, *minipy.Isolated, *Server, *httptest.Server) {
	m, err := opcount.Start()
	if err != nil {
		b.Logf("no counts: %v", err)
		m = nil
	} else {
		b.Cleanup(func() { m.Close() })
	}
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{WorkDirPath: Home})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close() })
	cfg.Engine = eng
	if stored {
		if cfg.Store, err = session.OpenStore(b.TempDir(), time.Hour, ""); err != nil {
			b.Fatal(err)
		}
	}
	s := New(cfg)
	srv := httptest.NewServer(s)
	b.Cleanup(func() { srv.Close(); s.Close() })
	return m, eng, s, srv
}

// benchCall makes an API call that must answer want, and returns the sandbox it names.
func benchCall(b testing.TB, base, method, path, body string, want int) sandboxBody {
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		b.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, out)
	}
	var sb sandboxBody
	json.Unmarshal(out, &sb) //nolint:errcheck // not every answer names one
	return sb
}

// benchRun executes code in sb; its answer must hold want.
func benchRun(b testing.TB, base string, sb sandboxBody, code, want string) {
	js, _ := json.Marshal(map[string]string{"code": code})
	req, _ := http.NewRequest("POST", base+"/execute", bytes.NewReader(js))
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(out, []byte(want)) || bytes.Contains(out, []byte(`"type":"error"`)) {
		b.Fatalf("execute %q: %s", code, out)
	}
}

// BenchmarkForwardedRun times an execution ("1+1", to its result, over HTTP) sent to the
// replica that runs the sandbox ("direct") and to another replica sharing its store, which
// forwards it (Config.Advertise), one of each per iteration, in the same run: ms-added is
// the forward's cost (the lease and address read from the store, a second HTTP hop on the
// same host). Counts per run of each kind over the whole process tree (both replicas and
// the sandbox).
func BenchmarkForwardedRun(b *testing.B) {
	for _, kind := range []string{"dir", "redis"} {
		b.Run(kind, func(b *testing.B) {
			url := b.TempDir()
			if kind == "redis" {
				url = redistest.Start(b).URL()
			}
			m, err := opcount.Start()
			if err != nil {
				b.Logf("no counts: %v", err)
			} else {
				defer m.Close()
			}
			_, baseA := benchReplica(b, url)
			_, baseB := benchReplica(b, url)
			sb := benchCall(b, baseA, "POST", "/v2/sandboxes", `{}`, http.StatusCreated)
			benchRun(b, baseB, sb, "1+1", `"text":"2"`) // (the forward's connection made)
			var direct, forwarded []time.Duration
			var cd, cf opcount.Counts
			timed := func(base string, took *[]time.Duration, c *opcount.Counts) {
				var before opcount.Counts
				if m != nil {
					before = m.Read()
				}
				start := time.Now()
				benchRun(b, base, sb, "1+1", `"text":"2"`)
				*took = append(*took, time.Since(start))
				if m != nil {
					*c = c.Add(m.Since(before))
				}
			}
			b.ResetTimer()
			for range b.N {
				timed(baseA, &direct, &cd)
				timed(baseB, &forwarded, &cf)
			}
			b.StopTimer()
			b.ReportMetric(float64(median(direct).Microseconds())/1e3, "ms-direct")
			b.ReportMetric(float64(median(forwarded).Microseconds())/1e3, "ms-forwarded")
			b.ReportMetric(float64(median(forwarded)-median(direct))/1e6, "ms-added")
			if m != nil {
				b.Logf("direct: %v; forwarded: %v", cd.Per(b.N), cf.Per(b.N))
				b.ReportMetric(cf.Per(b.N).Syscalls-cd.Per(b.N).Syscalls, "syscalls-added/op")
				b.ReportMetric(cf.Per(b.N).ContextSwitches-cd.Per(b.N).ContextSwitches, "cs-added/op")
			}
		})
	}
}

// benchReplica is a server of the store at url advertising its own address, as a replica.
func benchReplica(b *testing.B, url string) (*Server, string) {
	store, err := session.Open(url, session.StoreOptions{TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{WorkDirPath: Home})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close() })
	var s *Server
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.ServeHTTP(w, r) }))
	s = New(Config{Engine: eng, Store: store, Advertise: "http://" + ts.Listener.Addr().String()})
	ts.Start()
	b.Cleanup(func() { ts.Close(); s.Close() })
	return s, ts.URL
}

// BenchmarkSleepWake times a sleeping sandbox's wake (sleep.go): its first execution
// ("len(x)", to its result, over HTTP) after a sleep, which restores it into a fresh
// namespace, and (apart) the sleep itself, in memory and into a store's directory. The
// sandbox holds `x = list(range(1000))`, as issue 70's; bytes-asleep is what the server (or
// the store) holds of it asleep. Counts over the whole process tree for the wake, the floor
// a bare `python3 -c pass`, as BenchmarkCreateToFirstResult's.
func BenchmarkSleepWake(b *testing.B) {
	for _, name := range []string{"memory", "store"} {
		b.Run(name, func(b *testing.B) {
			m, eng, s, srv := benchServer(b, name == "store", Config{SleepIdle: time.Hour}) // (it puts it to sleep)
			body := benchCall(b, srv.URL, "POST", "/v2/sandboxes", `{}`, http.StatusCreated)
			benchRun(b, srv.URL, body, "x = list(range(1000))", "")
			sb := s.lookup(body.SandboxID)
			var woke, slept []time.Duration
			var counts opcount.Counts
			var asleep int64
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				s.sleep(sb)
				slept = append(slept, time.Since(start))
				if !sb.sleeping() {
					b.Fatal("it did not sleep")
				}
				asleep = s.asleepBytes(sb)
				var before opcount.Counts
				if m != nil {
					before = m.Read()
				}
				start = time.Now()
				benchRun(b, srv.URL, body, "len(x)", `"text":"1000"`)
				woke = append(woke, time.Since(start))
				if m != nil {
					counts = counts.Add(m.Since(before))
				}
			}
			b.StopTimer()
			reportCreate(b, m, woke, pythonFloor(b, eng), counts.Per(b.N))
			b.ReportMetric(float64(median(slept).Microseconds())/1e3, "ms-sleep-median")
			b.ReportMetric(float64(asleep), "bytes-asleep")
		})
	}
}
