package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// ChatCompletionRequest is the body of POST /v1/chat/completions, with vLLM's
// sampling extensions and vllm-omni's output options.
//
// Keys the type does not model are kept in Extra and written back by
// MarshalJSON, so a request decoded from a client and forwarded to vLLM loses
// nothing. An explicit JSON null on a modelled field decodes as absent, which
// is also how vLLM reads it.
type ChatCompletionRequest struct {
	Model    string        `json:"model,omitzero"`
	Messages []ChatMessage `json:"messages,omitzero"`
	// MaxCompletionTokens is OpenAI's newer name for MaxTokens; it wins when
	// both are set (see EffectiveMaxTokens).
	MaxCompletionTokens *int `json:"max_completion_tokens,omitzero"`
	SamplingParams
	Stream        *bool          `json:"stream,omitzero"`
	StreamOptions *StreamOptions `json:"stream_options,omitzero"`
	// Logprobs asks for the sampled tokens' log probabilities; TopLogprobs
	// adds that many alternatives per token and needs Logprobs.
	Logprobs    *bool   `json:"logprobs,omitzero"`
	TopLogprobs *int    `json:"top_logprobs,omitzero"`
	User        *string `json:"user,omitzero"`
	// KVTransferParams is the KV connector's opaque object. Numbers decode as
	// float64, as encoding/json does for any.
	KVTransferParams map[string]any `json:"kv_transfer_params,omitzero"`
	// Modalities is vllm-omni's choice of outputs: "text", "audio" or both.
	Modalities []string      `json:"modalities,omitzero"`
	Audio      *AudioOptions `json:"audio,omitzero"`
	Speaker    *string       `json:"speaker,omitzero"`

	// Extra holds every top-level key not modelled above, verbatim.
	Extra map[string]json.RawMessage `json:"-"`
}

// CompletionRequest is the body of POST /v1/completions. Keys it does not
// model (echo, suffix, prompt_embeds, ...) are kept in Extra.
type CompletionRequest struct {
	Model  string  `json:"model,omitzero"`
	Prompt *Prompt `json:"prompt,omitzero"`
	SamplingParams
	Stream        *bool          `json:"stream,omitzero"`
	StreamOptions *StreamOptions `json:"stream_options,omitzero"`
	// Logprobs is the legacy completions form: the number of alternatives to
	// return per token (an integer, unlike chat's boolean).
	Logprobs         *int           `json:"logprobs,omitzero"`
	User             *string        `json:"user,omitzero"`
	KVTransferParams map[string]any `json:"kv_transfer_params,omitzero"`

	Extra map[string]json.RawMessage `json:"-"`
}

// SamplingParams are the generation parameters the chat and completions
// endpoints share. Both request types embed it, so its fields read as the
// request's own (req.Temperature) and encode at the top level of the body.
type SamplingParams struct {
	MaxTokens   *int     `json:"max_tokens,omitzero"`
	Temperature *float64 `json:"temperature,omitzero"`
	TopP        *float64 `json:"top_p,omitzero"`
	// TopK of -1 or 0 disables top-k, as in vLLM.
	TopK              *int     `json:"top_k,omitzero"`
	MinP              *float64 `json:"min_p,omitzero"`
	N                 *int     `json:"n,omitzero"`
	Seed              *int64   `json:"seed,omitzero"`
	Stop              *Stop    `json:"stop,omitzero"`
	StopTokenIDs      []int    `json:"stop_token_ids,omitzero"`
	IgnoreEOS         *bool    `json:"ignore_eos,omitzero"`
	MinTokens         *int     `json:"min_tokens,omitzero"`
	RepetitionPenalty *float64 `json:"repetition_penalty,omitzero"`
	PresencePenalty   *float64 `json:"presence_penalty,omitzero"`
	FrequencyPenalty  *float64 `json:"frequency_penalty,omitzero"`

	IncludeStopStrInOutput *bool `json:"include_stop_str_in_output,omitzero"`
	SkipSpecialTokens      *bool `json:"skip_special_tokens,omitzero"`
}

