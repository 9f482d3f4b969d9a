package sampler

import (
	"errors"
	"fmt"
	"math"
)

// ErrInvalid is the class of every error Validate returns, so that a server
// can map any of them to HTTP 400 with errors.Is.
var ErrInvalid = errors.New("invalid sampling parameters")

// ParamError is a Validate failure. Msg is written for the client; Param is
// the request field at fault, for the "param" member of an OpenAI error body.
type ParamError struct {
	Param string
	Msg   string
}

func (e *ParamError) Error() string { return e.Msg }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *ParamError) Unwrap() error { return ErrInvalid }

// Params are the sampling parameters of one request, with vLLM's meaning and
// vLLM's validation. The zero Params is not valid (top_p and
// repetition_penalty must be positive); start from Defaults.
type Params struct {
	// Temperature 0 is greedy: the argmax, lowest id on ties, and no random
	// draw. As in vLLM, a positive temperature below 0.01 samples at 0.01.
	Temperature float64
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches TopP; in (0, 1], 1 is off.
	TopP float64
	// TopK keeps the K most likely tokens (exactly K: ties at the boundary go
	// to the lower id); 0 or -1 is off.
	TopK int
	// MinP drops tokens less likely than MinP times the most likely one; in
	// [0, 1], 0 is off.
	MinP float64
	// Seed makes sampling reproducible: the tokens then depend only on the
	// seed and the logits. nil (or -1, as in vLLM) draws a fresh seed.
	Seed *int64
	// RepetitionPenalty (vLLM/HF) applies to every token id present in the
	// prompt or the output: a positive logit is divided by it, any other
	// multiplied. 1 is off.
	RepetitionPenalty float64
	// PresencePenalty and FrequencyPenalty (OpenAI) apply to output tokens
	// only: logit -= FrequencyPenalty*count + PresencePenalty. In [-2, 2].
	PresencePenalty  float64
	FrequencyPenalty float64
	// MaxTokens caps the output length; 0 means no cap other than the
	// model's context (vLLM's None). The caller enforces it.
	MaxTokens int
	// MinTokens masks EOS and StopTokenIDs until this many tokens were
	// generated (EOS even with IgnoreEOS, as vLLM does).
	MinTokens int
	// StopTokenIDs end the sequence when generated (the token is not text).
	StopTokenIDs []int
	// IgnoreEOS keeps generating past EOS.
	IgnoreEOS bool
	// KeepSpecialTokens puts the text of generated special tokens (such as
	// <|im_end|> or a multimodal marker) in the output; vLLM's default,
	// skip_special_tokens true, leaves them out, and so does the zero value.
	// The tokens themselves are generated and counted either way.
	KeepSpecialTokens bool
	// Stop strings are matched by the caller on detokenized text; they are
	// here only to be validated with the rest.
	Stop []string
}

// Defaults returns vLLM's default sampling parameters as the OpenAI server
// applies them: temperature 1, every filter and penalty off, no length cap.
func Defaults() Params {
	return Params{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
}

// Validate reports the first parameter vLLM would reject, in vLLM's order,
// as a *ParamError. Bounds that need the vocabulary (stop token ids past
// its end) are the caller's to check.
func (p Params) Validate() error {
	bad := func(param, format string, args ...any) error {
		return &ParamError{Param: param, Msg: fmt.Sprintf(format, args...)}
	}
	// Comparisons are written so that NaN fails them.
	switch {
	case !(p.PresencePenalty >= -2 && p.PresencePenalty <= 2):
		return bad("presence_penalty", "presence_penalty must be in [-2, 2], got %v", p.PresencePenalty)
	case !(p.FrequencyPenalty >= -2 && p.FrequencyPenalty <= 2):
		return bad("frequency_penalty", "frequency_penalty must be in [-2, 2], got %v", p.FrequencyPenalty)
	case math.IsInf(p.RepetitionPenalty, 0):
		return bad("repetition_penalty", "repetition_penalty must be finite, got %v", p.RepetitionPenalty)
	case !(p.RepetitionPenalty > 0):
		return bad("repetition_penalty", "repetition_penalty must be > 0, got %v", p.RepetitionPenalty)
	case math.IsInf(p.Temperature, 0) || math.IsNaN(p.Temperature):
		return bad("temperature", "temperature must be finite, got %v", p.Temperature)
	case p.Temperature < 0:
		return bad("temperature", "temperature must be >= 0, got %v", p.Temperature)
	case p.Temperature > 2:
		return bad("temperature", "temperature must be <= 2, got %v", p.Temperature)
	case !(p.TopP > 0 && p.TopP <= 1):
		return bad("top_p", "top_p must be in (0, 1], got %v", p.TopP)
	case p.TopK < -1:
		return bad("top_k", "top_k must be 0 or -1 (off), or >= 1, got %d", p.TopK)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return bad("min_p", "min_p must be in [0, 1], got %v", p.MinP)
	case p.MaxTokens < 0:
		return bad("max_tokens", "max_tokens must be >= 1 (or 0 for no limit), got %d", p.MaxTokens)
	case p.MinTokens < 0:
		return bad("min_tokens", "min_tokens must be >= 0, got %d", p.MinTokens)
	case p.MaxTokens > 0 && p.MinTokens > p.MaxTokens:
		return bad("min_tokens", "min_tokens must not exceed max_tokens (min_tokens=%d, max_tokens=%d)", p.MinTokens, p.MaxTokens)
	}
	for _, id := range p.StopTokenIDs {
		if id < 0 {
			return bad("stop_token_ids", "stop_token_ids must not be negative, got %d", id)
		}
	}
	for _, s := range p.Stop {
		if s == "" {
			return bad("stop", "stop must not contain an empty string")
		}
	}
	return nil
}
