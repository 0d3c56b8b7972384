package minipy

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/minipy-go/minipy/internal/pyrt"
	"github.com/minipy-go/minipy/internal/worker"
)

// Live output: what a run prints reaches Options.Stdout and Options.Stderr while it runs.
//
// The rule, for both engines: the writers are called from one goroutine at a time, in the
// order the output was produced (in-process exactly; in a worker each stream in order, and
// the two streams in order of Python's own writes, fd-level writes of C code and child
// processes within liveInterval). The interpreter never waits for a writer: up to
// liveBacklog bytes wait in a queue, and output beyond that is dropped and replaced by a
// note that says how many bytes of which stream were dropped (Result.Stdout and Stderr keep
// them, capped as usual). A writer's error stops the writes to it for the rest of the run.
// Run returns once the writers have taken the run's last output, or liveFlushWait after the
// run ended if a writer is still busy: the rest of the queue is then dropped, and no Write
// starts after Run returns (one already in progress may finish later).
const (
	liveBacklog   = 1 << 20
	liveFlushWait = time.Second
	// liveInterval is how often the host asks a worker for what C code and child processes
	// wrote (pumpLive, worker.py's _Pump); Python's own writes are sent on the next switch
	// of stream too.
	liveInterval = 10 * time.Millisecond
)

// Stream numbers of output events (FrameOutput's stream byte).
const (
	streamStdout = 1
	streamStderr = 2
)

// pumpLive asks worker w for run rid's pending live output every liveInterval until stop
// is called (worker.Pump), when the run has live output: a run shorter than that costs the
// worker no wake-up for it.
func pumpLive(w *worker.Worker, rid uint64, live *liveOutput) (stop func()) {
	if live == nil {
		return func() {}
	}
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock() // (t is set before its function reads it)
	t = time.AfterFunc(liveInterval, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			w.Pump(rid)
			t.Reset(liveInterval)
		}
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// liveOutput feeds one run's output to its writers.
type liveOutput struct {
	writers [3]io.Writer // by stream number

	mu      sync.Mutex
	queue   []liveChunk
	queued  int
	dropped [3]int
	failed  [3]bool
	closed  bool // finish was called: take no more, write nothing new
	busy    bool // the writing goroutine is running
	idle    *sync.Cond
}

type liveChunk struct {
	stream byte
	data   []byte
}

// newLiveOutput returns the live output of a run with opts, or nil when it has none.
func newLiveOutput(opts *Options) *liveOutput {
	if opts == nil || (opts.Stdout == nil && opts.Stderr == nil) {
		return nil
	}
	l := &liveOutput{}
	l.writers[streamStdout], l.writers[streamStderr] = opts.Stdout, opts.Stderr
	l.idle = sync.NewCond(&l.mu)
	return l
}

// add queues data of stream (copied) for its writer. It never blocks on the writer.
func (l *liveOutput) add(stream byte, data []byte) {
	if l == nil || int(stream) >= len(l.writers) || l.writers[stream] == nil || len(data) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed || l.failed[stream]:
		return
	case l.queued+len(data) > liveBacklog:
		l.dropped[stream] += len(data)
		return
	}
	l.noteDropped()
	l.queue = append(l.queue, liveChunk{stream: stream, data: append([]byte(nil), data...)})
	l.queued += len(data)
	if !l.busy {
		l.busy = true
		go l.write()
	}
}

// drop counts output lost before it reached the host's side (a full event queue).
func (l *liveOutput) drop(stream byte, n int) {
	if l == nil || n <= 0 || int(stream) >= len(l.writers) {
		return
	}
	l.mu.Lock()
	l.dropped[stream] += n
	l.mu.Unlock()
}

// noteDropped queues the note for output dropped so far, once there is room again. Called
// with l.mu held.
func (l *liveOutput) noteDropped() {
	for stream, n := range l.dropped {
		if n == 0 || l.writers[stream] == nil {
			continue
		}
		name := [...]string{"", "stdout", "stderr"}[stream]
		note := fmt.Sprintf("\n[minipy: %d bytes of %s dropped here: the writer fell behind by more than %d bytes]\n",
			n, name, liveBacklog)
		l.queue = append(l.queue, liveChunk{stream: byte(stream), data: []byte(note)})
		l.queued += len(note)
		l.dropped[stream] = 0
	}
}

// write hands the queue to the writers until it is empty.
func (l *liveOutput) write() {
	l.mu.Lock()
	for len(l.queue) > 0 && !l.closed {
		c := l.queue[0]
		l.queue = l.queue[1:]
		l.queued -= len(c.data)
		if l.failed[c.stream] {
			continue
		}
		l.mu.Unlock()
		_, err := l.writers[c.stream].Write(c.data)
		l.mu.Lock()
		if err != nil {
			l.failed[c.stream] = true
		}
	}
	l.busy = false
	l.idle.Broadcast()
	l.mu.Unlock()
}

// finish waits until the writers have taken everything queued (with a note for what was
// dropped), at most liveFlushWait; then no more writes start.
func (l *liveOutput) finish() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noteDropped()
	if len(l.queue) > 0 && !l.busy {
		l.busy = true
		go l.write()
	}
	if l.busy {
		timer := time.AfterFunc(liveFlushWait, func() {
			l.mu.Lock()
			l.closed = true
			l.idle.Broadcast()
			l.mu.Unlock()
		})
		for l.busy && !l.closed {
			l.idle.Wait()
		}
		timer.Stop()
	}
	l.closed = true
	l.queue = nil
}

// runEvents is where a run's events go: its live output and its host calls (either may be
// nil). Both engines decode their events with it (see docs/protocol.md).
type runEvents struct {
	live  *liveOutput
	calls *hostCalls
}

// frames handles the frames of run events that an engine collected (u32 length, kind, u64
// run id, payload; see pyrt's Frame constants): those of run rid are applied, others (a
// late event of an earlier run) ignored. It returns an error for a malformed frame.
func (r runEvents) frames(frames []byte, rid uint64) error {
	for len(frames) > 0 {
		if len(frames) < 4 {
			return errNotProtocol
		}
		n := int(binary.LittleEndian.Uint32(frames))
		if n < 1 || len(frames)-4 < n {
			return errNotProtocol
		}
		if err := r.event(frames[4:4+n], rid); err != nil {
			return err
		}
		frames = frames[4+n:]
	}
	return nil
}

// event handles one event frame's body (kind, u64 run id, payload).
func (r runEvents) event(body []byte, rid uint64) error {
	if len(body) < 1+8 {
		return errNotProtocol
	}
	if binary.LittleEndian.Uint64(body[1:]) != rid {
		return nil
	}
	switch body[0] {
	case pyrt.FrameOutput:
		if len(body) < 1+8+1 {
			return errNotProtocol
		}
		if r.live != nil {
			r.live.add(body[9], body[10:])
		}
		return nil
	case pyrt.FrameCall:
		if r.calls == nil {
			return errNotProtocol // a run without host functions makes no calls
		}
		return r.calls.call(body[9:])
	}
	return errNotProtocol
}
