package openai

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Request bodies are decoded in one pass over bytes that are validated once.
//
// A request type's UnmarshalJSON validates its input (valid, in decode.go)
// and hands it to unmarshalValid, which walks the now trusted bytes with the
// scanner beside valid: members splits an object into keys and values and
// elements splits an array, without checking either again. Fields are found
// through a table built once per struct type (fieldsOf); scalars are decoded
// in place (strconv, or a string's own bytes when it has no escapes); nested
// request types are reached through unmarshalValid rather than UnmarshalJSON.
// A message's text is thus validated once, skipped over by a byte search at
// each level above it, and copied once. (encoding/json validated it again at
// every level: json.Unmarshal checks the whole of its input before it starts.)
//
// Whatever the fast paths do not handle — values this package does not model
// (kv_transfer_params), and every value of the wrong type — is handed to
// json.Unmarshal on its own, so results and error messages are exactly
// encoding/json's.

// validUnmarshaler is implemented by the request types that decode
// themselves: unmarshalValid is UnmarshalJSON for input already known to be
// valid JSON, without surrounding space.
type validUnmarshaler interface {
	unmarshalValid(b []byte) error
}

var validUnmarshalerType = reflect.TypeFor[validUnmarshaler]()

// unmarshalChecked is the UnmarshalJSON of the request types: it validates b
// once and decodes it with u's unmarshalValid.
func unmarshalChecked(b []byte, u validUnmarshaler) error {
	if !valid(b) && !json.Valid(b) {
		// Let encoding/json word the syntax error.
		var v any
		return valueError(json.Unmarshal(b, &v))
	}
	return u.unmarshalValid(trimSpace(b))
}

// decodeObject decodes the valid JSON object raw into the struct dst points to
// and returns the keys that are not fields of it, their values copied
// verbatim.
//
// encoding/json would match keys case-insensitively and drop unknown ones;
// vLLM matches exactly and the orchestrator must forward what it does not
// understand. So keys are matched exactly against the json tags of dst's
// fields (and of embedded structs). Of a repeated key the last value counts,
// as with encoding/json. The values are gathered first and decoded in field
// declaration order so that, of several bad fields, the same one is always
// reported, and each error names its field.
func decodeObject(raw []byte, dst any) (map[string]json.RawMessage, error) {
	if kindOf(raw) != "object" {
		if err := valueError(json.Unmarshal(raw, new(map[string]json.RawMessage))); err != nil {
			return nil, err
		}
		return nil, &RequestError{Message: "expected an object, got null"}
	}
	v := reflect.ValueOf(dst).Elem()
	fields := fieldsOf(v.Type())
	var buf [48][]byte
	vals := buf[:0]
	if n := len(fields.list); n <= len(buf) {
		vals = buf[:n]
	} else {
		vals = make([][]byte, n)
	}
	var extra map[string]json.RawMessage
	for key, val := range members(raw) {
		var (
			k     string
			i     int
			known bool
		)
		name, plain := verbatim(key)
		if plain {
			i, known = fields.byName[string(name)]
		} else {
			k = unquote(key)
			i, known = fields.byName[k]
		}
		if known {
			vals[i] = val
			continue
		}
		if plain {
			k = string(name)
		}
		if extra == nil {
			extra = map[string]json.RawMessage{}
		}
		extra[k] = bytes.Clone(val)
	}
	for i, f := range fields.list {
		if vals[i] == nil {
			continue
		}
		if err := f.decode(vals[i], v.FieldByIndex(f.index)); err != nil {
			return nil, within(f.name, err)
		}
	}
	return extra, nil
}

// rawValue is a valid JSON value left undecoded. Unlike json.RawMessage it
// is not copied: it points into the bytes being decoded.
type rawValue []byte

func (r *rawValue) unmarshalValid(b []byte) error {
	*r = b
	return nil
}

// decodeInto decodes the valid JSON value raw into the value ptr points to.
func decodeInto(raw []byte, ptr any) error {
	v := reflect.ValueOf(ptr).Elem()
	return decoderFor(v.Type())(raw, v)
}

// A decodeFunc decodes the valid JSON value raw into v, which is settable and
// holds its type's zero value.
type decodeFunc func(raw []byte, v reflect.Value) error

