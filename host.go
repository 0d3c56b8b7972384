package minipy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"

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

// hostParam is one property of a Function's input schema as a Python parameter.
type hostParam struct {
	key        string // the property's name
	py         string // the parameter's name ("" when only **kwargs can pass it)
	ann        string // its annotation, as Python source
	required   bool
	hasDefault bool
	def        any
	types      []string // its JSON types ([]: any)
	enum       []any    // nil: any value
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
	hf.spec = []any{fn.Name, int64(0), docstring(fn, params), specParams, returnAnnotation(fn.OutputSchema), open}
	return hf, nil
}

// checkedInPython reports whether the checks of the generated Python function (each
// argument's JSON type and enum, required and unknown names) are all that schema asks
// for; otherwise each call is validated against it in Go as well.
func checkedInPython(schema map[string]any) bool {
	for k := range schema {
		switch k {
		case "type", "properties", "required", "additionalProperties", "description", "title", "$schema", "$id":
		default:
			return false
		}
	}
	if ap, ok := schema["additionalProperties"]; ok {
		if _, isBool := ap.(bool); !isBool {
			return false
		}
	}
	props, _ := schema["properties"].(map[string]any)
	for _, p := range props {
		prop, ok := p.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range prop {
			switch k {
			case "type", "enum", "const", "description", "title", "default", "examples":
			case "anyOf", "oneOf":
				alts, _ := v.([]any)
				for _, alt := range alts {
					m, _ := alt.(map[string]any)
					if _, ok := m["type"].(string); !ok || len(m) != 1 {
						return false
					}
				}
			default:
				return false
			}
		}
	}
	return true
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// paramsOf turns an object schema's properties into parameters: required ones first (in
// the "required" list's order, or order's when given), then the others (in order's order,
// else by name). open reports whether additionalProperties lets other names through.
func paramsOf(schema map[string]any, order []string) (params []hostParam, open bool) {
	props, _ := schema["properties"].(map[string]any)
	required := map[string]bool{}
	var reqOrder []string
	if list, ok := schema["required"].([]any); ok {
		for _, r := range list {
			if name, ok := r.(string); ok && props[name] != nil && !required[name] {
				required[name] = true
				reqOrder = append(reqOrder, name)
			}
		}
	}
	rank := map[string]int{}
	for i, name := range order {
		rank[name] = i + 1
	}
	names := make([]string, 0, len(props))
	for name := range props {
		names = append(names, name)
	}
	// Required first; each group in order's order when known (Func: the struct's fields),
	// else required ones as "required" lists them and optional ones by name.
	pos := func(name string) int {
		if i := slices.Index(order, name); i >= 0 {
			return i
		}
		if i := slices.Index(reqOrder, name); i >= 0 && len(order) == 0 {
			return i
		}
		return len(order) + len(reqOrder) // unranked: after the ranked ones, by name
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := names[i], names[j]
		if required[a] != required[b] {
			return required[a]
		}
		if pa, pb := pos(a), pos(b); pa != pb {
			return pa < pb
		}
		return a < b
	})
	used := map[string]bool{}
	for _, name := range names {
		prop, _ := props[name].(map[string]any)
		p := hostParam{key: name, required: required[name]}
		p.types, p.enum = jsonTypes(prop)
		p.ann = annotation(prop)
		if def, ok := prop["default"]; ok && !p.required {
			p.hasDefault, p.def = true, jsonToPython(def)
		}
		if !p.required && !p.hasDefault && p.ann != "Any" && !slices.Contains(p.types, "null") &&
			(p.enum == nil || !slices.Contains(p.enum, any(nil))) {
			p.ann += " | None"
		}
		py := name
		if pythonKeywords[py] {
			py += "_" // `from` is passed as from_, the PEP 8 way
		}
		if isIdentifier(py) && !strings.HasPrefix(py, "_minipy_") && !used[py] {
			p.py = py
			used[py] = true
		}
		params = append(params, p)
	}
	switch ap := schema["additionalProperties"].(type) {
	case bool:
		open = ap
	case map[string]any:
		open = true
	case nil:
		// JSON Schema allows any other property by default, but a model that passes an
		// unknown name has made a mistake: only a schema that says so takes more.
		open = false
	}
	return params, open
}

// jsonTypes is the JSON types a property schema allows (none: any) and its enum.
func jsonTypes(prop map[string]any) (types []string, enum []any) {
	switch t := prop["type"].(type) {
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok {
				types = append(types, s)
			}
		}
	}
	if types == nil {
		// anyOf/oneOf of plain types, as in {"anyOf": [{"type": "string"}, {"type": "null"}]}.
		for _, key := range []string{"anyOf", "oneOf"} {
			alts, _ := prop[key].([]any)
			var all []string
			for _, alt := range alts {
				m, _ := alt.(map[string]any)
				t, _ := m["type"].(string)
				if t == "" {
					all = nil
					break
				}
				all = append(all, t)
			}
			if len(all) > 0 {
				types = all
				break
			}
		}
	}
	if e, ok := prop["enum"].([]any); ok {
		enum = make([]any, len(e))
		for i, v := range e {
			enum[i] = jsonToPython(v)
		}
	} else if c, ok := prop["const"]; ok {
		enum = []any{jsonToPython(c)}
	}
	return types, enum
}

