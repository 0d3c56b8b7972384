package minipy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/worker"
)

// Fuzz targets for what reaches the host from outside: the model's tool arguments, the
// values and replies a worker sends (its code can reach the protocol descriptor and forge
// them), and the worker's frame stream. `make test` runs each for a few seconds, `make
// fuzz` longer; seeds and every crash found live in testdata/fuzz.

func FuzzToolArguments(f *testing.F) {
	for _, seed := range []string{
		`{"code": "1 + 1"}`, `{"code": "print(1)", "timeout": 30}`, `{"code": "x", "timeout": "30s"}`,
		`"{\"code\": \"1\"}"`, `{"code": "\"print(1)\""}`, `{"code": "x", "timeout": "1e400"}`,
		`{"code": "x", "timeout": -5}`, `{"code": null}`, `{"code": ""}`, `null`, `[]`, `{}`, `{"code": 5}`,
		`{"code": "x", "timeout": {"s": 1}}`, `{"code": "x", "extra": [1, 2]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		args, err := parseToolArguments(input)
		if err != nil {
			var bad *argumentError
			if !errors.As(err, &bad) || bad.problem == "" {
				t.Fatalf("not an argument error the model can read: %T %v", err, err)
			}
			_ = badArguments(err, toolLimits{output: 2000})
			return
		}
		if strings.TrimSpace(args.code) == "" {
			t.Fatalf("accepted empty code from %q", input)
		}
		if args.timeout < 0 {
			t.Fatalf("negative timeout %v from %q", args.timeout, input)
		}
	})
}

func FuzzValueCodec(f *testing.F) {
	for _, v := range []any{
		nil, true, int64(-7), 3.5, "héllo", []byte{0, 1}, new(big.Int).Lsh(big.NewInt(1), 100),
		[]any{int64(1), "a", nil}, map[string]any{"k": []any{map[string]any{}}},
	} {
		b, err := appendValue(nil, v, 0)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("X"))
	f.Add(bytes.Repeat([]byte("l\x01\x00\x00\x00"), 200)) // deeper than maxValueDepth
	f.Fuzz(func(t *testing.T, data []byte) {
		// Replies built on values: whatever the bytes, an error or a result, never a panic.
		_, _ = opReply(data)
		_, _ = runReply(data, &Result{})
		d := decoder{buf: data}
		v, err := d.value()
		if err != nil || hasOpaque(v) {
			return
		}
		// A decoded value encodes again, and that encoding is stable.
		enc, err := appendValue(nil, v, 0)
		if err != nil {
			t.Fatalf("decoded %#v but cannot encode it: %v", v, err)
		}
		d2 := decoder{buf: enc}
		v2, err := d2.value()
		if err != nil {
			t.Fatalf("cannot decode our own encoding %q: %v", enc, err)
		}
		enc2, err := appendValue(nil, v2, 0)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("unstable encoding: %q then %q (%v)", enc, enc2, err)
		}
	})
}

func hasOpaque(v any) bool {
	switch x := v.(type) {
	case opaque:
		return true
	case []any:
		for _, e := range x {
			if hasOpaque(e) {
				return true
			}
		}
	case map[string]any:
		for _, e := range x {
			if hasOpaque(e) {
				return true
			}
		}
	}
	return false
}

func frame(kind byte, payload ...[]byte) []byte {
	body := append([]byte{kind}, bytes.Join(payload, nil)...)
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func FuzzWorkerFrames(f *testing.F) {
	ready, _ := appendValue(nil, []any{"3.11.2", "/usr/bin/python3", int64(2)}, 0)
	answer := append(binary.LittleEndian.AppendUint64(nil, 1), 0, 0, 'F', 'N')
	f.Add(frame('Y', ready))
	f.Add(append(frame('Y', ready), frame('A', answer)...))
	f.Add(frame('X', []byte{9, 0, 0, 0}))
	f.Add(frame('A', answer[:5]))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f, 'A'})
	call, _ := appendValue(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 1), 7),
		[]any{int64(1), map[string]any{"a": int64(1)}}, 0)
	f.Add(frame('C', call))
	f.Fuzz(func(t *testing.T, stream []byte) {
		r, wr, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		go func() {
			wr.Write(stream) //nolint:errcheck // the reader may stop first
			wr.Close()
		}()
		w := worker.Reading(r, 1<<20)
		live := newLiveOutput(&Options{Stdout: io.Discard, Stderr: io.Discard})
		defer live.finish()
		// Host calls of run 1, none registered: each is answered, refused.
		calls := newHostCalls(context.Background(), deadline{}, &hostRegistry{}, 2, 0, func(uint64, byte, []byte) {})
		defer calls.end()
		for i := 0; i < 1000; i++ {
			body, err := w.ReadFrame(time.Now().Add(5 * time.Second))
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal("the reader hung on a finished stream")
				}
				return
			}
			if len(body) == 0 {
				t.Fatal("an empty frame body")
			}
			switch body[0] {
			case 'Y':
				_, _, _ = readyFrame(body[1:])
			case 'A':
				if len(body) >= 10 {
					_, _ = runReply(body[10:], &Result{})
				}
			case 'O', 'C':
				_ = runEvents{live: live, calls: calls}.event(body, 1) // run id 1: the seeds' events apply
			}
		}
	})
}

// TestValueDepthLimit: the decoder stops at the depth limit the two sides of the codec share.
func TestValueDepthLimit(t *testing.T) {
	deep := bytes.Repeat([]byte("l\x01\x00\x00\x00"), maxValueDepth+1)
	d := decoder{buf: append(deep, 'N')}
	if _, err := d.value(); !errors.Is(err, errTruncated) {
		t.Fatalf("a value deeper than the limit decoded: %v", err)
	}
	ok := append(bytes.Repeat([]byte("l\x01\x00\x00\x00"), maxValueDepth), 'N')
	d = decoder{buf: ok}
	if _, err := d.value(); err != nil {
		t.Fatalf("a value at the limit did not decode: %v", err)
	}
}

// TestValueCountIsNotTrusted: a dict's item count is a claim of the worker's; the decoder
// sizes nothing by it beyond what the bytes that follow could hold (a map presized by a
// claimed 4M entries took 320 MB for a 4 MB buffer).
func TestValueCountIsNotTrusted(t *testing.T) {
	const n = 4 << 20
	buf := append([]byte{'d'}, binary.LittleEndian.AppendUint32(nil, n)...)
	buf = append(buf, bytes.Repeat([]byte{0xff}, n)...) // no valid entry
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d := decoder{buf: buf}
	_, err := d.value()
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, errTruncated)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(32<<20), "allocated by the claimed count")
}
