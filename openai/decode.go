package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrTooLarge is wrapped by the RequestError for a body over the size limit,
// so the HTTP layer can answer 413 rather than 400.
var ErrTooLarge = errors.New("request body too large")

// RequestError is a problem with a client's request: the HTTP layer answers
// it with 400 (413 for ErrTooLarge) and OpenAI's error body. Message is meant
// for the client; Err, when set, is the underlying cause for the log.
type RequestError struct {
	// Param is the offending parameter as a path into the body, e.g.
	// "messages[2].content[0].text"; empty when the body as a whole is bad.
	Param   string
	Message string
	Err     error
}

var _ error = (*RequestError)(nil)

func (e *RequestError) Error() string {
	if e.Param == "" {
		return e.Message
	}
	return e.Param + ": " + e.Message
}

func (e *RequestError) Unwrap() error { return e.Err }

// Response is the OpenAI error body for e.
func (e *RequestError) Response() *ErrorResponse {
	if errors.Is(e.Err, ErrTooLarge) {
		return newError(http.StatusRequestEntityTooLarge, TypeInvalidRequest, CodeRequestTooLarge, e.Error())
	}
	return InvalidRequest(e.Param, e.Error())
}

// DecodeChatRequest reads, decodes and validates a chat completions body of
// at most limit bytes (limit <= 0: no bound; the HTTP server should then
// bound it with http.MaxBytesReader, whose error is also reported as
// ErrTooLarge). Every client mistake is a *RequestError; an error reading r
// is returned wrapped, as it is not the client's request that is wrong.
func DecodeChatRequest(r io.Reader, limit int64) (*ChatCompletionRequest, error) {
	body, err := readBody(r, limit)
	if err != nil {
		return nil, err
	}
	req := new(ChatCompletionRequest)
	if err := decodeBody(body, req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return req, nil
}

// DecodeCompletionRequest is DecodeChatRequest for a completions body.
func DecodeCompletionRequest(r io.Reader, limit int64) (*CompletionRequest, error) {
	body, err := readBody(r, limit)
	if err != nil {
		return nil, err
	}
	req := new(CompletionRequest)
	if err := decodeBody(body, req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return req, nil
}

// DecodeCompletionRequestWithin is DecodeCompletionRequest for a server
// that knows the model's context, maxModelLen tokens (<= 0: unknown): a
// token-id prompt of maxModelLen ids or more, which cannot leave room for
// one generated token, is refused before its ids are decoded — they are
// counted in the body's bytes, so 15 MiB of ids costs no more than the 15
// MiB already read, instead of eight bytes an id. The refusal is vLLM's
// 400 (ContextLengthExceeded, param "prompt", or "prompt[i]" for one
// prompt of a batch), an *ErrorResponse.
func DecodeCompletionRequestWithin(r io.Reader, limit int64, maxModelLen int) (*CompletionRequest, error) {
	body, err := readBody(r, limit)
	if err != nil {
		return nil, err
	}
	req := new(CompletionRequest)
	if maxModelLen > 0 && valid(body) {
		// Validated once here; the decoder then walks the trusted bytes.
		doc := trimSpace(body)
		if kindOf(doc) == "object" {
			if err := refuseLongTokenPrompt(doc, maxModelLen); err != nil {
				return nil, err
			}
		}
		if err := wordBodyError(req.unmarshalValid(doc)); err != nil {
			return nil, err
		}
	} else if err := decodeBody(body, req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return req, nil
}

// ReadObject reads a body of at most limit bytes that must be one JSON
// object and returns it as sent, for requests omnipd passes on without
// modelling them (vLLM's /tokenize and /detokenize). Its errors are
// DecodeChatRequest's.
func ReadObject(r io.Reader, limit int64) ([]byte, error) {
	body, err := readBody(r, limit)
	if err != nil {
		return nil, err
	}
	if err := decodeBody(body, new(rawObject)); err != nil {
		return nil, err
	}
	return body, nil
}

// rawObject checks that a body is a JSON object and keeps nothing of it.
type rawObject struct{}

func (o *rawObject) UnmarshalJSON(b []byte) error { return unmarshalChecked(b, o) }

func (o *rawObject) unmarshalValid(b []byte) error {
	if k := kindOf(b); k != "object" {
		return &RequestError{Message: "expected an object, got " + k}
	}
	return nil
}

// refuseLongTokenPrompt refuses the completions body, a valid JSON object,
// whose prompt holds token ids that cannot fit maxModelLen. It counts the
// ids of the raw "prompt" value and decodes nothing; a prompt of another
// shape is left to the decoder.
func refuseLongTokenPrompt(doc []byte, maxModelLen int) error {
	var raw []byte
	for k, v := range members(doc) {
		if name, ok := verbatim(k); ok && string(name) == "prompt" || !ok && unquote(k) == "prompt" {
			raw = v // of a repeated key the last counts, as when decoding
		}
	}
	if kindOf(raw) != "array" {
		return nil
	}
	for e := range elements(raw) {
		switch kindOf(e) {
		case "number":
			// One tokenized prompt: [9707, 11, ...].
			if n := countElements(raw); n >= maxModelLen {
				return PromptTooLong("prompt", maxModelLen, n)
			}
		case "array":
			// A batch of them: [[9707], [11, ...]].
			i := 0
			for ids := range elements(raw) {
				if kindOf(ids) == "array" {
					if n := countElements(ids); n >= maxModelLen {
						return PromptTooLong("prompt["+strconv.Itoa(i)+"]", maxModelLen, n)
					}
				}
				i++
			}
		}
		return nil // the first element decides the shape, as in Prompt
	}
	return nil
}

// countElements is the number of elements of the valid JSON array arr.
func countElements(arr []byte) int {
	n := 0
	for range elements(arr) {
		n++
	}
	return n
}

func readBody(r io.Reader, limit int64) ([]byte, error) {
	if limit > 0 && limit < math.MaxInt64 {
		// One byte more than allowed tells "exactly at the limit" from "over".
		r = io.LimitReader(r, limit+1)
	}
	body, err := io.ReadAll(r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(mbe.Limit)
		}
		return nil, fmt.Errorf("openai: reading request body: %w", err)
	}
	if limit > 0 && int64(len(body)) > limit {
		return nil, tooLarge(limit)
	}
	return body, nil
}

func tooLarge(limit int64) error {
	return &RequestError{
		Message: fmt.Sprintf("request body exceeds the limit of %d bytes", limit),
		Err:     ErrTooLarge,
	}
}

// decodeBody decodes a whole request body and words whole-body errors: where
// the JSON is broken, or that it is not an object at all.
func decodeBody(body []byte, dst json.Unmarshaler) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return &RequestError{Message: "request body is empty; want a JSON object"}
	}
	err := dst.UnmarshalJSON(body)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line, col := position(body, se.Offset)
		return &RequestError{
			Message: fmt.Sprintf("invalid JSON at line %d, column %d (byte %d): %s", line, col, se.Offset, se.Error()),
			Err:     err,
		}
	}
	return wordBodyError(err)
}

