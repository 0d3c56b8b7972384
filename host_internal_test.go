package minipy

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A loop of quick host calls needs one or two call servers (each a goroutine blocked in C,
// so an OS thread): a server is started only when none waits, and one that is starting
// counts as waiting (once, every call started one while the first was still starting).
func TestCallServersStayFew(t *testing.T) {
	ns := NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.Register(Function{Name: "one", Call: func(context.Context, map[string]any) (any, error) { return 1, nil }}))
	// (Each call is a hand-off between two threads: on a machine loaded 4x its cores, each
	// waits for a CPU, and 20,000 calls took over a minute under -race. 15,000 in three runs
	// are still hand-offs back to back; the timeout bounds only a run that never ends.)
	opts := &Options{Globals: ns, Timeout: 10 * time.Minute}
	for range 3 {
		r, err := Run(context.Background(), "sum(one() for _ in range(5000))", opts)
		require.NoError(t, err)
		assert.Equal(t, int64(5000), r.Value)
	}
	e, err := inProcess()
	require.NoError(t, err)
	assert.LessOrEqual(t, e.servers.Load(), int32(4))
}

// The Python signature of a schema, as the tool description shows it.
func TestSignature(t *testing.T) {
	hf, err := newHostFunc(Function{
		Name: "f",
		InputSchema: map[string]any{"type": "object", "required": []any{"b", "a"}, "properties": map[string]any{
			"a":    map[string]any{"type": "string"},
			"b":    map[string]any{"type": []any{"integer", "null"}},
			"c":    map[string]any{"type": "array", "items": map[string]any{"type": "number"}, "default": []any{1.5}},
			"d":    map[string]any{"anyOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "null"}}},
			"e":    map[string]any{"enum": []any{"x", 2.0, true, nil}},
			"f-g":  map[string]any{"type": "object"},
			"from": map[string]any{},
		}},
		OutputSchema: map[string]any{"type": []any{"null", "array"}, "items": map[string]any{"type": "object"}},
		Call:         func(context.Context, map[string]any) (any, error) { return nil, nil },
	})
	require.NoError(t, err)
	assert.Equal(t, `f(b: int | None, a: str, c: list[float] = [1.5], d: str | None = None, e: Literal["x", 2, True, None] = None, `+
		`**{"f-g"}: dict | None = None, from_: Any = None) -> list[dict]`, hf.signature())
	assert.True(t, hf.validate, "minimum-free, but items and a default: checked in Go too")
}

func TestIdentifier(t *testing.T) {
	for in, want := range map[string]string{"get-sum": "get_sum", "2fa": "_2fa", "class": "class_", "": "_", "ünï": "ünï", "a.b": "a_b"} {
		assert.Equal(t, want, Identifier(in), in)
	}
}
