package openai

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
)

// Object names of the response types.
const (
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectTextCompletion      = "text_completion" // for completions and their chunks alike
)

// Finish reasons vLLM reports.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	// FinishAbort: the request was aborted (e.g. the client went away).
	FinishAbort = "abort"
	// FinishError: generation failed, e.g. decode could not load the KV the
	// prefill exported (vLLM's kv_load_failure_policy "fail").
	FinishError = "error"
)

// Output modalities of an omni request, also the top-level modality of a
// stream chunk.
const (
	ModalityText  = "text"
	ModalityAudio = "audio"
)

// Usage counts tokens. PromptTokensDetails.CachedTokens is where a decode
// stage reports prompt tokens it did not compute.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails breaks prompt tokens down.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ChatCompletion is a non-streaming chat completions response.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   Usage        `json:"usage"`
	// KVTransferParams is what the KV connector returned when the request
	// finished: an object for NIXL, null for Mooncake, P2pNccl and LMCache.
	// It is always written, null included, as vLLM does.
	KVTransferParams any `json:"kv_transfer_params"`
}

// ChatChoice is one choice of a ChatCompletion. An omni response with text
// and audio has two choices, both with index 0.
type ChatChoice struct {
	Index        int             `json:"index"`
	Message      ResponseMessage `json:"message"`
	Logprobs     *ChatLogprobs   `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

// ResponseMessage is the assistant message of a ChatChoice.
type ResponseMessage struct {
	Role string `json:"role"`
	// Content is null on an audio-only choice.
	Content *string       `json:"content"`
	Audio   *MessageAudio `json:"audio,omitempty"`
}

// MessageAudio is the audio of an omni response's audio choice.
type MessageAudio struct {
	// ID is "audio-" and 16 hex digits in vllm-omni.
	ID string `json:"id"`
	// Data is the base64 of a whole audio file in the requested format.
	Data string `json:"data"`
	// ExpiresAt is a Unix time (vllm-omni: 24 h after the response).
	ExpiresAt  int64  `json:"expires_at"`
	Transcript string `json:"transcript"`
}

// ChatLogprobs are a chat choice's log probabilities. Values must be finite:
// encoding/json cannot write -Inf, so write vLLM's -9999.0 instead.
type ChatLogprobs struct {
	Content []ChatTokenLogprob `json:"content"`
}

// ChatTokenLogprob is one sampled token with its alternatives.
type ChatTokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// Completion is a non-streaming completions response.
type Completion struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"`
	Created          int64              `json:"created"`
	Model            string             `json:"model"`
	Choices          []CompletionChoice `json:"choices"`
	Usage            Usage              `json:"usage"`
	KVTransferParams any                `json:"kv_transfer_params"`
}

// CompletionChoice is one choice of a Completion.
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason string              `json:"finish_reason"`
}

// CompletionLogprobs are the legacy completions log probabilities. A
// TokenLogprobs entry is null for an echoed first prompt token.
type CompletionLogprobs struct {
	TextOffset    []int                `json:"text_offset"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	Tokens        []string             `json:"tokens"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
}

// ChatCompletionChunk is one SSE event of a streamed chat completion.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	// Usage is null except on the final usage chunk (include_usage) or on
	// every chunk (continuous_usage_stats).
	Usage *Usage `json:"usage"`
	// Modality is vllm-omni's extension: "text" or "audio" on every chunk
	// of an omni stream.
	Modality string `json:"modality,omitempty"`
}

// ChatChunkChoice is one choice of a chunk.
type ChatChunkChoice struct {
	Index    int           `json:"index"`
	Delta    ChatDelta     `json:"delta"`
	Logprobs *ChatLogprobs `json:"logprobs,omitempty"`
	// FinishReason is null until the choice's last chunk.
	FinishReason *string `json:"finish_reason"`
}

// ChatDelta is the increment a chunk carries. Role is set on the first chunk
// (of each modality, in omni streams). Audio chunks carry the base64 of a
// small complete audio file in Content.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// CompletionChunk is one SSE event of a streamed completion.
type CompletionChunk struct {
	ID      string                  `json:"id"`
	Object  string                  `json:"object"`
	Created int64                   `json:"created"`
	Model   string                  `json:"model"`
	Choices []CompletionChunkChoice `json:"choices"`
	Usage   *Usage                  `json:"usage"`
}

// CompletionChunkChoice is one choice of a completion chunk.
type CompletionChunkChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs,omitempty"`
	FinishReason *string             `json:"finish_reason"`
}

