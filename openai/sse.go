package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// SSEWriter writes a stream of JSON events the way vLLM does: one
// "data: <json>\n\n" per event, ended by "data: [DONE]\n\n". WriteEvent
// and WriteDone send at once; Queue and QueueDone let a writer that knows
// more follows at once send several events in one write.
// It is not safe for concurrent use; one goroutine owns a stream.
type SSEWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte // one event's bytes, reused: a Write does not keep them
}

// NewSSEWriter sets the stream's headers on w. The status (200) goes out
// with the first event or Flush, so a handler can still answer with an error
// until then.
func NewSSEWriter(w http.ResponseWriter) *SSEWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	// nginx buffers proxied responses unless told not to, which would hold
	// back every token until the buffer fills.
	h.Set("X-Accel-Buffering", "no")
	return &SSEWriter{w: w, rc: http.NewResponseController(w)}
}

// WriteEvent writes v as one event and flushes it.
func (s *SSEWriter) WriteEvent(v any) error {
	if err := s.Queue(v); err != nil {
		return err
	}
	return s.Flush()
}

// Queue writes v as one event without flushing it, for a writer that knows
// more events follow at once: the next WriteEvent, WriteDone or Flush (or
// the end of the response) sends them together, one write instead of
// several.
func (s *SSEWriter) Queue(v any) error {
	payload, err := eventJSON(v)
	if err != nil {
		return err
	}
	s.buf = append(append(append(s.buf[:0], "data: "...), payload...), '\n', '\n')
	if _, err := s.w.Write(s.buf); err != nil {
		return fmt.Errorf("openai: writing SSE event: %w", err)
	}
	return nil
}

