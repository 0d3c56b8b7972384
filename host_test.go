package minipy_test

import (
	"context"
	"errors"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// hostEnv is a namespace of one engine with host functions registered.
type hostEnv struct {
	eng  minipy.Engine
	ns   *minipy.Namespace
	opts *minipy.Options
}

func newHostEnv(t *testing.T, eng minipy.Engine, fns ...minipy.Function) *hostEnv {
	t.Helper()
	ns := eng.NewNamespace()
	t.Cleanup(func() { ns.Close() })
	require.NoError(t, ns.Register(fns...))
	return &hostEnv{eng: eng, ns: ns, opts: &minipy.Options{Globals: ns, Timeout: 20 * time.Second}}
}

func (h *hostEnv) run(t *testing.T, code string) (*minipy.Result, error) {
	t.Helper()
	return h.eng.Run(context.Background(), code, h.opts)
}

func (h *hostEnv) value(t *testing.T, code string) any {
	t.Helper()
	r, err := h.run(t, code)
	require.NoError(t, err)
	return r.Value
}

// pyErr runs code that must raise and returns the Python error.
func (h *hostEnv) pyErr(t *testing.T, code string) *minipy.PythonError {
	t.Helper()
	_, err := h.run(t, code)
	var pe *minipy.PythonError
	require.ErrorAs(t, err, &pe)
	return pe
}

func object(required []any, props map[string]any) map[string]any {
	s := map[string]any{"type": "object", "properties": props}
	if required != nil {
		s["required"] = required
	}
	return s
}

func TestHostCallArguments(t *testing.T) {
	var calls atomic.Int64
	var last atomic.Value
	weather := minipy.Function{
		Name:        "get_weather",
		Description: "Forecast for a city.\nMore detail.",
		InputSchema: object([]any{"city"}, map[string]any{
			"city": map[string]any{"type": "string", "description": "A city name."},
			"days": map[string]any{"type": "integer", "default": 1},
			"unit": map[string]any{"type": "string", "enum": []any{"c", "f"}},
		}),
		Call: func(_ context.Context, args map[string]any) (any, error) {
			calls.Add(1)
			last.Store(args)
			return map[string]any{"city": args["city"], "days": args["days"]}, nil
		},
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, weather)
			calls.Store(0)

			assert.Equal(t, map[string]any{"city": "Oslo", "days": int64(1)}, h.value(t, "get_weather('Oslo')"))
			assert.Equal(t, map[string]any{"city": "Oslo", "city2": nil}["city"], h.value(t, "get_weather('Oslo', 3)['city']"))
			assert.Equal(t, int64(3), h.value(t, "get_weather(days=3, city='Oslo')['days']"))
			h.value(t, "get_weather('Oslo', unit='f')")
			assert.Equal(t, map[string]any{"city": "Oslo", "days": int64(1), "unit": "f"}, last.Load())
			// An optional argument without a default that is not passed is not sent.
			h.value(t, "get_weather('Oslo', unit=None)")
			assert.Equal(t, map[string]any{"city": "Oslo", "days": int64(1)}, last.Load())
			assert.Equal(t, int64(5), calls.Load())

			// Wrong arguments raise TypeError (or ValueError for a value outside the enum)
			// in Python's own words, and Go is not called.
			for code, want := range map[string]string{
				"get_weather()":                    "get_weather() missing 1 required positional argument: 'city'",
				"get_weather('Oslo', town='x')":    "get_weather() got an unexpected keyword argument 'town'",
				"get_weather(3)":                   "get_weather() argument 'city' must be str, not int",
				"get_weather('Oslo', days='2')":    "get_weather() argument 'days' must be int, not str",
				"get_weather('Oslo', days=True)":   "get_weather() argument 'days' must be int, not bool",
				"get_weather('Oslo', 1, 'c', 4)":   "get_weather() takes from 1 to 3 positional arguments but 4 were given",
				"get_weather('Oslo', days={1, 2})": "get_weather() argument 'days' must be int, not set",
			} {
				pe := h.pyErr(t, code)
				assert.Equal(t, "TypeError", pe.Type, code)
				assert.Equal(t, want, pe.Message, code)
			}
			pe := h.pyErr(t, "get_weather('Oslo', unit='k')")
			assert.Equal(t, "ValueError", pe.Type)
			assert.Equal(t, "get_weather() argument 'unit' must be one of 'c', 'f', not 'k'", pe.Message)
			assert.Equal(t, int64(5), calls.Load(), "Go was called with wrong arguments")

			// A real function: signature, docstring, help(). (3.14 writes Optional[X] as
			// X | None: typing's Union and the | type are one since then.)
			optional := "Optional[Literal['c', 'f']]"
			if minipy.LinkedVersion() >= "3.14" {
				optional = "Literal['c', 'f'] | None"
			}
			assert.Equal(t, "(city: str, days: int = 1, unit: "+optional+" = None)",
				h.value(t, "import inspect; str(inspect.signature(get_weather))"))
			assert.Equal(t, "Forecast for a city.\nMore detail.\n\nArgs:\n    city: A city name.",
				h.value(t, "get_weather.__doc__"))
		})
	}
}