// The response types write themselves into the request encoder's pooled
// buffer (object.go), field by field in declaration order, instead of going
// through encoding/json: a worker writes one chunk per token, and reflection
// plus encoding/json's second pass over a MarshalJSON result cost more than
// the bytes. The output is what marshalNoEscape wrote for these structs, byte
// for byte: the same omitempty fields left out, nil pointers as null, no HTML
// escaping. A nil Choices is written as [] rather than null: a final usage
// chunk has no choices, and OpenAI clients expect an array there. Logprobs,
// rare and full of floats, still go to encoding/json.

// MarshalJSON calls appendJSON through a closure rather than marshalAppender's
// interface, so that the copy of the value it is called on can stay on the
// stack: one allocation fewer per streamed chunk.

func (c ChatCompletion) MarshalJSON() ([]byte, error) {
	return marshalResponse(func(e *encoder) error { return c.appendJSON(e) })
}

func (c Completion) MarshalJSON() ([]byte, error) {
	return marshalResponse(func(e *encoder) error { return c.appendJSON(e) })
}

func (c ChatCompletionChunk) MarshalJSON() ([]byte, error) {
	return marshalResponse(func(e *encoder) error { return c.appendJSON(e) })
}

func (c CompletionChunk) MarshalJSON() ([]byte, error) {
	return marshalResponse(func(e *encoder) error { return c.appendJSON(e) })
}

// marshalResponse is marshalAppender for a response type's appendJSON.
func marshalResponse(appendJSON func(e *encoder) error) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer func() {
		if e.buf.Cap() <= 1<<20 { // let the rare huge body's buffer go
			e.buf.Reset()
			encoders.Put(e)
		}
	}()
	if err := appendJSON(e); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

func (c *ChatCompletion) appendJSON(e *encoder) error {
	if err := e.responseHead(c.ID, c.Object, c.Created, c.Model); err != nil {
		return err
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		e.choiceStart(i, ch.Index)
		e.buf.WriteString(`,"message":{"role":`)
		if err := e.str(ch.Message.Role); err != nil {
			return err
		}
		e.buf.WriteString(`,"content":`)
		if err := e.strPtr(ch.Message.Content); err != nil {
			return err
		}
		if a := ch.Message.Audio; a != nil {
			e.buf.WriteString(`,"audio":{"id":`)
			if err := e.str(a.ID); err != nil {
				return err
			}
			e.buf.WriteString(`,"data":`)
			if err := e.str(a.Data); err != nil {
				return err
			}
			e.buf.WriteString(`,"expires_at":`)
			e.int64(a.ExpiresAt)
			e.buf.WriteString(`,"transcript":`)
			if err := e.str(a.Transcript); err != nil {
				return err
			}
			e.buf.WriteByte('}')
		}
		e.buf.WriteByte('}')
		if err := choiceEnd(e, ch.Logprobs, false, &ch.FinishReason); err != nil {
			return err
		}
	}
	return e.answerTail(&c.Usage, c.KVTransferParams)
}

func (c *Completion) appendJSON(e *encoder) error {
	if err := e.responseHead(c.ID, c.Object, c.Created, c.Model); err != nil {
		return err
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		e.choiceStart(i, ch.Index)
		e.buf.WriteString(`,"text":`)
		if err := e.str(ch.Text); err != nil {
			return err
		}
		if err := choiceEnd(e, ch.Logprobs, false, &ch.FinishReason); err != nil {
			return err
		}
	}
	return e.answerTail(&c.Usage, c.KVTransferParams)
}

func (c *ChatCompletionChunk) appendJSON(e *encoder) error {
	if err := e.responseHead(c.ID, c.Object, c.Created, c.Model); err != nil {
		return err
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		e.choiceStart(i, ch.Index)
		e.buf.WriteString(`,"delta":{`)
		if ch.Delta.Role != "" {
			e.buf.WriteString(`"role":`)
			if err := e.str(ch.Delta.Role); err != nil {
				return err
			}
		}
		if ch.Delta.Content != nil {
			if ch.Delta.Role != "" {
				e.buf.WriteByte(',')
			}
			e.buf.WriteString(`"content":`)
			if err := e.str(*ch.Delta.Content); err != nil {
				return err
			}
		}
		e.buf.WriteByte('}')
		if err := choiceEnd(e, ch.Logprobs, true, ch.FinishReason); err != nil {
			return err
		}
	}
	e.buf.WriteString(`],"usage":`)
	e.usagePtr(c.Usage)
	if c.Modality != "" {
		e.buf.WriteString(`,"modality":`)
		if err := e.str(c.Modality); err != nil {
			return err
		}
	}
	e.buf.WriteByte('}')
	return nil
}

func (c *CompletionChunk) appendJSON(e *encoder) error {
	if err := e.responseHead(c.ID, c.Object, c.Created, c.Model); err != nil {
		return err
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		e.choiceStart(i, ch.Index)
		e.buf.WriteString(`,"text":`)
		if err := e.str(ch.Text); err != nil {
			return err
		}
		if err := choiceEnd(e, ch.Logprobs, true, ch.FinishReason); err != nil {
			return err
		}
	}
	e.buf.WriteString(`],"usage":`)
	e.usagePtr(c.Usage)
	e.buf.WriteByte('}')
	return nil
}