var decodeFuncs perType[decodeFunc]

func decoderFor(t reflect.Type) decodeFunc { return decodeFuncs.get(t, newDecoder) }

// perType keeps what is built once per type (a decoder, an encoder) for
// every call after the first.
type perType[F any] struct{ m sync.Map } // reflect.Type -> F

func (c *perType[F]) get(t reflect.Type, build func(reflect.Type) F) F {
	if f, ok := c.m.Load(t); ok {
		return f.(F)
	}
	f, _ := c.m.LoadOrStore(t, build(t))
	return f.(F)
}

// newDecoder builds the decoder of type t. A JSON null leaves a value as it
// is, except that it clears a pointer, slice or map and is passed to a type
// that decodes itself: that is what encoding/json does. (The request types
// are not recursive, so building a decoder never needs the one being built.)
func newDecoder(t reflect.Type) decodeFunc {
	switch {
	case reflect.PointerTo(t).Implements(validUnmarshalerType):
		return func(raw []byte, v reflect.Value) error {
			return v.Addr().Interface().(validUnmarshaler).unmarshalValid(raw)
		}
	case reflect.PointerTo(t).Implements(unmarshalerType), reflect.PointerTo(t).Implements(textUnmarshalerType):
		return decodeSlow
	}
	switch t.Kind() {
	case reflect.String:
		return func(raw []byte, v reflect.Value) error {
			if raw[0] != '"' {
				return decodeSlow(raw, v)
			}
			if s, ok := verbatim(raw); ok {
				v.SetString(string(s))
			} else {
				v.SetString(unquote(raw))
			}
			return nil
		}
	case reflect.Bool:
		return func(raw []byte, v reflect.Value) error {
			switch raw[0] {
			case 't':
				v.SetBool(true)
				return nil
			case 'f':
				v.SetBool(false)
				return nil
			}
			return decodeSlow(raw, v)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(raw []byte, v reflect.Value) error {
			if isNumber(raw) {
				if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil && !v.OverflowInt(n) {
					v.SetInt(n)
					return nil
				}
			}
			return decodeSlow(raw, v)
		}
	case reflect.Float32, reflect.Float64:
		return func(raw []byte, v reflect.Value) error {
			if isNumber(raw) {
				if f, err := strconv.ParseFloat(string(raw), t.Bits()); err == nil && !v.OverflowFloat(f) {
					v.SetFloat(f)
					return nil
				}
			}
			return decodeSlow(raw, v)
		}
	case reflect.Pointer:
		elem := decoderFor(t.Elem())
		return func(raw []byte, v reflect.Value) error {
			if raw[0] == 'n' {
				v.SetZero()
				return nil
			}
			p := reflect.New(t.Elem())
			if err := elem(raw, p.Elem()); err != nil {
				return err
			}
			v.Set(p)
			return nil
		}
	case reflect.Slice:
		if t.Elem().Kind() != reflect.Uint8 {
			return sliceDecoder(t)
		}
	case reflect.Map, reflect.Interface:
		if t == anyMapType || t == anyType {
			return decodeGeneric
		}
	}
	return decodeSlow
}

var (
	anyType    = reflect.TypeFor[any]()
	anyMapType = reflect.TypeFor[map[string]any]()
)

// decodeGeneric decodes into an empty map[string]any or any, such as a KV
// connector's kv_transfer_params, as encoding/json would; anything else (a
// map already holding keys, which encoding/json adds to; a value of the
// wrong type, whose error encoding/json words) goes to decodeSlow.
func decodeGeneric(raw []byte, v reflect.Value) error {
	if !v.IsNil() || (v.Kind() == reflect.Map && raw[0] != '{' && raw[0] != 'n') {
		return decodeSlow(raw, v)
	}
	if raw[0] == 'n' {
		return nil // stays nil
	}
	x, ok := genericValue(raw)
	if !ok {
		return decodeSlow(raw, v)
	}
	v.Set(reflect.ValueOf(x))
	return nil
}

// genericValue is the valid JSON value raw as encoding/json decodes it into
// an any: map[string]any, []any, string, float64, bool or nil. ok is false
// for a number no float64 holds, which encoding/json refuses.
func genericValue(raw []byte) (x any, ok bool) {
	switch raw[0] {
	case '{':
		m := map[string]any{}
		for k, val := range members(raw) {
			if x, ok = genericValue(val); !ok {
				return nil, false
			}
			if name, plain := verbatim(k); plain {
				m[string(name)] = x
			} else {
				m[unquote(k)] = x
			}
		}
		return m, true
	case '[':
		a := []any{}
		for e := range elements(raw) {
			if x, ok = genericValue(e); !ok {
				return nil, false
			}
			a = append(a, x)
		}
		return a, true
	case '"':
		if s, plain := verbatim(raw); plain {
			return string(s), true
		}
		return unquote(raw), true
	case 't':
		return true, true
	case 'f':
		return false, true
	case 'n':
		return nil, true
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	return f, err == nil
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decodeSlow decodes raw with encoding/json: for the types this file has no
// fast path for, and for every value of the wrong type, so that errors are
// worded as encoding/json finds them.
func decodeSlow(raw []byte, v reflect.Value) error {
	return valueError(json.Unmarshal(raw, v.Addr().Interface()))
}

// sliceDecoder decodes arrays element by element so that errors carry the
// index, and rejects null elements: encoding/json would silently turn
// [1, null] into [1, 0].
func sliceDecoder(t reflect.Type) decodeFunc {
	elem := decoderFor(t.Elem())
	null := &RequestError{Message: fmt.Sprintf("expected %s, got null", jsonKind(t.Elem()))}
	return func(raw []byte, v reflect.Value) error {
		switch raw[0] {
		case 'n':
			v.SetZero()
			return nil
		case '[':
		default:
			return valueError(json.Unmarshal(raw, new([]json.RawMessage)))
		}
		n := 0
		for range elements(raw) {
			n++
		}
		s := reflect.MakeSlice(t, n, n)
		i := 0
		for e := range elements(raw) {
			var err error
			if e[0] == 'n' {
				err = null
			} else {
				err = elem(e, s.Index(i))
			}
			if err != nil {
				return within("["+strconv.Itoa(i)+"]", err)
			}
			i++
		}
		v.Set(s)
		return nil
	}
}

// decodeString decodes the valid JSON value raw into s as encoding/json would.
func decodeString(raw []byte, s *string) error {
	if raw[0] != '"' {
		return valueError(json.Unmarshal(raw, s))
	}
	if b, ok := verbatim(raw); ok {
		*s = string(b)
	} else {
		*s = unquote(raw)
	}
	return nil
}

// structFields is what decodeObject and encoder.object need of a struct type:
// its JSON fields in declaration order, embedded structs' fields in place.
type structFields struct {
	list   []structField
	byName map[string]int // index into list
}

type structField struct {
	name   string
	index  []int // for reflect.Value.FieldByIndex
	decode decodeFunc
	encode encodeFunc
	key    string // `"name":`
	// omitZero and omitEmpty are the json tag's options; isZero is the
	// field type's IsZero method, which omitzero uses when there is one.
	omitZero, omitEmpty bool
	isZero              func(reflect.Value) bool
}

// omitted reports whether encoding/json would leave the field value v out.
func (f *structField) omitted(v reflect.Value) bool {
	switch {
	case f.omitEmpty && isEmptyValue(v):
		return true
	case !f.omitZero:
		return false
	case f.isZero != nil:
		return f.isZero(v)
	default:
		return v.IsZero()
	}
}

type isZeroer interface{ IsZero() bool }

// isZeroFunc is how encoding/json calls t's IsZero method for omitzero, or
// nil when t has none.
func isZeroFunc(t reflect.Type) func(reflect.Value) bool {
	zeroer := reflect.TypeFor[isZeroer]()
	switch {
	case t.Kind() == reflect.Interface && t.Implements(zeroer):
		return func(v reflect.Value) bool {
			return v.IsNil() || (v.Elem().Kind() == reflect.Pointer && v.Elem().IsNil()) || v.Interface().(isZeroer).IsZero()
		}
	case t.Kind() == reflect.Pointer && t.Implements(zeroer):
		return func(v reflect.Value) bool { return v.IsNil() || v.Interface().(isZeroer).IsZero() }
	case t.Implements(zeroer):
		return func(v reflect.Value) bool { return v.Interface().(isZeroer).IsZero() }
	case reflect.PointerTo(t).Implements(zeroer):
		return func(v reflect.Value) bool { return v.Addr().Interface().(isZeroer).IsZero() }
	}
	return nil
}

func isEmptyValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64,
		reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

var structFieldsOf perType[*structFields]

func fieldsOf(t reflect.Type) *structFields { return structFieldsOf.get(t, newStructFields) }

func newStructFields(t reflect.Type) *structFields {
	fields := &structFields{byName: map[string]int{}}
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			at := append(slices.Clip(index), i)
			if isEmbedded(f) {
				walk(f.Type, at)
				continue
			}
			name := jsonName(f)
			if name == "" {
				if f.IsExported() && f.Tag.Get("json") != "-" {
					// encoding/json would use the Go name; this table
					// would skip the field. Name it in the tag.
					panic(fmt.Sprintf("openai: field %s.%s has no json name", t, f.Name))
				}
				continue
			}
			if _, dup := fields.byName[name]; dup {
				continue // the first field of a name takes its key
			}
			_, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields.byName[name] = len(fields.list)
			fields.list = append(fields.list, structField{
				name:      name,
				index:     at,
				decode:    decoderFor(f.Type),
				encode:    encoderFor(f.Type),
				key:       `"` + name + `":`,
				omitZero:  slices.Contains(strings.Split(opts, ","), "omitzero"),
				omitEmpty: slices.Contains(strings.Split(opts, ","), "omitempty"),
				isZero:    isZeroFunc(f.Type),
			})
		}
	}
	walk(t, nil)
	return fields
}

// valueError turns an encoding/json error into a RequestError that says what
// was expected in words a client understands.
func valueError(err error) error {
	if err == nil {
		return nil
	}
	var re *RequestError
	if errors.As(err, &re) {
		return re
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		got := te.Value
		if got == "bool" {
			got = "boolean"
		}
		return &RequestError{
			Param:   te.Field,
			Message: fmt.Sprintf("expected %s, got %s", jsonKind(te.Type), got),
			Err:     err,
		}
	}
	return &RequestError{Message: err.Error(), Err: err}
}

// within puts err under the parameter path prefix: "messages" + "[2].role".
func within(prefix string, err error) error {
	var re *RequestError
	if !errors.As(err, &re) {
		return &RequestError{Param: prefix, Message: err.Error(), Err: err}
	}
	out := *re
	switch {
	case re.Param == "":
		out.Param = prefix
	case strings.HasPrefix(re.Param, "["):
		out.Param = prefix + re.Param
	default:
		out.Param = prefix + "." + re.Param
	}
	return &out
}

// jsonKind names the JSON type a Go type decodes from.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t {
	case reflect.TypeFor[Content]():
		return "a string or an array of content parts"
	case reflect.TypeFor[Stop]():
		return "a string or an array of strings"
	case reflect.TypeFor[Prompt]():
		return "a string, an array of strings, an array of token ids or an array of arrays of token ids"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	default:
		return "a JSON value"
	}
}

