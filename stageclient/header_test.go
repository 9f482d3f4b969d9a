package stageclient

import (
	"net/http"
	"strings"
	"testing"
)

// A leg's own headers (vLLM's X-data-parallel-rank) reach the instance on
// Post and Stream, beside the headers every call carries, over both the
// lean transport and a caller's http.Client.
func TestLegHeaders(t *testing.T) {
	for _, custom := range []bool{false, true} {
		var cfg Config
		if custom {
			cfg.HTTP = &http.Client{}
		}
		got := make(chan http.Header, 2)
		c := serve(t, cfg, func(w http.ResponseWriter, r *http.Request) {
			got <- r.Header.Clone()
			if strings.Contains(r.Header.Get("Accept"), "event-stream") {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write([]byte("data: {}\n\ndata: [DONE]\n\n"))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{}`))
		})
		h := http.Header{"X-Data-Parallel-Rank": {"1"}}
		if _, err := c.PostWith(testCtx(t), "/v1/completions", "req-1", h, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		s, err := c.StreamWith(testCtx(t), "/v1/completions", "req-1", h, []byte(`{"stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		for _, leg := range []string{"post", "stream"} {
			hdr := <-got
			if hdr.Get("X-data-parallel-rank") != "1" || hdr.Get("X-Request-Id") != "req-1" {
				t.Errorf("custom client %v, %s: headers %v; want X-data-parallel-rank 1 and X-Request-Id req-1", custom, leg, hdr)
			}
		}
	}
}

// A leg's headers cannot replace the ones the client owns, nor split
// headers.
func TestLegHeadersRefused(t *testing.T) {
	c := serve(t, Config{}, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("request sent with refused headers %v", r.Header)
	})
	for _, h := range []http.Header{
		{"X-Request-Id": {"other"}},
		{"Authorization": {"Bearer x"}},
		{"Content-Type": {"text/plain"}},
		{"X-Data-Parallel-Rank": {"1\r\nX-Evil: 1"}},
	} {
		if _, err := c.PostWith(testCtx(t), "/v1/completions", "req-1", h, []byte(`{}`)); err == nil {
			t.Errorf("PostWith %v: no error", h)
		}
		if s, err := c.StreamWith(testCtx(t), "/v1/completions", "req-1", h, []byte(`{}`)); err == nil {
			s.Close()
			t.Errorf("StreamWith %v: no error", h)
		}
	}
}
