package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// sameJSON reports whether a and b are the same JSON value, ignoring key
// order and whitespace.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("unmarshal %s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func decodeChat(t *testing.T, body string) *ChatCompletionRequest {
	t.Helper()
	req, err := DecodeChatRequest(strings.NewReader(body), 1<<20)
	if err != nil {
		t.Fatalf("DecodeChatRequest(%s): %v", body, err)
	}
	return req
}

func decodeCompletion(t *testing.T, body string) *CompletionRequest {
	t.Helper()
	req, err := DecodeCompletionRequest(strings.NewReader(body), 1<<20)
	if err != nil {
		t.Fatalf("DecodeCompletionRequest(%s): %v", body, err)
	}
	return req
}

func TestDecodePromptShapes(t *testing.T) {
	tests := []struct {
		name   string
		prompt string
		want   Prompt
		len    int
	}{
		{"string", `"Hello"`, Prompt{Kind: PromptText, Texts: []string{"Hello"}}, 1},
		{"empty string", `""`, Prompt{Kind: PromptText, Texts: []string{""}}, 1},
		{"strings", `["a", "b"]`, Prompt{Kind: PromptTexts, Texts: []string{"a", "b"}}, 2},
		{"token ids", `[9707, 11, 0]`, Prompt{Kind: PromptTokens, TokenIDs: [][]int{{9707, 11, 0}}}, 1},
		{"token id batch", `[[1, 2], [3]]`, Prompt{Kind: PromptTokenBatch, TokenIDs: [][]int{{1, 2}, {3}}}, 2},
		{"whitespace", " [ [ 1 ] ] ", Prompt{Kind: PromptTokenBatch, TokenIDs: [][]int{{1}}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","prompt":` + tt.prompt + `}`
			req := decodeCompletion(t, body)
			if !reflect.DeepEqual(*req.Prompt, tt.want) {
				t.Errorf("prompt = %#v, want %#v", *req.Prompt, tt.want)
			}
			if got := req.Prompt.Len(); got != tt.len {
				t.Errorf("Len() = %d, want %d", got, tt.len)
			}
			out, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			if !sameJSON(t, out, []byte(body)) {
				t.Errorf("round trip changed the prompt's shape:\n got %s\nwant %s", out, body)
			}
		})
	}
}

func TestDecodeContentShapes(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    *Content
		text    string
	}{
		{"string", `"hi"`, &Content{Text: "hi"}, "hi"},
		{"null", `null`, nil, ""},
		{"text parts", `[{"type":"text","text":"a"},{"type":"text","text":"b"}]`,
			&Content{Parts: []ContentPart{TextPart("a"), TextPart("b")}}, "a\nb"},
		{"empty parts", `[]`, &Content{Parts: []ContentPart{}}, ""},
		{"image and audio parts kept raw", `[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},` +
			`{"type":"text","text":"what is this?"},` +
			`{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]`,
			&Content{Parts: []ContentPart{
				{Type: "image_url", Extra: map[string]json.RawMessage{"image_url": json.RawMessage(`{"url":"data:image/png;base64,AAAA"}`)}},
				TextPart("what is this?"),
				{Type: "input_audio", Extra: map[string]json.RawMessage{"input_audio": json.RawMessage(`{"data":"UklGRg==","format":"wav"}`)}},
			}}, "what is this?"},
		{"part without type", `[{"image_url":"http://x/y.png"}]`,
			&Content{Parts: []ContentPart{{Extra: map[string]json.RawMessage{"image_url": json.RawMessage(`"http://x/y.png"`)}}}}, ""},
		{"unknown keys on a text part", `[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}]`,
			&Content{Parts: []ContentPart{{Type: "text", Text: "a", Extra: map[string]json.RawMessage{"cache_control": json.RawMessage(`{"type":"ephemeral"}`)}}}}, "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"messages":[{"role":"user","content":` + tt.content + `}]}`
			req := decodeChat(t, body)
			got := req.Messages[0].Content
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("content = %#v, want %#v", got, tt.want)
			}
			if s := req.Messages[0].Text(); s != tt.text {
				t.Errorf("Text() = %q, want %q", s, tt.text)
			}
			out, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			want := body
			if tt.content == "null" { // null and absent are the same to vLLM
				want = `{"messages":[{"role":"user"}]}`
			}
			if !sameJSON(t, out, []byte(want)) {
				t.Errorf("round trip:\n got %s\nwant %s", out, want)
			}
		})
	}
}