// kindOf names the JSON type of a valid JSON value by its first byte.
func kindOf(raw []byte) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "string"
	case '[':
		return "array"
	case '{':
		return "object"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

func isEmbedded(f reflect.StructField) bool {
	return f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == ""
}

func jsonName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "-" {
		return ""
	}
	return name
}

// Encoding mirrors decoding: a request is written into one buffer by walking
// the same field tables, and the nested request types append themselves to
// that buffer (appendJSON) instead of returning bytes from MarshalJSON, which
// encoding/json would validate and copy again at every level of nesting.
// Strings that need escaping, floats, and values this package does not model
// are written by encoding/json itself, through one json.Encoder per call, so
// the output is byte for byte what encoding/json would write.

// appender is implemented by the request types: appendJSON is MarshalJSON
// writing to e.
type appender interface {
	appendJSON(e *encoder) error
}

var appenderType = reflect.TypeFor[appender]()

// encoder is the buffer a body is written into.
type encoder struct {
	buf bytes.Buffer
	enc *json.Encoder // writes into buf, without HTML escaping
}

func newEncoder() *encoder {
	e := new(encoder)
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetEscapeHTML(false)
	return e
}

// encoders are reused so that a body is written into a buffer that is
// already large enough, then copied out once.
var encoders = sync.Pool{New: func() any { return newEncoder() }}