// StreamOptions is the stream_options object.
type StreamOptions struct {
	// IncludeUsage adds a final chunk with usage and no choices.
	IncludeUsage *bool `json:"include_usage,omitzero"`
	// ContinuousUsageStats (vLLM) puts running usage on every chunk.
	ContinuousUsageStats *bool `json:"continuous_usage_stats,omitzero"`

	Extra map[string]json.RawMessage `json:"-"`
}

// AudioOptions is the audio object of an omni chat request.
type AudioOptions struct {
	// Format is the container of the returned audio: wav (the default), pcm,
	// flac, mp3 or opus.
	Format string `json:"format,omitzero"`
	Voice  string `json:"voice,omitzero"`

	Extra map[string]json.RawMessage `json:"-"`
}

// ChatMessage is one entry of messages. Keys other than role and content
// (name, tool_calls, tool_call_id, ...) are kept in Extra.
type ChatMessage struct {
	Role string `json:"role"`
	// Content is nil when the message had no content or a null one.
	Content *Content `json:"content,omitzero"`

	Extra map[string]json.RawMessage `json:"-"`
}

// Text is the message's text: the string content, or its text parts joined
// with newlines, which is how vLLM flattens parts for a string chat template.
func (m ChatMessage) Text() string {
	if m.Content == nil {
		return ""
	}
	return m.Content.PlainText()
}

// Content is a message's content, which clients send either as a string or
// as an array of typed parts. Parts is non-nil exactly when it was an array,
// so a forwarded message keeps the client's shape.
type Content struct {
	Text  string
	Parts []ContentPart
}

// TextContent is string content.
func TextContent(s string) *Content { return &Content{Text: s} }