func TestHostCallValues(t *testing.T) {
	echo := minipy.Function{
		Name:        "echo",
		InputSchema: object(nil, map[string]any{"x": map[string]any{}}),
		Call: func(_ context.Context, args map[string]any) (any, error) {
			return map[string]any{"x": args["x"], "type": strings.TrimPrefix(typeName(args["x"]), "*")}, nil
		},
	}
	type point struct {
		X, Y int
		Tag  string `json:"tag,omitempty"`
	}
	values := minipy.Function{
		Name: "values",
		Call: func(context.Context, map[string]any) (any, error) {
			return []any{nil, true, int64(-3), 2.5, "é", []byte{0, 1}, new(big.Int).Lsh(big.NewInt(1), 80),
				point{X: 1, Y: 2}, []int{1, 2}, map[string]float32{"a": 1.5}}, nil
		},
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, echo, values)
			assert.Equal(t, "[None, True, -3, 2.5, 'é', b'\\x00\\x01', 1208925819614629174706176, {'X': 1, 'Y': 2}, [1, 2], {'a': 1.5}]",
				h.value(t, "repr(values())"))
			for code, want := range map[string]any{
				"echo(2**80)['type']":           "big.Int",
				"echo(b'ab')['type']":           "[]uint8",
				"echo([1, 'a'])['type']":        "[]interface {}",
				"echo({'k': None})['x']":        map[string]any{"k": nil},
				"echo(1.5)['x']":                1.5,
				"echo()['x'] is None":           true,
				"echo(x=(1, 2))['x']":           []any{int64(1), int64(2)},
				"type(echo(True)['x']) is bool": true,
			} {
				assert.Equal(t, want, h.value(t, code), code)
			}
			pe := h.pyErr(t, "echo({1, 2})")
			assert.Equal(t, "TypeError", pe.Type)
			assert.Contains(t, pe.Message, "echo() argument 'x' cannot be passed to Go: set")
		})
	}
}

func typeName(v any) string {
	switch v.(type) {
	case *big.Int:
		return "big.Int"
	case []byte:
		return "[]uint8"
	case []any:
		return "[]interface {}"
	}
	return "other"
}

