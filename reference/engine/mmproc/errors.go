package mmproc

import "errors"

// Sentinel errors; every error returned by this package wraps exactly one of
// them, so callers can tell a bad request from a bad configuration with
// errors.Is.
var (
	// ErrInvalidTokens reports a Tokens value with negative or repeated ids.
	ErrInvalidTokens = errors.New("invalid special token ids")
	// ErrInvalidOptions reports Options that no prompt could be processed with.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrInvalidSize reports a media item whose size or timing is impossible
	// (no frames, a grid not divisible by the merge size, ...).
	ErrInvalidSize = errors.New("invalid media size")
	// ErrPlaceholderMismatch reports a prompt whose placeholders do not pair
	// one-to-one, in order and by kind, with the media items.
	ErrPlaceholderMismatch = errors.New("placeholders do not match media items")
	// ErrMalformedPrompt reports special tokens outside the shapes the chat
	// template produces (a pad without its start/end tokens, a stray end
	// token, a run of pads of the wrong length, ...).
	ErrMalformedPrompt = errors.New("malformed multimodal placeholder")
	// ErrInvalidRotary reports a rotary section split that does not fit the
	// rotary dimension.
	ErrInvalidRotary = errors.New("invalid rotary section split")
)