// PlainText joins the text of the content; non-text parts are skipped.
func (c *Content) PlainText() string {
	if c == nil {
		return ""
	}
	if c.Parts == nil {
		return c.Text
	}
	var texts []string
	for _, p := range c.Parts {
		if p.Type == PartText {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// PartText is the only content part type this package reads. Every other
// type (image_url, input_audio, video_url, ...) is carried through untouched
// in ContentPart.Extra.
const PartText = "text"

// ContentPart is one element of array content. For a text part, Text holds
// its text; for every other type, the part's keys other than type are kept
// raw in Extra (e.g. Extra["image_url"], Extra["input_audio"]).
type ContentPart struct {
	// Type is empty only when the client left it out, which vLLM tolerates
	// for parts it can recognise by their keys.
	Type  string
	Text  string
	Extra map[string]json.RawMessage
}

// TextPart is a text content part.
func TextPart(s string) ContentPart { return ContentPart{Type: PartText, Text: s} }

// PromptKind is the shape a completions prompt was sent in.
type PromptKind uint8

const (
	// PromptText is one string: "prompt": "Hello".
	PromptText PromptKind = iota
	// PromptTexts is a batch of strings: "prompt": ["Hello", "Bye"].
	PromptTexts
	// PromptTokens is one tokenized prompt: "prompt": [9707, 11].
	PromptTokens
	// PromptTokenBatch is a batch of tokenized prompts: "prompt": [[9707], [11]].
	PromptTokenBatch
)

// Prompt is the prompt of a completions request in any of its four shapes.
// Texts holds the strings for PromptText (exactly one) and PromptTexts;
// TokenIDs holds the token ids for PromptTokens (exactly one list) and
// PromptTokenBatch. Kind is kept so a forwarded prompt keeps its shape.
type Prompt struct {
	Kind     PromptKind
	Texts    []string
	TokenIDs [][]int
}

// TextPrompt is a one-string prompt.
func TextPrompt(s string) *Prompt { return &Prompt{Kind: PromptText, Texts: []string{s}} }

// TokenPrompt is one tokenized prompt.
func TokenPrompt(ids []int) *Prompt { return &Prompt{Kind: PromptTokens, TokenIDs: [][]int{ids}} }

// Len is the number of prompts: vLLM generates n choices for each.
func (p *Prompt) Len() int {
	switch {
	case p == nil:
		return 0
	case p.Kind == PromptText || p.Kind == PromptTexts:
		return len(p.Texts)
	default:
		return len(p.TokenIDs)
	}
}

// Stop is the stop parameter, which clients send as one string or an array of
// strings. Single records the bare-string form so a forwarded body keeps it.
type Stop struct {
	Strings []string
	Single  bool
}

// StopList is the stop strings, whatever form they were sent in.
func (s *SamplingParams) StopList() []string {
	if s.Stop == nil {
		return nil
	}
	return s.Stop.Strings
}

// EffectiveMaxTokens is the output length limit that applies: OpenAI's
// max_completion_tokens when set, else the older max_tokens; nil when neither
// is. The result is a copy, so editing it does not edit the request.
func (r *ChatCompletionRequest) EffectiveMaxTokens() *int {
	if r.MaxCompletionTokens != nil {
		return clonePtr(r.MaxCompletionTokens)
	}
	return clonePtr(r.MaxTokens)
}

// EffectiveMaxTokens is max_tokens; it exists so callers can treat both
// request types alike.
func (r *CompletionRequest) EffectiveMaxTokens() *int { return clonePtr(r.MaxTokens) }

// Streaming reports whether the client asked for an SSE stream.
func (r *ChatCompletionRequest) Streaming() bool { return r.Stream != nil && *r.Stream }

// Streaming reports whether the client asked for an SSE stream.
func (r *CompletionRequest) Streaming() bool { return r.Stream != nil && *r.Stream }

// IncludeUsage reports whether a stream should end with a usage chunk.
func (r *ChatCompletionRequest) IncludeUsage() bool { return r.StreamOptions.includeUsage() }

// IncludeUsage reports whether a stream should end with a usage chunk.
func (r *CompletionRequest) IncludeUsage() bool { return r.StreamOptions.includeUsage() }

func (o *StreamOptions) includeUsage() bool {
	return o != nil && o.IncludeUsage != nil && *o.IncludeUsage
}

var (
	_ json.Unmarshaler = (*ChatCompletionRequest)(nil)
	_ json.Marshaler   = ChatCompletionRequest{}
	_ json.Unmarshaler = (*CompletionRequest)(nil)
	_ json.Marshaler   = CompletionRequest{}

	_ validUnmarshaler = (*ChatCompletionRequest)(nil)
	_ appender         = (*ChatCompletionRequest)(nil)
	_ validUnmarshaler = (*CompletionRequest)(nil)
	_ appender         = (*CompletionRequest)(nil)
)

// UnmarshalJSON decodes exactly-matched known keys and keeps the rest in
// Extra. Errors are *RequestError naming the offending parameter.
func (r *ChatCompletionRequest) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, r) }

func (r *ChatCompletionRequest) unmarshalValid(b []byte) error {
	*r = ChatCompletionRequest{}
	extra, err := decodeObject(b, r)
	if err != nil {
		return err
	}
	r.Extra = extra
	return nil
}

// MarshalJSON writes the modelled fields, then Extra's keys in sorted order.
func (r ChatCompletionRequest) MarshalJSON() ([]byte, error) { return marshalAppender(&r) }

func (r *ChatCompletionRequest) appendJSON(e *encoder) error {
	return e.object(reflect.ValueOf(r).Elem(), r.Extra)
}

// UnmarshalJSON decodes exactly-matched known keys and keeps the rest in
// Extra. Errors are *RequestError naming the offending parameter.
func (r *CompletionRequest) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, r) }

func (r *CompletionRequest) unmarshalValid(b []byte) error {
	*r = CompletionRequest{}
	extra, err := decodeObject(b, r)
	if err != nil {
		return err
	}
	r.Extra = extra
	return nil
}

