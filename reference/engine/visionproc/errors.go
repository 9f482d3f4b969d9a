package visionproc

import (
	"errors"
	"fmt"
	"io"
)

// Sentinel errors. Callers tell cases apart with errors.Is; every returned
// error wraps exactly one of these with context. Errors about the input
// also have a ClientMessage method (see inputError).
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

// inputError is an error about the image or video handed in. Its message
// says what is wrong with it in the terms of whoever sent it, with no
// package name or decoder jargon, so that a server can pass it to its
// client as is (ClientMessage); Error adds what a decoder underneath
// reported, for the log. It wraps its class, one of the sentinels above,
// and that cause.
type inputError struct {
	class error
	msg   string
	cause error
}

// badInput is an inputError of class with a formatted message.
func badInput(class error, format string, args ...any) error {
	return &inputError{class: class, msg: fmt.Sprintf(format, args...)}
}

// badInputCause is badInput keeping a decoder's own error for the log.
func badInputCause(class, cause error, format string, args ...any) error {
	return &inputError{class: class, msg: fmt.Sprintf(format, args...), cause: cause}
}

// badAVI is an ErrCorruptContainer about a malformed AVI file.
func badAVI(format string, args ...any) error {
	return &inputError{class: ErrCorruptContainer, msg: "not a valid AVI file: " + fmt.Sprintf(format, args...)}
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

// cutShort words a decoder error that ran out of bytes, the usual sign of
// a file cut short; for any other error it is empty.
func cutShort(err error) string {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return ": it is cut short"
	}
	return ""
}
