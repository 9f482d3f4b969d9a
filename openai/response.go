package openai

import (
	"crypto/rand"
	"encoding/hex"
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

// The response types write a nil Choices as [] rather than null: a final
// usage chunk has no choices, and OpenAI clients expect an array there.

func (c ChatCompletion) MarshalJSON() ([]byte, error) {
	type plain ChatCompletion
	c.Choices = orEmpty(c.Choices)
	return marshalNoEscape(plain(c))
}

func (c Completion) MarshalJSON() ([]byte, error) {
	type plain Completion
	c.Choices = orEmpty(c.Choices)
	return marshalNoEscape(plain(c))
}

func (c ChatCompletionChunk) MarshalJSON() ([]byte, error) {
	type plain ChatCompletionChunk
	c.Choices = orEmpty(c.Choices)
	return marshalNoEscape(plain(c))
}

func (c CompletionChunk) MarshalJSON() ([]byte, error) {
	type plain CompletionChunk
	c.Choices = orEmpty(c.Choices)
	return marshalNoEscape(plain(c))
}

// NewID is prefix followed by 32 hex digits from crypto/rand, e.g.
// NewID("chatcmpl-"). Random rather than sequential so ids from several
// omnipd processes never collide.
func NewID(prefix string) string {
	var b [16]byte
	rand.Read(b[:]) // never fails since Go 1.24
	return prefix + hex.EncodeToString(b[:])
}
