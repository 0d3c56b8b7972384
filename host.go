package minipy

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// Function is a Go function that Python code can call (see Namespace.Register).
type Function struct {
	// Name is the Python name it is bound to: an identifier, or a dotted path of them
	// ("orders.find") to group functions under a name, as a module groups them.
	Name string
	// Description is its docstring, and its line in the tool description.
	Description string
	// InputSchema is the JSON Schema (type "object") of its arguments; nil: it takes none.
	// Each property is a parameter. Python passes them positionally in the order of the
	// schema's "required" list, then the optional ones by name (Func keeps its struct's
	// field order), or by keyword.
	InputSchema map[string]any
	// OutputSchema is the JSON Schema of its result, if known: the tool description shows
	// it as the return annotation. Optional.
	OutputSchema map[string]any
	// Call does the work. args holds the arguments Python passed, already checked against
	// InputSchema, as Namespace.Get converts values (int64, float64, string, bool, nil,
	// []any, map[string]any, *big.Int, []byte). The result is converted as Namespace.Set
	// converts values; an error (or a panic) raises minipy.HostError with its text in
	// Python. ctx is cancelled when the run that called it is stopped or ends.
	Call func(ctx context.Context, args map[string]any) (any, error)
	// Inline runs Call on the in-process interpreter's own thread, while the calling
	// Python code waits, instead of handing it to a goroutine: a call then costs about half
	// as much (docs/host-functions.md has the figures). The price: a Call that ignores its
	// ctx holds the run past its deadline: the run is abandoned as one stuck in a C call
	// is (InterruptedError.Abandoned), and the interpreter stays busy until Call returns.
	// For quick functions that return when ctx is done. Calls from threads the code
	// started, and the isolated engine's, are served as usual.
	Inline bool

	err   error    // why Func could not build it
	order []string // the properties' order, when known (Func)
}

// Func builds a Function from a typed Go function. The input schema comes from In's
// fields (google/jsonschema-go: json tags name them, a field without omitempty or omitzero
// is required, a `jsonschema:"..."` tag describes it); In must be a struct. The arguments
// reach fn through their JSON form, and Out is converted as Namespace.Set converts values
// (structs through their JSON form). If In has no schema, Register reports why.
func Func[In, Out any](name, description string, fn func(context.Context, In) (Out, error)) Function {
	f := Function{Name: name, Description: description}
	in, err := jsonschema.For[In](nil)
	if err == nil && in.Type != "object" {
		err = fmt.Errorf("its input type %s is not a struct", reflect.TypeFor[In]())
	}
	if err != nil {
		f.err = err
		return f
	}
	f.order = in.PropertyOrder
	f.InputSchema, f.err = schemaMap(in)
	if out, err := jsonschema.For[Out](&jsonschema.ForOptions{IgnoreInvalidTypes: true}); err == nil {
		f.OutputSchema, _ = schemaMap(out)
	}
	f.Call = func(ctx context.Context, args map[string]any) (any, error) {
		var in In
		raw, err := json.Marshal(args)
		if err == nil {
			err = json.Unmarshal(raw, &in)
		}
		if err != nil {
			return nil, &argumentsError{err: err}
		}
		return fn(ctx, in)
	}
	return f
}

// argumentsError is an argument that the schema let through but In's JSON form refused
// (an integer too large for an int8 field, say): a TypeError in Python, like a schema
// mismatch.
type argumentsError struct{ err error }

func (e *argumentsError) Error() string { return e.err.Error() }

func schemaMap(s *jsonschema.Schema) (map[string]any, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(raw, &m)
}

