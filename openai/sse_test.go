package openai

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func TestSSEWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSEWriter(rec)
	chunk := ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Created: 1, Model: "m", Modality: ModalityText,
		Choices: []ChatChunkChoice{{Delta: ChatDelta{Role: "assistant", Content: new("<|a|>\nb")}}}}
	if err := s.WriteEvent(chunk); err != nil {
		t.Fatal(err)
	}
	if !rec.Flushed {
		t.Error("event not flushed")
	}
	if err := s.WriteEvent(rawEvent(" {\n \"a\" : 1 }\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteEvent(InvalidRequest("", "x")); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteDone(); err != nil {
		t.Fatal(err)
	}
	want := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"<|a|>\nb"},"finish_reason":null}],"usage":null,"modality":"text"}` + "\n\n" +
		`data: {"a":1}` + "\n\n" +
		`data: {"error":{"message":"x","type":"invalid_request_error","param":null,"code":null}}` + "\n\n" +
		"data: [DONE]\n\n"
	if got := rec.Body.String(); got != want {
		t.Errorf("body:\n got %q\nwant %q", got, want)
	}
	for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if rec.Code != http.StatusOK {
		t.Errorf("status %d", rec.Code)
	}

	// What the writer writes, the reader reads back.
	r := NewSSEReader(strings.NewReader(want), 0)
	var n int
	for {
		_, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 3 {
		t.Errorf("read back %d events, want 3", n)
	}

	if err := s.WriteEvent(func() {}); err == nil {
		t.Error("unencodable event written without error")
	}
}

type rawEvent string

func (j rawEvent) MarshalJSON() ([]byte, error) { return []byte(j), nil }

// noFlush hides the recorder's Flush, as a careless middleware wrapper does.
type noFlush struct{ http.ResponseWriter }

func TestSSEWriterCannotFlush(t *testing.T) {
	s := NewSSEWriter(noFlush{httptest.NewRecorder()})
	if err := s.WriteEvent(1); !errors.Is(err, http.ErrNotSupported) {
		t.Errorf("err = %v, want http.ErrNotSupported: a buffered stream must not pass silently", err)
	}
}

type failWriter struct{ *httptest.ResponseRecorder }

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestSSEWriterWriteError(t *testing.T) {
	s := NewSSEWriter(failWriter{httptest.NewRecorder()})
	if err := s.WriteDone(); err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Errorf("err = %v, want the write failure", err)
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		max    int
		want   []string
		err    string // "" means the stream ends cleanly with [DONE]
	}{
		{"plain", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n", 0, []string{`{"a":1}`, `{"b":2}`}, ""},
		{"CRLF", "data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n", 0, []string{`{"a":1}`}, ""},
		{"lone CR", "data: {\"a\":1}\r\rdata: [DONE]\r\r", 0, []string{`{"a":1}`}, ""},
		{"no space after colon", "data:{\"a\":1}\n\ndata:[DONE]\n\n", 0, []string{`{"a":1}`}, ""},
		{"comments and other fields", ": ping\n\nevent: message\nid: 7\nretry: 100\n: hi\ndata: 1\n\n:\n\ndata: [DONE]\n\n", 0, []string{`1`}, ""},
		{"multi-line data", "data: {\"a\":\ndata: [1,\ndata: 2]}\n\ndata: [DONE]\n\n", 0, []string{"{\"a\":\n[1,\n2]}"}, ""},
		{"extra blank lines", "\n\n\ndata: 1\n\n\n\ndata: [DONE]\n\n\n", 0, []string{"1"}, ""},
		{"BOM", "\uFEFFdata: 1\n\ndata: [DONE]\n\n", 0, []string{"1"}, ""},
		{"missing trailing newline", "data: 1\n\ndata: [DONE]", 0, []string{"1"}, ""},
		{"missing trailing blank line", "data: 1\n\ndata: [DONE]\n", 0, []string{"1"}, ""},
		{"nothing after DONE is read", "data: [DONE]\n\ngarbage\n\n", 0, nil, ""},
		{"last event cut by EOF, no DONE", "data: 1\n\ndata: 2", 0, []string{"1", "2"}, "ended without data: [DONE]"},
		{"no DONE", "data: 1\n\n", 0, []string{"1"}, "ended without data: [DONE]"},
		{"empty stream", "", 0, nil, "ended without data: [DONE]"},
		{"only comments", ": a\n: b\n", 0, nil, "ended without data: [DONE]"},
		{"html page", "<html>\n<body>502</body>\n", 0, nil, `unexpected field "<html>"`},
		{"not JSON", "data: hello\n\n", 0, nil, "is not JSON"},
		{"truncated JSON", "data: {\"a\":\n\n", 0, nil, "is not JSON"},
		{"oversized line", "data: \"" + strings.Repeat("x", 200) + "\"\n\ndata: [DONE]\n\n", 64, nil, "exceeds 64 bytes"},
		{"oversized line without newline", strings.Repeat("x", 1000), 64, nil, "exceeds 64 bytes"},
		{"oversized multi-line event", strings.Repeat("data: 1111111111\n", 10) + "\n", 64, nil, "exceeds 64 bytes"},
		{"payload at the bound", "data: \"" + strings.Repeat("x", 62) + "\"\n\ndata: [DONE]\n\n", 64, []string{`"` + strings.Repeat("x", 62) + `"`}, ""},
		{"payload one over the bound", "data: \"" + strings.Repeat("x", 63) + "\"\n\ndata: [DONE]\n\n", 64, nil, "exceeds 64 bytes"},
	}
	readers := map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"half":     func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
	}
	for _, tt := range tests {
		for rname, mk := range readers {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				r := NewSSEReader(mk(tt.stream), tt.max)
				var got []string
				var err error
				for range 100 { // a reader that never ends fails the test instead of hanging it
					var p []byte
					p, err = r.Next()
					if err != nil {
						break
					}
					got = append(got, string(p))
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("payloads = %q, want %q", got, tt.want)
				}
				switch {
				case tt.err == "" && err != io.EOF:
					t.Errorf("err = %v, want io.EOF", err)
				case tt.err != "" && (err == nil || err == io.EOF || !strings.Contains(err.Error(), tt.err)):
					t.Errorf("err = %v, want one containing %q", err, tt.err)
				}
				// Errors are sticky.
				if _, again := r.Next(); again != err {
					t.Errorf("second Next after the end = %v, want %v again", again, err)
				}
			})
		}
	}
}

func TestSSEReaderTruncationIsUnexpectedEOF(t *testing.T) {
	r := NewSSEReader(strings.NewReader("data: 1\n\n"), 0)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("err = %v, want io.ErrUnexpectedEOF", err)
	}
	boom := errors.New("connection reset")
	r = NewSSEReader(io.MultiReader(strings.NewReader("data: 1\n\n"), iotest.ErrReader(boom)), 0)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); !errors.Is(err, boom) {
		t.Errorf("err = %v, want the read error", err)
	}
}

func TestSSEPayloadsAreOwned(t *testing.T) {
	r := NewSSEReader(iotest.OneByteReader(strings.NewReader("data: [1]\n\ndata: [2]\n\ndata: [DONE]\n\n")), 0)
	a, _ := r.Next()
	b, _ := r.Next()
	if string(a) != "[1]" || string(b) != "[2]" {
		t.Errorf("payloads %q %q: an earlier payload was overwritten by a later read", a, b)
	}
}

func TestSSEWriterQueue(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSEWriter(rec)
	// A relayed payload on one line goes out as it came; one with line
	// breaks is compacted so it cannot end the event early.
	if err := s.Queue(json.RawMessage(`{"a": 1}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Queue(json.RawMessage("{\"b\":\n2}")); err != nil {
		t.Fatal(err)
	}
	if rec.Flushed {
		t.Fatal("Queue flushed")
	}
	if err := s.WriteDone(); err != nil {
		t.Fatal(err)
	}
	if !rec.Flushed {
		t.Error("WriteDone did not flush what was queued")
	}
	if got, want := rec.Body.String(), "data: {\"a\": 1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n"; got != want {
		t.Errorf("body:\n got %q\nwant %q", got, want)
	}
}

