package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// Bad requests through the public API of a PD deployment with audio: each
// is a 4xx with an OpenAI error body whose param (or, for whole-body
// problems, message) names what is wrong; good requests running at the
// same time are unaffected; and none of them leaves anything behind — not
// even those only the decode can refuse, after the prefill already
// exported their KV (their lease is claimed back, not left to expire).
//
// Unknown parameters are accepted and passed on to the engines, as vLLM
// and OpenAI's own SDK expect of extra body fields (openai/decode.go keeps
// them in Extra); the table pins that too.
func TestBadInput(t *testing.T) {
	const maxBody = 256 << 10
	d := testbed.Start(t, testbed.Options{Omni: true, MaxBodyBytes: maxBody})
	warm(t, d)
	user := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		name   string
		path   string
		body   string
		status int
		// names are the words one of which the error's param or message
		// must contain; code, when set, is the error code.
		names []string
		code  string
	}{
		{name: "oversized body", body: `{` + user + `,"x":"` + strings.Repeat("a", maxBody) + `"}`, status: 413, names: []string{"limit"}, code: "request_too_large"},
		{name: "invalid JSON", body: `{"messages":[{"role":"user"`, status: 400, names: []string{"invalid JSON"}},
		{name: "not an object", body: `[]`, status: 400, names: []string{"object"}},
		{name: "empty body", body: ``, status: 400, names: []string{"empty"}},
		{name: "messages of the wrong type", body: `{"messages":"hi"}`, status: 400, names: []string{"messages"}},
		{name: "content of the wrong type", body: `{"messages":[{"role":"user","content":5}]}`, status: 400, names: []string{"messages[0].content"}},
		{name: "max_tokens of the wrong type", body: `{` + user + `,"max_tokens":"ten"}`, status: 400, names: []string{"max_tokens"}},
		{name: "temperature of the wrong type", body: `{` + user + `,"temperature":"hot"}`, status: 400, names: []string{"temperature"}},
		{name: "stream of the wrong type", body: `{` + user + `,"stream":"yes"}`, status: 400, names: []string{"stream"}},
		{name: "negative max_tokens", body: `{` + user + `,"max_tokens":-5}`, status: 400, names: []string{"max_tokens"}},
		{name: "zero max_tokens", body: `{` + user + `,"max_tokens":0,"modalities":["text"]}`, status: 400, names: []string{"max_tokens"}},
		{name: "huge max_tokens", body: `{` + user + `,"max_tokens":1000000000,"modalities":["text"]}`, status: 400, names: []string{"max_tokens", "context"}},
		{name: "huge max_tokens, streamed", body: `{` + user + `,"max_tokens":1000000000,"stream":true,"modalities":["text"]}`, status: 400, names: []string{"max_tokens", "context"}},
		{name: "n the decode refuses", body: `{` + user + `,"n":2,"max_tokens":4,"modalities":["text"]}`, status: 400, names: []string{"n"}},
		{name: "top_p out of range", body: `{` + user + `,"top_p":5}`, status: 400, names: []string{"top_p"}},
		{name: "stream_options without stream", body: `{` + user + `,"stream_options":{"include_usage":true}}`, status: 400, names: []string{"stream_options"}},
		{name: "missing messages", body: `{"max_tokens":4}`, status: 400, names: []string{"messages"}},
		{name: "empty messages", body: `{"messages":[]}`, status: 400, names: []string{"messages"}},
		{name: "message without a role", body: `{"messages":[{"content":"hi"}]}`, status: 400, names: []string{"messages[0].role"}},
		{name: "unsupported modality", body: `{` + user + `,"modalities":["video"]}`, status: 400, names: []string{"modalities[0]"}},
		{name: "empty modalities", body: `{` + user + `,"modalities":[]}`, status: 400, names: []string{"modalities"}},
		{name: "unknown audio format", body: `{` + user + `,"audio":{"format":"ogg"}}`, status: 400, names: []string{"audio.format"}},
		{name: "audio format the pipeline cannot encode", body: `{` + user + `,"audio":{"format":"mp3"}}`, status: 400, names: []string{"audio.format"}},
		{name: "an image URL on a host not allowed", body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}],"modalities":["text"]}`,
			status: 400, names: []string{"messages[0].content[0]"}},
		{name: "unsupported content part", body: `{"messages":[{"role":"user","content":[{"type":"hologram","hologram":{}}]}],"modalities":["text"]}`,
			status: 400, names: []string{"messages[0].content[0].type"}},
		{name: "omnipd_encoder_cache from a client", body: `{` + user + `,"omnipd_encoder_cache":[{"url":"http://169.254.169.254","key":"k"}]}`, status: 400, names: []string{"omnipd_encoder_cache"}},
		{name: "omnipd_encoder_cache in vllm_xargs", body: `{` + user + `,"vllm_xargs":{"omnipd_encoder_cache":[]}}`, status: 400, names: []string{"vllm_xargs.omnipd_encoder_cache"}},
		{name: "kv_transfer_params from a client", body: `{` + user + `,"kv_transfer_params":{"do_remote_prefill":true}}`, status: 400, names: []string{"kv_transfer_params"}},
		{name: "omnipd_conditioning from a client", body: `{` + user + `,"omnipd_conditioning":{"key":"k","layer":2}}`, status: 400, names: []string{"omnipd_conditioning"}},
		{name: "unknown model", body: `{"model":"gpt-x",` + user[0:] + `}`, status: 404, names: []string{"gpt-x"}, code: "model_not_found"},
		{name: "completions without a prompt", path: completionPath, body: `{"max_tokens":4}`, status: 400, names: []string{"prompt"}},
		{name: "completions prompt of the wrong type", path: completionPath, body: `{"prompt":{"text":"hi"}}`, status: 400, names: []string{"prompt"}},
		{name: "completions empty prompt", path: completionPath, body: `{"prompt":[]}`, status: 400, names: []string{"prompt"}},
		{name: "completions negative token id", path: completionPath, body: `{"prompt":[1,-2]}`, status: 400, names: []string{"prompt[1]"}},
		{name: "completions huge max_tokens", path: completionPath, body: `{"prompt":"hi","max_tokens":1000000000}`, status: 400, names: []string{"max_tokens", "context"}},
		{name: "unknown model on completions", path: completionPath, body: `{"model":"gpt-x","prompt":"hi"}`, status: 404, code: "model_not_found"},
		{name: "unknown parameters are passed on", body: `{` + user + `,"max_tokens":3,"modalities":["text"],"frobnicate":{"x":1},"logit_bias_v2":null}`, status: 200},
		{name: "unknown completions parameters are passed on", path: completionPath, body: `{"prompt":"hi","max_tokens":3,"frobnicate":[1,2]}`, status: 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := c.path
			if path == "" {
				path = chatPath
			}
			by := startBystanders(d)
			ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
			defer cancel()
			a := send(ctx, d, path, c.body)
			by.finish(t)
			if c.status == http.StatusOK {
				if err := wellFormed(a, false); err != nil {
					t.Error(err)
				}
				return
			}
			cleanError(t, a, c.status, c.code)
			e, err := openAIError(a.body)
			if err != nil {
				return
			}
			named := false
			for _, n := range c.names {
				named = named || (e.Param != nil && strings.Contains(*e.Param, n)) || strings.Contains(e.Message, n)
			}
			if len(c.names) > 0 && !named {
				t.Errorf("the error names none of %q: %s", c.names, a.body)
			}
		})
	}
	d.Settled(t, settleWithin)
	if n := d.ExpiredLeases(); n != 0 {
		t.Errorf("%d KV leases of refused requests expired instead of being claimed back", n)
	}
}
