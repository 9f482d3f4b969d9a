package worker

import (
	"encoding/json"
	"testing"
)

// A parameter the reference engine cannot honour is a 400 naming it, on
// the endpoint that reads it, before any engine work; the values that ask
// for nothing are served as if absent, as vLLM serves them.
func TestUnsupportedParametersAreRefused(t *testing.T) {
	w := newPlainWorker(t, 0)
	const tool = `{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}`
	chat := func(extra string) string {
		return `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2` + extra + `}`
	}
	completion := func(extra string) string { return `{"prompt":"hi","max_tokens":2` + extra + `}` }
	refused := []struct{ path, body, param string }{
		{"/v1/chat/completions", chat(`,"tools":[` + tool + `]`), "tools"},
		{"/v1/chat/completions", chat(`,"tools":[` + tool + `],"tool_choice":"none"`), "tools"},
		{"/v1/chat/completions", chat(`,"tools":[` + tool + `],"tool_choice":"required"`), "tools"},
		{"/v1/chat/completions", chat(`,"tool_choice":"auto"`), "tool_choice"},
		{"/v1/chat/completions", chat(`,"tools":[],"tool_choice":{"type":"function","function":{"name":"get_weather"}}`), "tool_choice"},
		{"/v1/chat/completions", chat(`,"response_format":{"type":"json_object"}`), "response_format"},
		{"/v1/chat/completions", chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`), "response_format"},
		{"/v1/chat/completions", chat(`,"guided_json":{"type":"object"}`), "guided_json"},
		{"/v1/chat/completions", chat(`,"structured_outputs":{"regex":"a+"}`), "structured_outputs"},
		{"/v1/chat/completions", chat(`,"logit_bias":{"50":100}`), "logit_bias"},
		{"/v1/chat/completions", chat(`,"prompt_logprobs":1`), "prompt_logprobs"},
		{"/v1/chat/completions", chat(`,"use_beam_search":true`), "use_beam_search"},
		{"/v1/chat/completions", chat(`,"continue_final_message":true`), "continue_final_message"},
		{"/v1/chat/completions", chat(`,"include_stop_str_in_output":true`), "include_stop_str_in_output"},
		{"/v1/chat/completions", chat(`,"stream":true,"stream_options":{"continuous_usage_stats":true}`), "stream_options.continuous_usage_stats"},
		{"/v1/chat/completions", chat(`,"priority":5`), "priority"},
		{"/v1/completions", completion(`,"guided_regex":"[0-9]+"`), "guided_regex"},
		{"/v1/completions", completion(`,"guided_choice":["yes","no"]`), "guided_choice"},
		{"/v1/completions", completion(`,"echo":true`), "echo"},
		{"/v1/completions", completion(`,"suffix":" the end"`), "suffix"},
		{"/v1/completions", completion(`,"best_of":3`), "best_of"},
		{"/v1/completions", completion(`,"bad_words":["x"]`), "bad_words"},
		{"/v1/completions", completion(`,"allowed_token_ids":[1,2]`), "allowed_token_ids"},
	}
	for _, c := range refused {
		status, _, b := call(t, "POST", w.url+c.path, "", c.body)
		var e struct {
			Error struct{ Type, Param, Message string } `json:"error"`
		}
		if status != 400 || json.Unmarshal([]byte(b), &e) != nil || e.Error.Param != c.param || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
			t.Errorf("%s %s: %d %s; want 400 invalid_request_error on %s", c.path, c.body, status, b, c.param)
		}
	}
	if st := w.eng.Stats(); st.PromptTokensComputed != 0 {
		t.Errorf("refused requests reached the engine: %+v", st)
	}

	nothing := []struct{ path, body string }{
		{"/v1/chat/completions", chat(`,"tools":[]`)},
		{"/v1/chat/completions", chat(`,"tools":null,"tool_choice":null`)},
		{"/v1/chat/completions", chat(`,"tool_choice":"none"`)},
		{"/v1/chat/completions", chat(`,"tools":[],"tool_choice":"auto"`)},
		{"/v1/chat/completions", chat(`,"response_format":{"type":"text"}`)},
		{"/v1/chat/completions", chat(`,"response_format":null,"guided_json":null,"logit_bias":{}`)},
		{"/v1/chat/completions", chat(`,"include_stop_str_in_output":false,"use_beam_search":false,"priority":0`)},
		{"/v1/chat/completions", chat(`,"chat_template_kwargs":{"enable_thinking":false},"parallel_tool_calls":true`)},
		{"/v1/completions", completion(`,"echo":false,"suffix":"","best_of":1,"bad_words":[]`)},
	}
	for _, c := range nothing {
		if status, _, b := call(t, "POST", w.url+c.path, "", c.body); status != 200 {
			t.Errorf("%s %s: %d %s; want 200, as without the parameter", c.path, c.body, status, b)
		}
	}
}

// add_generation_prompt is honoured: without it the prompt ends after the
// last turn, three tokens ("<|im_start|>assistant\n" is 1 + 10 byte
// tokens) shorter.
func TestAddGenerationPrompt(t *testing.T) {
	w := newPlainWorker(t, 0)
	prompt := func(extra string) int {
		status, _, b := call(t, "POST", w.url+"/v1/chat/completions", "", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1`+extra+`}`)
		var r struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if status != 200 || json.Unmarshal([]byte(b), &r) != nil {
			t.Fatalf("%d %s", status, b)
		}
		return r.Usage.PromptTokens
	}
	with, without := prompt(``), prompt(`,"add_generation_prompt":false`)
	if header := len(testTokenizer.Encode("assistant\n")) + 1; with-without != header {
		t.Errorf("prompt tokens %d with the generation prompt, %d without; want %d apart", with, without, header)
	}
	if got := prompt(`,"add_generation_prompt":true`); got != with {
		t.Errorf("add_generation_prompt true: %d prompt tokens, want %d", got, with)
	}
}