// choiceStart opens the i-th choice of a choices array, up to its index.
func (e *encoder) choiceStart(i, index int) {
	if i > 0 {
		e.buf.WriteByte(',')
	}
	e.buf.WriteString(`{"index":`)
	e.int(index)
}

// choiceEnd writes what every choice ends with: its logprobs (which a chunk,
// omitNil, leaves out when it has none), its finish_reason, and the closing
// brace.
func choiceEnd[T ChatLogprobs | CompletionLogprobs](e *encoder, logprobs *T, omitNil bool, finishReason *string) error {
	if logprobs != nil || !omitNil {
		e.buf.WriteString(`,"logprobs":`)
		if err := appendLogprobs(e, logprobs); err != nil {
			return err
		}
	}
	e.buf.WriteString(`,"finish_reason":`)
	if err := e.strPtr(finishReason); err != nil {
		return err
	}
	e.buf.WriteByte('}')
	return nil
}

// answerTail closes a whole answer's choices and writes what follows them.
func (e *encoder) answerTail(u *Usage, kvTransferParams any) error {
	e.buf.WriteString(`],"usage":`)
	e.usage(u)
	e.buf.WriteString(`,"kv_transfer_params":`)
	if err := e.kvParams(kvTransferParams); err != nil {
		return err
	}
	e.buf.WriteByte('}')
	return nil
}

// responseHead writes what every response type starts with, up to the
// opening bracket of its choices.
func (e *encoder) responseHead(id, object string, created int64, model string) error {
	e.buf.WriteString(`{"id":`)
	if err := e.str(id); err != nil {
		return err
	}
	e.buf.WriteString(`,"object":`)
	if err := e.str(object); err != nil {
		return err
	}
	e.buf.WriteString(`,"created":`)
	e.int64(created)
	e.buf.WriteString(`,"model":`)
	if err := e.str(model); err != nil {
		return err
	}
	e.buf.WriteString(`,"choices":[`)
	return nil
}

func (e *encoder) usage(u *Usage) {
	e.buf.WriteString(`{"prompt_tokens":`)
	e.int(u.PromptTokens)
	e.buf.WriteString(`,"completion_tokens":`)
	e.int(u.CompletionTokens)
	e.buf.WriteString(`,"total_tokens":`)
	e.int(u.TotalTokens)
	if d := u.PromptTokensDetails; d != nil {
		e.buf.WriteString(`,"prompt_tokens_details":{"cached_tokens":`)
		e.int(d.CachedTokens)
		e.buf.WriteByte('}')
	}
	e.buf.WriteByte('}')
}

func (e *encoder) usagePtr(u *Usage) {
	if u == nil {
		e.buf.WriteString("null")
		return
	}
	e.usage(u)
}

func (e *encoder) strPtr(s *string) error {
	if s == nil {
		e.buf.WriteString("null")
		return nil
	}
	return e.str(*s)
}

func (e *encoder) int(n int) { e.int64(int64(n)) }

func (e *encoder) int64(n int64) {
	e.buf.Write(strconv.AppendInt(e.buf.AvailableBuffer(), n, 10))
}

// appendLogprobs writes *ChatLogprobs or *CompletionLogprobs, null when nil.
func appendLogprobs[T ChatLogprobs | CompletionLogprobs](e *encoder, p *T) error {
	if p == nil {
		e.buf.WriteString("null")
		return nil
	}
	return e.value(p)
}

// kvParams writes kv_transfer_params. What a connector returns is a JSON
// object whose values are mostly integers and lists of block ids, which
// jsonValue would hand to encoding/json one by one.
func (e *encoder) kvParams(v any) error {
	switch v := v.(type) {
	case int:
		e.int(v)
	case []int:
		if v == nil {
			e.buf.WriteString("null")
			return nil
		}
		e.buf.WriteByte('[')
		for i, n := range v {
			if i > 0 {
				e.buf.WriteByte(',')
			}
			e.int(n)
		}
		e.buf.WriteByte(']')
	case map[string]any:
		return e.sortedMap(v, e.kvParams)
	default:
		return e.jsonValue(v)
	}
	return nil
}

// NewID is prefix followed by 32 hex digits from crypto/rand, e.g.
// NewID("chatcmpl-"). Random rather than sequential so ids from several
// omnipd processes never collide.
func NewID(prefix string) string {
	var b [16]byte
	rand.Read(b[:]) // never fails since Go 1.24
	return prefix + hex.EncodeToString(b[:])
}

