package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestResponseJSON(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string
	}{
		{
			"chat completion, kv null",
			ChatCompletion{
				ID: "chatcmpl-1", Object: ObjectChatCompletion, Created: 1700000000, Model: "m",
				Choices: []ChatChoice{{Index: 0, Message: ResponseMessage{Role: "assistant", Content: new("Hi")}, FinishReason: FinishLength}},
				Usage:   Usage{PromptTokens: 5, CompletionTokens: 1, TotalTokens: 6},
			},
			`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m",` +
				`"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":"length"}],` +
				`"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6},"kv_transfer_params":null}`,
		},
		{
			"chat completion, omni text and audio, kv object, cached tokens",
			ChatCompletion{
				ID: "chatcmpl-2", Object: ObjectChatCompletion, Created: 1, Model: "m",
				Choices: []ChatChoice{
					{Index: 0, Message: ResponseMessage{Role: "assistant", Content: new("<b>&")}, FinishReason: FinishStop},
					{Index: 0, Message: ResponseMessage{Role: "assistant", Audio: &MessageAudio{ID: "audio-0123456789abcdef", Data: "UklGRg==", ExpiresAt: 86401}}, FinishReason: FinishStop},
				},
				Usage:            Usage{PromptTokens: 3, CompletionTokens: 2, TotalTokens: 5, PromptTokensDetails: &PromptTokensDetails{CachedTokens: 2}},
				KVTransferParams: map[string]any{"remote_block_ids": []int{1, 2}, "do_remote_prefill": true},
			},
			`{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"m","choices":[` +
				`{"index":0,"message":{"role":"assistant","content":"<b>&"},"logprobs":null,"finish_reason":"stop"},` +
				`{"index":0,"message":{"role":"assistant","content":null,"audio":{"id":"audio-0123456789abcdef","data":"UklGRg==","expires_at":86401,"transcript":""}},"logprobs":null,"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":2}},` +
				`"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2]}}`,
		},
		{
			"completion",
			Completion{ID: "cmpl-1", Object: ObjectTextCompletion, Created: 2, Model: "m",
				Choices: []CompletionChoice{{Index: 0, Text: " world", FinishReason: FinishStop}},
				Usage:   Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2}},
			`{"id":"cmpl-1","object":"text_completion","created":2,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":"stop"}],` +
				`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2},"kv_transfer_params":null}`,
		},
		{
			"first chat chunk",
			ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Created: 3, Model: "m",
				Choices: []ChatChunkChoice{{Delta: ChatDelta{Role: "assistant", Content: new("")}}}},
			`{"id":"c","object":"chat.completion.chunk","created":3,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}`,
		},
		{
			"last omni audio chunk",
			ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Created: 3, Model: "m", Modality: ModalityAudio,
				Choices: []ChatChunkChoice{{Delta: ChatDelta{Content: new("UklGRg==")}, FinishReason: new(FinishStop)}}},
			`{"id":"c","object":"chat.completion.chunk","created":3,"model":"m","choices":[{"index":0,"delta":{"content":"UklGRg=="},"finish_reason":"stop"}],"usage":null,"modality":"audio"}`,
		},
		{
			"usage chunk has empty choices",
			ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Created: 3, Model: "m", Usage: &Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}},
			`{"id":"c","object":"chat.completion.chunk","created":3,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
		},
		{
			"completion chunk",
			CompletionChunk{ID: "c", Object: ObjectTextCompletion, Created: 4, Model: "m", Choices: []CompletionChunkChoice{{Index: 1, Text: "x"}}},
			`{"id":"c","object":"text_completion","created":4,"model":"m","choices":[{"index":1,"text":"x","finish_reason":null}],"usage":null}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := marshalNoEscape(tt.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// The client side decodes what vLLM sends, including fields we do not model.
func TestDecodeVLLMResponse(t *testing.T) {
	body := `{"id":"chatcmpl-abc","object":"chat.completion","created":1,"model":"m",
		"choices":[{"index":0,"message":{"role":"assistant","content":"x","reasoning_content":null,"tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],
		"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"prompt_tokens_details":null},
		"prompt_logprobs":null,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_port":5600}}`
	var c ChatCompletion
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	kv, ok := c.KVTransferParams.(map[string]any)
	if !ok || kv["remote_engine_id"] != "e" || c.Choices[0].FinishReason != FinishLength || *c.Choices[0].Message.Content != "x" || c.Usage.TotalTokens != 10 {
		t.Errorf("decoded %+v", c)
	}
	var m ChatCompletion
	if err := json.Unmarshal([]byte(`{"choices":[],"kv_transfer_params":null}`), &m); err != nil || m.KVTransferParams != nil {
		t.Errorf("null kv_transfer_params: %v, %v", m.KVTransferParams, err)
	}
}

func TestNewID(t *testing.T) {
	re := regexp.MustCompile(`^chatcmpl-[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 100 {
		id := NewID("chatcmpl-")
		if !re.MatchString(id) {
			t.Fatalf("NewID = %q", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
}

func TestErrorConstructors(t *testing.T) {
	tests := []struct {
		e      *ErrorResponse
		status int
		body   string
	}{
		{InvalidRequest("temperature", "temperature: must be >= 0, got -1"), 400,
			`{"error":{"message":"temperature: must be >= 0, got -1","type":"invalid_request_error","param":"temperature","code":null}}`},
		{InvalidRequest("", "bad"), 400, `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`},
		{NotFound("no such route"), 404, `{"error":{"message":"no such route","type":"not_found_error","param":null,"code":null}}`},
		{ModelNotFound("gpt-9"), 404, `{"error":{"message":"The model \"gpt-9\" does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`},
		{RequestTooLarge(1024), 413, `{"error":{"message":"request body exceeds the limit of 1024 bytes","type":"invalid_request_error","param":null,"code":"request_too_large"}}`},
		{Unauthorized("bad key"), 401, `{"error":{"message":"bad key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`},
		{RateLimited("slow down"), 429, `{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`},
		{InternalError("oops"), 500, `{"error":{"message":"oops","type":"server_error","param":null,"code":null}}`},
		{Unavailable("draining"), 503, `{"error":{"message":"draining","type":"server_error","param":null,"code":"service_unavailable"}}`},
		{Upstream(502, "prefill_upstream_unavailable", "prefill worker refused the connection"), 502,
			`{"error":{"message":"prefill worker refused the connection","type":"upstream_error","param":null,"code":"prefill_upstream_unavailable"}}`},
		{Upstream(504, "prefill_upstream_timeout", "prefill timed out"), 504,
			`{"error":{"message":"prefill timed out","type":"upstream_error","param":null,"code":"prefill_upstream_timeout"}}`},
	}
	for _, tt := range tests {
		if tt.e.Status != tt.status {
			t.Errorf("%s: status %d, want %d", tt.body, tt.e.Status, tt.status)
		}
		got, err := marshalNoEscape(tt.e)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.body {
			t.Errorf("got  %s\nwant %s", got, tt.body)
		}
		rec := httptest.NewRecorder()
		if err := WriteError(rec, tt.e); err != nil {
			t.Fatal(err)
		}
		if rec.Code != tt.status || rec.Header().Get("Content-Type") != "application/json" || rec.Body.String() != tt.body+"\n" {
			t.Errorf("WriteError: %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
		}
	}
	if got := Upstream(504, "prefill_upstream_timeout", "prefill timed out").Error(); got != "504 upstream_error (prefill_upstream_timeout): prefill timed out" {
		t.Errorf("Error() = %q", got)
	}
}

func TestParseErrorResponse(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		message string
		typ     string
		code    string // "" means null
	}{
		{"openai", 429, `{"error":{"message":"slow","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`, "slow", "rate_limit_error", "rate_limit_exceeded"},
		{"vllm nested, numeric code", 400, `{"error":{"message":"max_tokens too big","type":"BadRequestError","param":"max_tokens","code":400}}`, "max_tokens too big", "BadRequestError", "400"},
		{"vllm flat", 400, `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`, "bad", "BadRequestError", "400"},
		{"fastapi detail", 404, `{"detail":"Not Found"}`, "Not Found", TypeNotFound, ""},
		{"error as string", 500, `{"error":"engine dead"}`, "engine dead", TypeServer, ""},
		{"html from a proxy", 502, "<html><body>Bad Gateway</body></html>", "<html><body>Bad Gateway</body></html>", TypeServer, ""},
		{"empty", 503, ``, "Service Unavailable", TypeServer, ""},
		{"huge text", 500, strings.Repeat("x", 2000), strings.Repeat("x", 512) + "…", TypeServer, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ParseErrorResponse(tt.status, []byte(tt.body))
			code := ""
			if e.Detail.Code != nil {
				code = *e.Detail.Code
			}
			if e.Status != tt.status || e.Detail.Message != tt.message || e.Detail.Type != tt.typ || code != tt.code {
				t.Errorf("got %d %q %q %q, want %d %q %q %q", e.Status, e.Detail.Message, e.Detail.Type, code, tt.status, tt.message, tt.typ, tt.code)
			}
		})
	}
}

func TestStreamError(t *testing.T) {
	if e := StreamError([]byte(`{"id":"c","choices":[{"delta":{"content":"error"}}]}`)); e != nil {
		t.Errorf("chunk mentioning \"error\" taken for an error: %v", e)
	}
	e := StreamError([]byte(`{"error":{"object":"error","message":"KV load failed","type":"InternalServerError","param":null,"code":500}}`))
	if e == nil || e.Status != http.StatusInternalServerError || e.Detail.Message != "KV load failed" {
		t.Errorf("StreamError = %+v", e)
	}
}

// oldResponseJSON is how the response types were encoded before they wrote
// themselves: encoding/json over a plain copy, without HTML escaping.
func oldResponseJSON(v any) ([]byte, error) {
	switch v := v.(type) {
	case ChatCompletion:
		type plain ChatCompletion
		v.Choices = orEmpty(v.Choices)
		return marshalNoEscape(plain(v))
	case Completion:
		type plain Completion
		v.Choices = orEmpty(v.Choices)
		return marshalNoEscape(plain(v))
	case ChatCompletionChunk:
		type plain ChatCompletionChunk
		v.Choices = orEmpty(v.Choices)
		return marshalNoEscape(plain(v))
	case CompletionChunk:
		type plain CompletionChunk
		v.Choices = orEmpty(v.Choices)
		return marshalNoEscape(plain(v))
	}
	panic("not a response type")
}

func TestResponseJSONMatchesEncodingJSON(t *testing.T) {
	odd := []string{"", "plain", "line\nbreak\r\ttab", `quote " backslash \`, "<|im_start|> & </b>", "sep\u2028par\u2029",
		"héllo 世界 🙂", "bad \xff utf8 \xe2\x82", "ctl \x00\x01\x1f\x7f \b\f"}
	var values []any
	for _, s := range odd {
		values = append(values,
			ChatCompletionChunk{ID: s, Object: ObjectChatCompletionChunk, Created: -1, Model: s,
				Choices: []ChatChunkChoice{{Index: 2, Delta: ChatDelta{Role: s, Content: &s}, FinishReason: &s}}, Modality: s},
			ChatCompletionChunk{ID: "c", Object: s, Choices: []ChatChunkChoice{{Delta: ChatDelta{Role: s}}, {Delta: ChatDelta{Content: &s}}},
				Usage: &Usage{PromptTokens: 1, PromptTokensDetails: &PromptTokensDetails{CachedTokens: 7}}},
			CompletionChunk{ID: s, Object: ObjectTextCompletion, Created: 1 << 40, Model: s,
				Choices: []CompletionChunkChoice{{Text: s, FinishReason: &s}, {Index: 1, Text: s}}},
			ChatCompletion{ID: s, Object: ObjectChatCompletion, Model: s,
				Choices: []ChatChoice{
					{Message: ResponseMessage{Role: s, Content: &s}, FinishReason: s},
					{Message: ResponseMessage{Role: "assistant", Audio: &MessageAudio{ID: s, Data: s, ExpiresAt: -5, Transcript: s}}},
				},
				KVTransferParams: map[string]any{s: s, "n": 5600, "ids": []int{1, -2}, "nested": map[string]any{s: []any{1.5, s, nil, true}}}},
			Completion{ID: s, Object: ObjectTextCompletion, Model: s, Choices: []CompletionChoice{{Text: s, FinishReason: s}},
				KVTransferParams: []any{s, 1e21, 1e-7, 0.1}},
		)
	}
	lp := -0.25
	values = append(values,
		ChatCompletionChunk{},
		CompletionChunk{Choices: []CompletionChunkChoice{}},
		ChatCompletion{},
		Completion{Usage: Usage{PromptTokensDetails: &PromptTokensDetails{}}},
		ChatCompletionChunk{Choices: []ChatChunkChoice{{Delta: ChatDelta{Content: new("x")},
			Logprobs: &ChatLogprobs{Content: []ChatTokenLogprob{{Token: "<x>", Logprob: -9999.0, Bytes: []int{60}, TopLogprobs: []TopLogprob{{Token: "y", Logprob: -1e-9}}}}}}}},
		ChatCompletion{Choices: []ChatChoice{{Logprobs: &ChatLogprobs{}}}, KVTransferParams: map[string]any{}},
		CompletionChunk{Choices: []CompletionChunkChoice{{Logprobs: &CompletionLogprobs{TextOffset: []int{0}, TokenLogprobs: []*float64{nil, &lp}, Tokens: []string{"a&b"}, TopLogprobs: []map[string]float64{nil, {"b": -0.5, "a": 0}}}}}},
		Completion{Choices: []CompletionChoice{{Logprobs: &CompletionLogprobs{}}}, KVTransferParams: []int(nil)},
		Completion{KVTransferParams: map[string]any(nil)},
		ChatCompletion{KVTransferParams: map[string]any{"remote_block_ids": []int(nil), "x": []string{"<"}, "f": 3.0}},
	)
	for i, v := range values {
		want, err := oldResponseJSON(v)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		got, err := v.(json.Marshaler).MarshalJSON()
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if string(got) != string(want) {
			t.Errorf("%d %T:\ngot  %s\nwant %s", i, v, got, want)
		}
		// What a worker writes for a whole response: json.Encoder's output,
		// HTML escaped, from MarshalJSON's bytes by json.HTMLEscape alone.
		var enc, esc bytes.Buffer
		if err := json.NewEncoder(&enc).Encode(v); err != nil {
			t.Fatal(err)
		}
		json.HTMLEscape(&esc, got)
		esc.WriteByte('\n')
		if enc.String() != esc.String() {
			t.Errorf("%d %T: HTML escaped\ngot  %s\nwant %s", i, v, esc.Bytes(), enc.Bytes())
		}
	}
	// A float encoding/json cannot write fails as before.
	bad := ChatCompletion{KVTransferParams: map[string]any{"x": math.Inf(-1)}}
	if _, err := bad.MarshalJSON(); err == nil {
		t.Error("-Inf in kv_transfer_params encoded")
	}
}

// Relay gives the client the answer under the router's id without the
// stage-protocol members, leaving every other byte and the member order as
// the stage wrote them.
func TestRelay(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"id":"chatcmpl-___prefill_addr_a:1___decode_addr_b:2_6162","object":"chat.completion","choices":[{"index":0}],"kv_transfer_params":null}`,
			`{"id":"chatcmpl-r1","object":"chat.completion","choices":[{"index":0}]}`},
		{` { "object" : "x" , "kv_transfer_params" : {"remote_block_ids":[1]}, "omnipd_conditioning":{"key":"k"} } `,
			`{"id":"chatcmpl-r1","object" : "x"}`},
		{`{"kv_transfer_params":null}`, `{"id":"chatcmpl-r1"}`},
		{`{}`, `{"id":"chatcmpl-r1"}`},
		{`{"\u0069d":"other","kv_transfer_p\u0061rams":1,"z":"\u00e9"}`, `{"id":"chatcmpl-r1","z":"\u00e9"}`},
		{`{"id":"chatcmpl-r1","choices":[{"delta":{"content":"kv_transfer_params"}}]}`,
			`{"id":"chatcmpl-r1","choices":[{"delta":{"content":"kv_transfer_params"}}]}`},
	} {
		got, err := Relay([]byte(c.in), "chatcmpl-r1")
		if err != nil || string(got) != c.want {
			t.Errorf("Relay(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	same := []byte(`{"id":"chatcmpl-r1","choices":[]}`)
	if got, _ := Relay(same, "chatcmpl-r1"); &got[0] != &same[0] {
		t.Error("Relay copied a document it did not change")
	}
	for _, bad := range []string{``, `[]`, `"x"`, `{"id":}`, `{"a":1}x`, `{"a":1,}`, `{"a" 1}`} {
		if _, err := Relay([]byte(bad), "x"); !errors.Is(err, ErrNotObject) {
			t.Errorf("Relay(%q) = %v, want ErrNotObject", bad, err)
		}
	}
}
