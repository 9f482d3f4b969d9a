package stageclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/openai"
)

// After [DONE] the server ends the response at once; reading that last bit
// lets the connection go back to the pool instead of being torn down. The
// grace and limit keep a server that goes on sending from holding Close up.
const (
	drainGrace = 100 * time.Millisecond
	drainLimit = 64 << 10
)

// Stream sends body (a JSON request with "stream": true) to path, like Post,
// and returns the response's events as they arrive. A non-2xx answer is an
// *UpstreamError here, before any event.
//
// The caller must Close the stream. Closing it before the end, or
// cancelling ctx, aborts the HTTP request: the instance sees its request
// context cancelled and stops generating.
func (c *Client) Stream(ctx context.Context, path, requestID string, body []byte) (*Stream, error) {
	return c.StreamWith(ctx, path, requestID, nil, body)
}

// StreamWith is Stream with header added to this one request, as PostWith.
func (c *Client) StreamWith(ctx context.Context, path, requestID string, header http.Header, body []byte) (*Stream, error) {
	// A context of the stream's own, so that Close can abort the request
	// even while the caller's context lives on.
	reqCtx, cancel := context.WithCancel(ctx)
	req, what, err := c.newRequest(reqCtx, http.MethodPost, path, requestID, body)
	if err == nil {
		err = addLegHeader(req, what, header)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.do(req, body)
	if err != nil {
		cancel()
		return nil, classifyDo(ctx, what, err)
	}
	if !is2xx(resp.StatusCode) {
		err := readUpstreamError(what, resp)
		resp.Body.Close()
		cancel()
		return nil, err
	}
	// A worker that ignored "stream": true answers one JSON document; say
	// so, rather than report it as a malformed event stream. No
	// Content-Type at all is left to the SSE reader to judge.
	if mt := mediaType(resp.Header); mt != "" && mt != "text/event-stream" {
		resp.Body.Close()
		cancel()
		return nil, classified(what, ErrProtocol, fmt.Errorf("%d response to a streaming request has Content-Type %q, not text/event-stream",
			resp.StatusCode, resp.Header.Get("Content-Type")))
	}
	body2 := &recordingReader{r: resp.Body}
	return &Stream{
		ctx:    ctx,
		cancel: cancel,
		resp:   resp,
		body:   body2,
		sse:    openai.NewSSEReader(body2, c.maxEvent),
		what:   what,
	}, nil
}

// Stream is a streaming response being read. Next is for one goroutine;
// Close may be called from any goroutine, also while Next is blocked, and
// makes Next return.
type Stream struct {
	// ctx is the caller's context for this one request, kept only to tell
	// its cancellation apart from other read failures.
	ctx    context.Context
	cancel context.CancelFunc
	resp   *http.Response
	body   *recordingReader
	sse    *openai.SSEReader
	what   string

	err error // sticky result of Next once the stream has ended or failed

	done      atomic.Bool // [DONE] was read: the body may be drained for reuse
	closed    atomic.Bool
	closeOnce sync.Once
}

// Header is the response's header (vLLM echoes X-Request-Id there).
func (s *Stream) Header() http.Header { return s.resp.Header }

// Next returns the next event's payload, a JSON document (a chunk) owned by
// the caller. It returns io.EOF, unwrapped, after "data: [DONE]". An error
// event ({"error": {...}}) in place of a chunk is an *UpstreamError; a stream
// that ends without [DONE] is ErrTruncated; one that is not SSE or not JSON,
// or has an event over the bound, is ErrProtocol. Once Next has returned an
// error it returns the same error again.
func (s *Stream) Next() (json.RawMessage, error) {
	if s.err != nil {
		return nil, s.err
	}
	if s.closed.Load() {
		// Events may still sit in the reader's buffer; after Close the
		// caller has said it wants none of them.
		s.err = s.classify(nil)
		return nil, s.err
	}
	payload, err := s.sse.Next()
	if err != nil {
		if err == io.EOF {
			s.done.Store(true)
			s.err = io.EOF
			return nil, io.EOF
		}
		s.err = s.classify(err)
		return nil, s.err
	}
	if e := openai.StreamError(payload); e != nil {
		if e.Status == 0 {
			// The response said 200 and the event names no status: the
			// engine failed while generating.
			e.Status = http.StatusInternalServerError
		}
		s.err = &UpstreamError{Status: e.Status, Body: e, Raw: payload, what: s.what, inStream: true}
		return nil, s.err
	}
	return payload, nil
}

// Buffered reports whether the next event has already arrived: Next will
// return it (or the stream's end, or its error) without waiting on the
// network, because it came in the same read as the last one. Only a whole
// event counts, so a relay can hold each event back exactly while another
// is buffered, and send what arrived together in one write. It is false
// once the stream has ended or been closed. Like Next, it is for one
// goroutine.
func (s *Stream) Buffered() bool {
	return s.err == nil && !s.closed.Load() && s.sse.Buffered()
}

func (s *Stream) classify(err error) error {
	switch {
	case s.closed.Load():
		return classified(s.what, ErrCanceled, errors.New("stream closed"))
	case s.ctx.Err() != nil:
		return contextError(s.ctx, s.what)
	case s.body.err != nil:
		// The transport failed under the SSE reader: a connection cut
		// mid-body or mid-line, a chunked encoding cut short, a network
		// timeout.
		return classifyRead(s.ctx, s.what, s.body.err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		// The body ended cleanly but without [DONE].
		return classified(s.what, ErrTruncated, err)
	default:
		return classified(s.what, ErrProtocol, err)
	}
}

// Close ends the stream. Before [DONE] it aborts the request, so the
// instance stops generating; after [DONE] it lets the connection be reused.
// It always returns nil; it is safe to call more than once.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.done.Load() {
			// Next will not read again (its result is sticky), so this
			// goroutine owns the body.
			t := time.AfterFunc(drainGrace, s.cancel)
			_, _ = io.Copy(io.Discard, io.LimitReader(s.resp.Body, drainLimit))
			t.Stop()
		}
		// Cancel first: it unblocks a Next waiting on the network, and for
		// HTTP/1 it closes the connection, which is how the server learns
		// the client is gone.
		s.cancel()
		s.resp.Body.Close()
	})
	return nil
}

// recordingReader remembers the first read error other than io.EOF, so a
// failure of the connection can be told apart from a malformed stream after
// the SSE reader has wrapped it. It also turns an end of body in the middle
// of a line into io.ErrUnexpectedEOF: with "Connection: close" framing a
// cut connection looks like a clean end, and the SSE reader would otherwise
// deliver the half event and fail it as "not JSON" — a protocol error where
// the truth is a truncated stream. Only Next's goroutine reads it.
type recordingReader struct {
	r    io.Reader
	err  error
	last byte // the last byte read, 0 before any
}

func (r *recordingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.last = p[n-1]
	}
	if err == io.EOF && r.last != 0 && r.last != '\n' && r.last != '\r' {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}
