package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

const toolFields = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
	"tool_choice":{"type":"function","function":{"name":"get_weather"}},"response_format":{"type":"json_object"}`

// toolStage answers like vLLM with a tool parser: a tool call, finish_reason
// "tool_calls", whole or streamed (delta.tool_calls).
func toolStage(w http.ResponseWriter, body map[string]any) {
	if stream, _ := body["stream"].(bool); stream {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","index":0,"function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
			`{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", ev)
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	if kv, _ := body["kv_transfer_params"].(map[string]any); kv["do_remote_decode"] == true {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-x","choices":[],"kv_transfer_params":%s}`, everyHandoffKey)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,
		"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],
		"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"kv_transfer_params":null}`)
}

// tools, tool_choice and response_format reach every Thinker leg as the
// client sent them, and the engine's tool call — message.tool_calls or
// delta.tool_calls, finish_reason "tool_calls" — reaches the client as the
// engine sent it, disaggregated and colocated, whole and streamed.
func TestToolCallsRelayedUnchanged(t *testing.T) {
	var sent map[string]any
	_ = json.Unmarshal([]byte("{"+toolFields+"}"), &sent)
	for _, pd := range []bool{false, true} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("pd=%v/stream=%v", pd, stream), func(t *testing.T) {
				pre, dec := &fakeStage{answer: toolStage}, &fakeStage{answer: toolStage}
				o := newOrch(t, pre, dec, "NixlConnector")
				if !pd {
					o.cfg.Contract = nil
				}
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"weather?"}],"stream":%v,%s}`, stream, toolFields)
				res, err := o.Do(context.Background(), chatRequest(t, "r-tools", body))
				if err != nil {
					t.Fatal(err)
				}
				defer res.Close()
				legs := []*fakeStage{dec}
				if pd {
					legs = append(legs, pre)
				}
				for _, leg := range legs {
					got, _ := leg.last()
					for k, want := range sent {
						if !reflect.DeepEqual(got[k], want) {
							t.Errorf("leg %s = %v, want the client's %v", k, got[k], want)
						}
					}
				}
				docs, err := answerDocs(res)
				if err != nil {
					t.Fatal(err)
				}
				var all string
				for _, d := range docs {
					all += string(d) + "\n"
				}
				for _, want := range []string{`"tool_calls":[{"id":"call_1","type":"function"`, `"finish_reason":"tool_calls"`, `get_weather`, `{\"city\":\"Paris\"}`} {
					if !strings.Contains(all, want) {
						t.Errorf("the client's answer lacks %s: %s", want, all)
					}
				}
			})
		}
	}
}

// A prefill that refuses the request (the reference worker refuses tools
// with a 400) gives the client that 400 with the worker's own error body,
// not a 502, and no decode is sent.
func TestPrefillRefusalRelayedAs400(t *testing.T) {
	const refusal = `{"error":{"message":"tools are not supported by the reference worker","type":"invalid_request_error","param":"tools","code":null}}`
	pre := &fakeStage{answer: func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, refusal)
	}}
	dec := &fakeStage{answer: toolStage}
	o := newOrch(t, pre, dec, "NixlConnector")
	_, err := o.Do(context.Background(), chatRequest(t, "r-400", `{"messages":[{"role":"user","content":"hi"}],`+toolFields+`}`))
	var oe *Error
	if !errors.As(err, &oe) {
		t.Fatalf("err = %v, want an *Error", err)
	}
	resp := oe.Response()
	if oe.Status != 400 || resp.Status != 400 || resp.Detail.Message != "tools are not supported by the reference worker" || resp.Detail.Param == nil || *resp.Detail.Param != "tools" {
		t.Errorf("client gets %d %+v; want the prefill's 400 and its error body", oe.Status, resp.Detail)
	}
	if b, _ := dec.last(); b != nil {
		t.Error("a decode was sent for a request the prefill refused")
	}
}