func TestDecodeChatFields(t *testing.T) {
	body := `{
		"model": "qwen3-omni",
		"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
		"max_tokens": 10, "max_completion_tokens": 20,
		"temperature": 0, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "n": 2, "seed": -7,
		"stop": "END", "stop_token_ids": [151645], "ignore_eos": true, "min_tokens": 3,
		"repetition_penalty": 1.1, "presence_penalty": -0.5, "frequency_penalty": 2,
		"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": false},
		"logprobs": true, "top_logprobs": 5,
		"include_stop_str_in_output": false, "skip_special_tokens": false,
		"user": "u1", "kv_transfer_params": {"do_remote_decode": true},
		"modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "Ethan"}, "speaker": "Chelsie"
	}`
	req := decodeChat(t, body)
	want := &ChatCompletionRequest{
		Model: "qwen3-omni",
		Messages: []ChatMessage{
			{Role: "system", Content: TextContent("be brief")},
			{Role: "user", Content: TextContent("hi")},
		},
		MaxCompletionTokens: new(20),
		SamplingParams: SamplingParams{
			MaxTokens: new(10), Temperature: new(0.0), TopP: new(0.9), TopK: new(-1), MinP: new(0.05),
			N: new(2), Seed: new(int64(-7)), Stop: &Stop{Strings: []string{"END"}, Single: true},
			StopTokenIDs: []int{151645}, IgnoreEOS: new(true), MinTokens: new(3),
			RepetitionPenalty: new(1.1), PresencePenalty: new(-0.5), FrequencyPenalty: new(2.0),
			IncludeStopStrInOutput: new(false), SkipSpecialTokens: new(false),
		},
		Stream:           new(true),
		StreamOptions:    &StreamOptions{IncludeUsage: new(true), ContinuousUsageStats: new(false)},
		Logprobs:         new(true),
		TopLogprobs:      new(5),
		User:             new("u1"),
		KVTransferParams: map[string]any{"do_remote_decode": true},
		Modalities:       []string{"text", "audio"},
		Audio:            &AudioOptions{Format: "wav", Voice: "Ethan"},
		Speaker:          new("Chelsie"),
	}
	if !reflect.DeepEqual(req, want) {
		gotJSON, _ := json.MarshalIndent(req, "", " ")
		t.Errorf("decoded request differs:\n%s", gotJSON)
	}
	if req.Extra != nil {
		t.Errorf("Extra = %v, want nil: every key is modelled", req.Extra)
	}
	if got := *req.EffectiveMaxTokens(); got != 20 {
		t.Errorf("EffectiveMaxTokens = %d, want max_completion_tokens 20", got)
	}
	if got := req.StopList(); !reflect.DeepEqual(got, []string{"END"}) {
		t.Errorf("StopList = %q", got)
	}
	if !req.Streaming() || !req.IncludeUsage() {
		t.Errorf("Streaming() = %v, IncludeUsage() = %v, want true, true", req.Streaming(), req.IncludeUsage())
	}
	out, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, out, []byte(body)) {
		t.Errorf("round trip:\n got %s\nwant %s", out, body)
	}
}

func TestEffectiveMaxTokensAndStopList(t *testing.T) {
	tests := []struct {
		body string
		max  *int
		stop []string
	}{
		{`{"messages":[{"role":"user"}]}`, nil, nil},
		{`{"messages":[{"role":"user"}],"max_tokens":7}`, new(7), nil},
		{`{"messages":[{"role":"user"}],"max_completion_tokens":9,"max_tokens":7}`, new(9), nil},
		{`{"messages":[{"role":"user"}],"stop":["a","b"]}`, nil, []string{"a", "b"}},
		{`{"messages":[{"role":"user"}],"stop":[]}`, nil, []string{}},
	}
	for _, tt := range tests {
		req := decodeChat(t, tt.body)
		got := req.EffectiveMaxTokens()
		if !reflect.DeepEqual(got, tt.max) {
			t.Errorf("%s: EffectiveMaxTokens = %v, want %v", tt.body, got, tt.max)
		}
		if got != nil {
			*got = 1000
			if m := req.EffectiveMaxTokens(); *m == 1000 {
				t.Errorf("%s: editing EffectiveMaxTokens' result edited the request", tt.body)
			}
		}
		if s := req.StopList(); !reflect.DeepEqual(s, tt.stop) {
			t.Errorf("%s: StopList = %q, want %q", tt.body, s, tt.stop)
		}
	}
}