// StageMembers are the top-level members of a Thinker's answer that belong
// to the protocol between omnipd and its stages, never to the client:
// kv_transfer_params (the KV connector's handoff, which vLLM writes into
// every whole answer, null included) and omnipd_conditioning (the handle of
// the rows a Thinker leg kept for the Talker).
var StageMembers = []string{KVTransferParamsMember, ConditioningMember}

// ErrNotObject: a stage's answer or chunk is not a JSON object.
var ErrNotObject = errors.New("not a JSON object")

// Relay rewrites a stage's answer or stream chunk, a JSON object, into what
// the client gets: the top-level "id" set to id (written first when the
// stage sent none), every StageMembers member removed, and everything else
// byte for byte in its order. It returns doc itself when nothing changes,
// which is the common case of a chunk whose id is already id.
//
// The id is the router's own, as vLLM's serving layer derives its answer's
// id from the request's X-Request-Id ("chatcmpl-" + id): a leg's id may be
// a connector's encoding (P2pNccl's "___prefill_addr_…"), which is routing
// metadata, not the client's.
//
// Relay runs on every streamed chunk, so the unchanged case is one
// validating scan that allocates nothing; only a document that changes is
// scanned again to be written.
func Relay(doc []byte, id string) ([]byte, error) {
	var qb [64]byte
	quoted, err := appendJSONString(qb[:0], id)
	if err != nil {
		return nil, err
	}
	_, changed, sawID, err := relayMembers(nil, doc, quoted, false, true)
	if err != nil || !changed {
		if err != nil {
			return nil, err
		}
		return doc, nil
	}
	out := make([]byte, 0, len(doc)+len(quoted)+len(`"id":,`))
	out, _, _, _ = relayMembers(out, doc, quoted, true, sawID)
	return out, nil
}

// relayMembers is Relay's pass over doc's members. Without write it only
// validates doc and reports whether Relay must change it and whether it has
// an "id"; with write it appends the client's document to dst, its id first
// when sawID says doc has none.
func relayMembers(dst, doc, quoted []byte, write, sawID bool) (out []byte, changed, hasID bool, err error) {
	i := skipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return nil, false, false, ErrNotObject
	}
	members := 0
	member := func(parts ...[]byte) {
		if members > 0 {
			dst = append(dst, ',')
		}
		members++
		for _, p := range parts {
			dst = append(dst, p...)
		}
	}
	if write {
		dst = append(dst, '{')
		if !sawID {
			member([]byte(`"id":`), quoted)
		}
	}
	i = skipSpace(doc, i+1)
	if i < len(doc) && doc[i] == '}' {
		i++
	} else {
		for {
			ks := i
			ke, ok := validValue(doc, i, 1)
			if !ok || doc[ks] != '"' {
				return nil, false, false, ErrNotObject
			}
			j := skipSpace(doc, ke)
			if j >= len(doc) || doc[j] != ':' {
				return nil, false, false, ErrNotObject
			}
			vs := skipSpace(doc, j+1)
			ve, ok := validValue(doc, vs, 1)
			if !ok {
				return nil, false, false, ErrNotObject
			}
			switch relayKind(doc[ks:ke]) {
			case relayID:
				hasID = true
				if !bytes.Equal(doc[vs:ve], quoted) {
					changed = true
				}
				if write {
					member([]byte(`"id":`), quoted)
				}
			case relayStage:
				changed = true
			default:
				if write {
					member(doc[ks:ve])
				}
			}
			i = skipSpace(doc, ve)
			if i < len(doc) && doc[i] == ',' {
				i = skipSpace(doc, i+1)
				continue
			}
			if i < len(doc) && doc[i] == '}' {
				i++
				break
			}
			return nil, false, false, ErrNotObject
		}
	}
	if skipSpace(doc, i) != len(doc) {
		return nil, false, false, ErrNotObject
	}
	if write {
		dst = append(dst, '}')
	}
	return dst, changed || !hasID, hasID, nil
}

const (
	relayOther = iota
	relayID
	relayStage
)

// relayKind says what Relay does with a member; raw is its key, a valid
// JSON string.
func relayKind(raw []byte) int {
	name := raw[1 : len(raw)-1]
	if bytes.IndexByte(name, '\\') >= 0 {
		var s string
		_ = json.Unmarshal(raw, &s)
		name = []byte(s)
	}
	if string(name) == "id" {
		return relayID
	}
	for _, m := range StageMembers {
		if string(name) == m {
			return relayStage
		}
	}
	return relayOther
}

// appendJSONString appends s as encoding/json writes it, without
// encoding/json's allocation for the plain ASCII ids omnipd makes.
func appendJSONString(dst []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, err := json.Marshal(s)
			return append(dst, q...), err
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"'), nil
}