func TestHostErrors(t *testing.T) {
	fail := minipy.Function{Name: "fail", Call: func(context.Context, map[string]any) (any, error) {
		return nil, errors.New("no such order: 42")
	}}
	boom := minipy.Function{Name: "boom", Call: func(context.Context, map[string]any) (any, error) {
		panic("kaboom")
	}}
	bad := minipy.Function{Name: "bad", Call: func(context.Context, map[string]any) (any, error) {
		return make(chan int), nil
	}}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, fail, boom, bad)
			pe := h.pyErr(t, "x = 1\nfail()")
			assert.Equal(t, "minipy.HostError", pe.Type)
			assert.Equal(t, "no such order: 42", pe.Message)
			// The user's call line, none of minipy's frames.
			// (3.13 underlines the call: "    ~~~~^^".)
			assert.Regexp(t, `^Traceback \(most recent call last\):\n  File "<cell-\d+>", line 2, in <module>\n    fail\(\)\n(    [~^]+\n)?minipy.HostError: no such order: 42\n$`, pe.Traceback)

			pe = h.pyErr(t, "boom()")
			assert.Equal(t, "minipy.HostError", pe.Type)
			assert.Equal(t, "host function boom panicked: kaboom", pe.Message)

			pe = h.pyErr(t, "bad()")
			assert.Equal(t, "minipy.HostError", pe.Type)
			assert.Contains(t, pe.Message, "the result of bad() cannot be converted to Python")

			// Code catches it like any exception, through the minipy module.
			assert.Equal(t, "caught: no such order: 42", h.value(t, `
import minipy
try:
    fail()
except minipy.HostError as e:
    r = "caught: " + str(e)
r`))
			assert.Equal(t, true, h.value(t, "issubclass(minipy.HostError, Exception)"))
		})
	}
}

// A run that times out while a host function ignores its ctx returns at its deadline; the
// function's ctx is cancelled then; its late result is dropped.
func TestHostCallTimeout(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			cancelled := make(chan time.Time, 1)
			release := make(chan struct{})
			stuck := minipy.Function{Name: "stuck", Call: func(ctx context.Context, _ map[string]any) (any, error) {
				go func() {
					<-ctx.Done()
					cancelled <- time.Now()
				}()
				<-release // ignores its ctx
				return "late", nil
			}}
			h := newHostEnv(t, e.eng, stuck)
			h.opts.Timeout = 300 * time.Millisecond
			start := time.Now()
			_, err := h.run(t, "stuck()")
			took := time.Since(start)
			require.ErrorIs(t, err, minipy.ErrTimeout)
			assert.NotErrorIs(t, err, minipy.ErrStateLost)
			var pe *minipy.PythonError
			require.ErrorAs(t, err, &pe)
			assert.Contains(t, pe.Traceback, "stuck()")
			assert.NotContains(t, pe.Traceback, "minipy-runtime")
			assert.Less(t, took, 2*time.Second, "the run waited for the function")
			select {
			case at := <-cancelled:
				assert.Less(t, at.Sub(start), 2*time.Second)
			case <-time.After(5 * time.Second):
				t.Fatal("the function's ctx was not cancelled")
			}
			close(release) // the late result goes nowhere
			h.opts.Timeout = 20 * time.Second
			assert.Equal(t, int64(2), h.value(t, "1+1"), "the namespace works on")
			assert.Equal(t, "late", h.value(t, "stuck()"), "the function works on")
		})
	}
}

func TestHostCallCancel(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			entered := make(chan struct{}, 1)
			wait := minipy.Function{Name: "wait", Call: func(ctx context.Context, _ map[string]any) (any, error) {
				entered <- struct{}{}
				<-ctx.Done()
				return nil, ctx.Err()
			}}
			h := newHostEnv(t, e.eng, wait)
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				<-entered
				cancel()
			}()
			_, err := h.eng.Run(ctx, "wait()", h.opts)
			require.ErrorIs(t, err, context.Canceled)
		})
	}
}

// Calls from several Python threads of one run proceed at once: the function below returns
// only when four calls are in it together.
func TestHostCallsInParallel(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			var mu sync.Mutex
			in := 0
			all := make(chan struct{})
			meet := minipy.Function{Name: "meet", Call: func(ctx context.Context, _ map[string]any) (any, error) {
				mu.Lock()
				in++
				if in == 4 {
					close(all)
				}
				mu.Unlock()
				select {
				case <-all:
					return "met", nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}}
			h := newHostEnv(t, e.eng, meet)
			h.opts.Timeout = 10 * time.Second
			got := h.value(t, `
import threading
out = []
ts = [threading.Thread(target=lambda: out.append(meet())) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
out`)
			assert.Equal(t, []any{"met", "met", "met", "met"}, got)
		})
	}
}