// The orchestrator forwards client bodies to vLLM: whatever it does not
// model must come out as it went in.
func TestUnknownFieldsSurvive(t *testing.T) {
	chat := []string{
		`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true,"guided_json":{"type":"object","properties":{"a":{"type":"integer"}}},"priority":-3,"echo":null,"min_completion_tokens":4}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}],"name":"bot"},{"role":"tool","tool_call_id":"c1","content":"42"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true,"future_option":[1,2]},"audio":{"format":"wav","sample_rate":24000}}`,
		// Case matters to vLLM: "Model" and "TEMPERATURE" are not model and temperature.
		`{"messages":[{"role":"user","content":"x"}],"Model":"other","TEMPERATURE":"hot","temperature":0.5}`,
		// Keys with escapes, unicode and HTML-significant characters.
		`{"messages":[{"role":"user","content":"<|im_start|>\u00e9\n"}],"we\"ird\\key":"<&>","ключ":{"ü":[]}}`,
	}
	for _, body := range chat {
		req := decodeChat(t, body)
		out, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if !sameJSON(t, out, []byte(body)) {
			t.Errorf("chat round trip:\n got %s\nwant %s", out, body)
		}
		// A clone marshals the same.
		out2, err := json.Marshal(req.Clone())
		if err != nil {
			t.Fatal(err)
		}
		if string(out2) != string(out) {
			t.Errorf("clone marshals differently:\n got %s\nwant %s", out2, out)
		}
	}

	req := decodeChat(t, chat[3])
	if req.Model != "" || *req.Temperature != 0.5 {
		t.Errorf("case-insensitive match: model %q temperature %v", req.Model, *req.Temperature)
	}
	if len(req.Extra) != 2 || string(req.Extra["Model"]) != `"other"` {
		t.Errorf("Extra = %s, want Model and TEMPERATURE", req.Extra)
	}

	completion := `{"model":"m","prompt":[1,2,3],"echo":true,"suffix":"s","logit_bias":{"50256":-100},"return_tokens_as_token_ids":true,"logprobs":2}`
	creq := decodeCompletion(t, completion)
	out, err := json.Marshal(creq)
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, out, []byte(completion)) {
		t.Errorf("completion round trip:\n got %s\nwant %s", out, completion)
	}
	if *creq.Logprobs != 2 {
		t.Errorf("completions logprobs = %v, want the integer 2", *creq.Logprobs)
	}
}

// An edit to a modelled field wins over a stale pass-through copy of it.
func TestMarshalFieldsWinOverExtra(t *testing.T) {
	req := decodeChat(t, `{"messages":[{"role":"user","content":"x"}],"foo":1}`)
	req.Extra["max_tokens"] = json.RawMessage(`99`)
	req.MaxTokens = new(1)
	req.Extra["bar"] = json.RawMessage(` [ 1 , 2 ] `)
	out, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"bar":[1,2],"foo":1}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
	req.Extra["bad"] = json.RawMessage(`{`)
	if _, err := json.Marshal(req); err == nil {
		t.Error("invalid JSON in Extra marshalled without error")
	}
}