// wordBodyError words an error about the body as a whole as one.
func wordBodyError(err error) error {
	var re *RequestError
	if errors.As(err, &re) && re.Param == "" {
		return &RequestError{Message: "request body: " + re.Message, Err: re.Err}
	}
	return err
}

// position turns json.SyntaxError's offset (bytes read when the error was
// found, so the bad byte is the last of them) into a 1-based line and column.
func position(body []byte, offset int64) (line, col int) {
	offset = min(max(offset, 0), int64(len(body)))
	before := body[:offset]
	line = 1 + bytes.Count(before, []byte("\n"))
	col = len(before) - bytes.LastIndexByte(before, '\n') - 1
	return line, max(col, 1)
}

// Validate checks the request the way vLLM would before it reaches the
// engine, so a bad request fails fast and names its parameter, and never
// reaches a prefill worker.
func (r *ChatCompletionRequest) Validate() error {
	if r.Messages == nil {
		return &RequestError{Param: "messages", Message: "required"}
	}
	if len(r.Messages) == 0 {
		return &RequestError{Param: "messages", Message: "must not be empty"}
	}
	for i, m := range r.Messages {
		if m.Role == "" {
			return &RequestError{Param: fmt.Sprintf("messages[%d].role", i), Message: "required"}
		}
	}
	if err := atLeast("max_completion_tokens", r.MaxCompletionTokens, 0); err != nil {
		return err
	}
	maxName := "max_tokens"
	if r.MaxCompletionTokens != nil {
		maxName = "max_completion_tokens"
	}
	if err := r.SamplingParams.validate(r.EffectiveMaxTokens(), maxName); err != nil {
		return err
	}
	if err := validateStream(r.Stream, r.StreamOptions); err != nil {
		return err
	}
	if err := atLeast("top_logprobs", r.TopLogprobs, 0); err != nil {
		return err
	}
	if r.TopLogprobs != nil && (r.Logprobs == nil || !*r.Logprobs) {
		return &RequestError{Param: "top_logprobs", Message: "requires logprobs to be true"}
	}
	if r.Modalities != nil && len(r.Modalities) == 0 {
		return &RequestError{Param: "modalities", Message: `must not be empty; want "text", "audio" or both`}
	}
	for i, m := range r.Modalities {
		if m != ModalityText && m != ModalityAudio {
			return &RequestError{Param: fmt.Sprintf("modalities[%d]", i), Message: fmt.Sprintf(`unsupported modality %q; want "text" or "audio"`, m)}
		}
	}
	if r.Audio != nil {
		switch r.Audio.Format {
		case "", "wav", "pcm", "flac", "mp3", "opus":
		default:
			return &RequestError{Param: "audio.format", Message: fmt.Sprintf("unsupported format %q; want wav, pcm, flac, mp3 or opus", r.Audio.Format)}
		}
	}
	return nil
}

