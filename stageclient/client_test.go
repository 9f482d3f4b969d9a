package stageclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// wait bounds every wait in these tests, so a bug hangs nothing.
const wait = 5 * time.Second

// serve starts a loopback server running h and a client for it. Handlers
// that block wait for their request context, which the cleanup cancels by
// cutting every connection, so a failing test still shuts down.
func serve(t *testing.T, cfg Config, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	cfg.BaseURL = srv.URL
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hijack takes over the connection to write raw bytes, then closes it.
func hijack(t *testing.T, w http.ResponseWriter, raw string) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	_, _ = buf.WriteString(raw)
	_ = buf.Flush()
	_ = conn.Close()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	t.Cleanup(cancel)
	return ctx
}

func TestNew(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"http://127.0.0.1:8000/", "http://127.0.0.1:8000"},
		{"HTTPS://prefill-0.svc:443//", "https://prefill-0.svc:443"},
		{"http://[::1]:8000", "http://[::1]:8000"},
		{"http://lb.internal/stage/0/", "http://lb.internal/stage/0"},
	} {
		c, err := New(Config{BaseURL: tc.in})
		if err != nil {
			t.Errorf("New(%q): %v", tc.in, err)
			continue
		}
		if c.BaseURL() != tc.want {
			t.Errorf("New(%q).BaseURL() = %q, want %q", tc.in, c.BaseURL(), tc.want)
		}
		if c.maxBody != DefaultMaxBodyBytes || c.http != sharedHTTP {
			t.Errorf("New(%q): defaults not applied", tc.in)
		}
	}
	for _, bad := range []string{
		"", "127.0.0.1:8000", "ftp://host", "http://", "http:///v1", "http://:8000",
		"http://user:pw@host:8000", "http://host:8000/?x=1", "http://host:8000/#f", "http://host:notaport",
		"http://host:99999", "http://ho st",
	} {
		if _, err := New(Config{BaseURL: bad}); err == nil {
			t.Errorf("New(%q) succeeded", bad)
		}
	}
	if _, err := New(Config{BaseURL: "http://h:1", Secret: "a\r\nX-Evil: 1"}); err == nil {
		t.Error("a secret with CRLF was accepted")
	}
}

