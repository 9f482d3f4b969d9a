package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
)

// vllmStage answers like a vLLM Thinker: the answer's id is "chatcmpl-"
// (or "cmpl-") followed by the leg's X-Request-Id, a whole answer always
// carries kv_transfer_params (the prefill's handoff, or null), and a leg
// asked to keep conditioning gets omnipd's handle back.
func vllmStage(handoff string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		id := "chatcmpl-" + r.Header.Get("X-Request-Id")
		if r.URL.Path == "/v1/completions" {
			id = "cmpl-" + r.Header.Get("X-Request-Id")
		}
		params := "null"
		if kv, _ := body["kv_transfer_params"].(map[string]any); kv["do_remote_decode"] == true {
			params = handoff
		}
		if stream, _ := body["stream"].(bool); stream {
			w.Header().Set("Content-Type", "text/event-stream")
			for i, ev := range []string{
				`{"id":%q,"object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hel"},"finish_reason":null}]}`,
				`{"id":%q,"object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"length"}],"kv_transfer_params":null,"omnipd_conditioning":{"key":"k","rows":3}}`,
				`{"id":%q,"object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
			} {
				_ = i
				fmt.Fprintf(w, "data: %s\n\n", fmt.Sprintf(ev, id))
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"logprobs":null,"finish_reason":"length"}],
			"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"kv_transfer_params":%s,"omnipd_conditioning":{"key":"k","rows":3}}`, id, params)
	}
}

// everyHandoffKey is a prefill handoff with every key some connector's
// contract requires.
const everyHandoffKey = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p0","remote_block_ids":[1,2],
	"remote_host":"127.0.0.1","remote_port":5600,"remote_request_id":"r-1","tp_size":1,"transfer_id":"xfer-r"}`

// publicAnswer fails t unless doc, a whole answer or one chunk, shows the
// client omnipd's own id and nothing of the stage protocol.
func publicAnswer(t *testing.T, what string, doc []byte, wantID string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatalf("%s: not a JSON object: %v: %s", what, err, doc)
	}
	for _, internal := range []string{"kv_transfer_params", "omnipd_conditioning"} {
		if v, ok := m[internal]; ok {
			t.Errorf("%s: carries %s (%s): %s", what, internal, v, doc)
		}
	}
	var id string
	_ = json.Unmarshal(m["id"], &id)
	if id != wantID {
		t.Errorf("%s: id %q, want omnipd's own %q", what, id, wantID)
	}
}

// What reaches the client is the answer's content under omnipd's request
// id: never a connector's encoded request id, kv_transfer_params (null
// included) or a conditioning handle, for whole answers and every streamed
// chunk, whichever connector moved the KV.
func TestRelayedAnswersShowNothingOfTheStageProtocol(t *testing.T) {
	type variant struct {
		connector string
		extra     map[string]any
	}
	var variants []variant
	reg := kvconnector.NewRegistry()
	for _, name := range reg.Names() {
		extra := map[string]any{"read_mode": true}
		if name == "MultiConnector" {
			extra = map[string]any{"connectors": []any{map[string]any{"kv_connector": kvconnector.NixlConnector}, map[string]any{"kv_connector": kvconnector.LMCacheConnectorV1}}}
		}
		variants = append(variants, variant{name, extra})
	}
	variants = append(variants, variant{kvconnector.ReferenceConnector, map[string]any{"handshake": "push"}}, variant{"", nil})
	for _, v := range variants {
		for _, stream := range []bool{false, true} {
			name := fmt.Sprintf("%s/%v/stream=%v", v.connector, v.extra["handshake"], stream)
			if v.connector == "" {
				name = fmt.Sprintf("colocated/stream=%v", stream)
			}
			t.Run(name, func(t *testing.T) {
				o := newOrch(t, vllmStage(everyHandoffKey), vllmStage(everyHandoffKey), kvconnector.NixlConnector)
				if v.connector == "" {
					o.cfg.Contract = nil
				} else {
					c, err := reg.Lookup(v.connector, v.extra)
					if err != nil {
						t.Fatal(err)
					}
					o.cfg.Contract = c
				}
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":%v}`, stream)
				res, err := o.Do(context.Background(), chatRequest(t, "req-42-ab12", body))
				if err != nil {
					t.Fatal(err)
				}
				defer res.Close()
				const want = "chatcmpl-req-42-ab12"
				if !stream {
					publicAnswer(t, "answer", res.Body, want)
					if !strings.Contains(string(res.Body), "hello") {
						t.Errorf("answer lost its content: %s", res.Body)
					}
					return
				}
				chunks, err := answerDocs(res)
				if err != nil {
					t.Fatal(err)
				}
				for i, ev := range chunks {
					publicAnswer(t, fmt.Sprintf("chunk %d", i+1), ev, want)
				}
				if len(chunks) != 3 {
					t.Errorf("relayed %d chunks, want 3", len(chunks))
				}
			})
		}
	}
}