// A host function that uses the interpreter waiting for it gets ErrReentrant at once; one
// that uses another engine is served.
func TestHostCallReentry(t *testing.T) {
	other := newIsolated(t, minipy.IsolatedConfig{})
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			var h *hostEnv
			var errs sync.Map
			reenter := minipy.Function{Name: "reenter", Call: func(ctx context.Context, _ map[string]any) (any, error) {
				_, err := h.eng.Run(ctx, "1", nil)
				errs.Store("run", err)
				_, err = h.ns.Get("x")
				errs.Store("get", err)
				errs.Store("set", h.ns.Set("y", 1))
				_, err = h.eng.Run(context.Background(), "1", h.opts)
				errs.Store("run-background", err)
				r, err := other.Run(ctx, "6*7", nil)
				if err != nil {
					return nil, err
				}
				return r.Value, nil
			}}
			h = newHostEnv(t, e.eng, reenter)
			start := time.Now()
			assert.Equal(t, int64(42), h.value(t, "x = 1\nreenter()"))
			assert.Less(t, time.Since(start), 5*time.Second)
			for _, k := range []string{"run", "get", "set", "run-background"} {
				err, _ := errs.Load(k)
				if k == "run" && e.name == "isolated" {
					// The default namespace is a worker of its own: no interpreter waits.
					assert.Nil(t, err, k)
					continue
				}
				require.NotNil(t, err, k)
				assert.ErrorIs(t, err.(error), minipy.ErrReentrant, k)
			}
		})
	}
}

// A namespace's functions are its own: another namespace cannot call them, even by id.
func TestHostFunctionsBelongToTheirNamespace(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			var calls atomic.Int64
			secret := minipy.Function{Name: "secret", Call: func(context.Context, map[string]any) (any, error) {
				calls.Add(1)
				return "s3cret", nil
			}}
			a := newHostEnv(t, e.eng, secret)
			assert.Equal(t, "s3cret", a.value(t, "secret()"))
			b := newHostEnv(t, e.eng)
			pe := b.pyErr(t, "secret()")
			assert.Equal(t, "NameError", pe.Type)
			// Forged calls from b with every plausible function id.
			got := b.value(t, `
import sys
rt = sys.modules['_minipy_runtime']
msgs = set()
for fid in range(200):
    try:
        rt._call(fid, 'x', {})
    except Exception as e:
        msgs.add(type(e).__name__)
sorted(msgs)`)
			assert.Equal(t, []any{"HostError"}, got)
			assert.Equal(t, int64(1), calls.Load(), "another namespace's run called the function")
		})
	}
}

// Functions can be called only during a run of their namespace: a thread that outlives its
// run gets HostError.
func TestHostCallOutsideRun(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, addFunction)
			h.value(t, `
import threading, time
result = []
def later():
    time.sleep(0.3)
    try:
        result.append(add(1, 2))
    except Exception as e:
        result.append(type(e).__name__ + ": " + str(e))
threading.Thread(target=later).start()`)
			// (Get is no run: polling with it leaves the thread no run to call in.)
			var result any
			require.Eventually(t, func() bool {
				v, err := h.ns.Get("result")
				result = v
				return err == nil && len(v.([]any)) > 0
			}, 30*time.Second, 10*time.Millisecond, "the thread's call")
			assert.Equal(t, []any{"HostError: host functions can be called only while a run of their namespace is in progress"},
				result)
		})
	}
}

type orderQuery struct {
	Customer string `json:"customer" jsonschema:"the customer's name"`
	Status   string `json:"status,omitempty"`
	Limit    int    `json:"limit,omitempty"`
}

type order struct {
	ID       int       `json:"id"`
	Customer string    `json:"customer"`
	Total    float64   `json:"total"`
	Placed   time.Time `json:"placed"`
	Note     string    `json:"note,omitempty"`
}