func TestKVTransferParamsRoundTrip(t *testing.T) {
	params := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2,3],[4]],` +
		`"remote_engine_id":"e-1","remote_request_id":"r","remote_host":"10.0.0.2","remote_port":5600,` +
		`"tp_size":1,"nested":{"z":null,"a":[{"b":1.5}]},"empty":{}}`
	// Key order differs between the client body and our output; the value must not.
	body := `{"model":"m","prompt":"p","kv_transfer_params":` + params + `}`
	req := decodeCompletion(t, body)
	if got := req.KVTransferParams["remote_port"]; got != 5600.0 {
		t.Errorf("remote_port = %#v, want float64 5600", got)
	}
	out, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, back.KV, []byte(params)) {
		t.Errorf("kv_transfer_params changed:\n got %s\nwant %s", back.KV, params)
	}

	// An empty object is not the same as absent: it survives.
	req = decodeCompletion(t, `{"prompt":"p","kv_transfer_params":{}}`)
	if req.KVTransferParams == nil {
		t.Fatal("empty kv_transfer_params decoded as absent")
	}
	out, _ = json.Marshal(req)
	if !strings.Contains(string(out), `"kv_transfer_params":{}`) {
		t.Errorf("empty kv_transfer_params dropped: %s", out)
	}
	// Null is absent.
	req = decodeCompletion(t, `{"prompt":"p","kv_transfer_params":null}`)
	if req.KVTransferParams != nil {
		t.Errorf("null kv_transfer_params = %v", req.KVTransferParams)
	}
}

func TestValidationErrorsNameTheirParam(t *testing.T) {
	chat := func(extra string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	tests := []struct {
		name  string
		body  string
		param string
		msg   string // a substring of Error()
	}{
		// presence and shape of messages
		{"messages missing", `{"model":"m"}`, "messages", "required"},
		{"messages null", `{"messages":null}`, "messages", "required"},
		{"messages empty", `{"messages":[]}`, "messages", "must not be empty"},
		{"messages not array", `{"messages":"hi"}`, "messages", "expected an array, got string"},
		{"message not object", `{"messages":["hi"]}`, "messages[0]", "expected an object, got string"},
		{"message null", `{"messages":[{"role":"user"},null]}`, "messages[1]", "got null"},
		{"role missing", `{"messages":[{"role":"user"},{"content":"x"}]}`, "messages[1].role", "required"},
		{"role wrong type", `{"messages":[{"role":1}]}`, "messages[0].role", "expected a string, got number"},
		{"content wrong type", `{"messages":[{"role":"user","content":5}]}`, "messages[0].content", "expected a string or an array of content parts, got number"},
		{"content part not object", `{"messages":[{"role":"user","content":["x"]}]}`, "messages[0].content[0]", "expected an object, got string"},
		{"content part type wrong", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":7}]}]}`, "messages[0].content[1].type", "expected a string, got number"},
		{"text part without text", `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text", "required"},
		{"text part text not string", `{"messages":[{"role":"user","content":[{"type":"text","text":["a"]}]}]}`, "messages[0].content[0].text", "expected a string, got array"},
		// wrong types of scalars
		{"model not string", `{"model":1,"messages":[{"role":"user"}]}`, "model", "expected a string, got number"},
		{"temperature string", chat(`,"temperature":"0.5"`), "temperature", "expected a number, got string"},
		{"max_tokens fractional", chat(`,"max_tokens":1.5`), "max_tokens", "expected an integer, got number 1.5"},
		{"max_tokens huge", chat(`,"max_tokens":1e40`), "max_tokens", "expected an integer"},
		{"n bool", chat(`,"n":true`), "n", "expected an integer, got boolean"},
		{"stream string", chat(`,"stream":"yes"`), "stream", "expected a boolean, got string"},
		{"stop number", chat(`,"stop":3`), "stop", "expected a string or an array of strings, got number"},
		{"stop element", chat(`,"stop":["a",1]`), "stop[1]", "expected a string, got number"},
		{"stop_token_ids element", chat(`,"stop_token_ids":[1,"2"]`), "stop_token_ids[1]", "expected an integer, got string"},
		{"stop_token_ids null element", chat(`,"stop_token_ids":[1,null]`), "stop_token_ids[1]", "expected an integer, got null"},
		{"kv_transfer_params array", chat(`,"kv_transfer_params":[]`), "kv_transfer_params", "expected an object, got array"},
		{"stream_options wrong", chat(`,"stream":true,"stream_options":{"include_usage":1}`), "stream_options.include_usage", "expected a boolean, got number"},
		{"audio not object", chat(`,"audio":"wav"`), "audio", "expected an object, got string"},
		{"modalities element", chat(`,"modalities":["text",2]`), "modalities[1]", "expected a string, got number"},
		// ranges
		{"n zero", chat(`,"n":0`), "n", "must be >= 1, got 0"},
		{"max_tokens negative", chat(`,"max_tokens":-1`), "max_tokens", "must be >= 0, got -1"},
		{"max_completion_tokens negative", chat(`,"max_completion_tokens":-5`), "max_completion_tokens", "must be >= 0"},
		{"temperature negative", chat(`,"temperature":-0.1`), "temperature", "must be >= 0, got -0.1"},
		{"top_p zero", chat(`,"top_p":0`), "top_p", "must be in (0, 1], got 0"},
		{"top_p above one", chat(`,"top_p":1.01`), "top_p", "must be in (0, 1]"},
		{"top_k", chat(`,"top_k":-2`), "top_k", "must be -1 or 0 (disabled) or >= 1, got -2"},
		{"min_p", chat(`,"min_p":1.5`), "min_p", "must be in [0, 1]"},
		{"stop_token_ids negative", chat(`,"stop_token_ids":[3,-1]`), "stop_token_ids[1]", "must be >= 0"},
		{"min_tokens negative", chat(`,"min_tokens":-1`), "min_tokens", "must be >= 0"},
		{"min_tokens over max_tokens", chat(`,"min_tokens":5,"max_tokens":4`), "min_tokens", "must be <= max_tokens (4), got 5"},
		{"min_tokens over max_completion_tokens", chat(`,"min_tokens":5,"max_tokens":10,"max_completion_tokens":4`), "min_tokens", "must be <= max_completion_tokens (4)"},
		{"repetition_penalty", chat(`,"repetition_penalty":0`), "repetition_penalty", "must be > 0"},
		{"presence_penalty", chat(`,"presence_penalty":2.5`), "presence_penalty", "must be in [-2, 2]"},
		{"frequency_penalty", chat(`,"frequency_penalty":-3`), "frequency_penalty", "must be in [-2, 2]"},
		{"stream_options without stream", chat(`,"stream_options":{"include_usage":true}`), "stream_options", "only allowed when stream is true"},
		{"stream_options with stream false", chat(`,"stream":false,"stream_options":{}`), "stream_options", "only allowed"},
		{"top_logprobs negative", chat(`,"logprobs":true,"top_logprobs":-1`), "top_logprobs", "must be >= 0"},
		{"top_logprobs without logprobs", chat(`,"top_logprobs":2`), "top_logprobs", "requires logprobs"},
		{"modalities empty", chat(`,"modalities":[]`), "modalities", "must not be empty"},
		{"modality unknown", chat(`,"modalities":["text","video"]`), "modalities[1]", `unsupported modality "video"`},
		{"audio format", chat(`,"audio":{"format":"aiff"}`), "audio.format", `unsupported format "aiff"`},
		// whole body
		{"empty body", ``, "", "request body is empty"},
		{"whitespace body", " \n\t", "", "request body is empty"},
		{"array body", `[1]`, "", "request body: expected an object, got array"},
		{"null body", `null`, "", "request body: expected an object, got null"},
		{"string body", `"x"`, "", "expected an object, got string"},
		{"syntax error", "{\n  \"model\": \"m\",\n  \"messages\": [}", "", "invalid JSON at line 3, column 16 (byte 34)"},
		{"truncated", `{"messages":[{"role":"user"`, "", "unexpected end of JSON input"},
		{"trailing garbage", `{"messages":[{"role":"user"}]} x`, "", "invalid JSON at line 1, column 32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeChatRequest(strings.NewReader(tt.body), 1<<20)
			checkRequestError(t, err, tt.param, tt.msg)
		})
	}

	completions := []struct {
		name  string
		body  string
		param string
		msg   string
	}{
		{"prompt missing", `{"model":"m"}`, "prompt", "required"},
		{"prompt null", `{"prompt":null}`, "prompt", "required"},
		{"prompt number", `{"prompt":5}`, "prompt", "expected a string, an array of strings, an array of token ids or an array of arrays of token ids, got number"},
		{"prompt object", `{"prompt":{}}`, "prompt", "got object"},
		{"prompt empty array", `{"prompt":[]}`, "prompt", "must not be empty"},
		{"prompt mixed strings", `{"prompt":["a",1]}`, "prompt[1]", "expected a string, got number"},
		{"prompt mixed ids", `{"prompt":[1,"a"]}`, "prompt[1]", "expected an integer, got string"},
		{"prompt fractional id", `{"prompt":[1,2.5]}`, "prompt[1]", "expected an integer, got number 2.5"},
		{"prompt null id", `{"prompt":[null]}`, "prompt[0]", "expected an integer, got null"},
		{"prompt negative id", `{"prompt":[1,-2]}`, "prompt[1]", "token ids must be >= 0, got -2"},
		{"prompt batch mixed", `{"prompt":[[1],2]}`, "prompt[1]", "expected an array, got number"},
		{"prompt batch inner", `{"prompt":[[1],[2,"x"]]}`, "prompt[1][1]", "expected an integer, got string"},
		{"prompt batch empty inner", `{"prompt":[[1],[]]}`, "prompt[1]", "must not be empty"},
		{"prompt batch negative", `{"prompt":[[1],[0,-1]]}`, "prompt[1][1]", "must be >= 0"},
		{"logprobs bool", `{"prompt":"p","logprobs":true}`, "logprobs", "expected an integer, got boolean"},
		{"logprobs negative", `{"prompt":"p","logprobs":-1}`, "logprobs", "must be >= 0"},
		{"n zero", `{"prompt":"p","n":0}`, "n", "must be >= 1"},
		{"top_p", `{"prompt":"p","top_p":-1}`, "top_p", "must be in (0, 1]"},
		{"stream_options", `{"prompt":"p","stream_options":{}}`, "stream_options", "only allowed"},
	}
	for _, tt := range completions {
		t.Run("completions/"+tt.name, func(t *testing.T) {
			_, err := DecodeCompletionRequest(strings.NewReader(tt.body), 1<<20)
			checkRequestError(t, err, tt.param, tt.msg)
		})
	}
}

func checkRequestError(t *testing.T, err error, param, msg string) {
	t.Helper()
	var re *RequestError
	if !errors.As(err, &re) {
		t.Fatalf("error = %v (%T), want *RequestError", err, err)
	}
	if re.Param != param {
		t.Errorf("Param = %q, want %q (error: %v)", re.Param, param, err)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("Error() = %q, want it to contain %q", err.Error(), msg)
	}
	if param != "" && !strings.HasPrefix(err.Error(), param+": ") {
		t.Errorf("Error() = %q does not start with its param", err.Error())
	}
	resp := re.Response()
	if resp.Status != http.StatusBadRequest || resp.Detail.Type != TypeInvalidRequest {
		t.Errorf("Response() = %d %s, want 400 invalid_request_error", resp.Status, resp.Detail.Type)
	}
	if (resp.Detail.Param == nil) != (param == "") || (param != "" && *resp.Detail.Param != param) {
		t.Errorf("Response().param = %v, want %q", resp.Detail.Param, param)
	}
}

func TestValidRequestsPass(t *testing.T) {
	chat := []string{
		`{"messages":[{"role":"user"}]}`,
		`{"messages":[{"role":"user","content":""}],"max_tokens":0,"temperature":0,"top_p":1,"top_k":0,"min_p":0,"n":1,"min_tokens":0}`,
		`{"messages":[{"role":"user","content":"x"}],"top_k":-1,"presence_penalty":-2,"frequency_penalty":2,"stream":true,"stream_options":{}}`,
		`{"messages":[{"role":"user","content":"x"}],"modalities":["audio"],"audio":{"format":"pcm"},"speaker":"Ethan"}`,
		`{"messages":[{"role":"user","content":"x"}],"min_tokens":4,"max_tokens":4,"logprobs":false}`,
	}
	for _, body := range chat {
		decodeChat(t, body)
	}
	completions := []string{
		`{"prompt":""}`,
		`{"prompt":[""]}`,
		`{"prompt":[0]}`,
		`{"prompt_embeds":"AAAA"}`, // vLLM accepts embeddings instead of a prompt
		`{"prompt":"p","logprobs":0,"max_tokens":0,"echo":true}`,
	}
	for _, body := range completions {
		decodeCompletion(t, body)
	}
}

func TestBodyLimit(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"hello"}]}`
	n := int64(len(body))
	for _, tt := range []struct {
		limit   int64
		tooBig  bool
		comment string
	}{
		{n, false, "exactly at the limit"},
		{n + 1, false, "under"},
		{n - 1, true, "one byte over"},
		{1, true, "tiny limit"},
		{0, false, "no limit"},
		{-1, false, "no limit"},
	} {
		_, err := DecodeChatRequest(iotest.HalfReader(strings.NewReader(body)), tt.limit)
		if got := errors.Is(err, ErrTooLarge); got != tt.tooBig {
			t.Errorf("%s (limit %d): errors.Is(err, ErrTooLarge) = %v, err = %v", tt.comment, tt.limit, got, err)
		}
		if tt.tooBig {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("too-large error %T is not a *RequestError", err)
			}
			if resp := re.Response(); resp.Status != http.StatusRequestEntityTooLarge || *resp.Detail.Code != CodeRequestTooLarge {
				t.Errorf("Response() = %d %v, want 413 request_too_large", resp.Status, resp.Detail.Code)
			}
		}
	}

	// A body the HTTP server already cut with http.MaxBytesReader is too large too.
	rec := httptest.NewRecorder()
	r := http.MaxBytesReader(rec, io.NopCloser(strings.NewReader(body)), 10)
	if _, err := DecodeCompletionRequest(r, 0); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxBytesReader overflow: err = %v, want ErrTooLarge", err)
	}

	// A failing reader is not the client's request being wrong.
	boom := errors.New("connection reset")
	_, err := DecodeChatRequest(iotest.ErrReader(boom), 100)
	var re *RequestError
	if !errors.Is(err, boom) || errors.As(err, &re) {
		t.Errorf("read failure: err = %v, want the cause wrapped, not a *RequestError", err)
	}
}

func TestSyntaxErrorKeepsCause(t *testing.T) {
	_, err := DecodeChatRequest(strings.NewReader(`{"a":}`), 0)
	var se *json.SyntaxError
	if !errors.As(err, &se) || se.Offset != 6 {
		t.Fatalf("err = %v, want a wrapped *json.SyntaxError at offset 6", err)
	}
	if !strings.Contains(err.Error(), "line 1, column 6") {
		t.Errorf("Error() = %q, want line 1, column 6", err)
	}
}

// Clone must be deep: the orchestrator edits the prefill copy (max_tokens=1,
// no stop, n=1) and the decode copy separately.
func TestCloneIsDeep(t *testing.T) {
	chatBody := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","x":1},{"type":"image_url","image_url":{"url":"u"}}],"name":"n"},{"role":"assistant","content":"b"}],
		"max_completion_tokens":3,"max_tokens":4,"temperature":0.5,"top_p":0.5,"top_k":3,"min_p":0.1,"n":1,"seed":1,"stop":["s"],"stop_token_ids":[1],"ignore_eos":true,"min_tokens":1,
		"repetition_penalty":1,"presence_penalty":1,"frequency_penalty":1,"include_stop_str_in_output":true,"skip_special_tokens":true,
		"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true,"o":1},"logprobs":true,"top_logprobs":1,"user":"u",
		"kv_transfer_params":{"a":[1,{"b":[2]}],"c":{"d":"e"}},"modalities":["text"],"audio":{"format":"wav","voice":"v","z":1},"speaker":"s","extra":{"k":[1]}}`
	orig := decodeChat(t, chatBody)
	before, _ := json.Marshal(orig)
	c := orig.Clone()
	scribble(reflect.ValueOf(c).Elem())
	after, _ := json.Marshal(orig)
	if string(before) != string(after) {
		t.Errorf("editing the clone edited the original:\nbefore %s\nafter  %s", before, after)
	}
	if cloned, _ := json.Marshal(c); string(cloned) == string(before) {
		t.Error("scribble changed nothing; the test is not testing")
	}

	compBody := `{"prompt":[[1,2],[3]],"stop":"x","stream":false,"logprobs":1,"user":"u","kv_transfer_params":{"a":[1]},"echo":true}`
	corig := decodeCompletion(t, compBody)
	before, _ = json.Marshal(corig)
	scribble(reflect.ValueOf(corig.Clone()).Elem())
	after, _ = json.Marshal(corig)
	if string(before) != string(after) {
		t.Errorf("editing the completion clone edited the original:\nbefore %s\nafter  %s", before, after)
	}
	if (*ChatCompletionRequest)(nil).Clone() != nil || (*CompletionRequest)(nil).Clone() != nil {
		t.Error("Clone of nil is not nil")
	}
}

// scribble changes every value reachable from v in place, through pointers,
// slices and maps, so that any memory the clone shares with the original
// shows up as a change in the original.
func scribble(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			scribble(v.Elem())
		}
	case reflect.Interface:
		// What an interface holds is not addressable: edit containers in
		// place, replace scalars.
		switch {
		case v.IsNil():
		case v.Elem().Kind() == reflect.Map || v.Elem().Kind() == reflect.Slice:
			scribble(v.Elem())
		default:
			v.Set(reflect.ValueOf("scribbled"))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				scribble(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			for i := range v.Len() {
				v.Index(i).SetUint('!')
			}
			return
		}
		for i := range v.Len() {
			scribble(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := v.MapIndex(k)
			// Map values are not addressable: edit containers in place,
			// replace scalars.
			inner := e
			if inner.Kind() == reflect.Interface && !inner.IsNil() {
				inner = inner.Elem()
			}
			switch inner.Kind() {
			case reflect.Map, reflect.Slice:
				scribble(inner)
			default:
				v.SetMapIndex(k, reflect.ValueOf("scribbled")) // only map[string]any gets here
			}
		}
	case reflect.String:
		v.SetString(v.String() + "~")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint8:
		v.SetUint(v.Uint() + 1)
	case reflect.Float64:
		v.SetFloat(v.Float() + 1)
	}
}

// The decoder walks the body with its own scanner; these are the corners of
// JSON it must read as encoding/json does.
func TestDecodeScannerCorners(t *testing.T) {
	body := " \r\n\t{ \"mod\\u0065l\" : \"m1\" , \"model\":\"m2\", " + // escaped key; the last of a repeated key counts
		`"max_tokens": "bad", "max_tokens" : 7 ,` + // only the last value is decoded
		`"messages" : [ { "role" : "us\"er" , "content" : "a \"quoted\" ] } [ { \\" } ,` +
		` { "role" : "assistant", "content" : [ { "type" : "text" , "text" : "x\ud83d\ude00\ud800y\u00e9\\\/" , "type" : "text" } ] } ] ,` +
		` "we\"ird" : { "a" : [ "]}\\", { } , [ ] , -1.5e+3 , true , null ] } , "\u00ff" : 1 , "ÿ" : 2 , "e" : "<&>\u2028" } ` + "\n"
	req := decodeChat(t, body)
	if req.Model != "m2" || *req.MaxTokens != 7 {
		t.Errorf("model %q, max_tokens %d; want the last of each repeated key", req.Model, *req.MaxTokens)
	}
	if got := req.Messages[0]; got.Role != `us"er` || got.Content.Text != `a "quoted" ] } [ { \` {
		t.Errorf("message 0 = %q %q", got.Role, got.Content.Text)
	}
	if got := req.Messages[1].Content.Parts[0].Text; got != "x\U0001F600\uFFFDy\u00e9\\/" {
		t.Errorf("text part = %q", got)
	}
	wantExtra := map[string]string{
		`we"ird`: `{ "a" : [ "]}\\", { } , [ ] , -1.5e+3 , true , null ] }`, // verbatim, inner space kept
		"ÿ":      `2`,
		"e":      `"<&>\u2028"`,
	}
	if len(req.Extra) != len(wantExtra) {
		t.Errorf("Extra = %q, want %q", req.Extra, wantExtra)
	}
	for k, v := range wantExtra {
		if string(req.Extra[k]) != v {
			t.Errorf("Extra[%q] = %s, want %s", k, req.Extra[k], v)
		}
	}
}