// annotation renders a schema as a Python type annotation, as gptme's callable_signature
// shows one: str, int, list[str], Literal["c", "f"], int | None, Any.
func annotation(s map[string]any) string {
	types, enum := jsonTypes(s)
	if enum != nil {
		lits := make([]string, len(enum))
		for i, v := range enum {
			lits[i] = pyLiteral(v)
		}
		return "Literal[" + strings.Join(lits, ", ") + "]"
	}
	if len(types) == 0 {
		return "Any"
	}
	names := make([]string, 0, len(types))
	null := false
	for _, t := range types {
		switch t {
		case "string":
			names = append(names, "str")
		case "integer":
			names = append(names, "int")
		case "number":
			names = append(names, "float")
		case "boolean":
			names = append(names, "bool")
		case "null":
			null = true // last: str | None
		case "object":
			names = append(names, "dict")
		case "array":
			if items, ok := s["items"].(map[string]any); ok && len(items) > 0 {
				names = append(names, "list["+annotation(items)+"]")
			} else {
				names = append(names, "list")
			}
		default:
			names = append(names, "Any")
		}
	}
	if null {
		names = append(names, "None")
	}
	return strings.Join(names, " | ")
}

// returnAnnotation renders a result's schema, leaving out None when the result may also
// be something else (a Go nil slice or pointer: what the function means is the rest).
func returnAnnotation(schema map[string]any) string {
	if len(schema) == 0 {
		return ""
	}
	a := strings.TrimSuffix(annotation(schema), " | None")
	if a == "Any" {
		return ""
	}
	return a
}