func TestFunc(t *testing.T) {
	placed := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var got orderQuery
	find := minipy.Func("orders.find", "Find a customer's orders.", func(_ context.Context, q orderQuery) ([]order, error) {
		got = q
		return []order{{ID: 7, Customer: q.Customer, Total: 12.5, Placed: placed}}, nil
	})
	assert.Equal(t, map[string]any{
		"type":                 "object",
		"additionalProperties": false,
		"required":             []any{"customer"},
		"properties": map[string]any{
			"customer": map[string]any{"type": "string", "description": "the customer's name"},
			"status":   map[string]any{"type": "string"},
			"limit":    map[string]any{"type": "integer"},
		},
	}, find.InputSchema)
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, find)
			assert.Equal(t, []any{map[string]any{"id": int64(7), "customer": "ann", "total": 12.5, "placed": "2026-11-30T12:00:00Z"}},
				h.value(t, "orders.find('ann', limit=3)"))
			assert.Equal(t, orderQuery{Customer: "ann", Limit: 3}, got)
			assert.Equal(t, "(customer: str, status: str | None = None, limit: int | None = None) -> list[dict]",
				h.value(t, "import inspect; str(inspect.signature(orders.find))"))
			assert.Equal(t, "<host functions orders: find>", h.value(t, "repr(orders)"))
		})
	}
}

func TestRegisterRefuses(t *testing.T) {
	ok := func(context.Context, map[string]any) (any, error) { return nil, nil }
	ns := minipy.NewNamespace()
	defer ns.Close()
	for name, fn := range map[string]minipy.Function{
		"bad name":     {Name: "my-func", Call: ok},
		"keyword":      {Name: "class", Call: ok},
		"empty part":   {Name: "a..b", Call: ok},
		"nil call":     {Name: "f"},
		"not object":   {Name: "f", Call: ok, InputSchema: map[string]any{"type": "string"}},
		"bad schema":   {Name: "f", Call: ok, InputSchema: map[string]any{"type": "object", "properties": 3}},
		"not a struct": minipy.Func("f", "", func(context.Context, int) (int, error) { return 0, nil }),
		"func field":   minipy.Func("f", "", func(context.Context, struct{ F func() }) (int, error) { return 0, nil }),
	} {
		err := ns.Register(fn)
		assert.ErrorIs(t, err, minipy.ErrInvalidFunction, name)
	}
	assert.ErrorIs(t, ns.Register(minipy.Function{Name: "f", Call: ok}, minipy.Function{Name: "f", Call: ok}), minipy.ErrInvalidFunction)
	closed := minipy.NewNamespace()
	closed.Close()
	assert.ErrorIs(t, closed.Register(minipy.Function{Name: "f", Call: ok}), minipy.ErrNamespaceClosed)
}

// Parameters whose names are not identifiers are passed by keyword; a keyword name gets a
// trailing underscore; a schema constraint Python does not check is checked in Go.
func TestHostParameterNames(t *testing.T) {
	var last atomic.Value
	fn := minipy.Function{
		Name: "query",
		InputSchema: object([]any{"from"}, map[string]any{
			"from":      map[string]any{"type": "string"},
			"max-n":     map[string]any{"type": "integer", "minimum": 1},
			"_minipy_a": map[string]any{"type": "integer"},
		}),
		Call: func(_ context.Context, args map[string]any) (any, error) {
			last.Store(args)
			return nil, nil
		},
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, fn)
			h.value(t, "query('x', **{'max-n': 2, '_minipy_a': 1})")
			assert.Equal(t, map[string]any{"from": "x", "max-n": int64(2), "_minipy_a": int64(1)}, last.Load())
			h.value(t, "query(from_='y')")
			assert.Equal(t, map[string]any{"from": "y"}, last.Load())
			pe := h.pyErr(t, "query('x', **{'max-n': 0})")
			assert.Equal(t, "TypeError", pe.Type)
			assert.Contains(t, pe.Message, "query() arguments do not match its schema")
			pe = h.pyErr(t, "query('x', **{'max-n': 'a'})")
			assert.Equal(t, "query() argument 'max-n' must be int, not str", pe.Message)
		})
	}
}

// Registering a name again replaces the function; the old one's id is gone.
func TestRegisterReplaces(t *testing.T) {
	v := func(s string) minipy.Function {
		return minipy.Function{Name: "version", Call: func(context.Context, map[string]any) (any, error) { return s, nil }}
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, v("one"))
			h.value(t, "old = version")
			require.NoError(t, h.ns.Register(v("two")))
			assert.Equal(t, "two", h.value(t, "version()"))
			pe := h.pyErr(t, "old()")
			assert.Equal(t, "minipy.HostError", pe.Type)
		})
	}
}

