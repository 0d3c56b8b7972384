package minipy

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// The value codec shared with runtime.py (see its header for the format): how Go values
// cross into Python (Namespace.Set) and Python values come back (Result.Value,
// Namespace.Get). Both engines use it unchanged.

// opaque stands for a Python value with no Go equivalent (tag X); it never leaves the package.
type opaque struct{}

type decoder struct {
	buf []byte
	pos int
}

var errTruncated = fmt.Errorf("minipy: malformed response from the Python runtime")

var errTooDeep = fmt.Errorf("%w: a value nested more than %d containers deep", errTruncated, maxValueDepth)

func (d *decoder) u32() (int, error) {
	if d.pos+4 > len(d.buf) {
		return 0, errTruncated
	}
	n := binary.LittleEndian.Uint32(d.buf[d.pos:])
	d.pos += 4
	return int(n), nil
}

func (d *decoder) raw(n int) ([]byte, error) {
	if n < 0 || d.pos+n > len(d.buf) {
		return nil, errTruncated
	}
	b := d.buf[d.pos : d.pos+n]
	d.pos += n
	return b, nil
}

func (d *decoder) str() (string, error) {
	n, err := d.u32()
	if err != nil {
		return "", err
	}
	b, err := d.raw(n)
	return string(b), err
}

// maxValueDepth is how deeply containers may nest in a value, both ways (runtime.py's
// MAX_DEPTH is the same constant): deeper values are refused, not recursed into.
const maxValueDepth = pyrt.MaxDepth

// value decodes the next value.
func (d *decoder) value() (any, error) { return d.valueAt(0) }

func (d *decoder) valueAt(depth int) (any, error) {
	if d.pos >= len(d.buf) {
		return nil, errTruncated
	}
	tag := d.buf[d.pos]
	d.pos++
	switch tag {
	case 'N':
		return nil, nil
	case 'T':
		return true, nil
	case 'F':
		return false, nil
	case 'X':
		return opaque{}, nil
	case 'i':
		b, err := d.raw(8)
		if err != nil {
			return nil, err
		}
		return int64(binary.LittleEndian.Uint64(b)), nil
	case 'f':
		b, err := d.raw(8)
		if err != nil {
			return nil, err
		}
		return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
	case 's':
		return d.str()
	case 'b':
		n, err := d.u32()
		if err != nil {
			return nil, err
		}
		b, err := d.raw(n)
		return append([]byte(nil), b...), err
	case 'I':
		return d.bigInt()
	case 'l':
		return d.list(depth)
	case 'd':
		return d.dict(depth)
	}
	return nil, fmt.Errorf("minipy: unknown value tag %q from the Python runtime", tag)
}

// bigInt decodes an integer past int64: a sign byte, then the magnitude's bytes.
func (d *decoder) bigInt() (any, error) {
	sign, err := d.raw(1)
	if err != nil {
		return nil, err
	}
	n, err := d.u32()
	if err != nil {
		return nil, err
	}
	mag, err := d.raw(n)
	if err != nil {
		return nil, err
	}
	v := new(big.Int).SetBytes(mag)
	if sign[0] == '-' {
		v.Neg(v)
	}
	return v, nil
}

// container reads the item count of a list or dict at depth: at most what is left of the
// buffer (each item takes a byte at least), and no deeper than maxValueDepth.
func (d *decoder) container(depth int) (int, error) {
	n, err := d.u32()
	if err != nil {
		return 0, err
	}
	if n > len(d.buf)-d.pos {
		return 0, errTruncated
	}
	if depth >= maxValueDepth {
		return 0, errTooDeep
	}
	return n, nil
}

func (d *decoder) list(depth int) (any, error) {
	n, err := d.container(depth)
	if err != nil {
		return nil, err
	}
	items := make([]any, n)
	for i := range items {
		if items[i], err = d.valueAt(depth + 1); err != nil {
			return nil, err
		}
	}
	return items, nil
}