// marshalAppender is MarshalJSON for an appender.
func marshalAppender(a appender) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer func() {
		if e.buf.Cap() <= 1<<20 { // let the rare huge body's buffer go
			e.buf.Reset()
			encoders.Put(e)
		}
	}()
	if err := a.appendJSON(e); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// object writes the struct v (addressable) as encoding/json would, honouring
// omitzero and omitempty, then the keys of extra that are not fields of it.
// Fields win over extras so that an edit to a modelled field cannot be undone
// by a stale pass-through value. Extras are sorted so the output is
// deterministic.
func (e *encoder) object(v reflect.Value, extra map[string]json.RawMessage) error {
	fields := fieldsOf(v.Type())
	e.buf.WriteByte('{')
	first := true
	for _, f := range fields.list {
		fv := v.FieldByIndex(f.index)
		if f.omitted(fv) {
			continue
		}
		if !first {
			e.buf.WriteByte(',')
		}
		first = false
		e.buf.WriteString(f.key)
		if err := f.encode(e, fv); err != nil {
			return err
		}
	}
	if len(extra) > 0 {
		keys := make([]string, 0, len(extra))
		for k := range extra {
			if _, known := fields.byName[k]; !known {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !first {
				e.buf.WriteByte(',')
			}
			first = false
			if err := e.str(k); err != nil {
				return err
			}
			e.buf.WriteByte(':')
			// Compact also validates: a bad value set by a caller fails here
			// instead of producing a body vLLM cannot parse.
			if err := json.Compact(&e.buf, extra[k]); err != nil {
				return fmt.Errorf("openai: extra field %q: %w", k, err)
			}
		}
	}
	e.buf.WriteByte('}')
	return nil
}

// str writes s as a JSON string.
func (e *encoder) str(s string) error {
	for i := range len(s) {
		if c := s[i]; c < ' ' || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return e.value(s) // needs escaping, or is not plain ASCII
		}
	}
	e.buf.WriteByte('"')
	e.buf.WriteString(s)
	e.buf.WriteByte('"')
	return nil
}

