package stageclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"
)

// TestNoGoroutineLeak runs every way a call can end — success, upstream
// error, cancellation mid-stream, early Close, truncation, timeout — and
// checks that once the server is gone and idle connections are closed, the
// goroutine count is back where it started.
func TestNoGoroutineLeak(t *testing.T) {
	sharedHTTP.CloseIdleConnections()
	base, _ := settleGoroutines(runtime.NumGoroutine(), 0)

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/ok":
			_, _ = io.WriteString(w, `{}`)
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/hang":
			<-r.Context().Done()
		case "/stream", "/stream-forever", "/stream-cut":
			sseHeaders(w)
			for i := range 3 {
				writeEvents(w, fmt.Sprintf(`{"i":%d}`, i))
			}
			switch r.URL.Path {
			case "/stream":
				writeEvents(w, "[DONE]")
			case "/stream-forever":
				<-r.Context().Done()
			}
		}
	}))
	c, err := New(Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for range 10 {
		if _, err := c.Post(ctx, "/ok", "r", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Post(ctx, "/fail", "r", []byte(`{}`)); err == nil {
			t.Fatal("no error from /fail")
		}
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		if _, err := c.Post(short, "/hang", "r", []byte(`{}`)); !errors.Is(err, ErrTimeout) {
			t.Fatalf("/hang: %v", err)
		}
		cancel()

		// Read to the end; read partway and close; cancel mid-stream; cut.
		for _, tc := range []struct {
			path   string
			read   int
			cancel bool
		}{{"/stream", 5, false}, {"/stream-forever", 1, false}, {"/stream-forever", 3, true}, {"/stream-cut", 5, false}} {
			sctx, cancel := context.WithCancel(ctx)
			s, err := c.Stream(sctx, tc.path, "r", []byte(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			for range tc.read {
				if _, err := s.Next(); err != nil {
					break
				}
			}
			if tc.cancel {
				cancel()
				if _, err := s.Next(); !errors.Is(err, ErrCanceled) {
					t.Fatalf("%s after cancel: %v", tc.path, err)
				}
			}
			s.Close()
			cancel()
		}
	}
	srv.Close()
	if n, ok := settleGoroutines(base, wait); !ok {
		t.Fatalf("%d goroutines, %d before\n%s", n, base, goroutineDump())
	}
}
