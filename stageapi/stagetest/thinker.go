package stagetest

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/omnipd/omnipd/stageapi"
)

// prompts the checks send: plain text, so that any tokenizer takes them.
const (
	shortPrompt = "Hello!"
	longPrompt  = "Tell me a story about a lighthouse keeper who counts the waves, one by one, every night of the year."
)

// credential is what a caller without the deployment secret might
// present.
type credential struct{ name, header string }

func (c *checker) badCredentials() []credential {
	return []credential{
		{"no Authorization", ""},
		{"a wrong secret", "Bearer not-" + c.d.Secret},
		{"another scheme", "Basic " + c.d.Secret},
		{"an empty bearer", "Bearer "},
		{"the bare secret", c.d.Secret},
	}
}

// wantUnauthorized checks a refusal as docs/security.md §3 describes it:
// 401, WWW-Authenticate: Bearer, OpenAI's invalid_api_key body, and no echo
// of the credential.
func (c *checker) wantUnauthorized(what string, r reply) {
	c.Helper()
	if r.status != http.StatusUnauthorized {
		c.Errorf("%s: %v; want 401", what, r)
		return
	}
	if got := r.header.Get("WWW-Authenticate"); got != "Bearer" {
		c.Errorf("%s: WWW-Authenticate %q; want Bearer", what, got)
	}
	e, err := openAIError(r)
	if err != nil {
		c.Errorf("%s: %v: %s", what, err, r)
	} else if e.code() != "invalid_api_key" || e.Error.Type != "invalid_request_error" {
		c.Errorf("%s: type %q code %s; want invalid_request_error, invalid_api_key", what, e.Error.Type, e.Error.Code)
	}
	if c.d.Secret != "" && strings.Contains(string(r.body), c.d.Secret) {
		c.Errorf("%s: the refusal echoes the credential: %s", what, r)
	}
}

type endpoint struct{ method, path, body string }

// checkSecret: every endpoint but /health and /metrics answers 401 before
// doing anything to a caller without the secret; with it, the same calls
// go through.
func checkSecret(c *checker) {
	if c.d.Secret == "" {
		c.Fatalf("the deployment has no secret: the suite checks workers that require one")
	}
	var thinker, talker, code2wav string
	var kept string
	if c.d.Thinker != nil {
		thinker = c.thinker()
		kept = "secret-victim"
		c.generate(thinker, "a request that keeps conditioning", c.keep(c.completionBody(shortPrompt, 2), kept, false))
	}
	if c.d.Talker != nil {
		talker = c.talker()
	}
	if c.d.Code2Wav != nil {
		code2wav = c.code2wav()
	}
	refuse := func(base string, eps []endpoint) {
		for _, ep := range eps {
			for _, cred := range c.badCredentials() {
				var body []byte
				if ep.body != "" {
					body = []byte(ep.body)
				}
				c.wantUnauthorized(ep.method+" "+ep.path+" with "+cred.name, c.call(ep.method, base+ep.path, cred.header, body))
			}
		}
		for _, path := range []string{"/health", "/metrics"} {
			if r := c.call(http.MethodGet, base+path, "", nil); r.status != http.StatusOK {
				c.Errorf("GET %s without the secret: %v; it stays open for probes", path, r)
			}
		}
	}
	if thinker != "" {
		eps := []endpoint{
			{"POST", "/v1/completions", c.jsonString(c.keep(c.completionBody(shortPrompt, 2), "secret-refused", false))},
			{"POST", "/v1/chat/completions", c.jsonString(c.chatBody(shortPrompt, 2))},
			{"POST", "/tokenize", c.jsonString(map[string]any{"model": c.d.Model, "prompt": shortPrompt})},
			{"POST", "/detokenize", c.jsonString(map[string]any{"model": c.d.Model, "tokens": []int{1, 2}})},
			{"GET", "/v1/models", ""},
			{"GET", stageapi.ConditioningPath + kept, ""},
			{"GET", stageapi.ConditioningPath + kept + "?from=0", ""},
			{"DELETE", stageapi.ConditioningPath + kept, ""},
		}
		refuse(thinker, eps)
		// Refused reads and drops touched nothing, and refused requests
		// kept nothing.
		c.wantStashes(thinker, 1, "after refused reads, drops and requests")
		c.fetch(thinker, kept)
		for _, ep := range eps[:5] {
			var body []byte
			if ep.body != "" {
				body = []byte(ep.body)
			}
			if r := c.call(ep.method, thinker+ep.path, c.withSecret(), body); r.status != http.StatusOK {
				c.Errorf("%s %s with the secret: %v; want 200", ep.method, ep.path, r)
			}
		}
		// The one request above that kept conditioning went through.
		c.fetch(thinker, "secret-refused")
	}
	if talker != "" {
		var handle stageapi.ConditioningHandle
		if thinker != "" {
			handle = stageapi.ConditioningHandle{URL: thinker, Key: "secret-talker"}
			c.generate(thinker, "a request that keeps conditioning", c.keep(c.completionBody(shortPrompt, 2), handle.Key, false))
		} else {
			handle = stageapi.ConditioningHandle{URL: "http://127.0.0.1:1", Key: "none"}
		}
		refuse(talker, []endpoint{{"POST", stageapi.TalkerPath, c.jsonString(stageapi.TalkerRequest{
			Conditioning: []stageapi.ConditioningHandle{handle}, MaxFrames: 2})}})
		if thinker != "" {
			// A refused Talker call fetched nothing.
			c.wantStashes(thinker, 1, "after refused Talker calls")
			c.fetch(thinker, handle.Key)
		}
	}
	if code2wav != "" {
		refuse(code2wav, []endpoint{{"POST", stageapi.Code2WavPath, c.jsonString(stageapi.Code2WavRequest{
			Codes: make([]int, 2*stageapi.Codebooks), NumFrames: 2})}})
	}
	// omnipd serve probes readiness with an authenticated GET /v1/models
	// (docs/security.md §3): past the secret check, an audio stage answers
	// it with anything but 401 or 403.
	for _, base := range []string{talker, code2wav} {
		if base == "" {
			continue
		}
		if r := c.call(http.MethodGet, base+"/v1/models", c.withSecret(), nil); r.status == http.StatusUnauthorized || r.status == http.StatusForbidden {
			c.Errorf("GET %s/v1/models with the secret: %v; omnipd serve takes that for a stage that refuses its secret", base, r)
		}
	}
}