// eventJSON encodes v on one line, so it cannot break the SSE framing. A
// json.Marshaler's output (a json.RawMessage relayed from a stage, a chunk
// type's MarshalJSON) is taken as it is when it holds no line break: it is
// valid JSON already, and compacting it again would cost as much as
// encoding it did. Anything else goes through encoding/json, which compacts.
func eventJSON(v any) ([]byte, error) {
	if m, ok := v.(json.Marshaler); ok {
		b, err := m.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("openai: encoding SSE event: %w", err)
		}
		if bytes.IndexByte(b, '\n') < 0 && bytes.IndexByte(b, '\r') < 0 {
			return b, nil
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err != nil {
			return nil, fmt.Errorf("openai: encoding SSE event: %w", err)
		}
		return buf.Bytes(), nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("openai: encoding SSE event: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

var doneEvent = []byte("data: [DONE]\n\n")

// WriteDone writes the terminating "data: [DONE]" event and flushes it,
// with anything queued before it.
func (s *SSEWriter) WriteDone() error {
	return s.write(doneEvent)
}

// QueueDone writes the terminating "data: [DONE]" event without flushing,
// for a handler that returns right after: net/http's end of the response
// then sends it, with anything queued before it and the end of the body
// (a chunked body's terminator), in one write where WriteDone and the end
// of the response take two. A handler with more to do after its stream (waiting on another
// call, releasing something slow) uses WriteDone instead, or its client
// waits for [DONE] until the handler returns.
func (s *SSEWriter) QueueDone() error {
	if _, err := s.w.Write(doneEvent); err != nil {
		return fmt.Errorf("openai: writing SSE event: %w", err)
	}
	return nil
}

// Flush sends the headers and anything written so far, e.g. to show the
// client the stream is open while a long prefill runs.
func (s *SSEWriter) Flush() error {
	if err := s.rc.Flush(); err != nil {
		// A writer that cannot flush (a middleware wrapper without Unwrap)
		// would silently turn the stream into one response at the end, so
		// this is an error rather than a no-op.
		return fmt.Errorf("openai: flushing SSE stream: %w", err)
	}
	return nil
}

func (s *SSEWriter) write(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("openai: writing SSE event: %w", err)
	}
	return s.Flush()
}

// DefaultMaxEventSize bounds an SSE line and an event's data when the caller
// gives no bound. Audio chunks (base64 of a couple of seconds of WAV) are the
// largest events omni streams carry, well under this.
const DefaultMaxEventSize = 4 << 20

// SSEReader reads the data payloads of an SSE stream written by vLLM, a
// reference worker or SSEWriter. It follows the SSE framing rules (LF, CRLF
// or CR line ends; comment lines starting with ':'; several data lines joined
// by '\n'; a blank line ending an event) with three deliberate differences,
// because a truncated or foreign stream must be an error rather than silently
// short output:
//
//   - a field other than data, event, id or retry is an error (an HTML error
//     page from a proxy is not an event stream);
//   - each payload must be valid JSON (or [DONE]);
//   - the stream must end with "data: [DONE]"; ending without it is
//     io.ErrUnexpectedEOF. An event cut off only by the missing final blank
//     line is still delivered.
//
// Lines and payloads longer than the bound are errors, so a stream without
// newlines cannot exhaust memory. Next blocks only as long as the underlying
// reader does; bound it with the request's context.
//
// The reader keeps its own buffer rather than a bufio.Scanner's so that
// Buffered can tell a relay what one read brought beyond the event it just
// returned.
type SSEReader struct {
	r       io.Reader
	max     int // bound on an event's payload
	maxLine int // a line, its end excluded, must be shorter than this

	// buf[start:end] is read but not yet parsed; its first scanned bytes
	// hold no line end, so the search for one resumes after them (a long
	// line arriving in many reads is scanned once).
	buf        []byte
	start, end int
	scanned    int
	skipLF     bool  // the last line ended with CR: an LF next is part of that end
	rerr       error // the underlying reader's error, io.EOF at its end; nothing is read after it

	line int    // lines parsed, for error messages
	data []byte // the payload of the event being parsed
	have bool   // the event has a data line (its payload may still be empty)

	// The result of an event Buffered parsed ahead, for the next Next.
	ahead        bool
	aheadPayload json.RawMessage
	aheadErr     error

	err error // sticky: once the stream failed or ended, Next repeats it
}

// sseReadSize is the reader's buffer, until a line too long for it needs more.
const sseReadSize = 4096

// NewSSEReader reads events from r. maxEventSize bounds each line and each
// event's payload; <= 0 means DefaultMaxEventSize.
func NewSSEReader(r io.Reader, maxEventSize int) *SSEReader {
	if maxEventSize <= 0 {
		maxEventSize = DefaultMaxEventSize
	}
	// Room for the field name and line end around a maximal payload.
	return &SSEReader{r: r, max: maxEventSize, maxLine: maxEventSize + len("data: \r\n")}
}

// Next returns the next event's payload, a JSON document owned by the
// caller. After data: [DONE] it returns io.EOF; any other error means the
// stream was malformed, truncated or failed to read.
func (s *SSEReader) Next() (json.RawMessage, error) {
	if s.ahead {
		payload, err := s.aheadPayload, s.aheadErr
		s.ahead, s.aheadPayload, s.aheadErr = false, nil, nil
		return payload, err
	}
	if s.err != nil {
		return nil, s.err
	}
	payload, _, err := s.parse(true)
	return payload, err
}

// Buffered reports whether the next Next will return without reading from
// the underlying reader: what was read already holds a whole event, blank
// line included (or [DONE], or a line that fails the stream). An event
// received only in part does not count, so a relay that sends at once when
// Buffered is false, and otherwise queues the event to go out with the next,
// never holds an event back waiting for one not yet received. After Next
// has returned an error, Buffered is false.
//
// It parses ahead (never reading) and keeps the result for Next; like Next,
// it is for the one goroutine that reads the stream.
func (s *SSEReader) Buffered() bool {
	if !s.ahead && s.err == nil {
		s.aheadPayload, s.ahead, s.aheadErr = s.parse(false)
	}
	return s.ahead
}

// parse parses lines up to the end of the next event. Without block it
// stops, returning false, where it would have to read: the event is not
// whole yet, and what it parsed of it so far is kept for the next call.
func (s *SSEReader) parse(block bool) (json.RawMessage, bool, error) {
	for {
		line, ok := s.cutLine()
		if !ok {
			if s.rerr == nil {
				if s.end-s.start >= s.maxLine {
					return nil, true, s.fail(fmt.Errorf("openai: SSE line %d exceeds %d bytes: %w", s.line+1, s.max, bufio.ErrTooLong))
				}
				if !block {
					return nil, false, nil
				}
				s.fill()
				continue
			}
			if s.start == s.end {
				break
			}
			// The input ended (or failed) in the middle of a line: that
			// is its last line.
			line = s.buf[s.start:s.end]
			s.start, s.scanned = s.end, 0
		}
		if len(line) >= s.maxLine {
			return nil, true, s.fail(fmt.Errorf("openai: SSE line %d exceeds %d bytes: %w", s.line+1, s.max, bufio.ErrTooLong))
		}
		s.line++
		if s.line == 1 {
			line = bytes.TrimPrefix(line, []byte("\uFEFF")) // the spec allows one BOM
		}
		if len(line) == 0 {
			if s.have {
				return s.dispatch()
			}
			continue
		}
		if line[0] == ':' {
			continue // comment, e.g. a keep-alive ping
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(name) {
		case "data":
			sep := 0
			if s.have {
				sep = 1
			}
			if len(s.data)+sep+len(value) > s.max {
				return nil, true, s.fail(fmt.Errorf("openai: SSE event at line %d exceeds %d bytes", s.line, s.max))
			}
			if s.have {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, value...)
			s.have = true
		case "event", "id", "retry":
			// Valid SSE, but vLLM does not use them and neither do we.
		default:
			return nil, true, s.fail(fmt.Errorf("openai: SSE line %d: unexpected field %.40q; not an event stream?", s.line, name))
		}
	}
	if s.rerr != io.EOF {
		return nil, true, s.fail(fmt.Errorf("openai: reading SSE stream: %w", s.rerr))
	}
	if s.have {
		return s.dispatch()
	}
	return nil, true, s.fail(fmt.Errorf("openai: SSE stream ended without data: [DONE]: %w", io.ErrUnexpectedEOF))
}

// cutLine takes the next whole line, without its end, off the buffer. A
// line ends at LF, CRLF or a lone CR; a CR ends it at once, so an event
// framed with CRs is not held until the next byte shows whether an LF
// follows.
func (s *SSEReader) cutLine() ([]byte, bool) {
	if s.skipLF && s.start < s.end {
		s.skipLF = false
		if s.buf[s.start] == '\n' {
			s.start++
		}
	}
	rest := s.buf[s.start+s.scanned : s.end]
	i := bytes.IndexByte(rest, '\n')
	head := rest
	if i >= 0 {
		head = rest[:i]
	}
	if j := bytes.IndexByte(head, '\r'); j >= 0 {
		i = j
	}
	if i < 0 {
		s.scanned = s.end - s.start
		return nil, false
	}
	i += s.scanned
	line := s.buf[s.start : s.start+i]
	s.skipLF = s.buf[s.start+i] == '\r'
	s.start += i + 1
	s.scanned = 0
	return line, true
}

// fill reads once more into the buffer. Parse calls it only when the buffer
// holds no whole line, so what it keeps is the start of one line: it moves
// that to the front, and grows the buffer when the line fills half of it.
func (s *SSEReader) fill() {
	if s.start > 0 {
		s.end = copy(s.buf, s.buf[s.start:s.end])
		s.start = 0
	}
	switch {
	case s.buf == nil:
		s.buf = sseBufs.Get().(*[sseReadSize]byte)[:]
	case s.end > len(s.buf)/2 && len(s.buf) <= s.maxLine:
		// Doubling keeps a long line's reads large; past the bound there
		// is room to read the byte that proves the line too long.
		buf := make([]byte, min(2*len(s.buf), s.maxLine+1))
		s.end = copy(buf, s.buf[:s.end])
		s.buf = buf
	}
	// As bufio.Scanner, give up on a reader that keeps returning nothing.
	for range 100 {
		n, err := s.r.Read(s.buf[s.end:])
		s.end += n
		if err != nil {
			s.rerr = err
			return
		}
		if n > 0 {
			return
		}
	}
	s.rerr = io.ErrNoProgress
}

func (s *SSEReader) dispatch() (json.RawMessage, bool, error) {
	data := s.data
	s.data, s.have = nil, false
	if string(data) == "[DONE]" {
		return nil, true, s.fail(io.EOF)
	}
	if !ValidJSON(data) {
		return nil, true, s.fail(fmt.Errorf("openai: SSE event ending at line %d is not JSON: %.80q", s.line, data))
	}
	return data, true, nil
}

func (s *SSEReader) fail(err error) error {
	s.err = err
	// Nothing is parsed after this, and no payload points into the
	// buffer, so another stream may have it.
	if cap(s.buf) == sseReadSize {
		sseBufs.Put((*[sseReadSize]byte)(s.buf[:sseReadSize]))
	}
	s.buf, s.start, s.end, s.scanned = nil, 0, 0, 0
	return err
}

// sseBufs holds readers' buffers of the first size between streams: a
// relay reads one stream per request.
var sseBufs = sync.Pool{New: func() any { return new([sseReadSize]byte) }}
