package stageclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func writeEvents(w http.ResponseWriter, events ...string) {
	for _, e := range events {
		_, _ = io.WriteString(w, "data: "+e+"\n\n")
	}
	_ = http.NewResponseController(w).Flush()
}

func sseHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("X-Request-Id", "r-stream")
}

func TestStreamSuccess(t *testing.T) {
	chunks := []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"}}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	}
	c := serve(t, Config{Secret: "k"}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		for name, want := range map[string]string{
			"X-Request-Id": "r-stream", "Accept": "text/event-stream",
			"Content-Type": "application/json", "Authorization": "Bearer k",
		} {
			if got := r.Header.Get(name); got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
		sseHeaders(w)
		_, _ = io.WriteString(w, ": keep-alive\n\n")
		for _, ch := range chunks {
			writeEvents(w, ch)
		}
		writeEvents(w, "[DONE]")
	})
	s, err := c.Stream(testCtx(t), "/v1/chat/completions", "r-stream", []byte(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Header().Get("X-Request-Id") != "r-stream" {
		t.Errorf("header %v", s.Header())
	}
	for i, want := range chunks {
		got, err := s.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if string(got) != want {
			t.Errorf("event %d = %s, want %s", i, got, want)
		}
	}
	for range 2 { // io.EOF, unwrapped, and again
		if _, err := s.Next(); err != io.EOF {
			t.Fatalf("after [DONE]: %v, want io.EOF", err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// streamUntilGone writes n events, then blocks until the request context
// is cancelled, and reports that on gone.
func streamUntilGone(n int, gone chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // also what lets net/http notice the client leave
		sseHeaders(w)
		for i := range n {
			writeEvents(w, fmt.Sprintf(`{"i":%d}`, i))
		}
		<-r.Context().Done()
		close(gone)
	}
}

func awaitGone(t *testing.T, gone <-chan struct{}) {
	t.Helper()
	select {
	case <-gone:
	case <-time.After(wait):
		t.Fatal("the server never saw its request context cancelled")
	}
}

func readN(t *testing.T, s *Stream, n int) {
	t.Helper()
	for i := range n {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		var v struct{ I int }
		if json.Unmarshal(ev, &v) != nil || v.I != i {
			t.Fatalf("event %d = %s", i, ev)
		}
	}
}

func TestStreamCancelMidStream(t *testing.T) {
	gone := make(chan struct{})
	c := serve(t, Config{}, streamUntilGone(2, gone))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s, err := c.Stream(ctx, "/v1/chat/completions", "r", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	readN(t, s, 2)
	cancel() // the client went away
	_, err = s.Next()
	assertClass(t, "Next", err, ErrCanceled)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("%v does not wrap context.Canceled", err)
	}
	awaitGone(t, gone)
}

func TestStreamCloseEarly(t *testing.T) {
	gone := make(chan struct{})
	c := serve(t, Config{}, streamUntilGone(3, gone))
	s, err := c.Stream(testCtx(t), "/v1/completions", "r", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 1) // the orchestrator stops reading, e.g. another leg failed
	s.Close()
	awaitGone(t, gone)
	_, err = s.Next()
	assertClass(t, "Next after Close", err, ErrCanceled)
}

func TestStreamCloseUnblocksNext(t *testing.T) {
	gone := make(chan struct{})
	c := serve(t, Config{}, streamUntilGone(1, gone))
	// No deadline: only Close can end the blocked Next.
	s, err := c.Stream(t.Context(), "/v1/completions", "r", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 1)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Next() // blocks: the engine is "thinking"
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let Next block; correctness does not depend on it
	s.Close()
	select {
	case err := <-errc:
		assertClass(t, "Next", err, ErrCanceled)
	case <-time.After(wait):
		t.Fatal("Close did not unblock Next")
	}
	awaitGone(t, gone)
}

func TestStreamTimeout(t *testing.T) {
	gone := make(chan struct{})
	c := serve(t, Config{}, streamUntilGone(1, gone))
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	s, err := c.Stream(ctx, "/v1/completions", "r", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	readN(t, s, 1)
	start := time.Now()
	_, err = s.Next()
	assertClass(t, "Next", err, ErrTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%v does not wrap context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v to time out", d)
	}
	awaitGone(t, gone)
}

func TestStreamErrorEvent(t *testing.T) {
	for _, tc := range []struct {
		name, event string
		status      int
		message     string
	}{
		{"vllm 500", `{"error":{"message":"Failed to load KV for request cmpl-9","type":"InternalServerError","param":null,"code":500}}`, 500, "Failed to load KV for request cmpl-9"},
		{"vllm 400", `{"error":{"object":"error","message":"bad logits processor","type":"BadRequestError","param":null,"code":400}}`, 400, "bad logits processor"},
		{"no code", `{"error":{"message":"engine dead","type":"EngineDeadError"}}`, 500, "engine dead"},
		{"string", `{"error":"boom"}`, 500, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				sseHeaders(w)
				// vLLM sends the error event, then [DONE].
				writeEvents(w, `{"i":0}`, tc.event, "[DONE]")
			})
			s, err := c.Stream(testCtx(t), "/v1/completions", "r9", []byte(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			readN(t, s, 1)
			for range 2 { // sticky
				_, err = s.Next()
				var ue *UpstreamError
				if !errors.As(err, &ue) {
					t.Fatalf("Next: %v, want *UpstreamError", err)
				}
				if ue.Status != tc.status || ue.Body.Status != tc.status || ue.Body.Detail.Message != tc.message || string(ue.Raw) != tc.event {
					t.Errorf("got status %d, body %+v, raw %s", ue.Status, ue.Body, ue.Raw)
				}
				if ue.Retryable() {
					t.Errorf("%v is retryable", ue)
				}
				if !strings.Contains(ue.Error(), "error event") || !strings.Contains(ue.Error(), "request r9") {
					t.Errorf("message: %v", ue)
				}
			}
		})
	}
}

func TestStreamTruncated(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(t *testing.T, w http.ResponseWriter)
	}{
		{"no DONE", func(t *testing.T, w http.ResponseWriter) {
			sseHeaders(w)
			writeEvents(w, `{"i":0}`)
			// The handler returns: a clean end of the body, without [DONE].
		}},
		{"chunked cut", func(t *testing.T, w http.ResponseWriter) {
			ev := "data: {\"i\":0}\n\n"
			hijack(t, w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
				fmt.Sprintf("%x\r\n%s\r\n", len(ev), ev)+"40\r\ndata: {\"i\":")
		}},
		{"connection close", func(t *testing.T, w http.ResponseWriter) {
			hijack(t, w, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: {\"i\":0}\n\ndata: {\"i\"")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				tc.handler(t, w)
			})
			s, err := c.Stream(testCtx(t), "/v1/completions", "r", []byte(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			readN(t, s, 1)
			_, err = s.Next()
			assertClass(t, "Next", err, ErrTruncated)
		})
	}
}

func TestStreamMalformed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handler   func(w http.ResponseWriter)
		atConnect bool // the error comes from Stream, not Next
	}{
		{"json answer", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"cmpl-1","choices":[]}`)
		}, true},
		{"not json", func(w http.ResponseWriter) {
			sseHeaders(w)
			writeEvents(w, `{"i":0}`, `not json`, "[DONE]")
		}, false},
		{"html without content type", func(w http.ResponseWriter) {
			w.Header()["Content-Type"] = nil
			_, _ = io.WriteString(w, "data: {\"i\":0}\n\n<html>\n")
		}, false},
		{"oversized event", func(w http.ResponseWriter) {
			sseHeaders(w)
			writeEvents(w, `{"i":0}`, `{"text":"`+strings.Repeat("x", 500)+`"}`, "[DONE]")
		}, false},
		{"oversized line", func(w http.ResponseWriter) {
			sseHeaders(w)
			writeEvents(w, `{"i":0}`)
			_, _ = io.WriteString(w, strings.Repeat("x", 10000))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, Config{MaxEventBytes: 256}, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				tc.handler(w)
			})
			s, err := c.Stream(testCtx(t), "/v1/completions", "r", []byte(`{}`))
			if tc.atConnect {
				assertClass(t, "Stream", err, ErrProtocol)
				if err == nil {
					s.Close()
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			readN(t, s, 1)
			_, err = s.Next()
			assertClass(t, "Next", err, ErrProtocol)
		})
	}
}

// Buffered is true for an event that arrived with the one Next returned,
// false once the events that came together are used up, and false after
// the end or Close.
func TestStreamBuffered(t *testing.T) {
	chunk := func(s string) string { return `{"choices":[{"index":0,"delta":{"content":"` + s + `"}}]}` }
	for _, closeEarly := range []bool{false, true} {
		t.Run(fmt.Sprintf("close=%v", closeEarly), func(t *testing.T) {
			release := make(chan struct{})
			c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
				sseHeaders(w)
				writeEvents(w, chunk("a"), chunk("b")) // one write
				select {
				case <-release:
					writeEvents(w, "[DONE]")
				case <-r.Context().Done():
				}
			})
			s, err := c.Stream(testCtx(t), "/v1/chat/completions", "r", []byte(`{"stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if ev, err := s.Next(); err != nil || string(ev) != chunk("a") {
				t.Fatalf("first event %s, %v", ev, err)
			}
			if !s.Buffered() {
				t.Fatal("the event that arrived with the first is not Buffered")
			}
			if closeEarly {
				s.Close()
				if s.Buffered() {
					t.Error("Buffered after Close")
				}
				return
			}
			if ev, err := s.Next(); err != nil || string(ev) != chunk("b") {
				t.Fatalf("second event %s, %v", ev, err)
			}
			if s.Buffered() {
				t.Fatal("Buffered while the stage has sent nothing more")
			}
			close(release)
			if _, err := s.Next(); err != io.EOF {
				t.Fatalf("end: %v", err)
			}
			if s.Buffered() {
				t.Error("Buffered after the end")
			}
		})
	}
}
