package visionproc

import "errors"

// Sentinel errors. Callers tell cases apart with errors.Is; every returned
// error wraps exactly one of these with context.
var (
	// ErrUnsupportedFormat: the bytes are not an image format this package
	// decodes (PNG, JPEG, GIF), e.g. WebP, BMP, TIFF, HEIC.
	ErrUnsupportedFormat = errors.New("unsupported image format")
	// ErrCorruptImage: the bytes claim a supported image format but do not
	// decode.
	ErrCorruptImage = errors.New("corrupt image")
	// ErrTooLarge: an input, a header field or a derived output exceeds a
	// configured limit; nothing large was allocated.
	ErrTooLarge = errors.New("input exceeds limit")
	// ErrUnsupportedContainer: the bytes are a video container other than
	// AVI (MP4/MOV, WebM/MKV, ...).
	ErrUnsupportedContainer = errors.New("unsupported video container")
	// ErrUnsupportedCodec: an AVI whose video is not Motion-JPEG or whose
	// audio is not PCM.
	ErrUnsupportedCodec = errors.New("unsupported codec")
	// ErrCorruptContainer: a malformed or truncated AVI, or an undecodable
	// frame inside one.
	ErrCorruptContainer = errors.New("corrupt video container")
	// ErrAspectRatio: the longer side is more than 200 times the shorter,
	// which smart_resize refuses.
	ErrAspectRatio = errors.New("aspect ratio exceeds 200")
	// ErrTooFewFrames: the video has fewer frames than one temporal patch
	// needs after sampling.
	ErrTooFewFrames = errors.New("too few video frames")
	// ErrInvalidArgument: a configuration value or dimension that the
	// formulas cannot work with (zero sizes, non-positive factors, ...).
	ErrInvalidArgument = errors.New("invalid argument")
)