// MarshalJSON writes the modelled fields, then Extra's keys in sorted order.
func (r CompletionRequest) MarshalJSON() ([]byte, error) { return marshalAppender(&r) }

func (r *CompletionRequest) appendJSON(e *encoder) error {
	return e.object(reflect.ValueOf(r).Elem(), r.Extra)
}

func (o *StreamOptions) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, o) }

func (o *StreamOptions) unmarshalValid(b []byte) error {
	*o = StreamOptions{}
	extra, err := decodeObject(b, o)
	o.Extra = extra
	return err
}

func (o StreamOptions) MarshalJSON() ([]byte, error) { return marshalAppender(&o) }

func (o *StreamOptions) appendJSON(e *encoder) error {
	return e.object(reflect.ValueOf(o).Elem(), o.Extra)
}

func (a *AudioOptions) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, a) }

func (a *AudioOptions) unmarshalValid(b []byte) error {
	*a = AudioOptions{}
	extra, err := decodeObject(b, a)
	a.Extra = extra
	return err
}

func (a AudioOptions) MarshalJSON() ([]byte, error) { return marshalAppender(&a) }

func (a *AudioOptions) appendJSON(e *encoder) error {
	return e.object(reflect.ValueOf(a).Elem(), a.Extra)
}

func (m *ChatMessage) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, m) }

func (m *ChatMessage) unmarshalValid(b []byte) error {
	*m = ChatMessage{}
	extra, err := decodeObject(b, m)
	m.Extra = extra
	return err
}

func (m ChatMessage) MarshalJSON() ([]byte, error) { return marshalAppender(&m) }

func (m *ChatMessage) appendJSON(e *encoder) error {
	return e.object(reflect.ValueOf(m).Elem(), m.Extra)
}

func (c *Content) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, c) }

func (c *Content) unmarshalValid(b []byte) error {
	*c = Content{}
	switch kindOf(b) {
	case "string":
		return decodeString(b, &c.Text)
	case "array":
		var parts []ContentPart
		if err := decodeInto(b, &parts); err != nil {
			return err
		}
		c.Parts = parts
		return nil
	default:
		return &RequestError{Message: "expected a string or an array of content parts, got " + kindOf(b)}
	}
}

func (c Content) MarshalJSON() ([]byte, error) { return marshalAppender(&c) }

func (c *Content) appendJSON(e *encoder) error {
	if c.Parts != nil {
		return e.encode(&c.Parts)
	}
	return e.str(c.Text)
}

func (p *ContentPart) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, p) }

// unmarshalValid gathers type and text before it decodes either, because
// only a text part claims the "text" key: any other part keeps it in Extra.
func (p *ContentPart) unmarshalValid(b []byte) error {
	*p = ContentPart{}
	if kindOf(b) == "null" {
		return &RequestError{Message: "expected a content part object, got null"}
	}
	var head struct {
		Type rawValue `json:"type"`
		Text rawValue `json:"text"`
	}
	extra, err := decodeObject(b, &head)
	if err != nil {
		return err
	}
	if head.Type != nil {
		if err := decodeString(head.Type, &p.Type); err != nil {
			return within("type", err)
		}
	}
	switch {
	case p.Type == PartText && head.Text == nil:
		return &RequestError{Param: "text", Message: `required for a part of type "text"`}
	case p.Type == PartText && kindOf(head.Text) != "string":
		return &RequestError{Param: "text", Message: "expected a string, got " + kindOf(head.Text)}
	case p.Type == PartText:
		if err := decodeString(head.Text, &p.Text); err != nil {
			return within("text", err)
		}
	case head.Text != nil:
		if extra == nil {
			extra = map[string]json.RawMessage{}
		}
		extra["text"] = bytes.Clone(head.Text)
	}
	p.Extra = extra
	return nil
}

func (p ContentPart) MarshalJSON() ([]byte, error) { return marshalAppender(&p) }