func TestPostSuccess(t *testing.T) {
	const reqBody = `{"model":"m","prompt":"hi","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`
	const respBody = `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"!","finish_reason":"length"}],"kv_transfer_params":null}`
	c := serve(t, Config{Secret: "s3cret"}, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		for name, want := range map[string]string{
			"X-Request-Id":  "req-42",
			"Content-Type":  "application/json",
			"Authorization": "Bearer s3cret",
			"Accept":        "application/json",
		} {
			if got := r.Header.Get(name); got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
		if r.Method != http.MethodPost || r.URL.Path != "/v1/completions" || string(body) != reqBody {
			t.Errorf("got %s %s %s", r.Method, r.URL.Path, body)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		_, _ = io.WriteString(w, respBody)
	})
	resp, err := c.Post(testCtx(t), "/v1/completions", "req-42", []byte(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusOK || string(resp.Body) != respBody || resp.Header.Get("X-Request-Id") != "req-42" {
		t.Errorf("got %d %q %v", resp.Status, resp.Body, resp.Header)
	}
}

func TestNoAuthorizationWithoutSecret(t *testing.T) {
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header["Authorization"]; ok {
			t.Error("Authorization sent without a secret")
		}
		_, _ = io.WriteString(w, `{}`)
	})
	if _, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Health(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestRequestMisuse(t *testing.T) {
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("request sent: %s %s", r.Method, r.URL)
	})
	for _, tc := range []struct{ path, id string }{
		{"/v1/completions", ""},
		{"/v1/completions", "a\nb"},
		{"v1/completions", "r"},
	} {
		if _, err := c.Post(testCtx(t), tc.path, tc.id, []byte(`{}`)); err == nil {
			t.Errorf("Post(%q, %q) succeeded", tc.path, tc.id)
		}
		if s, err := c.Stream(testCtx(t), tc.path, tc.id, []byte(`{}`)); err == nil {
			s.Close()
			t.Errorf("Stream(%q, %q) succeeded", tc.path, tc.id)
		}
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: the dial is refused
	c, err := New(Config{BaseURL: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	_, err = c.Post(ctx, "/v1/completions", "r1", []byte(`{}`))
	assertClass(t, "Post", err, ErrConnect)
	if !strings.Contains(err.Error(), "request r1") || !strings.Contains(err.Error(), addr) {
		t.Errorf("error does not name the request and instance: %v", err)
	}
	_, err = c.Stream(ctx, "/v1/completions", "r1", []byte(`{}`))
	assertClass(t, "Stream", err, ErrConnect)
	assertClass(t, "Health", c.Health(ctx), ErrConnect)
	_, err = c.Metrics(ctx)
	assertClass(t, "Metrics", err, ErrConnect)
}

func TestClosedBeforeResponse(t *testing.T) {
	// The connection is accepted, the request read, and the connection
	// closed without a byte of response: a crashed worker.
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		hijack(t, w, "")
	})
	_, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`))
	assertClass(t, "Post", err, ErrConnect)
}

var allClasses = []error{ErrConnect, ErrTimeout, ErrCanceled, ErrTruncated, ErrProtocol}

// assertClass checks that err is of class want and of no other.
func assertClass(t *testing.T, call string, err, want error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %v", call, want)
		return
	}
	for _, class := range allClasses {
		if got := errors.Is(err, class); got != (class == want) {
			t.Errorf("%s: errors.Is(%v, %v) = %v", call, err, class, got)
		}
	}
	var ue *UpstreamError
	if errors.As(err, &ue) {
		t.Errorf("%s: %v is also an *UpstreamError", call, err)
	}
}

func TestUpstreamErrors(t *testing.T) {
	for _, tc := range []struct {
		name        string
		status      int
		contentType string
		body        string
		wantMessage string
		wantType    string
		retryable   bool
	}{
		{
			name: "vllm nested 500", status: 500, contentType: "application/json",
			body:        `{"error":{"message":"KV transfer failed for request cmpl-x","type":"InternalServerError","param":null,"code":500}}`,
			wantMessage: "KV transfer failed for request cmpl-x", wantType: "InternalServerError",
		},
		{
			name: "vllm flat 503", status: 503, contentType: "application/json",
			body:        `{"object":"error","message":"The engine is overloaded","type":"ServiceUnavailableError","param":null,"code":503}`,
			wantMessage: "The engine is overloaded", wantType: "ServiceUnavailableError", retryable: true,
		},
		{
			name: "nested 502", status: 502, contentType: "application/json",
			body:        `{"error":{"message":"prefill unreachable","type":"upstream_error","param":null,"code":"prefill_upstream_unavailable"}}`,
			wantMessage: "prefill unreachable", wantType: "upstream_error", retryable: true,
		},
		{
			name: "plain text 503", status: 503, contentType: "text/plain",
			body:        "upstream connect error or disconnect/reset before headers. reset reason: connection failure\n",
			wantMessage: "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
			wantType:    "server_error", retryable: true,
		},
		{
			name: "html 504", status: 504, contentType: "text/html",
			body:        "<html><head><title>504 Gateway Time-out</title></head></html>",
			wantMessage: "<html><head><title>504 Gateway Time-out</title></head></html>",
			wantType:    "server_error", retryable: true,
		},
		{
			name: "vllm 400", status: 400, contentType: "application/json",
			body:        `{"error":{"message":"This model's maximum context length is 32768 tokens.","type":"BadRequestError","param":null,"code":400}}`,
			wantMessage: "This model's maximum context length is 32768 tokens.", wantType: "BadRequestError",
		},
		{
			name: "empty 503", status: 503, wantMessage: "Service Unavailable", wantType: "server_error", retryable: true,
		},
		{
			name: "redirect", status: 307, wantMessage: "Temporary Redirect", wantType: "invalid_request_error",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				if tc.status == 307 {
					w.Header().Set("Location", "/elsewhere")
				}
				if tc.contentType != "" {
					w.Header().Set("Content-Type", tc.contentType)
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			check := func(call string, err error) {
				t.Helper()
				var ue *UpstreamError
				if !errors.As(err, &ue) {
					t.Fatalf("%s: %v is not an *UpstreamError", call, err)
				}
				for _, class := range allClasses {
					if errors.Is(err, class) {
						t.Errorf("%s: %v is also %v", call, err, class)
					}
				}
				if ue.Status != tc.status || ue.Retryable() != tc.retryable || string(ue.Raw) != tc.body {
					t.Errorf("%s: status %d retryable %v raw %q", call, ue.Status, ue.Retryable(), ue.Raw)
				}
				if ue.Body == nil || ue.Body.Status != tc.status || ue.Body.Detail.Message != tc.wantMessage || ue.Body.Detail.Type != tc.wantType {
					t.Errorf("%s: body %+v", call, ue.Body)
				}
				if !strings.Contains(ue.Error(), "request r7") {
					t.Errorf("%s: message does not name the request: %v", call, ue)
				}
			}
			_, err := c.Post(testCtx(t), "/v1/chat/completions", "r7", []byte(`{}`))
			check("Post", err)
			s, err := c.Stream(testCtx(t), "/v1/chat/completions", "r7", []byte(`{"stream":true}`))
			if err == nil {
				s.Close()
			}
			check("Stream", err)
		})
	}
}

func TestPostTimeout(t *testing.T) {
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		<-r.Context().Done() // a prefill that never finishes
	})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`))
	assertClass(t, "Post", err, ErrTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%v does not wrap context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v to time out", d)
	}
}

