package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

// Member finds what json.Unmarshal into a struct with one json.RawMessage
// field finds, for keys spelled exactly.
func TestMemberAgreesWithEncodingJSON(t *testing.T) {
	docs := []string{
		`{"kv_transfer_params":{"remote_engine_id":"p0","remote_block_ids":[1,2]}}`,
		`{"choices":[{"index":0,"text":"}\"kv_transfer_params\":1"}],"kv_transfer_params":null}`,
		` { "id" : "x" , "kv_transfer_params" : [ 1 , { "a" : "b" } ] } `,
		`{"kv_transfer_params":1,"kv_transfer_params":"last wins"}`,
		`{"kv_transfer\u005fparams":{"escaped":"key"}}`,
		`{"nested":{"kv_transfer_params":"not top level"}}`,
		`{}`,
		`null`,
		`{"kv_transfer_params":true,"usage":{"prompt_tokens":3}}`,
	}
	for _, doc := range docs {
		var want struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal([]byte(doc), &want); err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		got, err := Member([]byte(doc), "kv_transfer_params")
		if err != nil || string(got) != string(want.KV) {
			t.Errorf("Member(%s) = %s, %v; want %s", doc, got, err, want.KV)
		}
	}
}

// MemberValue decodes the member as encoding/json decodes it into an any,
// a number too large for a float64 included (an error).
func TestMemberValueAgreesWithEncodingJSON(t *testing.T) {
	docs := []string{
		`{"kv_transfer_params":{"remote_engine_id":"p0","remote_block_ids":[1,2],"remote_port":17100,"remote_shm":"AQx-_9"}}`,
		`{"kv_transfer_params":null}`,
		`{"kv_transfer_params":[1.5e-3,"\u00e9\ud83d\ude00",false,{}]}`,
		`{"other":1}`,
		`{"kv_transfer_params":{"big":1e999}}`,
	}
	for _, doc := range docs {
		var want struct {
			KV any `json:"kv_transfer_params"`
		}
		wantErr := json.Unmarshal([]byte(doc), &want)
		got, err := MemberValue([]byte(doc), "kv_transfer_params")
		if (err == nil) != (wantErr == nil) || err == nil && !reflect.DeepEqual(got, want.KV) {
			t.Errorf("MemberValue(%s) = %#v, %v; encoding/json %#v, %v", doc, got, err, want.KV, wantErr)
		}
	}
	if _, err := MemberValue([]byte(`[1]`), "k"); err == nil {
		t.Error("MemberValue of an array: no error")
	}
}

func TestMemberRefusesWhatIsNotAnObject(t *testing.T) {
	for doc, want := range map[string]string{
		``:         "not JSON",
		`{"a":`:    "not JSON",
		`{"a":1}x`: "not JSON",
		`[1,2]`:    "a JSON array, not an object",
		`"text"`:   "a JSON string, not an object",
		` 12 `:     "a JSON number, not an object",
		"\ttrue\n": "a JSON boolean, not an object",
	} {
		if _, err := Member([]byte(doc), "k"); err == nil || err.Error() != want {
			t.Errorf("Member(%q) error = %v, want %q", doc, err, want)
		}
	}
}
