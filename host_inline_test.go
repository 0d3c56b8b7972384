package minipy_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// An Inline function runs on the interpreter's own thread in-process (the thread the code
// runs on), and behaves as any other: values, errors, argument checks, cancellation,
// reentry, calls from the code's threads; the isolated engine serves it as usual.
func TestHostInline(t *testing.T) {
	tid := func(inline bool) minipy.Function {
		return minipy.Function{Name: "tid", Inline: inline, Call: func(context.Context, map[string]any) (any, error) {
			return int64(syscall.Gettid()), nil
		}}
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			add := addFunction
			add.Inline = true
			fail := minipy.Function{Name: "fail", Inline: true, Call: func(context.Context, map[string]any) (any, error) {
				panic("boom")
			}}
			h := newHostEnv(t, e.eng, add, fail, tid(true))
			assert.Equal(t, int64(5), h.value(t, "add(2, 3)"))
			assert.Equal(t, int64(4950), h.value(t, "sum(add(a=i, b=0) for i in range(100))"))
			assert.Equal(t, "TypeError", h.pyErr(t, "add('x', 1)").Type)
			pe := h.pyErr(t, "fail()")
			assert.Equal(t, "minipy.HostError", pe.Type)
			assert.Contains(t, pe.Message, "panicked: boom")
			// From a thread the code started: served by a goroutine, as always.
			assert.Equal(t, int64(7), h.value(t, `
import threading
out = []
t = threading.Thread(target=lambda: out.append(add(3, 4)))
t.start(); t.join()
out[0]`))
			if e.name != "inprocess" {
				return
			}
			same := h.value(t, "import threading; tid() == threading.get_native_id()")
			assert.Equal(t, true, same, "an Inline function runs on the code's thread")
			plain := newHostEnv(t, e.eng, tid(false))
			assert.Equal(t, false, plain.value(t, "import threading; tid() == threading.get_native_id()"),
				"a function that is not Inline is served by a goroutine")
		})
	}
}

// An Inline function that returns when its ctx is done stops with the run; code that calls
// the runtime's hook itself cannot run a function that is not Inline on its thread.
func TestHostInlineStops(t *testing.T) {
	eng := minipy.InProcess()
	entered := make(chan struct{}, 1)
	wait := minipy.Function{Name: "wait", Inline: true, Call: func(ctx context.Context, _ map[string]any) (any, error) {
		entered <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	plain := minipy.Function{Name: "plain", Call: func(context.Context, map[string]any) (any, error) {
		return "served", nil
	}}
	h := newHostEnv(t, eng, wait)

	h.opts.Timeout = 200 * time.Millisecond
	start := time.Now()
	_, err := h.run(t, "wait()")
	require.ErrorIs(t, err, minipy.ErrTimeout)
	var ie *minipy.InterruptedError
	require.ErrorAs(t, err, &ie)
	assert.False(t, ie.Abandoned)
	assert.Less(t, time.Since(start), 3*time.Second)
	<-entered

	h.opts.Timeout = 20 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-entered
		cancel()
	}()
	_, err = eng.Run(ctx, "wait()", h.opts)
	require.ErrorIs(t, err, context.Canceled)

	forger := newHostEnv(t, eng, plain)
	got := forger.value(t, `
import sys
rt = sys.modules['_minipy_runtime']
out = []
for fid in range(200):
    try:
        out.append(rt._call(fid, 'x', {}, True))
    except Exception as e:
        out.append(type(e).__name__)
'served' in out`)
	assert.Equal(t, false, got, "a function that is not Inline ran inline")
	assert.Equal(t, "served", forger.value(t, "plain()"))
}

// An Inline function that ignores its ctx holds the run past its deadline: the run is
// abandoned, and the interpreter is busy until the function returns.
func TestHostInlineIgnoringItsContext(t *testing.T) {
	eng := minipy.InProcess()
	release := make(chan struct{})
	stuck := minipy.Function{Name: "stuck", Inline: true, Call: func(context.Context, map[string]any) (any, error) {
		<-release
		return "late", nil
	}}
	h := newHostEnv(t, eng, stuck)
	h.opts.Timeout = 100 * time.Millisecond
	_, err := h.run(t, "stuck()")
	var ie *minipy.InterruptedError
	require.ErrorAs(t, err, &ie)
	assert.True(t, ie.Abandoned)
	close(release)
	h.opts.Timeout = 20 * time.Second
	assert.Eventually(t, func() bool {
		r, err := h.run(t, "1+1")
		return err == nil && r.Value == int64(2)
	}, 10*time.Second, 20*time.Millisecond, "the interpreter came back once the function returned")
}
