package minipy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// engines returns both engines under the names the subtests use.
func engines(t *testing.T) []struct {
	name string
	eng  minipy.Engine
} {
	return []struct {
		name string
		eng  minipy.Engine
	}{
		{"inprocess", minipy.InProcess()},
		{"isolated", newIsolated(t, minipy.IsolatedConfig{})},
	}
}

// inEachEngine runs f in a subtest of each engine, with a fresh namespace of that engine.
func inEachEngine(t *testing.T, f func(t *testing.T, eng minipy.Engine, opts *minipy.Options)) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			ns := e.eng.NewNamespace()
			defer ns.Close()
			f(t, e.eng, &minipy.Options{Globals: ns})
		})
	}
}

// recorder is a live-output writer that notes when each write arrived.
type recorder struct {
	mu     sync.Mutex
	stream string
	all    *recorderLog
	delay  time.Duration
	rate   int // bytes a second the writer takes (0: any)
	err    error
}

type recorderLog struct {
	mu     sync.Mutex
	writes []liveWrite
	seen   func(all string) // if set, called after each write with everything written so far
}

type liveWrite struct {
	stream string
	data   string
	at     time.Time
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.delay > 0 {
		time.Sleep(r.delay)
	}
	if r.rate > 0 {
		time.Sleep(time.Duration(len(p)) * time.Second / time.Duration(r.rate))
	}
	r.all.mu.Lock()
	r.all.writes = append(r.all.writes, liveWrite{r.stream, string(p), time.Now()})
	seen := r.all.seen
	r.all.mu.Unlock()
	if seen != nil {
		seen(r.all.text(""))
	}
	if r.err != nil {
		return 0, r.err
	}
	return len(p), nil
}

func (l *recorderLog) text(stream string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, w := range l.writes {
		if stream == "" || w.stream == stream {
			b.WriteString(w.data)
		}
	}
	return b.String()
}

// firstAt is when the first write containing s arrived.
func (l *recorderLog) firstAt(t *testing.T, s string) time.Time {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var seen string
	for _, w := range l.writes {
		seen += w.data
		if strings.Contains(seen, s) {
			return w.at
		}
	}
	t.Fatalf("%q never arrived; got %q", s, seen)
	return time.Time{}
}

func liveOpts(ns *minipy.Namespace) (*minipy.Options, *recorderLog) {
	log := &recorderLog{}
	return &minipy.Options{Globals: ns, Stdout: &recorder{stream: "out", all: log}, Stderr: &recorder{stream: "err", all: log}}, log
}

// Output reaches the writers while the code runs, not when it ends, on both engines, and
// the Result still has all of it.
func TestLiveOutputArrivesWhileRunning(t *testing.T) {
	for _, tc := range engines(t) {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.eng.NewNamespace()
			defer ns.Close()
			opts, log := liveOpts(ns)
			// The code goes on only once the writer has its output (a file the writer makes
			// says so), which it could not if the output came when the run ends: no clock.
			dir := ns.WorkDir() // (the isolated worker's working directory, its cwd)
			prefix := ""
			if dir == "" {
				dir = t.TempDir()
				prefix = dir + "/"
			}
			var mu sync.Mutex
			made := map[string]bool{}
			log.seen = func(all string) {
				mu.Lock()
				defer mu.Unlock()
				for _, s := range []string{"first", "oops"} {
					if !made[s] && strings.Contains(all, s) {
						made[s] = true
						assert.NoError(t, os.WriteFile(filepath.Join(dir, "seen-"+s), nil, 0o644))
					}
				}
			}
			code := fmt.Sprintf(`import os, sys, time
def seen(name):
    for _ in range(3000):
        if os.path.exists(%q + "seen-" + name):
            return True
        time.sleep(0.01)
    return False
print('first')
sys.stdout.flush()
a = seen('first')
print('oops', file=sys.stderr)
b = seen('oops')
print('last')
[a, b]`, prefix)
			r, err := tc.eng.Run(context.Background(), code, opts)
			ended := time.Now()
			require.NoError(t, err)
			assert.Equal(t, "first\nlast\n", r.Stdout)
			assert.Equal(t, "oops\n", r.Stderr)
			assert.Equal(t, []any{true, true}, r.Value, "the writer had first and oops while the code ran")
			assert.Equal(t, "first\nlast\n", log.text("out"))
			assert.Equal(t, "oops\n", log.text("err"))
			assert.False(t, log.firstAt(t, "last").After(ended), "Run returned before the writer got the last output")
		})
	}
}

// Interleaved writes to both streams reach the writers in the order they were made.
func TestLiveOutputKeepsOrderAcrossStreams(t *testing.T) {
	for _, tc := range engines(t) {
		t.Run(tc.name, func(t *testing.T) {
			opts, log := liveOpts(tc.eng.NewNamespace())
			defer opts.Globals.Close()
			code := "import sys\nfor i in range(200):\n    print('o%d' % i)\n    print('e%d' % i, file=sys.stderr)"
			_, err := tc.eng.Run(context.Background(), code, opts)
			require.NoError(t, err)
			var want strings.Builder
			for i := range 200 {
				fmt.Fprintf(&want, "o%d\ne%d\n", i, i)
			}
			assert.Equal(t, want.String(), log.text(""))
		})
	}
}

