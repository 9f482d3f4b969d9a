package worker

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// POST /detokenize is vLLM's: {"model", "tokens"} in, {"prompt"} out, the
// ids' text as the tokenizer decodes them — what /tokenize gave back, and
// special tokens as their content. An id outside the vocabulary is a 400
// naming it, an unknown model a 404, and more ids than the context holds
// are refused, like a text /tokenize would not count, before they are
// decoded.
func TestDetokenize(t *testing.T) {
	w := newPlainWorker(t, 64)
	const text = "Hello, omni! ünïcode"
	_, _, b := call(t, "POST", w.url+"/tokenize", "", fmt.Sprintf(`{"prompt":%q}`, text))
	var tok struct{ Tokens []int }
	if err := json.Unmarshal([]byte(b), &tok); err != nil || len(tok.Tokens) == 0 {
		t.Fatalf("/tokenize: %s", b)
	}
	ids, _ := json.Marshal(tok.Tokens)
	for _, c := range []struct{ body, want string }{
		{`{"model":"omnipd-reference","tokens":` + string(ids) + `}`, text},
		{`{"tokens":` + string(ids) + `}`, text},
		{`{"tokens":[257,104,105,258]}`, "<|im_start|>hi<|im_end|>"},
		{`{"tokens":[]}`, ""},
		{`{"tokens":[104],"model":null,"add_special_tokens":true}`, "h"}, // fields vLLM ignores are ignored
	} {
		status, hdr, b := call(t, "POST", w.url+"/detokenize", "", c.body)
		var got map[string]any
		if status != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") || json.Unmarshal([]byte(b), &got) != nil {
			t.Errorf("%s: %d %s", c.body, status, b)
			continue
		}
		if len(got) != 1 || got["prompt"] != c.want {
			t.Errorf("%s: %s, want {\"prompt\": %q}", c.body, b, c.want)
		}
	}

	many := "[" + strings.TrimSuffix(strings.Repeat("104,", 65), ",") + "]"
	for _, c := range []struct {
		name, body      string
		status          int
		param, code, in string
	}{
		{"an id past the vocabulary", `{"tokens":[104,269]}`, 400, "tokens", "", "Token id 269 is out of vocabulary"},
		{"a negative id", `{"tokens":[-1]}`, 400, "tokens", "", "Token id -1 is out of vocabulary"},
		{"an id past int64", `{"tokens":[9223372036854775808]}`, 400, "tokens", "", "Token id 9223372036854775808 is out of vocabulary"},
		{"an id that is no integer", `{"tokens":[104,1.5]}`, 400, "tokens[1]", "", "integer"},
		{"ids that are no list", `{"tokens":"hi"}`, 400, "tokens", "", "list"},
		{"no ids", `{"model":"omnipd-reference"}`, 400, "tokens", "", "required"},
		{"an unknown model", `{"model":"gpt-9","tokens":[104]}`, 404, "model", "model_not_found", "gpt-9"},
		{"a model that is no string", `{"model":7,"tokens":[104]}`, 400, "model", "", "string"},
		{"more ids than the context", `{"tokens":` + many + `}`, 400, "tokens", CodeContextLengthExceeded, "maximum context length is 64 tokens"},
		{"invalid JSON", `{"tokens":[104,`, 400, "", "", "JSON"},
		{"no object", `[104]`, 400, "", "", "object"},
	} {
		status, _, b := call(t, "POST", w.url+"/detokenize", "", c.body)
		var e struct {
			Error struct {
				Message, Type string
				Param, Code   *string
			} `json:"error"`
		}
		if status != c.status || json.Unmarshal([]byte(b), &e) != nil || !strings.Contains(e.Error.Message, c.in) {
			t.Errorf("%s: %d %s; want %d saying %q", c.name, status, b, c.status, c.in)
			continue
		}
		if got := deref(e.Error.Param); got != c.param {
			t.Errorf("%s: param %q, want %q", c.name, got, c.param)
		}
		if got := deref(e.Error.Code); got != c.code {
			t.Errorf("%s: code %q, want %q", c.name, got, c.code)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// GET /v1/models is vLLM's model list: one ModelCard with the worker's
// max_model_len, its root, no parent (no adapter) and vLLM's one
// permission, as omnipd serve lists it.
func TestModelsIsVLLMsModelCard(t *testing.T) {
	w := newPlainWorker(t, 64)
	status, _, body := call(t, "GET", w.url+"/v1/models", "", "")
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &list) != nil || list.Object != "list" || len(list.Data) != 1 {
		t.Fatalf("GET /v1/models: %d %s", status, body)
	}
	card := list.Data[0]
	for _, key := range []string{"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"} {
		if _, ok := card[key]; !ok {
			t.Errorf("model card without %q: %s", key, body)
		}
	}
	if card["id"] != "omnipd-reference" || card["object"] != "model" || card["root"] != "omnipd-reference" || card["parent"] != nil || card["max_model_len"] != 64.0 {
		t.Errorf("model card %v: want id and root omnipd-reference, object model, parent null, max_model_len 64", card)
	}
	perms, _ := card["permission"].([]any)
	if len(perms) != 1 {
		t.Fatalf("permission %v: want one", card["permission"])
	}
	perm, _ := perms[0].(map[string]any)
	if id, _ := perm["id"].(string); perm["object"] != "model_permission" || !strings.HasPrefix(id, "modelperm-") || perm["allow_sampling"] != true || perm["organization"] != "*" {
		t.Errorf("permission %v: want vLLM's (model_permission, modelperm-…, sampling allowed, organization *)", perm)
	}
}
