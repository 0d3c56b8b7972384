package minipy

// Serving the host calls of a run: decode, validate, call the Go function, reply.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// hostCalls serves the host calls of one run (call events, from either engine).
type hostCalls struct {
	reg      *hostRegistry
	gid, lid uint32
	ctx      context.Context // the calls' ctx: the run's, with its deadline
	cancel   context.CancelFunc
	reply    func(id uint64, status byte, payload []byte)
	ended    atomic.Bool
	inflight atomic.Int64 // calls being served
	pending  atomic.Int64 // calls taken and not yet served (bounded by limit)
	limit    int64        // calls that may be pending at once; 0: no bound (the in-process engine's)
	mu       sync.Mutex
	held     []uint64      // calls of a run being stopped, answered by its kick (or end)
	gen      atomic.Uint64 // in-process: the run's request generation, once known
}

// hostCallKey marks the ctx of a host call, so that a Run with it on the same
// interpreter fails with ErrReentrant.
type hostCallKey struct{}

func newHostCalls(ctx context.Context, dl deadline, reg *hostRegistry, gid, lid uint32,
	reply func(id uint64, status byte, payload []byte)) *hostCalls {
	h := &hostCalls{reg: reg, gid: gid, lid: lid, reply: reply}
	if !dl.at.IsZero() {
		h.ctx, h.cancel = context.WithDeadline(ctx, dl.at)
	} else {
		h.ctx, h.cancel = context.WithCancel(ctx)
	}
	h.ctx = context.WithValue(h.ctx, hostCallKey{}, h)
	return h
}

// end is called when the run has ended: calls still in flight see their ctx cancelled.
func (h *hostCalls) end() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.ended.Store(true)
	held := h.held
	h.held = nil
	h.mu.Unlock()
	h.cancel()
	for _, id := range held {
		h.reply(id, pyrt.CallStopped, nil)
	}
}

// call handles one call event's payload (u64 call id, codec [function id, {args}]) of the
// isolated engine: it serves the call on a goroutine of its own, so that the run's
// goroutine goes on reading the worker's frames. It reports a malformed payload.
func (h *hostCalls) call(payload []byte) error {
	id, v, err := decodeCall(payload)
	if err != nil {
		return err
	}
	if n := h.pending.Add(1); h.limit > 0 && n > h.limit {
		h.pending.Add(-1)
		return fmt.Errorf("%w: more than %d host calls in flight at once, more than the worker's threads can make",
			errNotProtocol, h.limit)
	}
	go func() {
		defer h.pending.Add(-1)
		h.serve(id, v)
	}()
	return nil
}

// hostCallLimit bounds the host calls in flight of one run of the isolated engine (a
// goroutine each in the host): an honest worker has one per thread at most, and its
// threads are bounded by Processes; code that forges call events (20,000 made the host run
// as many goroutines) has its worker killed, ErrProtocol. Without a Processes limit, the
// bound is maxHostCalls.
func hostCallLimit(processes int) int64 {
	if processes > 0 {
		return int64(processes)
	}
	return maxHostCalls
}

const maxHostCalls = 4096

// decodeCall splits a call event's payload into the call id and [function id, {args}].
func decodeCall(payload []byte) (uint64, any, error) {
	if len(payload) < 8 {
		return 0, nil, errNotProtocol
	}
	d := decoder{buf: payload, pos: 8}
	v, err := d.value()
	if err != nil {
		return 0, nil, errNotProtocol
	}
	return binary.LittleEndian.Uint64(payload), v, nil
}