func TestPostTimeoutMidBody(t *testing.T) {
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Length", "100")
		_, _ = io.WriteString(w, `{"id":`)
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`))
	assertClass(t, "Post", err, ErrTimeout)
}

func TestPostCanceled(t *testing.T) {
	arrived := make(chan struct{})
	gone := make(chan struct{})
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		close(arrived)
		<-r.Context().Done()
		close(gone)
	})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-arrived
		cancel()
	}()
	_, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`))
	assertClass(t, "Post", err, ErrCanceled)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("%v does not wrap context.Canceled", err)
	}
	select {
	case <-gone:
	case <-time.After(wait):
		t.Fatal("the server never saw the request cancelled")
	}
}

func TestPostMalformed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(t *testing.T, w http.ResponseWriter)
		want    error
	}{
		{"html 200", func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html>proxy login</html>")
		}, ErrProtocol},
		{"sse 200", func(t *testing.T, w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
		}, ErrProtocol},
		{"empty 200", func(t *testing.T, w http.ResponseWriter) {}, ErrProtocol},
		{"oversized", func(t *testing.T, w http.ResponseWriter) {
			_, _ = io.WriteString(w, `{"text":"`+strings.Repeat("x", 2000)+`"}`)
		}, ErrProtocol},
		{"cut short", func(t *testing.T, w http.ResponseWriter) {
			hijack(t, w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
		}, ErrTruncated},
		{"not http", func(t *testing.T, w http.ResponseWriter) {
			hijack(t, w, "SSH-2.0-OpenSSH_9.6\r\n")
		}, ErrProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, Config{MaxBodyBytes: 1024}, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				tc.handler(t, w)
			})
			_, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`))
			assertClass(t, "Post", err, tc.want)
		})
	}
}

func TestPost204(t *testing.T) {
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	resp, err := c.Post(testCtx(t), "/v1/release", "r", []byte(`{}`))
	if err != nil || resp.Status != http.StatusNoContent || len(resp.Body) != 0 {
		t.Fatalf("got %+v, %v", resp, err)
	}
}

func TestConnectionsReused(t *testing.T) {
	var newConns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/v1/completions" {
			_, _ = io.WriteString(w, `{}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			_ = http.NewResponseController(w).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		// The end of the body comes a moment after [DONE], as from a busy
		// server: Close must wait for it for the connection to be reused.
		_ = http.NewResponseController(w).Flush()
		time.Sleep(10 * time.Millisecond)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			newConns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c, err := New(Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for range 5 {
		if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		s, err := c.Stream(ctx, "/v1/chat/completions", "r", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := s.Next(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
	}
	srv.Close() // waits for the connections, so newConns is final
	if n := newConns.Load(); n != 1 {
		t.Errorf("%d connections for sequential requests, want 1", n)
	}
}
