package openai

import (
	"encoding/json"
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
