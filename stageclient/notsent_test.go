package stageclient

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"
)

// ErrNotSent marks the ErrConnect failures where the request provably never
// reached the instance, and only those: a leg another instance may take
// without running twice.
func TestNotSentOnlyWhenNothingWasSent(t *testing.T) {
	refused := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close()
		return url
	}
	wantNotSent := func(t *testing.T, call string, err error, notSent bool) {
		t.Helper()
		if !errors.Is(err, ErrConnect) {
			t.Errorf("%s: %v is not ErrConnect", call, err)
		}
		if errors.Is(err, ErrNotSent) != notSent {
			t.Errorf("%s: errors.Is(%v, ErrNotSent) = %v, want %v", call, err, !notSent, notSent)
		}
	}

	t.Run("dial refused", func(t *testing.T) {
		url := refused(t)
		for _, cfg := range []Config{{BaseURL: url}, {BaseURL: url, HTTP: &http.Client{}}} {
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`))
			wantNotSent(t, "Post", err, true)
			_, err = c.Stream(testCtx(t), "/v1/completions", "r", []byte(`{}`))
			wantNotSent(t, "Stream", err, true)
		}
	})

	t.Run("closed after the request was read", func(t *testing.T) {
		c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
			hijack(t, w, "")
		})
		_, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`))
		wantNotSent(t, "Post", err, false)
	})

	t.Run("written on a reused connection, then closed", func(t *testing.T) {
		srv := newRawServer(t, okOrHealth)
		tr := newLeanTransport()
		c := leanClient(t, srv.URL(), tr)
		if _, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		closeIdleConn(t, tr, srv, false)
		tr.usable = func(*leanConn) bool { return true } // the close came after the probe
		_, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`))
		wantNotSent(t, "Post", err, false)
	})

	t.Run("pooled connection dead on first write, instance gone", func(t *testing.T) {
		srv := newRawServer(t, okOrHealth)
		tr := newLeanTransport()
		c := leanClient(t, srv.URL(), tr)
		if _, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		srv.ln.Close() // the instance died: its connections reset, new ones refused
		closeIdleConn(t, tr, srv, true)
		tr.usable = func(*leanConn) bool { return true }
		_, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`))
		wantNotSent(t, "Post", err, true)
	})
}

// The plain-HTTP transport reports the write of a request to an
// httptrace.ClientTrace, as net/http's does: the orchestrator learns there
// that a leg reached its instance before the answer comes.
func TestLeanTracesTheWrite(t *testing.T) {
	written := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // so that the server sees the client leave
		// The answer waits for the trace: the write was reported before it.
		select {
		case <-written:
		case <-r.Context().Done():
		case <-time.After(wait): // only when the write is never reported
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(hs.Close)
	c, err := New(Config{BaseURL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	if c.lean == nil {
		t.Fatal("the default client does not use the plain-HTTP transport")
	}
	var calls atomic.Int32
	ctx := httptrace.WithClientTrace(testCtx(t), &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil && calls.Add(1) == 1 {
			close(written)
		}
	}})
	if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("WroteRequest reported %d writes, want 1", n)
	}

	// A refused dial wrote nothing, and reports nothing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := New(Config{BaseURL: "http://" + ln.Addr().String()})
	ln.Close()
	ctx = httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
		t.Error("WroteRequest reported a request whose dial was refused")
	}})
	if _, err := dead.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err == nil {
		t.Fatal("a refused dial succeeded")
	}
}