func (p *ContentPart) appendJSON(e *encoder) error {
	// The head struct's fields win over Extra's keys (see encoder.object),
	// so only a text part claims "text"; any other part passes its "text" on.
	if p.Type == PartText {
		head := struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{p.Type, p.Text}
		return e.object(reflect.ValueOf(&head).Elem(), p.Extra)
	}
	head := struct {
		Type string `json:"type,omitzero"`
	}{p.Type}
	return e.object(reflect.ValueOf(&head).Elem(), p.Extra)
}

func (p *Prompt) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, p) }

func (p *Prompt) unmarshalValid(b []byte) error {
	*p = Prompt{}
	switch kindOf(b) {
	case "string":
		var s string
		if err := decodeString(b, &s); err != nil {
			return err
		}
		*p = Prompt{Kind: PromptText, Texts: []string{s}}
		return nil
	case "array":
	default:
		return &RequestError{Message: "expected " + jsonKind(reflect.TypeFor[Prompt]()) + ", got " + kindOf(b)}
	}
	// The first element decides the shape; decodeInto then names any
	// element that does not fit it.
	first := "string"
	for e := range elements(b) {
		first = kindOf(e)
		break
	}
	switch first {
	case "string":
		p.Kind = PromptTexts
		return decodeInto(b, &p.Texts)
	case "array":
		p.Kind = PromptTokenBatch
		return decodeInto(b, &p.TokenIDs)
	default:
		var ids []int
		if err := decodeInto(b, &ids); err != nil {
			return err
		}
		*p = Prompt{Kind: PromptTokens, TokenIDs: [][]int{ids}}
		return nil
	}
}

func (p Prompt) MarshalJSON() ([]byte, error) { return marshalAppender(&p) }

func (p *Prompt) appendJSON(e *encoder) error {
	switch p.Kind {
	case PromptText:
		if len(p.Texts) != 1 {
			return fmt.Errorf("openai: text prompt holds %d strings, want 1", len(p.Texts))
		}
		return e.str(p.Texts[0])
	case PromptTexts:
		return e.encode(new(orEmpty(p.Texts)))
	case PromptTokens:
		if len(p.TokenIDs) != 1 {
			return fmt.Errorf("openai: token prompt holds %d lists, want 1", len(p.TokenIDs))
		}
		return e.encode(new(orEmpty(p.TokenIDs[0])))
	case PromptTokenBatch:
		batch := make([][]int, len(p.TokenIDs))
		for i, ids := range p.TokenIDs {
			batch[i] = orEmpty(ids)
		}
		return e.encode(&batch)
	default:
		return fmt.Errorf("openai: unknown prompt kind %d", p.Kind)
	}
}

// orEmpty keeps a nil slice from encoding as null where an array is required.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (s *Stop) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, s) }

func (s *Stop) unmarshalValid(b []byte) error {
	*s = Stop{}
	switch kindOf(b) {
	case "string":
		var v string
		if err := decodeString(b, &v); err != nil {
			return err
		}
		*s = Stop{Strings: []string{v}, Single: true}
		return nil
	case "array":
		return decodeInto(b, &s.Strings)
	default:
		return &RequestError{Message: "expected a string or an array of strings, got " + kindOf(b)}
	}
}

func (s Stop) MarshalJSON() ([]byte, error) { return marshalAppender(&s) }

func (s *Stop) appendJSON(e *encoder) error {
	if s.Single && len(s.Strings) == 1 {
		return e.str(s.Strings[0])
	}
	return e.encode(new(orEmpty(s.Strings)))
}