// Validate checks the request the way vLLM would before it reaches the engine.
func (r *CompletionRequest) Validate() error {
	if r.Prompt == nil {
		// vLLM accepts prompt_embeds instead; they travel in Extra.
		if _, ok := r.Extra["prompt_embeds"]; !ok {
			return &RequestError{Param: "prompt", Message: "required; want a string, an array of strings, or token ids"}
		}
	} else if err := r.Prompt.validate(); err != nil {
		return err
	}
	if err := r.SamplingParams.validate(r.MaxTokens, "max_tokens"); err != nil {
		return err
	}
	if err := validateStream(r.Stream, r.StreamOptions); err != nil {
		return err
	}
	if err := atLeast("logprobs", r.Logprobs, 0); err != nil {
		return err
	}
	return nil
}

func (p *Prompt) validate() error {
	empty := &RequestError{Param: "prompt", Message: "must not be empty"}
	switch p.Kind {
	case PromptText:
		if len(p.Texts) != 1 {
			return &RequestError{Param: "prompt", Message: fmt.Sprintf("a single-string prompt holds %d strings", len(p.Texts))}
		}
	case PromptTexts:
		if len(p.Texts) == 0 {
			return empty
		}
	case PromptTokens:
		if len(p.TokenIDs) != 1 {
			return &RequestError{Param: "prompt", Message: fmt.Sprintf("a single token prompt holds %d lists", len(p.TokenIDs))}
		}
		if len(p.TokenIDs[0]) == 0 {
			return empty
		}
		return tokenIDs("prompt", p.TokenIDs[0])
	case PromptTokenBatch:
		if len(p.TokenIDs) == 0 {
			return empty
		}
		for i, ids := range p.TokenIDs {
			param := "prompt[" + strconv.Itoa(i) + "]"
			if len(ids) == 0 {
				return &RequestError{Param: param, Message: "must not be empty"}
			}
			if err := tokenIDs(param, ids); err != nil {
				return err
			}
		}
	default:
		return &RequestError{Param: "prompt", Message: fmt.Sprintf("unknown prompt kind %d", p.Kind)}
	}
	return nil
}

func tokenIDs(param string, ids []int) error {
	for i, id := range ids {
		if id < 0 {
			return &RequestError{Param: param + "[" + strconv.Itoa(i) + "]", Message: fmt.Sprintf("token ids must be >= 0, got %d", id)}
		}
	}
	return nil
}