func (c *checker) jsonString(v any) string { return string(mustJSON(v)) }

// checkHealth: every instance answers GET /health 200 once ready, without
// the secret.
func checkHealth(c *checker) {
	bases := map[string]string{}
	if c.d.Thinker != nil {
		bases["colocated Thinker"] = c.thinker()
	}
	if c.d.PD != nil {
		p := c.pair()
		bases["prefill"], bases["decode"] = p.Prefill, p.Decode
	}
	if c.d.Talker != nil {
		bases["Talker"] = c.talker()
	}
	if c.d.Code2Wav != nil {
		bases["Code2Wav"] = c.code2wav()
	}
	for name, base := range bases {
		if r := c.call(http.MethodGet, base+"/health", "", nil); r.status != http.StatusOK {
			c.Errorf("%s: GET /health: %v; want 200 from a ready instance", name, r)
		}
	}
}

// modelCard reads the one card of GET /v1/models, with which keys it has.
func (c *checker) modelCard(base string) (card map[string]json.RawMessage, maxModelLen int) {
	c.Helper()
	r := c.call(http.MethodGet, base+"/v1/models", c.withSecret(), nil)
	if r.status != http.StatusOK {
		c.Fatalf("GET /v1/models: %v", r)
	}
	var list struct {
		Object string                       `json:"object"`
		Data   []map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil {
		c.Fatalf("GET /v1/models: not JSON: %v: %s", err, r)
	}
	if list.Object != "list" || len(list.Data) != 1 {
		c.Fatalf("GET /v1/models: object %q with %d cards; want a list of one: %s", list.Object, len(list.Data), r)
	}
	card = list.Data[0]
	if err := json.Unmarshal(card["max_model_len"], &maxModelLen); err != nil || maxModelLen <= 0 {
		c.Fatalf("GET /v1/models: max_model_len %s; want a positive integer", card["max_model_len"])
	}
	return card, maxModelLen
}

// checkModels: GET /v1/models lists vLLM's ModelCard of the served model.
func checkModels(c *checker) {
	card, _ := c.modelCard(c.thinker())
	for _, key := range []string{"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"} {
		if _, ok := card[key]; !ok {
			c.Errorf("the model card has no %q: %v", key, card)
		}
	}
	str := func(key string) string {
		var s string
		if err := json.Unmarshal(card[key], &s); err != nil {
			c.Errorf("the model card's %s is %s; want a string", key, card[key])
		}
		return s
	}
	if id := str("id"); id != c.d.Model {
		c.Errorf("the model card's id is %q; want the served name %q", id, c.d.Model)
	}
	if o := str("object"); o != "model" {
		c.Errorf("the model card's object is %q; want \"model\"", o)
	}
	if o := str("owned_by"); o == "" {
		c.Errorf("the model card's owned_by is empty")
	}
	if root := str("root"); root != c.d.Model {
		c.Errorf("the model card's root is %q; want the served name %q", root, c.d.Model)
	}
	if p := strings.TrimSpace(string(card["parent"])); p != "null" {
		c.Errorf("the model card's parent is %s; want null (no adapter)", p)
	}
	var created int64
	if err := json.Unmarshal(card["created"], &created); err != nil || created <= 0 {
		c.Errorf("the model card's created is %s; want unix seconds", card["created"])
	}
	var perms []struct {
		Object string `json:"object"`
	}
	if err := json.Unmarshal(card["permission"], &perms); err != nil || len(perms) != 1 || perms[0].Object != "model_permission" {
		c.Errorf("the model card's permission is %s; want vLLM's one model_permission", card["permission"])
	}
}

type tokenized struct {
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len"`
	Tokens      []int `json:"tokens"`
}

func (c *checker) tokenize(base string, body map[string]any) tokenized {
	c.Helper()
	r := c.post(base+"/tokenize", body)
	var out tokenized
	if r.status != http.StatusOK || json.Unmarshal(r.body, &out) != nil {
		c.Fatalf("POST /tokenize %s: %v", mustJSON(body), r)
	}
	if out.Count != len(out.Tokens) || out.Count == 0 {
		c.Errorf("POST /tokenize: count %d for %d tokens", out.Count, len(out.Tokens))
	}
	return out
}

// checkTokenize: /tokenize and /detokenize round trip, agree with the
// model card and with what a completion counts as its prompt.
func checkTokenize(c *checker) {
	base := c.thinker()
	_, maxLen := c.modelCard(base)
	const text = "The quick brown fox jumps over the lazy dog."
	tok := c.tokenize(base, map[string]any{"model": c.d.Model, "prompt": text})
	if tok.MaxModelLen != maxLen {
		c.Errorf("POST /tokenize: max_model_len %d; the model card says %d", tok.MaxModelLen, maxLen)
	}
	r := c.post(base+"/detokenize", map[string]any{"model": c.d.Model, "tokens": tok.Tokens})
	var detok struct {
		Prompt *string `json:"prompt"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &detok) != nil || detok.Prompt == nil {
		c.Fatalf("POST /detokenize %s: %v", intsString(tok.Tokens), r)
	}
	if *detok.Prompt != text {
		c.Errorf("POST /detokenize of /tokenize's %s: %q; want %q back", intsString(tok.Tokens), *detok.Prompt, text)
	}
	// What /tokenize counts is what a completion counts as its prompt.
	got := c.generate(base, "a completion", c.completionBody(text, 1))
	if got.Usage.PromptTokens != tok.Count {
		c.Errorf("the completion's prompt_tokens %d; /tokenize counts %d", got.Usage.PromptTokens, tok.Count)
	}
	chat := c.chatBody(text, 1)
	msgs := c.tokenize(base, map[string]any{"model": c.d.Model, "messages": chat["messages"]})
	if got := c.generate(base, "a chat completion", chat); got.Usage.PromptTokens != msgs.Count {
		c.Errorf("the chat completion's prompt_tokens %d; /tokenize of its messages counts %d", got.Usage.PromptTokens, msgs.Count)
	}
}

// checkCompletions: POST /v1/completions whole and streamed.
func checkCompletions(c *checker) {
	c.checkGeneration(c.completionBody(longPrompt, 8), "text_completion", "text_completion")
}

// checkChatCompletions: POST /v1/chat/completions whole and streamed.
func checkChatCompletions(c *checker) {
	c.checkGeneration(c.chatBody(longPrompt, 8), "chat.completion", "chat.completion.chunk")
}

// chunk is one streamed event of a completion.
type chunk struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Model   string          `json:"model"`
	Choices json.RawMessage `json:"choices"`
	Usage   *usage          `json:"usage"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Text         *string `json:"text"`
	FinishReason *string `json:"finish_reason"`
	Delta        *struct {
		Role    string  `json:"role"`
		Content *string `json:"content"`
	} `json:"delta"`
}

// checkGeneration sends body whole, then streamed with and without usage,
// and checks each answer's shape and that the three agree (greedy: an
// engine with itself).
func (c *checker) checkGeneration(body map[string]any, object, chunkObject string) {
	base := c.thinker()
	maxTokens := body["max_tokens"].(int)
	whole := c.generate(base, "whole", body)
	if whole.Object != object || whole.ID == "" || whole.Model != c.d.Model || whole.Created <= 0 {
		c.Errorf("whole: object %q id %q model %q created %d; want %q, an id, %q, unix seconds", whole.Object, whole.ID, whole.Model, whole.Created, object, c.d.Model)
	}
	ch := whole.Choices[0]
	switch {
	case ch.FinishReason == nil || (*ch.FinishReason != "stop" && *ch.FinishReason != "length"):
		c.Errorf("whole: finish_reason %v; want stop or length", ch.FinishReason)
	case object == "text_completion" && ch.Text == nil:
		c.Errorf("whole: the choice has no text")
	case object == "chat.completion" && (ch.Message == nil || ch.Message.Role != "assistant" || ch.Message.Content == nil):
		c.Errorf("whole: the choice has no assistant message with content")
	}
	u := *whole.Usage
	if u.PromptTokens <= 0 || u.CompletionTokens < 1 || u.CompletionTokens > maxTokens || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		c.Errorf("whole: usage %+v for max_tokens %d", u, maxTokens)
	}
	if ch.FinishReason != nil && *ch.FinishReason == "length" && u.CompletionTokens != maxTokens {
		c.Errorf("whole: finish_reason length after %d of max_tokens %d", u.CompletionTokens, maxTokens)
	}
	for _, includeUsage := range []bool{true, false} {
		sb := map[string]any{"stream": true}
		for k, v := range body {
			sb[k] = v
		}
		what := "streamed"
		if includeUsage {
			sb["stream_options"] = map[string]any{"include_usage": true}
			what = "streamed with include_usage"
		}
		events := c.stream(base+pathOf(body), what, sb)
		var text strings.Builder
		var finishes []string
		var usages []int
		ids := map[string]bool{}
		role := ""
		for i, ev := range events {
			var k chunk
			if err := json.Unmarshal([]byte(ev.data), &k); err != nil {
				c.Fatalf("%s: event %d is not a chunk: %v: %s", what, i, err, ev.data)
			}
			if k.Object != chunkObject || k.ID == "" || k.Model != c.d.Model {
				c.Errorf("%s: event %d: object %q id %q model %q; want %q, an id, %q", what, i, k.Object, k.ID, k.Model, chunkObject, c.d.Model)
			}
			ids[k.ID] = true
			var choices []chunkChoice
			if err := json.Unmarshal(k.Choices, &choices); err != nil || choices == nil {
				c.Errorf("%s: event %d: choices %s; want a list", what, i, k.Choices)
			}
			if k.Usage != nil {
				usages = append(usages, i)
				if *k.Usage != u {
					c.Errorf("%s: usage %+v; the whole answer's is %+v", what, *k.Usage, u)
				}
				if len(choices) != 0 {
					c.Errorf("%s: the usage chunk has %d choices; want [] (OpenAI's final usage chunk)", what, len(choices))
				}
			}
			for _, cc := range choices {
				if cc.Index != 0 {
					c.Errorf("%s: event %d: choice index %d", what, i, cc.Index)
				}
				switch {
				case cc.Text != nil:
					text.WriteString(*cc.Text)
				case cc.Delta != nil:
					if cc.Delta.Content != nil {
						text.WriteString(*cc.Delta.Content)
					}
					if role == "" {
						role = cc.Delta.Role
					}
				}
				if cc.FinishReason != nil {
					finishes = append(finishes, *cc.FinishReason)
				}
			}
		}
		if len(ids) != 1 {
			c.Errorf("%s: %d chunk ids; want one per stream", what, len(ids))
		}
		if got := text.String(); got != whole.text() {
			c.Errorf("%s: text %q; the whole answer's is %q", what, got, whole.text())
		}
		if ch.FinishReason != nil && !slices.Equal(finishes, []string{*ch.FinishReason}) {
			c.Errorf("%s: finish reasons %q; want one, the whole answer's %q", what, finishes, *ch.FinishReason)
		}
		if chunkObject == "chat.completion.chunk" && role != "assistant" {
			c.Errorf("%s: the first delta's role is %q; want assistant", what, role)
		}
		switch {
		case includeUsage && !(len(usages) == 1 && usages[0] == len(events)-1):
			c.Errorf("%s: usage in events %v of %d; want it once, in the last before [DONE]", what, usages, len(events))
		case !includeUsage && len(usages) != 0:
			c.Errorf("%s: usage in events %v without stream_options.include_usage", what, usages)
		}
	}
}