// Register binds functions into the namespace, on either engine: code run with the
// namespace as Globals (or Locals) calls them like Python functions. A name that is bound
// already is replaced. On the isolated engine the functions still run here, in the host;
// a worker that replaces a lost one gets them again.
//
// Calls from Python check their arguments first (a missing, unknown or wrongly typed one
// raises TypeError, and Go is not called), then run fn on a goroutine of their own while
// the interpreter goes on: calls from several Python threads run in parallel. When the run
// is stopped (its deadline, its context) the ctx of its calls in flight is cancelled and
// the run returns on time even if a function ignores its ctx; a late result is dropped.
// Functions can be called only while a run of the namespace is in progress (a thread that
// outlives its run gets minipy.HostError).
//
// A host function must not use the interpreter that is waiting for it: a Run, CallTool or
// Namespace method on it from the function (or with its ctx) returns ErrReentrant at once.
// Other engines (and other workers of an isolated engine) serve such calls.
func (ns *Namespace) Register(fns ...Function) error {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return err
	}
	built := make([]*hostFunc, 0, len(fns))
	seen := map[string]bool{}
	for _, fn := range fns {
		hf, err := newHostFunc(fn)
		if err != nil {
			return err
		}
		if seen[fn.Name] {
			return fmt.Errorf("%w: %q is given twice", ErrInvalidFunction, fn.Name)
		}
		seen[fn.Name] = true
		built = append(built, hf)
	}
	reg := ns.engine.hosts()
	reg.add(ns.id, built)
	specs := make([]any, len(built))
	for i, hf := range built {
		specs[i] = hf.spec
	}
	_, err = ns.op(pyrt.OpRegister, specs)
	return err
}

// hostFunc is a registered Function with what its calls need.
type hostFunc struct {
	fn       Function
	id       uint64
	refs     int // the namespaces that hold it (a Fork's copy shares its functions)
	params   []hostParam
	resolved *jsonschema.Resolved
	validate bool  // the schema says more than the Python side checks (types and enums)
	spec     []any // runtime.py's make_host_function spec (id set by hostRegistry.add)
}

func newHostFunc(fn Function) (*hostFunc, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidFunction, fn.Name, fmt.Sprintf(format, args...))
	}
	if fn.err != nil {
		return nil, bad("%v", fn.err)
	}
	for _, part := range strings.Split(fn.Name, ".") {
		if !isIdentifier(part) || pythonKeywords[part] {
			return nil, bad("the name must be a Python identifier, or a dotted path of them")
		}
	}
	if fn.Call == nil {
		return nil, bad("Call is nil")
	}
	schema := fn.InputSchema
	if schema == nil {
		schema = map[string]any{"type": "object", "properties": map[string]any{}, "additionalProperties": false}
	}
	if t, ok := schema["type"]; ok && t != "object" {
		return nil, bad(`the input schema's type must be "object", not %v`, t)
	}
	var s jsonschema.Schema
	raw, err := json.Marshal(schema)
	if err == nil {
		err = json.Unmarshal(raw, &s)
	}
	var resolved *jsonschema.Resolved
	if err == nil {
		resolved, err = s.Resolve(nil)
	}
	if err != nil {
		return nil, bad("the input schema is not valid JSON Schema: %v", err)
	}
	params, open := paramsOf(schema, fn.order)
	hf := &hostFunc{fn: fn, params: params, resolved: resolved, validate: !checkedInPython(schema)}
	specParams := make([]any, 0, len(params))
	for _, p := range params {
		var enum any
		if p.enum != nil {
			enum = p.enum
		}
		specParams = append(specParams, []any{p.key, p.py, p.ann, p.required, p.hasDefault, p.def,
			anySlice(p.types), enum})
	}
	hf.spec = []any{fn.Name, int64(0), docstring(fn, params), specParams, returnAnnotation(fn.OutputSchema), open, fn.Inline}
	return hf, nil
}

// WithDisplays is a host function's result that also shows displays: the code gets value,
// and each display is shown as if the code had called display() on it as the call
// returned. Its text form (for an image, "[image N: PNG 640x480, 23 KB]") is printed where
// the call was made, it is in Result.Displays, and CallToolResult sends its image to the
// model, within Options.MaxImages and MaxImageBytes. Give each display a "text/plain" that
// says what it is; without one, its Markdown, LaTeX, JSON or HTML stands in, or else
// "<display from NAME()>".
func WithDisplays(value any, displays ...Display) any {
	return shown{value: value, displays: displays}
}

// shown is WithDisplays' result.
type shown struct {
	value    any
	displays []Display
}
