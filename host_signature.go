package minipy

// A Function's input schema as a Python signature: parameters, annotations, defaults
// and a docstring, so the model sees help() as for any Python function.

import (
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

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