// unquote must decode every JSON string exactly as encoding/json does.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{
		``, `plain`, `a\nb\tc\\d\/e\"f\bg\fh\ri`, `\u00e9\u00E9`, `\ud83d\ude00`, `\ud800`, `\ud800x`,
		`\udc00\ud800`, `\ud800\u0041`, `\ud800\ud800\udc00`, "\xff\xfe", "é\x80", "\xed\xa0\x80", `\u0000`, "\u2028",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		str := []byte(`"` + s + `"`)
		var want string
		if json.Unmarshal(str, &want) != nil {
			return // not a valid JSON string
		}
		if got := unquote(str); got != want {
			t.Errorf("unquote(%q) = %q, want %q", str, got, want)
		}
		if inner, ok := verbatim(str); ok && string(inner) != want {
			t.Errorf("verbatim(%q) = %q, want %q", str, inner, want)
		}
	})
}

// encoder.str must write every string exactly as encoding/json does without
// HTML escaping.
func FuzzEncodeString(f *testing.F) {
	for _, s := range []string{``, `plain`, "<|im_start|>&", "a\"b\\c\n\x00\x1f\x7f", "é\u2028\u2029", "\xff\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := marshalNoEscape(s)
		if err != nil {
			t.Fatal(err)
		}
		e := newEncoder()
		if err := e.str(s); err != nil {
			t.Fatal(err)
		}
		if got := e.buf.Bytes(); string(got) != string(want) {
			t.Errorf("str(%q) = %s, want %s", s, got, want)
		}
	})
}