func (d *decoder) dict(depth int) (any, error) {
	n, err := d.container(depth)
	if err != nil {
		return nil, err
	}
	// n is the sender's claim, which the bytes that follow bound only loosely (an entry
	// takes 5 of them at least, a map's slot 80 bytes): size the map by what real entries
	// (a distinct key and a value) leave room for, and let it grow as they decode.
	m := make(map[string]any, min(n, (len(d.buf)-d.pos)/16))
	for i := 0; i < n; i++ {
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		if m[k], err = d.valueAt(depth + 1); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func appendU32(b []byte, n int) []byte { return binary.LittleEndian.AppendUint32(b, uint32(n)) }

func appendStr(b []byte, tag byte, s string) []byte {
	if tag != 0 {
		b = append(b, tag)
	}
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // Python str is text: invalid bytes become U+FFFD
	}
	b = appendU32(b, len(s))
	return append(b, s...)
}

func appendBig(b []byte, v *big.Int) []byte {
	if v.IsInt64() {
		return binary.LittleEndian.AppendUint64(append(b, 'i'), uint64(v.Int64()))
	}
	sign := byte('+')
	if v.Sign() < 0 {
		sign = '-'
	}
	mag := new(big.Int).Abs(v).Bytes()
	b = appendU32(append(b, 'I', sign), len(mag))
	return append(b, mag...)
}

// appendValue encodes v (the Go side of the type table) for runtime.py's decode.
func appendValue(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxValueDepth {
		return nil, fmt.Errorf("minipy: value nested more than %d levels deep", maxValueDepth)
	}
	switch x := v.(type) {
	case nil:
		return append(b, 'N'), nil
	case bool:
		if x {
			return append(b, 'T'), nil
		}
		return append(b, 'F'), nil
	case string:
		return appendStr(b, 's', x), nil
	case json.RawMessage:
		// The JSON value it holds, not its bytes.
		dec := json.NewDecoder(bytes.NewReader(x))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%w: json.RawMessage: %v", ErrUnsupportedValue, err)
		}
		return appendValue(b, fromJSON(v), depth)
	case []byte:
		b = appendU32(append(b, 'b'), len(x))
		return append(b, x...), nil
	case int:
		return binary.LittleEndian.AppendUint64(append(b, 'i'), uint64(x)), nil
	case int64:
		return binary.LittleEndian.AppendUint64(append(b, 'i'), uint64(x)), nil
	case float64:
		return binary.LittleEndian.AppendUint64(append(b, 'f'), math.Float64bits(x)), nil
	case *big.Int:
		if x == nil {
			return append(b, 'N'), nil
		}
		return appendBig(b, x), nil
	case big.Int:
		return appendBig(b, &x), nil
	case []any:
		b = appendU32(append(b, 'l'), len(x))
		var err error
		for _, item := range x {
			if b, err = appendValue(b, item, depth+1); err != nil {
				return nil, err
			}
		}
		return b, nil
	case map[string]any:
		b = appendU32(append(b, 'd'), len(x))
		var err error
		for k, item := range x {
			b = appendStr(b, 0, k)
			if b, err = appendValue(b, item, depth+1); err != nil {
				return nil, err
			}
		}
		return b, nil
	}
	return appendReflect(b, reflect.ValueOf(v), depth)
}

