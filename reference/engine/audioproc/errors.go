package audioproc

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns wraps exactly one of
// them, so a caller can map it to a response (errors.Is) while the message
// keeps the detail. Errors about the input also have a ClientMessage method
// (see inputError).
var (
	// ErrUnsupportedFormat: the declared format, or an encoding inside a
	// known container (ADPCM WAV, MPEG layer II, free-format MP3, a sample
	// rate or channel count out of range), is not one this package decodes.
	ErrUnsupportedFormat = errors.New("unsupported audio format")

	// ErrFormatMismatch: the bytes are recognisably another format than the
	// one declared (a RIFF/WAVE file sent as "mp3", or the reverse).
	ErrFormatMismatch = errors.New("audio bytes do not match the declared format")

	// ErrCorrupt: the bytes claim to be the declared format but are
	// malformed or truncated, or hold non-finite samples.
	ErrCorrupt = errors.New("corrupt audio data")

	// ErrLimitExceeded: the audio is longer, or has more samples, than the
	// Limits allow. Sizes are checked from headers before anything is
	// allocated for the samples.
	ErrLimitExceeded = errors.New("audio exceeds limits")

	// ErrTooShort: fewer samples than one feature frame (HopLength), which
	// the upstream extractor cannot represent either.
	ErrTooShort = errors.New("audio too short")

	// ErrNonFiniteSample: a NaN or infinity in samples handed to LogMel or
	// Resample.
	ErrNonFiniteSample = errors.New("non-finite audio sample")
)

// inputError is an error about the audio handed in. Its message says what
// is wrong with the file in the terms of whoever sent it, with no package
// name or decoder jargon, so that a server can pass it to its client as is
// (ClientMessage); Error adds what a decoder underneath reported, for the
// log. It wraps its class, one of the sentinels above, and that cause.
type inputError struct {
	class error
	msg   string
	cause error
}

// badAudio is an inputError of class with a formatted message.
func badAudio(class error, format string, args ...any) error {
	return &inputError{class: class, msg: fmt.Sprintf(format, args...)}
}

// badAudioCause is badAudio keeping the decoder's own error for the log.
func badAudioCause(class, cause error, format string, args ...any) error {
	return &inputError{class: class, msg: fmt.Sprintf(format, args...), cause: cause}
}

func (e *inputError) Error() string {
	if e.cause == nil {
		return e.msg
	}
	return e.msg + ": " + e.cause.Error()
}

// ClientMessage is the message without the cause underneath.
func (e *inputError) ClientMessage() string { return e.msg }

func (e *inputError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.class}
	}
	return []error{e.class, e.cause}
}
