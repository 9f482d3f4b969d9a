package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// SSEWriter writes a stream of JSON events the way vLLM does: one
// "data: <json>\n\n" per event, flushed at once, ended by "data: [DONE]\n\n".
// It is not safe for concurrent use; one goroutine owns a stream.
type SSEWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
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
// more events follow at once: the next WriteEvent, WriteDone or Flush sends
// them together, one write instead of several.
func (s *SSEWriter) Queue(v any) error {
	payload, err := eventJSON(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len("data: ")+len(payload)+2)
	buf = append(append(append(buf, "data: "...), payload...), '\n', '\n')
	if _, err := s.w.Write(buf); err != nil {
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

// WriteDone writes the terminating "data: [DONE]" event.
func (s *SSEWriter) WriteDone() error {
	return s.write([]byte("data: [DONE]\n\n"))
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
type SSEReader struct {
	sc   *bufio.Scanner
	max  int
	line int
	err  error // sticky: once the stream failed or ended, Next repeats it
}

// NewSSEReader reads events from r. maxEventSize bounds each line and each
// event's payload; <= 0 means DefaultMaxEventSize.
func NewSSEReader(r io.Reader, maxEventSize int) *SSEReader {
	if maxEventSize <= 0 {
		maxEventSize = DefaultMaxEventSize
	}
	sc := bufio.NewScanner(r)
	// Room for the field name and line end around a maximal payload.
	sc.Buffer(make([]byte, 0, min(4096, maxEventSize)), maxEventSize+len("data: \r\n"))
	sc.Split(scanLines)
	return &SSEReader{sc: sc, max: maxEventSize}
}

// Next returns the next event's payload, a JSON document owned by the
// caller. After data: [DONE] it returns io.EOF; any other error means the
// stream was malformed, truncated or failed to read.
func (s *SSEReader) Next() (json.RawMessage, error) {
	if s.err != nil {
		return nil, s.err
	}
	var data []byte
	have := false
	for s.sc.Scan() {
		s.line++
		line := s.sc.Bytes()
		if s.line == 1 {
			line = bytes.TrimPrefix(line, []byte("\uFEFF")) // the spec allows one BOM
		}
		if len(line) == 0 {
			if have {
				return s.dispatch(data)
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
			if have {
				sep = 1
			}
			if len(data)+sep+len(value) > s.max {
				return nil, s.fail(fmt.Errorf("openai: SSE event at line %d exceeds %d bytes", s.line, s.max))
			}
			if have {
				data = append(data, '\n')
			}
			data = append(data, value...)
			have = true
		case "event", "id", "retry":
			// Valid SSE, but vLLM does not use them and neither do we.
		default:
			return nil, s.fail(fmt.Errorf("openai: SSE line %d: unexpected field %.40q; not an event stream?", s.line, name))
		}
	}
	if err := s.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, s.fail(fmt.Errorf("openai: SSE line %d exceeds %d bytes: %w", s.line+1, s.max, err))
		}
		return nil, s.fail(fmt.Errorf("openai: reading SSE stream: %w", err))
	}
	if have {
		return s.dispatch(data)
	}
	return nil, s.fail(fmt.Errorf("openai: SSE stream ended without data: [DONE]: %w", io.ErrUnexpectedEOF))
}

func (s *SSEReader) dispatch(data []byte) (json.RawMessage, error) {
	if string(data) == "[DONE]" {
		return nil, s.fail(io.EOF)
	}
	if !json.Valid(data) {
		return nil, s.fail(fmt.Errorf("openai: SSE event ending at line %d is not JSON: %.80q", s.line, data))
	}
	return data, nil
}

func (s *SSEReader) fail(err error) error {
	s.err = err
	return err
}

// scanLines splits at LF, CRLF or a lone CR, the three line ends SSE allows.
func scanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if data[i] == '\n' {
			return i + 1, data[:i], nil
		}
		switch {
		case i+1 < len(data) && data[i+1] == '\n':
			return i + 2, data[:i], nil
		case i+1 < len(data) || atEOF:
			return i + 1, data[:i], nil
		default:
			return 0, nil, nil // a CR at the end: wait to see whether LF follows
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}