// In a worker, what C code and child processes write to fds 1 and 2 streams too.
func TestLiveOutputOfChildProcessesInWorker(t *testing.T) {
	eng := newIsolated(t, minipy.IsolatedConfig{})
	ns := eng.NewNamespace()
	opts, log := liveOpts(ns)
	// The run ends only once the writer has the child's line (it makes a file then).
	var once sync.Once
	log.seen = func(all string) {
		if strings.Contains(all, "child\n") {
			once.Do(func() { assert.NoError(t, os.WriteFile(filepath.Join(ns.WorkDir(), "seen"), nil, 0o644)) })
		}
	}
	code := "import os, subprocess, time\nos.write(1, b'raw\\n')\nsubprocess.run(['echo', 'child'])\nsubprocess.run('echo err >&2', shell=True)\n" +
		"for _ in range(3000):\n    if os.path.exists('seen'):\n        break\n    time.sleep(0.01)\nos.path.exists('seen')"
	r, err := eng.Run(context.Background(), code, opts)
	require.NoError(t, err)
	assert.Equal(t, true, r.Value, "the writer had the child's output while the run went on")
	assert.Equal(t, "raw\nchild\n", r.Stdout)
	assert.Equal(t, "raw\nchild\n", log.text("out"))
	assert.Equal(t, "err\n", log.text("err"))
}

// A worker has no thread of its own for live output (the host asks for it, worker.Pump):
// none besides the main and control threads runs beside the code, live or not.
func TestLiveOutputNoPumpThread(t *testing.T) {
	eng := newIsolated(t, minipy.IsolatedConfig{})
	ns := eng.NewNamespace()
	opts, _ := liveOpts(ns)
	r, err := eng.Run(context.Background(), "import threading\nsorted(t.name for t in threading.enumerate())", opts)
	require.NoError(t, err)
	assert.Equal(t, []any{"MainThread", "minipy-control"}, r.Value)
}

// A writer that cannot keep up never stalls the code: output beyond the backlog is dropped
// from the live feed with a note, the Result keeps it, and Run returns about a second after
// the run at most.
func TestLiveOutputSlowWriterDropsWithNote(t *testing.T) {
	for _, tc := range engines(t) {
		t.Run(tc.name, func(t *testing.T) {
			log := &recorderLog{}
			// 5 MB/s, far slower than the code prints, however its output arrives: in small
			// chunks (in-process) or in frames of up to 1 MiB a few ms apart (a worker).
			opts := &minipy.Options{MaxOutput: -1, Stdout: &recorder{stream: "out", all: log, rate: 5 << 20}}
			started := time.Now()
			r, err := tc.eng.Run(context.Background(), "for i in range(40):\n    print('x' * 100_000)", opts)
			require.NoError(t, err)
			assert.Less(t, time.Since(started), 10*time.Second)
			assert.Equal(t, 40*100_001, len(r.Stdout), "the Result keeps everything")
			got := log.text("out")
			assert.Less(t, len(got), 40*100_001)
			assert.Contains(t, got, "bytes of stdout dropped here: the writer fell behind")
		})
	}
}

// A writer's error stops the writes to it; the run goes on and Run reports no error for it.
func TestLiveOutputWriterErrorStopsItsWrites(t *testing.T) {
	for _, tc := range engines(t) {
		t.Run(tc.name, func(t *testing.T) {
			log := &recorderLog{}
			opts := &minipy.Options{Stdout: &recorder{stream: "out", all: log, err: errors.New("closed")},
				Stderr: &recorder{stream: "err", all: log}}
			r, err := tc.eng.Run(context.Background(), "import sys\nprint('a')\nsys.stdout.flush()\nimport time; time.sleep(0.05)\nprint('b')\nprint('c', file=sys.stderr)", opts)
			require.NoError(t, err)
			assert.Equal(t, "a\nb\n", r.Stdout)
			got := log.text("out")
			assert.True(t, got != "" && strings.HasPrefix("a\n", got), "nothing after the failed write: %q", got)
			assert.Equal(t, "c\n", log.text("err"))
		})
	}
}

// A run that times out still delivers what it printed, and only that run's output.
func TestLiveOutputOfStoppedRun(t *testing.T) {
	for _, tc := range engines(t) {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			var mu sync.Mutex
			w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
			_, err := tc.eng.Run(context.Background(), "print('before')\nwhile True:\n    pass", &minipy.Options{Timeout: 200 * time.Millisecond, Stdout: w})
			require.ErrorIs(t, err, minipy.ErrTimeout)
			r, err := tc.eng.Run(context.Background(), "print('next')", nil)
			require.NoError(t, err)
			assert.Equal(t, "next\n", r.Stdout)
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, "before\n", out.String())
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Text that is not plain ASCII reaches the writer as UTF-8, a lone surrogate included, and
// bytes written through sys.stdout.buffer as they are.
func TestLiveOutputEncoding(t *testing.T) {
	for _, tc := range engines(t) {
		t.Run(tc.name, func(t *testing.T) {
			opts, log := liveOpts(tc.eng.NewNamespace())
			defer opts.Globals.Close()
			r, err := tc.eng.Run(context.Background(), "import sys\nprint('héllo ✓')\nsys.stdout.buffer.write(b'raw\\n')\nprint('\\udc80' if False else 'end')", opts)
			require.NoError(t, err)
			assert.Equal(t, "héllo ✓\nraw\nend\n", log.text("out"))
			assert.Equal(t, r.Stdout, log.text("out"))
		})
	}
}
