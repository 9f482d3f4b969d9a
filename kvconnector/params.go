package kvconnector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
)

// rule is one key a prefill response must carry. check returns why a present,
// non-null value is unusable, or "".
type rule struct {
	key   string
	check func(v any) string
}

// checkResponse turns a prefill response's kv_transfer_params into an object
// and checks the contract's rules. A null response is fine for a contract
// that requires nothing (Mooncake's prefill returns null); anything else that
// is not an object is not.
//
// Values are checked, not only keys: a decode given do_remote_prefill with a
// block list that is not a list, or a port that is not a port, fails inside
// the engine where nobody can tell the client why.
func checkResponse(connector string, rules []rule, v any) (map[string]any, error) {
	if raw, ok := v.(json.RawMessage); ok {
		decoded, err := decodeJSON(raw)
		if err != nil {
			return nil, &HandoffError{Connector: connector, Shape: "not valid JSON", Missing: ruleKeys(rules)}
		}
		v = decoded
	}
	if m, ok := v.(map[string]any); ok {
		if m != nil {
			return m, checkRules(connector, rules, m)
		}
		v = nil // a nil map is what JSON calls null
	}
	shape := jsonKind(v)
	if v == nil && len(rules) == 0 {
		return nil, nil
	}
	return nil, &HandoffError{Connector: connector, Shape: shape, Missing: ruleKeys(rules)}
}

func checkRules(connector string, rules []rule, m map[string]any) error {
	var e HandoffError
	for _, r := range rules {
		v, ok := m[r.key]
		if !ok || v == nil {
			e.Missing = append(e.Missing, r.key)
			continue
		}
		if why := r.check(v); why != "" {
			e.Invalid = append(e.Invalid, r.key+": "+why)
		}
	}
	if e.Missing == nil && e.Invalid == nil {
		return nil
	}
	e.Connector = connector
	return &e
}

func ruleKeys(rules []rule) []string {
	if len(rules) == 0 {
		return nil
	}
	keys := make([]string, len(rules))
	for i, r := range rules {
		keys[i] = r.key
	}
	return keys
}

// decodeJSON decodes one JSON value, keeping numbers as written so that they
// are passed on verbatim. Empty input is an absent field: null.
func decodeJSON(raw []byte) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return v, nil
}

func isString(v any) string {
	s, ok := v.(string)
	switch {
	case !ok:
		return "want a string, got " + jsonKind(v)
	case s == "":
		return "empty"
	}
	return ""
}

func isList(v any) string {
	if _, ok := v.([]any); ok {
		return ""
	}
	rv := reflect.ValueOf(v)
	if (rv.Kind() == reflect.Slice && rv.Type().Elem().Kind() != reflect.Uint8) || rv.Kind() == reflect.Array {
		return ""
	}
	return "want a list of block ids, got " + jsonKind(v)
}

func isPort(v any) string {
	n, ok := wholeNumber(v)
	if !ok || n < 1 || n > 65535 {
		return "want a port number (1-65535), got " + describe(v)
	}
	return ""
}

// wholeNumber reads an integral JSON number however it was decoded.
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		if n != math.Trunc(n) || math.Abs(n) > 1<<53 {
			return 0, false
		}
		return int64(n), true
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return i, true
		}
		f, err := n.Float64()
		if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return 0, false
		}
		return int64(f), true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if u := rv.Uint(); u <= math.MaxInt64 {
			return int64(u), true
		}
	case reflect.Float32:
		f := rv.Float()
		if f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
			return int64(f), true
		}
	}
	return 0, false
}

// jsonKind names a value's JSON type, with an article, for error messages.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case map[string]any:
		return "an object"
	}
	switch reflect.ValueOf(v).Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return fmt.Sprintf("a Go %T", v)
}

// describe shows a config or response value in an error message.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "unset"
	case string:
		if len(v) > 64 {
			v = v[:64] + "..."
		}
		return strconv.Quote(v)
	case bool:
		return strconv.FormatBool(v)
	}
	if k := jsonKind(v); k != "a number" {
		return k
	}
	return fmt.Sprint(v)
}
