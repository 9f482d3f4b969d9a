package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// decodeObject decodes the JSON object raw into the struct dst points to and
// returns the keys that are not fields of it.
//
// encoding/json would match keys case-insensitively and drop unknown ones;
// vLLM matches exactly and the orchestrator must forward what it does not
// understand. So keys are matched exactly against the json tags of dst's
// fields (and of embedded structs), and each field is decoded on its own so
// that an error can name the field it is about.
func decodeObject(raw []byte, dst any) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, valueError(err)
	}
	if obj == nil {
		return nil, &RequestError{Message: "expected an object, got null"}
	}
	if err := decodeFields(obj, reflect.ValueOf(dst).Elem()); err != nil {
		return nil, err
	}
	if len(obj) == 0 {
		return nil, nil
	}
	return obj, nil
}

// decodeFields consumes from obj every key that names a field of v. Fields are
// visited in declaration order so that, of several bad fields, the same one is
// always reported.
func decodeFields(obj map[string]json.RawMessage, v reflect.Value) error {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if isEmbedded(f) {
			if err := decodeFields(obj, v.Field(i)); err != nil {
				return err
			}
			continue
		}
		name := jsonName(f)
		if name == "" {
			continue
		}
		raw, ok := obj[name]
		if !ok {
			continue
		}
		delete(obj, name)
		if err := decodeValue(raw, v.Field(i).Addr()); err != nil {
			return within(name, err)
		}
	}
	return nil
}

// decodeValue decodes raw into the value ptr points to. Slices are decoded
// element by element so that errors carry the index, and null elements are
// rejected: encoding/json would silently turn [1, null] into [1, 0].
func decodeValue(raw json.RawMessage, ptr reflect.Value) error {
	t := ptr.Type().Elem()
	if t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8 && !ptr.Type().Implements(unmarshalerType) {
		return decodeSlice(raw, ptr.Elem())
	}
	if err := json.Unmarshal(raw, ptr.Interface()); err != nil {
		return valueError(err)
	}
	return nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func decodeSlice(raw json.RawMessage, v reflect.Value) error {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return valueError(err)
	}
	if elems == nil { // null
		v.SetZero()
		return nil
	}
	s := reflect.MakeSlice(v.Type(), len(elems), len(elems))
	for i, e := range elems {
		var err error
		if kindOf(e) == "null" {
			err = &RequestError{Message: fmt.Sprintf("expected %s, got null", jsonKind(v.Type().Elem()))}
		} else {
			err = decodeValue(e, s.Index(i).Addr())
		}
		if err != nil {
			return within("["+strconv.Itoa(i)+"]", err)
		}
	}
	v.Set(s)
	return nil
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

var fieldNameCache sync.Map // reflect.Type -> map[string]bool

// fieldNames is the set of JSON keys the struct type t encodes as fields.
func fieldNames(t reflect.Type) map[string]bool {
	if v, ok := fieldNameCache.Load(t); ok {
		return v.(map[string]bool)
	}
	names := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if isEmbedded(f) {
				walk(f.Type)
			} else if name := jsonName(f); name != "" {
				names[name] = true
			}
		}
	}
	walk(t)
	fieldNameCache.Store(t, names)
	return names
}

// encodeObject encodes plain, a pointer to a method-free copy of a request
// type, and appends the extra keys that are not already fields. Fields win
// over extras so that an edit to a modelled field cannot be undone by a stale
// pass-through value. Extras are sorted so the output is deterministic.
func encodeObject(plain any, extra map[string]json.RawMessage) ([]byte, error) {
	b, err := marshalNoEscape(plain)
	if err != nil {
		return nil, err
	}
	if len(extra) == 0 {
		return b, nil
	}
	known := fieldNames(reflect.TypeOf(plain).Elem())
	keys := make([]string, 0, len(extra))
	for k := range extra {
		if !known[k] {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out bytes.Buffer
	out.Grow(len(b) + 64*len(keys))
	out.Write(b[:len(b)-1]) // without the closing brace
	for _, k := range keys {
		if out.Len() > 1 {
			out.WriteByte(',')
		}
		kb, err := marshalNoEscape(k)
		if err != nil {
			return nil, err
		}
		out.Write(kb)
		out.WriteByte(':')
		// Compact also validates: a bad value set by a caller fails here
		// instead of producing a body vLLM cannot parse.
		if err := json.Compact(&out, extra[k]); err != nil {
			return nil, fmt.Errorf("openai: extra field %q: %w", k, err)
		}
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}

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
