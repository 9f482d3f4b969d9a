package openai

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzGenericValue: for every valid JSON document, decoding into an any or
// a map[string]any gives what encoding/json gives, errors included.
func FuzzGenericValue(f *testing.F) {
	for _, s := range []string{
		`{"remote_engine_id":"p0","remote_block_ids":[1,2,3],"remote_port":17100,"do_remote_decode":false}`,
		`{"a":{"b":[null,true,false,-0,1.5e-3,"\u00e9\ud83d\ude00"]},"a":"last wins"}`,
		`{"k\u0000":"\"quoted\"","":[[],{}]}`,
		`[1e400]`, `{"big":-1e999}`, `"\ud800"`, `null`, `[]`, `{}`, `0`, `"x"`, `true`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			return
		}
		var wantAny, gotAny any
		wantErr := json.Unmarshal(doc, &wantAny)
		gotErr := decodeGeneric(trimSpace(doc), reflect.ValueOf(&gotAny).Elem())
		if (gotErr == nil) != (wantErr == nil) || !reflect.DeepEqual(gotAny, wantAny) {
			t.Fatalf("any from %s: got %#v, %v; encoding/json %#v, %v", doc, gotAny, gotErr, wantAny, wantErr)
		}
		var wantMap, gotMap map[string]any
		wantErr = json.Unmarshal(doc, &wantMap)
		gotErr = decodeGeneric(trimSpace(doc), reflect.ValueOf(&gotMap).Elem())
		if (gotErr == nil) != (wantErr == nil) || !reflect.DeepEqual(gotMap, wantMap) {
			t.Fatalf("map from %s: got %#v, %v; encoding/json %#v, %v", doc, gotMap, gotErr, wantMap, wantErr)
		}
	})
}

// A decode leg's kv_transfer_params arrive as encoding/json would decode
// them, numbers as float64.
func TestKVTransferParamsDecode(t *testing.T) {
	req, err := DecodeChatRequest(strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"remote_block_ids":[4,5],"remote_host":"10.0.0.1","do_remote_prefill":true,"x":null}}`), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"remote_block_ids": []any{4.0, 5.0}, "remote_host": "10.0.0.1", "do_remote_prefill": true, "x": nil}
	if !reflect.DeepEqual(req.KVTransferParams, want) {
		t.Errorf("kv_transfer_params = %#v, want %#v", req.KVTransferParams, want)
	}
	if _, err := DecodeChatRequest(strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"kv_transfer_params":[1]}`), 1<<20); err == nil {
		t.Error("an array for kv_transfer_params was accepted")
	}
}
