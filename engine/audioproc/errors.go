package audioproc

import "errors"

// Sentinel errors. Every error this package returns wraps exactly one of
// them, so a caller can map it to a response (errors.Is) while the message
// keeps the detail.
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