// float writes f as encoding/json does. In the range where encoding/json
// writes plain decimals it is one strconv call; elsewhere (exponents, NaN and
// infinities, which are errors) encoding/json writes it.
func (e *encoder) float(f float64) error {
	if abs := math.Abs(f); abs == 0 || abs >= 1e-6 && abs < 1e21 {
		e.buf.Write(strconv.AppendFloat(e.buf.AvailableBuffer(), f, 'f', -1, 64))
		return nil
	}
	return e.value(f)
}

// jsonValue writes v, a value of the kind encoding/json decodes into any
// (kv_transfer_params), as encoding/json would: object keys sorted, nil maps
// and slices as null. Other types go to encoding/json.
func (e *encoder) jsonValue(v any) error {
	switch v := v.(type) {
	case nil:
		e.buf.WriteString("null")
	case string:
		return e.str(v)
	case bool:
		e.buf.Write(strconv.AppendBool(e.buf.AvailableBuffer(), v))
	case float64:
		return e.float(v)
	case []any:
		if v == nil {
			e.buf.WriteString("null")
			return nil
		}
		e.buf.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				e.buf.WriteByte(',')
			}
			if err := e.jsonValue(x); err != nil {
				return err
			}
		}
		e.buf.WriteByte(']')
	case map[string]any:
		return e.sortedMap(v, e.jsonValue)
	default:
		return e.value(v)
	}
	return nil
}