// A worker that replaces a crashed one gets the namespace's functions again.
func TestHostFunctionsSurviveWorkerLoss(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	h := newHostEnv(t, e, addFunction)
	assert.Equal(t, int64(3), h.value(t, "add(1, 2)"))
	_, err := h.run(t, "import os; os._exit(3)")
	require.ErrorIs(t, err, minipy.ErrStateLost)
	// The replacement worker starts the namespace empty, with its functions.
	assert.Equal(t, int64(5), h.value(t, "add(2, 3)"))
	assert.Equal(t, []string{"add"}, names(t, h.ns))
}

func TestToolSchemaListsFunctions(t *testing.T) {
	weather := minipy.Function{
		Name:         "get_weather",
		Description:  "Forecast for a city.\nIgnored second line.",
		InputSchema:  object([]any{"city"}, map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer", "default": 1}, "unit": map[string]any{"enum": []any{"c", "f"}}}),
		OutputSchema: map[string]any{"type": "object"},
		Call:         func(context.Context, map[string]any) (any, error) { return nil, nil },
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, weather, addFunction)
			desc := e.eng.ToolSchemaFor(h.opts).Description
			assert.Contains(t, desc, "\n  add(a: int, b: int) — Add two integers.")
			assert.Contains(t, desc, "\n  get_weather(city: str, days: int = 1, unit: Literal[\"c\", \"f\"] | None = None) -> dict — Forecast for a city.")
			assert.NotContains(t, e.eng.ToolSchemaFor(nil).Description, "get_weather")
			same := *h.opts
			same.Locals = h.ns
			assert.Equal(t, 1, strings.Count(e.eng.ToolSchemaFor(&same).Description, "add(a: int"), "listed once")

			var many []minipy.Function
			for i := range 100 {
				f := addFunction
				f.Name = "add" + string(rune('a'+i/26)) + string(rune('a'+i%26))
				many = append(many, f)
			}
			require.NoError(t, h.ns.Register(many...))
			desc = e.eng.ToolSchemaFor(h.opts).Description
			assert.Contains(t, desc, "... and 42 more")
		})
	}
}

type base struct {
	ID int `json:"id"`
}

type item struct {
	base
	Name    string     `json:"name"`
	Price   float64    `json:"price"`
	Hidden  string     `json:"-"`
	Note    string     `json:"note,omitempty"`
	Count   int        `json:",omitempty"`
	When    time.Time  `json:"when"`
	Parent  *item      `json:"parent,omitempty"`
	secret  string     //nolint:unused // unexported: not part of the JSON form
	Created *time.Time `json:"created,omitzero"`
}

// Set (and host function results) convert structs as their JSON form, keeping Go's number
// types: a whole float64 stays a float.
func TestSetStruct(t *testing.T) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	require.NoError(t, ns.Set("it", &item{base: base{ID: 3}, Name: "pen", Price: 2, Hidden: "x", When: when, secret: "s"}))
	r, err := minipy.Minipy("it", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	assert.Equal(t, "{'id': 3, 'name': 'pen', 'price': 2.0, 'when': '2026-01-02T03:04:05Z'}", r.Repr)
	assert.ErrorIs(t, ns.Set("bad", struct{ C chan int }{}), minipy.ErrUnsupportedValue)
}

// Functions registered before and after a worker was lost are all there in its replacement.
func TestRegisterAfterWorkerLoss(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{NoRollback: true})
	h := newHostEnv(t, e, addFunction)
	_, err := h.run(t, "import os; os._exit(3)")
	require.ErrorIs(t, err, minipy.ErrStateLost)
	double := minipy.Function{Name: "double", InputSchema: object([]any{"x"}, map[string]any{"x": map[string]any{"type": "integer"}}),
		Call: func(_ context.Context, args map[string]any) (any, error) { return 2 * args["x"].(int64), nil }}
	require.NoError(t, h.ns.Register(double))
	assert.Equal(t, int64(10), h.value(t, "double(add(2, 3))"))
}