// validate checks the shared sampling parameters. maxTokens is the limit in
// force and maxName the parameter it came from, so that min_tokens is
// compared with the right one. Comparisons are written so NaN fails them.
func (s *SamplingParams) validate(maxTokens *int, maxName string) error {
	if err := atLeast("max_tokens", s.MaxTokens, 0); err != nil {
		return err
	}
	if v := s.Temperature; v != nil && !(*v >= 0) {
		return &RequestError{Param: "temperature", Message: "must be >= 0, got " + formatFloat(*v)}
	}
	if v := s.TopP; v != nil && !(*v > 0 && *v <= 1) {
		return &RequestError{Param: "top_p", Message: "must be in (0, 1], got " + formatFloat(*v)}
	}
	if err := atLeast("top_k", s.TopK, -1); err != nil {
		err.Message = "must be -1 or 0 (disabled) or >= 1, got " + strconv.Itoa(*s.TopK)
		return err
	}
	if v := s.MinP; v != nil && !(*v >= 0 && *v <= 1) {
		return &RequestError{Param: "min_p", Message: "must be in [0, 1], got " + formatFloat(*v)}
	}
	if err := atLeast("n", s.N, 1); err != nil {
		return err
	}
	if err := tokenIDs("stop_token_ids", s.StopTokenIDs); err != nil {
		return err
	}
	if err := atLeast("min_tokens", s.MinTokens, 0); err != nil {
		return err
	}
	if s.MinTokens != nil && maxTokens != nil && *s.MinTokens > *maxTokens {
		return &RequestError{Param: "min_tokens", Message: fmt.Sprintf("must be <= %s (%d), got %d", maxName, *maxTokens, *s.MinTokens)}
	}
	if v := s.RepetitionPenalty; v != nil && !(*v > 0) {
		return &RequestError{Param: "repetition_penalty", Message: "must be > 0, got " + formatFloat(*v)}
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"presence_penalty", s.PresencePenalty}, {"frequency_penalty", s.FrequencyPenalty}} {
		if p.v != nil && !(*p.v >= -2 && *p.v <= 2) {
			return &RequestError{Param: p.name, Message: "must be in [-2, 2], got " + formatFloat(*p.v)}
		}
	}
	return nil
}

// validateStream applies vLLM's rule that stream_options only makes sense on
// a stream; silently ignoring it would hide a client bug.
func validateStream(stream *bool, opts *StreamOptions) error {
	if opts != nil && (stream == nil || !*stream) {
		return &RequestError{Param: "stream_options", Message: "only allowed when stream is true"}
	}
	return nil
}