// Clone returns a deep copy: the orchestrator edits one copy per stage
// (prefill, decode) and must not see the edits leak into the other.
func (r *ChatCompletionRequest) Clone() *ChatCompletionRequest {
	if r == nil {
		return nil
	}
	c := *r
	if r.Messages != nil {
		c.Messages = make([]ChatMessage, len(r.Messages))
		for i, m := range r.Messages {
			c.Messages[i] = m.clone()
		}
	}
	c.MaxCompletionTokens = clonePtr(r.MaxCompletionTokens)
	c.SamplingParams = r.SamplingParams.clone()
	c.Stream = clonePtr(r.Stream)
	c.StreamOptions = r.StreamOptions.clone()
	c.Logprobs = clonePtr(r.Logprobs)
	c.TopLogprobs = clonePtr(r.TopLogprobs)
	c.User = clonePtr(r.User)
	c.KVTransferParams = cloneJSONObject(r.KVTransferParams)
	c.Modalities = slices.Clone(r.Modalities)
	if r.Audio != nil {
		a := *r.Audio
		a.Extra = cloneExtra(r.Audio.Extra)
		c.Audio = &a
	}
	c.Speaker = clonePtr(r.Speaker)
	c.Extra = cloneExtra(r.Extra)
	return &c
}

// Clone returns a deep copy.
func (r *CompletionRequest) Clone() *CompletionRequest {
	if r == nil {
		return nil
	}
	c := *r
	if r.Prompt != nil {
		p := Prompt{Kind: r.Prompt.Kind, Texts: slices.Clone(r.Prompt.Texts)}
		if r.Prompt.TokenIDs != nil {
			p.TokenIDs = make([][]int, len(r.Prompt.TokenIDs))
			for i, ids := range r.Prompt.TokenIDs {
				p.TokenIDs[i] = slices.Clone(ids)
			}
		}
		c.Prompt = &p
	}
	c.SamplingParams = r.SamplingParams.clone()
	c.Stream = clonePtr(r.Stream)
	c.StreamOptions = r.StreamOptions.clone()
	c.Logprobs = clonePtr(r.Logprobs)
	c.User = clonePtr(r.User)
	c.KVTransferParams = cloneJSONObject(r.KVTransferParams)
	c.Extra = cloneExtra(r.Extra)
	return &c
}

func (s SamplingParams) clone() SamplingParams {
	c := s
	c.MaxTokens = clonePtr(s.MaxTokens)
	c.Temperature = clonePtr(s.Temperature)
	c.TopP = clonePtr(s.TopP)
	c.TopK = clonePtr(s.TopK)
	c.MinP = clonePtr(s.MinP)
	c.N = clonePtr(s.N)
	c.Seed = clonePtr(s.Seed)
	if s.Stop != nil {
		c.Stop = &Stop{Strings: slices.Clone(s.Stop.Strings), Single: s.Stop.Single}
	}
	c.StopTokenIDs = slices.Clone(s.StopTokenIDs)
	c.IgnoreEOS = clonePtr(s.IgnoreEOS)
	c.MinTokens = clonePtr(s.MinTokens)
	c.RepetitionPenalty = clonePtr(s.RepetitionPenalty)
	c.PresencePenalty = clonePtr(s.PresencePenalty)
	c.FrequencyPenalty = clonePtr(s.FrequencyPenalty)
	c.IncludeStopStrInOutput = clonePtr(s.IncludeStopStrInOutput)
	c.SkipSpecialTokens = clonePtr(s.SkipSpecialTokens)
	return c
}

func (o *StreamOptions) clone() *StreamOptions {
	if o == nil {
		return nil
	}
	return &StreamOptions{
		IncludeUsage:         clonePtr(o.IncludeUsage),
		ContinuousUsageStats: clonePtr(o.ContinuousUsageStats),
		Extra:                cloneExtra(o.Extra),
	}
}

func (m ChatMessage) clone() ChatMessage {
	c := ChatMessage{Role: m.Role, Extra: cloneExtra(m.Extra)}
	if m.Content != nil {
		content := Content{Text: m.Content.Text}
		if m.Content.Parts != nil {
			content.Parts = make([]ContentPart, len(m.Content.Parts))
			for i, p := range m.Content.Parts {
				content.Parts[i] = ContentPart{Type: p.Type, Text: p.Text, Extra: cloneExtra(p.Extra)}
			}
		}
		c.Content = &content
	}
	return c
}