// sortedMap writes m as an object with its keys sorted, as encoding/json
// does, and each value with elem; a nil map is null.
func (e *encoder) sortedMap(m map[string]any, elem func(any) error) error {
	if m == nil {
		e.buf.WriteString("null")
		return nil
	}
	e.buf.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			e.buf.WriteByte(',')
		}
		if err := e.str(k); err != nil {
			return err
		}
		e.buf.WriteByte(':')
		if err := elem(m[k]); err != nil {
			return err
		}
	}
	e.buf.WriteByte('}')
	return nil
}

// encode writes the value ptr points to.
func (e *encoder) encode(ptr any) error {
	v := reflect.ValueOf(ptr).Elem()
	return encoderFor(v.Type())(e, v)
}

// value writes v as encoding/json encodes it.
func (e *encoder) value(v any) error {
	if err := e.enc.Encode(v); err != nil {
		return err
	}
	e.buf.Truncate(e.buf.Len() - 1) // the newline Encode ends with
	return nil
}

// An encodeFunc writes v, which is addressable.
type encodeFunc func(e *encoder, v reflect.Value) error

var encodeFuncs perType[encodeFunc]

func encoderFor(t reflect.Type) encodeFunc { return encodeFuncs.get(t, newEncodeFunc) }

func newEncodeFunc(t reflect.Type) encodeFunc {
	switch {
	case t.Kind() == reflect.Pointer:
		// Before the method checks: *T has T's MarshalJSON, and a nil *T is
		// null whatever its methods.
		elem := encoderFor(t.Elem())
		return func(e *encoder, v reflect.Value) error {
			if v.IsNil() {
				e.buf.WriteString("null")
				return nil
			}
			return elem(e, v.Elem())
		}
	case reflect.PointerTo(t).Implements(appenderType):
		return func(e *encoder, v reflect.Value) error {
			return v.Addr().Interface().(appender).appendJSON(e)
		}
	case t.Implements(marshalerType), reflect.PointerTo(t).Implements(marshalerType),
		t.Implements(textMarshalerType), reflect.PointerTo(t).Implements(textMarshalerType):
		return encodeSlow
	}
	switch t.Kind() {
	case reflect.String:
		return func(e *encoder, v reflect.Value) error { return e.str(v.String()) }
	case reflect.Bool:
		return func(e *encoder, v reflect.Value) error {
			e.buf.Write(strconv.AppendBool(e.buf.AvailableBuffer(), v.Bool()))
			return nil
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(e *encoder, v reflect.Value) error {
			e.buf.Write(strconv.AppendInt(e.buf.AvailableBuffer(), v.Int(), 10))
			return nil
		}
	case reflect.Float64:
		return func(e *encoder, v reflect.Value) error { return e.float(v.Float()) }
	case reflect.Map:
		if t == reflect.TypeFor[map[string]any]() {
			return func(e *encoder, v reflect.Value) error { return e.jsonValue(v.Interface()) }
		}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			break // base64, by encoding/json
		}
		elem := encoderFor(t.Elem())
		return func(e *encoder, v reflect.Value) error {
			if v.IsNil() {
				e.buf.WriteString("null")
				return nil
			}
			e.buf.WriteByte('[')
			for i := range v.Len() {
				if i > 0 {
					e.buf.WriteByte(',')
				}
				if err := elem(e, v.Index(i)); err != nil {
					return err
				}
			}
			e.buf.WriteByte(']')
			return nil
		}
	}
	return encodeSlow
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// encodeSlow writes v with encoding/json: floats, maps, interfaces, and types
// with marshalling methods of their own.
func encodeSlow(e *encoder, v reflect.Value) error { return e.value(v.Interface()) }

// marshalNoEscape is json.Marshal without HTML escaping: prompts are full of
// "<|im_start|>", and vLLM's own output does not escape them either.
func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func cloneExtra(m map[string]json.RawMessage) map[string]json.RawMessage {
	if m == nil {
		return nil
	}
	out := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}

// cloneJSON deep-copies a value decoded by encoding/json into any. Values of
// other types are copied shallowly.
func cloneJSON(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return cloneJSONObject(v)
	case []any:
		if v == nil {
			return v
		}
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = cloneJSON(e)
		}
		return out
	default:
		return v
	}
}

func cloneJSONObject(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, e := range m {
		out[k] = cloneJSON(e)
	}
	return out
}