// pyLiteral renders a JSON value as Python source.
func pyLiteral(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case string:
		return strconv.Quote(x) // a Go quoted string is a valid Python literal of it
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case *big.Int:
		return x.String()
	case []any:
		parts := make([]string, len(x))
		for i, item := range x {
			parts[i] = pyLiteral(item)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = strconv.Quote(k) + ": " + pyLiteral(x[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// jsonToPython turns a value decoded from JSON (float64 numbers) into the codec's Go side:
// whole numbers become int64, so that Python sees 1, not 1.0.
func jsonToPython(v any) any {
	return mapLeaves(v, func(leaf any) any {
		if x, ok := leaf.(float64); ok && x == float64(int64(x)) && x >= -1<<53 && x <= 1<<53 {
			return int64(x)
		}
		return leaf
	})
}

// mapLeaves copies a value of the codec's Go side ([]any and map[string]any containers)
// with f applied to every other value in it.
func mapLeaves(v any, f func(any) any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			out[i] = mapLeaves(item, f)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, item := range x {
			out[k] = mapLeaves(item, f)
		}
		return out
	}
	return f(v)
}

// docstring is the Python function's __doc__: the description, then its arguments'.
func docstring(fn Function, params []hostParam) string {
	doc := strings.TrimSpace(fn.Description)
	props, _ := fn.InputSchema["properties"].(map[string]any)
	var args []string
	for _, p := range params {
		prop, _ := props[p.key].(map[string]any)
		if d, _ := prop["description"].(string); d != "" {
			name := p.py
			if name == "" {
				name = strconv.Quote(p.key)
			}
			args = append(args, "    "+name+": "+strings.TrimSpace(d))
		}
	}
	if len(args) > 0 {
		if doc != "" {
			doc += "\n\n"
		}
		doc += "Args:\n" + strings.Join(args, "\n")
	}
	return doc
}

// signature renders fn as the tool description lists it: name(params) -> ret.
func (hf *hostFunc) signature() string {
	var b strings.Builder
	b.WriteString(hf.fn.Name)
	b.WriteByte('(')
	for i, p := range hf.params {
		if i > 0 {
			b.WriteString(", ")
		}
		name := p.py
		if name == "" {
			name = "**{" + strconv.Quote(p.key) + "}"
		}
		b.WriteString(name + ": " + p.ann)
		switch {
		case p.hasDefault:
			b.WriteString(" = " + pyLiteral(p.def))
		case !p.required:
			b.WriteString(" = None")
		}
	}
	b.WriteByte(')')
	if ret := returnAnnotation(hf.fn.OutputSchema); ret != "" {
		b.WriteString(" -> " + ret)
	}
	return b.String()
}

// Identifier makes name a Python identifier, for Function names that come from elsewhere:
// other characters become "_" (an MCP tool's "get-sum" is get_sum), a leading digit gets a
// "_" before it and a keyword one after it.
func Identifier(name string) string {
	var b strings.Builder
	for i, r := range name {
		switch {
		case r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			if i == 0 && unicode.IsDigit(r) {
				b.WriteByte('_')
			}
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := b.String()
	if s == "" {
		return "_"
	}
	if pythonKeywords[s] {
		s += "_"
	}
	return s
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if r == '_' || unicode.IsLetter(r) || (i > 0 && unicode.IsDigit(r)) {
			continue
		}
		return false
	}
	return true
}

// pythonKeywords are the names Python's grammar reserves (keyword.kwlist of 3.11-3.13).
var pythonKeywords = map[string]bool{
	"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true, "async": true,
	"await": true, "break": true, "class": true, "continue": true, "def": true, "del": true, "elif": true,
	"else": true, "except": true, "finally": true, "for": true, "from": true, "global": true, "if": true,
	"import": true, "in": true, "is": true, "lambda": true, "nonlocal": true, "not": true, "or": true,
	"pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true,
}

// hostRegistry is an engine's registered functions, by id and by namespace.
type hostRegistry struct {
	mu   sync.Mutex
	next uint64
	byID map[uint64]*hostFunc
	byNS map[uint32]map[string]*hostFunc
}

// add registers fns in namespace ns, replacing functions of the same names, and gives each
// its id.
func (r *hostRegistry) add(ns uint32, fns []*hostFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[uint64]*hostFunc{}
		r.byNS = map[uint32]map[string]*hostFunc{}
	}
	names := r.byNS[ns]
	if names == nil {
		names = map[string]*hostFunc{}
		r.byNS[ns] = names
	}
	for _, hf := range fns {
		r.next++
		hf.id, hf.refs = r.next, 1
		hf.spec[1] = int64(hf.id)
		if old := names[hf.fn.Name]; old != nil {
			r.unref(old)
		}
		names[hf.fn.Name] = hf
		r.byID[hf.id] = hf
	}
}

func (r *hostRegistry) unref(hf *hostFunc) {
	if hf.refs--; hf.refs == 0 {
		delete(r.byID, hf.id)
	}
}

// forget drops namespace ns's functions (it was freed).
func (r *hostRegistry) forget(ns uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, hf := range r.byNS[ns] {
		r.unref(hf)
	}
	delete(r.byNS, ns)
}

// fork gives namespace to the functions of namespace from (a Fork's copy): the same
// functions, with the same ids, which the copy's Python functions call.
func (r *hostRegistry) fork(from, to uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.byNS[from]) == 0 {
		return
	}
	names := make(map[string]*hostFunc, len(r.byNS[from]))
	for name, hf := range r.byNS[from] {
		hf.refs++
		names[name] = hf
	}
	r.byNS[to] = names
}

// holds reports whether hf is one of namespace ns's functions.
func (r *hostRegistry) holds(ns uint32, hf *hostFunc) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ns != 0 && r.byNS[ns][hf.fn.Name] == hf
}

// has reports whether any of the namespaces has functions.
func (r *hostRegistry) has(ids ...uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if len(r.byNS[id]) > 0 {
			return true
		}
	}
	return false
}

// functions returns namespace ns's functions, sorted by name.
func (r *hostRegistry) functions(ns uint32) []*hostFunc {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*hostFunc, 0, len(r.byNS[ns]))
	for _, hf := range r.byNS[ns] {
		out = append(out, hf)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].fn.Name < out[j].fn.Name })
	return out
}

// specs returns the registration requests that recreate namespace ns's functions in a new
// worker, or nil.
func (r *hostRegistry) specs(ns uint32) []any {
	fns := r.functions(ns)
	if len(fns) == 0 {
		return nil
	}
	specs := make([]any, len(fns))
	for i, hf := range fns {
		specs[i] = hf.spec
	}
	return specs
}

func (r *hostRegistry) lookup(id uint64) *hostFunc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// hostCalls serves the host calls of one run (call events, from either engine).
type hostCalls struct {
	reg      *hostRegistry
	gid, lid uint32
	ctx      context.Context // the calls' ctx: the run's, with its deadline
	cancel   context.CancelFunc
	reply    func(id uint64, status byte, payload []byte)
	ended    atomic.Bool
	inflight atomic.Int64 // calls being served
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
	go h.serve(id, v)
	return nil
}

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

func (h *hostCalls) run(v any) (status byte, payload []byte) {
	parts, _ := v.([]any)
	var fid int64
	var args map[string]any
	if len(parts) == 2 {
		fid, _ = parts[0].(int64)
		args, _ = parts[1].(map[string]any)
	}
	hf := h.reg.lookup(uint64(fid))
	switch {
	case h.ended.Load():
		return pyrt.CallRefused, []byte("host functions can be called only while a run of their namespace is in progress")
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