func atLeast(param string, v *int, least int) *RequestError {
	if v != nil && *v < least {
		return &RequestError{Param: param, Message: fmt.Sprintf("must be >= %d, got %d", least, *v)}
	}
	return nil
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// JSON syntax. A body is checked once, by valid; after that the scanner
// further down finds its way through it without checking anything again.

// valid reports whether b is one JSON value, as json.Valid does, several
// times faster: it is a plain recursive descent where encoding/json's scanner
// makes a call per byte. It may be stricter than json.Valid (it gives up
// nesting deeper than encoding/json's limit a little early), never looser;
// callers fall back to json.Valid when it says no.
func valid(b []byte) bool {
	i, ok := validValue(b, skipSpace(b, 0), 0)
	return ok && skipSpace(b, i) == len(b)
}

// ValidJSON reports whether b is one JSON value, exactly as json.Valid does,
// at the speed of valid for the values that are.
func ValidJSON(b []byte) bool { return valid(b) || json.Valid(b) }

// Member returns the value of the member key of doc, a JSON object, as it
// is in doc; nil when the object has no such member. Where a key repeats,
// the last one counts, as with encoding/json. Keys are matched exactly,
// after decoding their escapes. It fails when doc is not JSON or not an
// object. It reads one field of a large answer (a prefill's
// kv_transfer_params, say) without decoding the rest.
func Member(doc []byte, key string) (json.RawMessage, error) {
	if !ValidJSON(doc) {
		return nil, errors.New("not JSON")
	}
	i := skipSpace(doc, 0)
	switch doc[i] {
	case '{':
	case 'n':
		return nil, nil // null: an object with no members, to encoding/json
	default:
		return nil, fmt.Errorf("a JSON %s, not an object", kindOf(doc[i:]))
	}
	var found json.RawMessage
	for k, v := range members(doc[i:]) {
		if name, ok := verbatim(k); ok && string(name) == key || !ok && unquote(k) == key {
			found = v
		}
	}
	return found, nil
}

// MemberValue is Member's value decoded as encoding/json decodes it into an
// any — map[string]any, []any, string, float64, bool or nil (also when doc
// has no such member) — without its reflection: a prefill's
// kv_transfer_params, say, on every PD request.
func MemberValue(doc []byte, key string) (any, error) {
	raw, err := Member(doc, key)
	if err != nil || len(raw) == 0 {
		return nil, err
	}
	if x, ok := genericValue(trimSpace(raw)); ok {
		return x, nil
	}
	var x any
	return nil, json.Unmarshal(raw, &x) // a number no float64 holds: encoding/json's error
}

// maxValidDepth is a little under encoding/json's nesting limit of 10000.
const maxValidDepth = 9990

// validValue checks the value that starts at b[i] and returns the index just
// past it. depth is the number of arrays and objects it is inside.
func validValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '{':
		if depth >= maxValidDepth {
			return i, false
		}
		if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return i, false
			}
			var ok bool
			i, ok = validString(b, i)
			if i = skipSpace(b, i); !ok || i >= len(b) || b[i] != ':' {
				return i, false
			}
			if i, ok = validValue(b, skipSpace(b, i+1), depth+1); !ok {
				return i, false
			}
			if i = skipSpace(b, i); i < len(b) && b[i] == '}' {
				return i + 1, true
			}
			if i >= len(b) || b[i] != ',' {
				return i, false
			}
			i = skipSpace(b, i+1)
		}
	case '[':
		if depth >= maxValidDepth {
			return i, false
		}
		if i = skipSpace(b, i+1); i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = validValue(b, i, depth+1); !ok {
				return i, false
			}
			if i = skipSpace(b, i); i < len(b) && b[i] == ']' {
				return i + 1, true
			}
			if i >= len(b) || b[i] != ',' {
				return i, false
			}
			i = skipSpace(b, i+1)
		}
	case '"':
		return validString(b, i)
	case 't':
		return i + 4, bytes.HasPrefix(b[i:], []byte("true"))
	case 'f':
		return i + 5, bytes.HasPrefix(b[i:], []byte("false"))
	case 'n':
		return i + 4, bytes.HasPrefix(b[i:], []byte("null"))
	default:
		return validNumber(b, i)
	}
}

// validString checks the string that starts at b[i]: no control characters,
// and only the escapes JSON has. Other bytes, valid UTF-8 or not, are
// allowed, as encoding/json allows them.
func validString(b []byte, i int) (int, bool) {
	for i++; ; i++ {
		// Most of a string is plain text: skip it eight bytes at a time,
		// then a byte at a time up to the byte that ended the fast scan.
		for i+8 <= len(b) && !mayNeedLook(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= ' ' {
			i++
		}
		if i >= len(b) {
			return i, false
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < ' ':
			return i, false
		}
		// A backslash: one of JSON's escapes must follow.
		if i++; i >= len(b) {
			return i, false
		}
		switch b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			if i+4 >= len(b) {
				return i, false
			}
			for _, h := range b[i+1 : i+5] {
				if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
					return i, false
				}
			}
			i += 4
		default:
			return i, false
		}
	}
}

const (
	eachByte = 0x0101010101010101 // a one in every byte
	highBits = 0x8080808080808080 // every byte's top bit
)

// mayNeedLook reports whether any of the eight bytes in w may be one a
// string scan must stop at: a quote, a backslash or a control character.
// It can report a byte that is none of these (one just above a byte that
// is), never miss one. Each test is the classic "has a byte below n":
// (w - n·eachByte) &^ w has a byte's top bit set where that byte is below
// n, or where a borrow from below reaches it.
func mayNeedLook(w uint64) bool {
	quote := w ^ ('"' * eachByte)
	backslash := w ^ ('\\' * eachByte)
	found := (quote-eachByte)&^quote | (backslash-eachByte)&^backslash | (w-' '*eachByte)&^w
	return found&highBits != 0
}

