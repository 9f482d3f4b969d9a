package worker

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/omnipd/omnipd/openai"
)

// The reference engine samples plain text: it has no tool parser, no
// structured-output (guided decoding) backend, no logprobs, no beam search
// and no logit processors. A request that asks for any of them gets a 400
// naming the parameter rather than a 200 whose output quietly ignores it;
// a vllm serve stage, which receives the same fields unchanged, honours
// them. Values that ask for nothing are accepted, as vLLM accepts them
// (vllm/entrypoints/openai/protocol.py, ChatCompletionRequest
// check_tool_usage and the structured-output validators):
//
//   - tools absent, null or []; tool_choice absent, null or "none", and
//     "auto" or "required" with an empty tools list, under which no tool can
//     be called. Any tool definition is refused, even with tool_choice
//     "none": vLLM still renders the definitions into the prompt then, so
//     ignoring them would change the model's input.
//   - response_format absent, null or {"type": "text"}.
//   - guided_json, guided_regex, guided_choice, guided_grammar,
//     structured_outputs, prompt_logprobs, logit_bias, bad_words,
//     allowed_token_ids, logits_processors, suffix, prompt_embeds: absent,
//     null or empty.
//   - echo, use_beam_search, continue_final_message, include_stop_str_in_output
//     and stream_options.continuous_usage_stats: absent, null or false;
//     best_of absent, null or 1; priority absent, null or 0 (vLLM itself
//     refuses a priority without --scheduling-policy priority).
//
// What the reference engine does honour: temperature, top_p, top_k, min_p,
// seed, stop, stop_token_ids, ignore_eos, min_tokens, max_tokens /
// max_completion_tokens, repetition/presence/frequency penalties, stream
// and stream_options.include_usage, return_token_ids, add_generation_prompt
// and kv_transfer_params. chat_template_kwargs are accepted: a chat template
// ignores variables it does not use, and the reference ChatML template uses
// none. n > 1 and logprobs are refused where they are read (generate.go).

// emptyValue says whether raw is JSON that asks for nothing: null, false,
// 0, "", [] or {}.
func emptyValue(raw json.RawMessage) bool {
	switch string(bytes.TrimSpace(raw)) {
	case "null", "false", "0", `""`, "[]", "{}":
		return true
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch v := v.(type) {
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}

// unsupportedFields are the extra parameters the reference engine cannot
// honour, with what each would need. Each is accepted only when empty.
var unsupportedFields = []struct{ name, needs string }{
	{"guided_json", "structured output"},
	{"guided_regex", "structured output"},
	{"guided_choice", "structured output"},
	{"guided_grammar", "structured output"},
	{"structured_outputs", "structured output"},
	{"prompt_logprobs", "logprobs"},
	{"logit_bias", "logit biases"},
	{"bad_words", "banned words"},
	{"allowed_token_ids", "a token allow-list"},
	{"logits_processors", "logits processors"},
	{"echo", "echoing the prompt"},
	{"suffix", "a suffix"},
	{"prompt_embeds", "prompt embeddings"},
	{"use_beam_search", "beam search"},
	{"continue_final_message", "continuing the final message"},
	{"priority", "priority scheduling"},
}

// refuseUnsupported answers 400 for a parameter the reference engine
// cannot honour (see the package's rule above). chat says which endpoint
// the request came to.
func refuseUnsupported(chat bool, extra map[string]json.RawMessage, sp *openai.SamplingParams, opts *openai.StreamOptions) error {
	refuse := func(param, needs string) error {
		return openai.InvalidRequest(param, fmt.Sprintf("%s needs %s, which the reference engine does not support; omit it, or serve this stage with vllm serve", param, needs))
	}
	if chat {
		if err := checkTools(extra); err != nil {
			return err
		}
		if raw, ok := extra["response_format"]; ok && !emptyValue(raw) {
			var rf struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(raw, &rf) != nil || rf.Type != "text" {
				return refuse("response_format", "structured output")
			}
		}
	}
	for _, f := range unsupportedFields {
		if raw, ok := extra[f.name]; ok && !emptyValue(raw) {
			return refuse(f.name, f.needs)
		}
	}
	if raw, ok := extra["best_of"]; ok && !emptyValue(raw) && string(bytes.TrimSpace(raw)) != "1" {
		return refuse("best_of", "several candidates per prompt")
	}
	if sp.IncludeStopStrInOutput != nil && *sp.IncludeStopStrInOutput {
		return refuse("include_stop_str_in_output", "stop strings kept in the output")
	}
	if opts != nil && opts.ContinuousUsageStats != nil && *opts.ContinuousUsageStats {
		return refuse("stream_options.continuous_usage_stats", "usage on every chunk")
	}
	return nil
}

// checkTools applies vLLM's tool rules to a reference Thinker, which has no
// tool parser: no tool may be defined, and a tool_choice other than "none"
// needs tools, as in vLLM ("When using `tool_choice`, `tools` must be
// set."), and then only an empty list is accepted.
func checkTools(extra map[string]json.RawMessage) error {
	tools, hasTools := extra["tools"]
	if hasTools && string(bytes.TrimSpace(tools)) == "null" {
		hasTools = false
	}
	if hasTools && !emptyValue(tools) {
		return openai.InvalidRequest("tools", "tools need a tool-call parser, which the reference engine does not have; omit tools, or serve this stage with vllm serve")
	}
	choice, ok := extra["tool_choice"]
	if !ok || emptyValue(choice) {
		return nil
	}
	var s string
	if json.Unmarshal(choice, &s) == nil && s == "none" {
		return nil
	}
	if !hasTools {
		return openai.InvalidRequest("tool_choice", "When using `tool_choice`, `tools` must be set.")
	}
	if s == "auto" || s == "required" {
		return nil // no tool to call: the same as "none"
	}
	return openai.InvalidRequest("tool_choice", "tool_choice names a tool that tools does not define")
}