// QueueDone leaves [DONE] and what was queued before it for the end of the
// response to send.
func TestSSEWriterQueueDone(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSEWriter(rec)
	if err := s.Queue(json.RawMessage(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.QueueDone(); err != nil {
		t.Fatal(err)
	}
	if rec.Flushed {
		t.Error("QueueDone flushed")
	}
	if got, want := rec.Body.String(), "data: {\"a\":1}\n\ndata: [DONE]\n\n"; got != want {
		t.Errorf("body:\n got %q\nwant %q", got, want)
	}
	if err := NewSSEWriter(failWriter{httptest.NewRecorder()}).QueueDone(); err == nil || !strings.Contains(err.Error(), "broken pipe") {
		t.Errorf("err = %v, want the write failure", err)
	}
}

// BenchmarkSSEReader reads an 18-chunk stream delivered in one read, as a
// relay does: ns and allocs per event.
func BenchmarkSSEReader(b *testing.B) {
	var stream strings.Builder
	const events = 18
	for i := range events {
		stream.WriteString(`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token ` + string(rune('a'+i)) + `"},"finish_reason":null}]}` + "\n\n")
	}
	stream.WriteString("data: [DONE]\n\n")
	s := stream.String()
	var sr strings.Reader
	b.SetBytes(int64(len(s)))
	b.ReportAllocs()
	for b.Loop() {
		sr.Reset(s)
		r := NewSSEReader(&sr, 0)
		for {
			if _, err := r.Next(); err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
}

// burstReader returns its burst in one Read, then fails every later Read:
// a Next that reads after Buffered said it would not gets that error.
type burstReader struct {
	burst string
	reads int
}

var errReadPastBurst = errors.New("read past the burst")

func (r *burstReader) Read(p []byte) (int, error) {
	r.reads++
	if r.reads > 1 {
		return 0, errReadPastBurst
	}
	return copy(p, r.burst), nil
}

func TestSSEReaderBuffered(t *testing.T) {
	tests := []struct {
		name  string
		burst string // arrives in one read, after which Next would block
		want  bool   // after the first event: is the next one here?
		next  string // with want, what the next Next returns: a payload or an error
	}{
		{"two whole events", "data: 1\n\ndata: 2\n\n", true, "2"},
		{"CRLF", "data: 1\r\n\r\ndata: 2\r\n\r\n", true, "2"},
		{"lone CR", "data: 1\r\rdata: 2\r\r", true, "2"},
		{"lone CR before a CRLF", "data: 1\r\rdata: 2\r\r\n", true, "2"},
		{"multi-line event", "data: 1\n\ndata: [2,\ndata: 3]\n\n", true, "[2,\n3]"},
		{"[DONE] is here", "data: 1\n\ndata: [DONE]\n\n", true, "EOF"},
		{"a bad line is here", "data: 1\n\n<html>\n", true, "unexpected field"},
		{"half an event", "data: 1\n\ndata: {\"a\"", false, ""},
		{"an event without its blank line", "data: 1\n\ndata: 2\n", false, ""},
		{"an event without the LF of its CRLF", "data: 1\r\n\r\ndata: 2\r\n", false, ""},
		{"only the first event", "data: 1\n\n", false, ""},
		{"an extra blank line", "data: 1\n\n\n", false, ""},
		{"a comment is no event", "data: 1\n\n: ping\n\n", false, ""},
		{"fields without data", "data: 1\n\nevent: x\nid: 2\n\n", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := &burstReader{burst: tt.burst}
			r := NewSSEReader(br, 0)
			if got, err := r.Next(); err != nil || string(got) != "1" {
				t.Fatalf("first event %q, %v", got, err)
			}
			if got := r.Buffered(); got != tt.want {
				t.Fatalf("Buffered = %v, want %v", got, tt.want)
			}
			if r.Buffered() != tt.want {
				t.Fatal("a second Buffered answered differently")
			}
			if !tt.want {
				// Whatever was parsed ahead of the half event is kept: the
				// next read must not lose it or see it twice.
				if _, err := r.Next(); !errors.Is(err, errReadPastBurst) {
					t.Errorf("Next after Buffered = false: %v, want the read past the burst", err)
				}
				return
			}
			got, err := r.Next()
			switch {
			case err == nil && string(got) != tt.next:
				t.Errorf("next event %q, want %q", got, tt.next)
			case err != nil && !strings.Contains(err.Error(), tt.next):
				t.Errorf("next = %v, want %q", err, tt.next)
			}
			if br.reads != 1 {
				t.Errorf("Next read again after Buffered said the event was here")
			}
			if err != nil && r.Buffered() {
				t.Error("Buffered after the end of the stream")
			}
		})
	}
}

// The burst ends mid-event; what comes later completes it, and the part
// already parsed (by Buffered, which must not read) is neither lost nor
// repeated.
func TestSSEReaderBufferedKeepsThePartParsed(t *testing.T) {
	pr, pw := io.Pipe()
	r := NewSSEReader(pr, 0)
	go func() {
		_, _ = io.WriteString(pw, "data: 1\n\ndata: [2,\ndata: 3")
		_, _ = io.WriteString(pw, "]\n\ndata: [DONE]\n\n")
		_ = pw.Close()
	}()
	if got, err := r.Next(); err != nil || string(got) != "1" {
		t.Fatalf("first event %q, %v", got, err)
	}
	if r.Buffered() {
		t.Fatal("Buffered with half an event")
	}
	if got, err := r.Next(); err != nil || string(got) != "[2,\n3]" {
		t.Fatalf("second event %q, %v", got, err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

// chunkReader delivers s in reads whose sizes cuts gives, one byte where it
// runs out; it counts its reads.
type chunkReader struct {
	s     string
	cuts  []byte
	reads int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	r.reads++
	if len(r.s) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.cuts) > 0 {
		n, r.cuts = max(int(r.cuts[0]), 1), r.cuts[1:]
	}
	n = min(n, len(r.s), len(p))
	copy(p, r.s[:n])
	r.s = r.s[n:]
	return n, nil
}

type sseResult struct {
	payloads []string
	err      string
}

// FuzzSSEReader: however a stream arrives, the reader returns the same
// events and the same end as when it arrives whole; asking Buffered between
// events changes nothing; and Buffered is true exactly when the next Next
// returns without reading.
func FuzzSSEReader(f *testing.F) {
	f.Add("data: {\"a\":1}\n\ndata: [DONE]\n\n", []byte{3, 200}, uint64(0xff))
	f.Add("data: 1\r\n\r\n: c\r\ndata: 2\r\rdata: [DONE]\r\n", []byte{9, 1, 1, 7}, uint64(0x5))
	f.Add("\uFEFFdata: [1,\ndata: 2]\n\nid: 1\n\n\n\ndata: \"x\"", []byte{2, 2, 30}, uint64(0xaaaa))
	f.Add("data: \""+strings.Repeat("x", 70)+"\"\n\n", []byte{40, 40}, uint64(1))
	f.Add("data: 1\n\nevent: e\nbogus\n\n", []byte{10}, uint64(3))
	const max = 64
	f.Fuzz(func(t *testing.T, stream string, cuts []byte, asks uint64) {
		read := func(r *SSEReader, ask func(i int) bool, reads func() int) sseResult {
			var res sseResult
			for i := range 200 {
				var buffered bool
				asked := ask(i)
				if asked {
					buffered = r.Buffered()
				}
				before := reads()
				p, err := r.Next()
				if asked && buffered != (reads() == before) {
					t.Fatalf("event %d: Buffered = %v, but Next read %d times", i, buffered, reads()-before)
				}
				if err != nil {
					res.err = err.Error()
					if r.Buffered() {
						t.Fatal("Buffered after the end")
					}
					return res
				}
				res.payloads = append(res.payloads, string(p))
			}
			return res
		}
		whole := read(NewSSEReader(strings.NewReader(stream), max), func(int) bool { return false }, func() int { return 0 })
		cr := &chunkReader{s: stream, cuts: cuts}
		chunked := read(NewSSEReader(cr, max), func(i int) bool { return asks>>(i%64)&1 == 1 }, func() int { return cr.reads })
		if !reflect.DeepEqual(whole, chunked) {
			t.Errorf("whole %q\nchunked %q", whole, chunked)
		}
	})
}

// A reader's buffer goes to the next stream once its own has ended; the
// payloads it returned are the caller's and stay as they were.
func TestSSEReaderPayloadsOutliveItsBuffer(t *testing.T) {
	read := func(stream string) {
		r := NewSSEReader(strings.NewReader(stream), 0)
		for {
			if _, err := r.Next(); err == io.EOF {
				return
			} else if err != nil {
				t.Fatal(err)
			}
		}
	}
	first := NewSSEReader(strings.NewReader("data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n"), 0)
	p1, _ := first.Next()
	p2, _ := first.Next()
	if _, err := first.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	for range 3 {
		read("data: {\"xxxxxxxx\":\"yyyyyyyyyyyyyyyyyyyy\"}\n\ndata: [DONE]\n\n")
	}
	if string(p1) != `{"a":1}` || string(p2) != `{"b":2}` {
		t.Errorf("payloads of an ended stream became %s and %s", p1, p2)
	}
	if _, err := first.Next(); err != io.EOF || first.Buffered() {
		t.Errorf("an ended reader: Next %v, Buffered %v; want io.EOF, false", err, first.Buffered())
	}
}