// serve runs one call and replies.
func (h *hostCalls) serve(id uint64, v any) {
	h.inflight.Add(1)
	status, payload := h.run(v)
	h.inflight.Add(-1)
	if status == pyrt.CallStopped {
		// The run is being stopped: its kick ends this call's wait, and the code stops as
		// a kicked run does (an InterruptedError, not the function's ctx error). Should the
		// run end first, end answers the call.
		h.mu.Lock()
		if !h.ended.Load() {
			h.held = append(h.held, id)
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
	}
	h.reply(id, status, payload)
}

// callParts splits a decoded call, [function id, {args}], into the function (nil if none
// has that id) and its arguments (nil if malformed).
func (h *hostCalls) callParts(v any) (*hostFunc, map[string]any) {
	parts, _ := v.([]any)
	var fid int64
	var args map[string]any
	if len(parts) == 2 {
		fid, _ = parts[0].(int64)
		args, _ = parts[1].(map[string]any)
	}
	return h.reg.lookup(uint64(fid)), args
}

// function is the function a decoded call names, or nil.
func (h *hostCalls) function(v any) *hostFunc {
	hf, _ := h.callParts(v)
	return hf
}

func (h *hostCalls) run(v any) (status byte, payload []byte) {
	hf, args := h.callParts(v)
	switch {
	case h.ended.Load():
		return pyrt.CallRefused, []byte(notInRun)
	case hf == nil || args == nil:
		return pyrt.CallRefused, []byte("no such host function (it was replaced or its namespace closed)")
	case !h.reg.holds(h.gid, hf) && !h.reg.holds(h.lid, hf):
		return pyrt.CallRefused, fmt.Appendf(nil, "%s() belongs to another namespace than this run's", hf.fn.Name)
	}
	if hf.validate {
		if err := hf.resolved.Validate(validationValue(args)); err != nil {
			return pyrt.CallBadArgs, fmt.Appendf(nil, "%s() arguments do not match its schema: %v", hf.fn.Name, err)
		}
	}
	if h.ctx.Err() != nil {
		return pyrt.CallStopped, nil
	}
	result, err := callSafely(h.ctx, hf.fn, args)
	var bad *argumentsError
	switch {
	case h.ctx.Err() != nil && !h.ended.Load():
		return pyrt.CallStopped, nil // the run is being stopped: the result is dropped
	case errors.As(err, &bad):
		return pyrt.CallBadArgs, fmt.Appendf(nil, "%s() arguments do not fit its Go input: %v", hf.fn.Name, bad.err)
	case err != nil:
		return pyrt.CallError, []byte(err.Error())
	}
	status = pyrt.CallOK
	if s, ok := result.(shown); ok {
		bundles := make([]any, len(s.displays))
		for i, d := range s.displays {
			bundle := make(map[string]any, len(d.Data))
			for mime, data := range d.Data {
				bundle[mime] = data
			}
			bundles[i] = bundle
		}
		status, result = pyrt.CallShow, []any{s.value, bundles}
	}
	out, err := appendValue(nil, result, 0)
	if err != nil {
		return pyrt.CallError, fmt.Appendf(nil, "the result of %s() cannot be converted to Python: %v", hf.fn.Name, err)
	}
	return status, out
}

// callSafely calls fn, turning a panic into an error.
func callSafely(ctx context.Context, fn Function, args map[string]any) (result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("host function %s panicked: %v", fn.Name, p)
		}
	}()
	return fn.Call(ctx, args)
}

// inCall reports whether the caller is a host function of h's run (it is running inside
// callSafely while h has calls in flight, or ctx is one of h's calls' ctx): a use of the
// interpreter that waits for h would deadlock. Only called before waiting for an
// interpreter, so the stack walk costs nothing per call.
func (h *hostCalls) inCall(ctx context.Context) bool {
	if h == nil {
		return false
	}
	if ctx != nil && ctx.Value(hostCallKey{}) == h {
		return true
	}
	return h.inflight.Load() > 0 && inHostFunction()
}

var callSafelyName = runtime.FuncForPC(reflect.ValueOf(callSafely).Pointer()).Name()

// inHostFunction reports whether the calling goroutine is running a host function: its
// stack holds callSafely. (A Namespace method takes no ctx: Go has no other way to tell.)
func inHostFunction() bool {
	pcs := make([]uintptr, 256)
	for {
		n := runtime.Callers(2, pcs)
		frames := runtime.CallersFrames(pcs[:n])
		for {
			f, more := frames.Next()
			if f.Function == callSafelyName {
				return true
			}
			if !more {
				break
			}
		}
		if n < len(pcs) {
			return false
		}
		pcs = make([]uintptr, 2*len(pcs)) // a deep stack: look at all of it
	}
}

// validationValue is args as jsonschema-go validates it: big ints as float64, bytes as
// strings, the rest as is.
func validationValue(v any) any {
	return mapLeaves(v, func(leaf any) any {
		switch x := leaf.(type) {
		case *big.Int:
			f, _ := new(big.Float).SetInt(x).Float64()
			return f
		case []byte:
			return string(x)
		}
		return leaf
	})
}
