package stageclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/openai"
)

// Error classes. Every error a call returns, other than *UpstreamError and
// misuse (a bad path or request id), wraps exactly one of these (and
// ErrNotSent, a refinement of ErrConnect, besides it), so the
// orchestrator can pick retry, failover or fail with errors.Is, without
// reading messages.
var (
	// ErrConnect: no HTTP response arrived — the dial failed, or the
	// connection was refused, reset or closed before a status line. The
	// instance is unreachable; another replica may serve the request. For a
	// POST the request may nevertheless have reached the engine (the reset
	// can come after it was written), so a retry can duplicate work —
	// unless the error is also ErrNotSent.
	ErrConnect = errors.New("cannot reach the stage instance")
	// ErrNotSent refines ErrConnect — an error that is ErrNotSent is also
	// ErrConnect — for the failures that prove the instance never had the
	// request: the dial failed (refused, unreachable, timed out), or the
	// connection broke while the request was being written, before the
	// instance had all of it. Such a leg may go to another instance without
	// anything running twice. An ErrConnect that is not ErrNotSent (a
	// connection that ended after the whole request was written) may have
	// reached the engine.
	ErrNotSent = errors.New("nothing was sent")
	// ErrTimeout: the caller's deadline passed, or the network timed out,
	// while waiting for the instance.
	ErrTimeout = errors.New("timed out")
	// ErrCanceled: the caller's context was canceled — typically the client
	// went away — or the stream was closed. Not a fault of the instance.
	ErrCanceled = errors.New("canceled")
	// ErrTruncated: the response started but ended early — a stream without
	// its final "data: [DONE]", a body shorter than announced, or a
	// connection cut mid-response. Output may already have been delivered.
	ErrTruncated = errors.New("response cut short")
	// ErrProtocol: the instance answered something that is not the API —
	// a body that is not JSON, a stream that is not SSE, or a response over
	// the size bound.
	ErrProtocol = errors.New("malformed response")
)

// UpstreamError is an error the instance itself reported: a non-2xx status,
// or an error event in place of a chunk in a stream that had started with
// 200.
type UpstreamError struct {
	// Status is the HTTP status. For an error event mid-stream it is the
	// event's code when that is an HTTP error status (vLLM puts the status
	// there), else 500.
	Status int
	// Body is the parsed error, never nil; its Status equals Status.
	Body *openai.ErrorResponse
	// Raw is the body or event payload as received, bounded in size.
	Raw []byte

	what     string // method, URL and request id, for the message
	inStream bool
}

// Retryable reports whether the status says the instance could not take the
// request right now (bad gateway, unavailable, gateway timeout), so another
// attempt — on this or another replica — may succeed. A 500 is not: the
// engine ran the request and failed.
func (e *UpstreamError) Retryable() bool {
	switch e.Status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

func (e *UpstreamError) Error() string {
	var msg string
	switch {
	case e.inStream && e.Body != nil:
		msg = "upstream error event: " + e.Body.Error()
	case e.Body != nil:
		msg = "upstream " + e.Body.Error() // which starts with the status
	default:
		msg = "upstream status " + strconv.Itoa(e.Status)
	}
	if e.what == "" {
		return "stageclient: " + msg
	}
	return e.what + ": " + msg
}

func newUpstreamError(what string, status int, raw []byte) *UpstreamError {
	return &UpstreamError{
		Status: status,
		Body:   openai.ParseErrorResponse(status, raw),
		Raw:    raw,
		what:   what,
	}
}

// classified wraps cause in class, with what (method, URL, request id) in
// front, keeping both inspectable: errors.Is(err, ErrTimeout) and
// errors.Is(err, context.DeadlineExceeded) both hold for a deadline.
func classified(what string, class, cause error) error {
	if cause == nil {
		return fmt.Errorf("%s: %w", what, class)
	}
	return fmt.Errorf("%s: %w: %w", what, class, cause)
}

// contextError classifies a failure that happened while ctx was done: the
// context, not whatever the transport reported, is the reason.
func contextError(ctx context.Context, what string) error {
	class := ErrCanceled
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		class = ErrTimeout
	}
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return fmt.Errorf("%s: %w: %w (cause: %w)", what, class, ctx.Err(), cause)
	}
	return classified(what, class, ctx.Err())
}

// classifyDo classifies an error from http.Client.Do, which means no
// response was received.
func classifyDo(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return contextError(ctx, what)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) && uerr.Err != nil {
		err = uerr.Err // *url.Error repeats the method and URL that what names
	}
	var op *net.OpError
	var unsent *notSentError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		// Even a dial timeout: the instance is unreachable, which is a
		// failover case, not the request running out of time.
		return fmt.Errorf("%s: %w (%w): %w", what, ErrConnect, ErrNotSent, err)
	case errors.As(err, &unsent):
		return fmt.Errorf("%s: %w (%w): %w", what, ErrConnect, ErrNotSent, unsent.err)
	}
	if isNetTimeout(err) {
		return classified(what, ErrTimeout, err)
	}
	var perr *protocolError
	if errors.As(err, &perr) || strings.Contains(err.Error(), "malformed HTTP ") {
		// Bytes came back, but not HTTP: something else listens on the
		// port. net/http has no error type for this, only the message
		// (http.ReadResponse's, which leanTransport passes on too);
		// TestPostMalformed pins it. leanTransport's own refusals (a 101,
		// an oversized header) are *protocolError.
		return classified(what, ErrProtocol, err)
	}
	return classified(what, ErrConnect, err)
}

// classifyRead classifies an error reading a response body after its
// status line arrived.
func classifyRead(ctx context.Context, what string, err error) error {
	switch {
	case ctx.Err() != nil:
		return contextError(ctx, what)
	case isNetTimeout(err):
		return classified(what, ErrTimeout, err)
	default:
		return classified(what, ErrTruncated, err)
	}
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// notSentError is a failure leanTransport knows happened before the
// instance had the whole request: the write broke off. classifyDo makes it
// ErrNotSent.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }
