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