// The request types encode their fields by walking them; what they write
// must be what encoding/json writes for the same struct without methods.
func TestEncodeMatchesEncodingJSON(t *testing.T) {
	req := decodeChat(t, `{"model":"<m>\u2028é","messages":[{"role":"user","content":"a\nb"},{"role":"assistant","content":[{"type":"text","text":"t"}]},{"role":"tool"}],
		"max_completion_tokens":5,"max_tokens":0,"temperature":1e-7,"top_p":0.1,"top_k":-1,"min_p":1e-7,"n":2,"seed":-9223372036854775808,
		"stop":["x"],"stop_token_ids":[],"ignore_eos":false,"min_tokens":3,"repetition_penalty":1e21,"presence_penalty":-0.0,
		"frequency_penalty":2,"include_stop_str_in_output":true,"skip_special_tokens":false,"stream":true,"stream_options":{},
		"logprobs":true,"top_logprobs":0,"user":"","kv_transfer_params":{"z":1,"a":[1.5,"<",null,{"b":{}}]},
		"modalities":["text"],"audio":{"format":"wav","voice":""},"speaker":"s"}`)
	type plainChat ChatCompletionRequest
	type plainMessage ChatMessage
	type plainSampling SamplingParams
	for _, tt := range []struct {
		name  string
		value json.Marshaler
		plain any
	}{
		{"chat", req, (*plainChat)(req)},
		{"message", req.Messages[0], (*plainMessage)(&req.Messages[0])},
		{"message without content", req.Messages[2], (*plainMessage)(&req.Messages[2])},
		{"empty message", ChatMessage{}, &plainMessage{}},
		{"empty chat", ChatCompletionRequest{}, &plainChat{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.value.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			want, err := marshalNoEscape(tt.plain)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
	// Values encoding/json refuses are refused.
	req.Temperature = new(math.NaN())
	if _, err := req.MarshalJSON(); err == nil {
		t.Error("a NaN temperature encoded without error")
	}
}

// valid must agree with json.Valid; it may only give up early on nesting
// close to encoding/json's limit, where the decoder asks json.Valid instead.
func FuzzValid(f *testing.F) {
	for _, s := range []string{
		``, ` `, `{}`, `[]`, `""`, `0`, `-0`, `01`, `-`, `1.`, `.5`, `1.5e`, `1e+5`, `1E-05`, `-0.0e0`, `+1`,
		`true`, `tru`, `truex`, `nul`, `null `, ` [1 , 2 ]`, `[1,]`, `[,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`,
		`{"a":1}{"b":2}`, `"\u00e9\ud800\"\\\/\b\f\n\r\t"`, `"\u00g0"`, `"\x"`, "\"\x01\"", "\"\xff\xfe\"", `"\u12"`,
		`[[[[]]]]`, `{"a":{"b":[{"c":null}]}}`, "\t\r\n{}\n", `[1 2]`, `{"a":1 "b":2}`, `["a""b"]`,
		// Strings long enough to be scanned eight bytes at a time, with what
		// ends the fast scan at several offsets of a word.
		`"abcdefghijklmnopqrstuvwxyz"`, `"abcdefgh\"ijklmnop"`, `"abcdefg\\hijklmnop"`, "\"abcdefghijklmn\x1fop\"",
		`"abcdefghijklmno`, `"héllo wörld, ça va? 日本語のテキスト"`, "\"abcdefgh\x7f\x80\xffijklmnop\"", `"abcdefgh\u00e9ijklmn"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, want := valid(b), json.Valid(b)
		if got != want && (got || bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) < maxValidDepth) {
			t.Errorf("valid(%q) = %v, json.Valid = %v", b, got, want)
		}
	})
}

// Nesting is refused where encoding/json refuses it, not earlier.
func TestDecodeDeepNesting(t *testing.T) {
	const limit = 10000 // encoding/json's
	nested := func(depth int) string {
		return strings.Repeat("[", depth) + strings.Repeat("]", depth)
	}
	deep := nested(limit - 1) // and the body's object makes limit
	req := decodeChat(t, `{"messages":[{"role":"user"}],"x":`+deep+`}`)
	if string(req.Extra["x"]) != deep {
		t.Errorf("Extra[x] is not the %d-deep array it was sent as", limit-1)
	}
	_, err := DecodeChatRequest(strings.NewReader(`{"messages":[{"role":"user"}],"x":`+nested(limit)+`}`), 0)
	checkRequestError(t, err, "", "exceeded max depth")
}

// mayNeedLook never misses a quote, a backslash or a control character at
// any offset of a word, whatever surrounds it, and flags no word of bytes
// a string scan passes over.
func TestMayNeedLook(t *testing.T) {
	special := func(c byte) bool { return c == '"' || c == '\\' || c < ' ' }
	word := func(b [8]byte) uint64 { return binary.LittleEndian.Uint64(b[:]) }
	for _, fill := range []byte{' ', '!', '#', '[', ']', 'a', 0x7f, 0x80, 0xc3, 0xff} {
		var plain [8]byte
		for i := range plain {
			plain[i] = fill
		}
		if mayNeedLook(word(plain)) {
			t.Errorf("a word of %#x flagged", fill)
		}
		for c := range 256 {
			for at := range 8 {
				w := plain
				w[at] = byte(c)
				if got := mayNeedLook(word(w)); special(byte(c)) && !got {
					t.Errorf("%#x at byte %d among %#x missed", c, at, fill)
				} else if !special(byte(c)) && got {
					t.Errorf("%#x at byte %d among %#x flagged", c, at, fill)
				}
			}
		}
	}
}
