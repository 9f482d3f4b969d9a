package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/omnipd/omnipd/stageclient"
)

// A Thinker instance that goes quiet past the stage idle timeout — before
// its answer, or mid-stream — sits out: the requests after it go to the
// instance that answers, not (once its own stalled leg has ended and it
// looks idle again) back to it.
func TestQuietInstanceSitsOut(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			t.Parallel()
			quiet := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body) // so that the server sees the leg abandoned
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					_ = http.NewResponseController(w).Flush()
				}
				select { // until the leg is abandoned (bounded: never hang the test)
				case <-r.Context().Done():
				case <-time.After(time.Minute):
				}
			})
			pool := &Pool{Name: "thinker"}
			for _, h := range []http.Handler{quiet, &fakeStage{answer: toolStage}} {
				hs := httptest.NewServer(h)
				t.Cleanup(hs.Close)
				c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL})
				if err != nil {
					t.Fatal(err)
				}
				pool.Instances = append(pool.Instances, &Instance{Client: c})
			}
			// Only the quiet instance reaches the idle timeout: the other
			// answers at once, however busy the machine.
			o, err := New(Config{Decode: pool, StageIdleTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":%v}`, stream)
			timedOut := 0
			for i := range 6 {
				res, err := o.Do(context.Background(), chatRequest(t, fmt.Sprintf("r-%d", i), body))
				if err == nil && stream {
					_, err = answerDocs(res)
				}
				if res != nil {
					res.Close()
				}
				var oe *Error
				switch {
				case errors.As(err, &oe) && oe.Code == "decode_upstream_timeout":
					timedOut++
				case err != nil:
					t.Fatalf("request %d: %v", i, err)
				}
			}
			if timedOut != 1 {
				t.Errorf("%d of 6 requests went to the quiet instance and timed out; want only the first that found it", timedOut)
			}
		})
	}
}

// A Thinker instance whose stream breaks off (it died mid-answer) sits out
// too: once its broken leg has ended it must not draw the next requests.
func TestBrokenStreamInstanceSitsOut(t *testing.T) {
	broken := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"))
		_ = http.NewResponseController(w).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close() // the worker dies
		}
	})
	pool := &Pool{Name: "thinker"}
	for _, h := range []http.Handler{broken, &fakeStage{answer: toolStage}} {
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL})
		if err != nil {
			t.Fatal(err)
		}
		pool.Instances = append(pool.Instances, &Instance{Client: c})
	}
	o, err := New(Config{Decode: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i := range 6 {
		res, err := o.Do(context.Background(), chatRequest(t, fmt.Sprintf("r-%d", i), `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if _, err := answerDocs(res); err != nil {
			failed++
		}
		res.Close()
	}
	if failed != 1 {
		t.Errorf("%d of 6 streams broke off; want only the first that found the dying instance", failed)
	}
}