// validNumber checks the number that starts at b[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(b []byte, i int) (int, bool) {
	digits := func(i int) (int, bool) {
		start := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i, i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return i, false
	case b[i] == '0':
		i++
	case '1' <= b[i] && b[i] <= '9':
		i, _ = digits(i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		var ok bool
		if i, ok = digits(i + 1); !ok {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		return digits(i)
	}
	return i, true
}

// The scanner: functions that find their way through JSON already known to be
// valid, so they check nothing. Each takes the index of a value's first byte.

// members yields the key (quotes included) and value of each member of the
// valid JSON object obj, in order.
func members(obj []byte) iter.Seq2[[]byte, []byte] {
	return func(yield func(key, val []byte) bool) {
		i := skipSpace(obj, 1)
		if obj[i] == '}' {
			return
		}
		for {
			end := stringEnd(obj, i)
			key := obj[i:end]
			i = skipSpace(obj, skipSpace(obj, end)+1) // past the colon
			end = valueEnd(obj, i)
			if !yield(key, obj[i:end]) {
				return
			}
			i = skipSpace(obj, end)
			if obj[i] == '}' {
				return
			}
			i = skipSpace(obj, i+1) // past the comma
		}
	}
}

// elements yields each element of the valid JSON array arr, in order.
func elements(arr []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		i := skipSpace(arr, 1)
		if arr[i] == ']' {
			return
		}
		for {
			end := valueEnd(arr, i)
			if !yield(arr[i:end]) {
				return
			}
			i = skipSpace(arr, end)
			if arr[i] == ']' {
				return
			}
			i = skipSpace(arr, i+1)
		}
	}
}

// valueEnd is the index just past the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
	default: // a number, true, false or null
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
			i++
		}
		return i
	}
}

// stringEnd is the index just past the string that starts at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		q := j + bytes.IndexByte(b[j:], '"')
		// The quote ends the string unless an odd number of backslashes
		// escapes it.
		n := 0
		for k := q - 1; b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

func trimSpace(b []byte) []byte { return bytes.Trim(b, " \t\r\n") }

// verbatim returns the text of the valid JSON string str when decoding it
// changes nothing: no escapes, and valid UTF-8 (encoding/json turns invalid
// bytes into U+FFFD).
func verbatim(str []byte) ([]byte, bool) {
	s := str[1 : len(str)-1]
	return s, bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s)
}

// unquote decodes the valid JSON string str as encoding/json does: escapes
// are replaced, and bytes that are not UTF-8 and unpaired surrogates become
// U+FFFD.
func unquote(str []byte) string {
	s := str[1 : len(str)-1]
	var b strings.Builder
	b.Grow(len(s))
	for {
		run := s
		if i := bytes.IndexByte(s, '\\'); i >= 0 {
			run = s[:i]
		}
		s = s[len(run):]
		if utf8.Valid(run) {
			b.Write(run)
		} else {
			for len(run) > 0 {
				r, n := utf8.DecodeRune(run) // utf8.RuneError for a bad byte
				b.WriteRune(r)
				run = run[n:]
			}
		}
		if len(s) == 0 {
			return b.String()
		}
		// s starts with an escape.
		switch c := s[1]; c {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r := hex4(s[2:6])
			s = s[6:]
			if utf16.IsSurrogate(r) {
				next := rune(-1)
				if len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
					next = hex4(s[2:6])
				}
				if r = utf16.DecodeRune(r, next); r != utf8.RuneError {
					s = s[6:] // a valid pair
				}
			}
			b.WriteRune(r)
			continue
		default: // '"', '\\' or '/'
			b.WriteByte(c)
		}
		s = s[2:]
	}
}

// hex4 is the value of four hex digits.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// isNumber reports whether the valid JSON value raw is a number.
func isNumber(raw []byte) bool { return raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9' }