// appendReflect covers the other integer, float, slice, array, map and pointer types.
func appendReflect(b []byte, rv reflect.Value, depth int) ([]byte, error) {
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return binary.LittleEndian.AppendUint64(append(b, 'i'), uint64(rv.Int())), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return appendBig(b, new(big.Int).SetUint64(u)), nil
		}
		return binary.LittleEndian.AppendUint64(append(b, 'i'), u), nil
	case reflect.Float32, reflect.Float64:
		return binary.LittleEndian.AppendUint64(append(b, 'f'), math.Float64bits(rv.Float())), nil
	case reflect.Bool:
		return appendValue(b, rv.Bool(), depth)
	case reflect.String:
		return appendStr(b, 's', rv.String()), nil
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return append(b, 'N'), nil
		}
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			raw := make([]byte, rv.Len())
			reflect.Copy(reflect.ValueOf(raw), rv)
			return appendValue(b, raw, depth)
		}
		b = appendU32(append(b, 'l'), rv.Len())
		var err error
		for i := 0; i < rv.Len(); i++ {
			if b, err = appendValue(b, rv.Index(i).Interface(), depth+1); err != nil {
				return nil, err
			}
		}
		return b, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, &UnsupportedTypeError{Type: rv.Type()}
		}
		if rv.IsNil() {
			return append(b, 'N'), nil
		}
		b = appendU32(append(b, 'd'), rv.Len())
		var err error
		it := rv.MapRange()
		for it.Next() {
			b = appendStr(b, 0, it.Key().String())
			if b, err = appendValue(b, it.Value().Interface(), depth+1); err != nil {
				return nil, err
			}
		}
		return b, nil
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return append(b, 'N'), nil
		}
		return appendValue(b, rv.Elem().Interface(), depth+1)
	case reflect.Struct:
		return appendStruct(b, rv, depth)
	}
	return nil, &UnsupportedTypeError{Type: rv.Type()}
}

// appendStruct encodes a struct as the dict of its JSON form: encoding/json's field names
// (json tags, "-", omitempty, omitzero, embedded structs), with each field's own Go type
// kept (a float64 stays a float even when it is whole). A type with its own JSON or text
// form (time.Time) goes through encoding/json.
func appendStruct(b []byte, rv reflect.Value, depth int) ([]byte, error) {
	if rv.Type().Implements(jsonMarshaler) || rv.Type().Implements(textMarshaler) ||
		reflect.PointerTo(rv.Type()).Implements(jsonMarshaler) || reflect.PointerTo(rv.Type()).Implements(textMarshaler) {
		raw, err := json.Marshal(rv.Interface())
		if err != nil {
			return nil, &UnsupportedTypeError{Type: rv.Type()}
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, &UnsupportedTypeError{Type: rv.Type()}
		}
		return appendValue(b, fromJSON(v), depth)
	}
	fields := map[string]any{}
	var order []string
	structFields(rv, fields, &order)
	b = appendU32(append(b, 'd'), len(order))
	var err error
	for _, name := range order {
		b = appendStr(b, 0, name)
		if b, err = appendValue(b, fields[name], depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// structFields collects rv's fields under their JSON names (the first of a name wins).
func structFields(rv reflect.Value, fields map[string]any, order *[]string) {
	t := rv.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		v := rv.Field(i)
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				if v.IsNil() {
					continue
				}
				ft, v = ft.Elem(), v.Elem()
			}
			if ft.Kind() == reflect.Struct {
				structFields(v, fields, order) // promoted, as encoding/json does
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if (hasOption(opts, "omitempty") && isEmpty(v)) || (hasOption(opts, "omitzero") && v.IsZero()) {
			continue
		}
		if _, dup := fields[name]; dup {
			continue
		}
		val := v.Interface()
		if hasOption(opts, "string") {
			val = fmt.Sprint(val)
		}
		fields[name] = val
		*order = append(*order, name)
	}
}

func hasOption(opts, want string) bool {
	for opts != "" {
		var o string
		o, opts, _ = strings.Cut(opts, ",")
		if o == want {
			return true
		}
	}
	return false
}

// isEmpty is encoding/json's omitempty test.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

// fromJSON turns a value decoded from JSON with UseNumber into the codec's Go side: whole
// numbers as int64 (or *big.Int beyond it), others as float64.
func fromJSON(v any) any {
	return mapLeaves(v, func(leaf any) any {
		x, ok := leaf.(json.Number)
		if !ok {
			return leaf
		}
		if i, err := x.Int64(); err == nil {
			return i
		}
		if i, ok := new(big.Int).SetString(string(x), 10); ok {
			return i
		}
		f, _ := x.Float64()
		return f
	})
}
