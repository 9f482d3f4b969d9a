//go:build unix

package stageclient

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU, user and system, the process has used: on a shared
// two-core machine a steadier measure than wall time, and the one a
// transport's goroutine hand-offs show up in.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTransport runs Post (a prefill's whole answer) and Stream (a
// decode's 8 chunks and [DONE]) against an in-process server over
// net/http's transport and over leanTransport, by one caller and by 16 at
// once. The server shares the process, so ns/op and allocs/op include its
// side of each exchange, which is the same for both transports. cpu-ns/op
// is the process's CPU time (user and system) per call.
//
//	go test -run '^$' -bench Transport -benchmem ./stageclient/
func BenchmarkTransport(b *testing.B) {
	const answer = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"!","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13},"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e0","remote_block_ids":[1,2,3],"remote_host":"10.0.0.1","remote_port":5600}}`
	const chunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Path == "/v1/completions" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, answer)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for range 8 {
			writeEvents(w, chunk)
		}
		writeEvents(w, "[DONE]")
	}))
	defer srv.Close()
	body := []byte(`{"model":"m","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)

	clients := map[string]func(b *testing.B) *Client{
		"net-http": func(b *testing.B) *Client {
			tr := newTransport()
			b.Cleanup(tr.CloseIdleConnections)
			c, err := New(Config{BaseURL: srv.URL, HTTP: &http.Client{Transport: tr,
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}})
			if err != nil {
				b.Fatal(err)
			}
			return c
		},
		"lean": func(b *testing.B) *Client {
			tr := newLeanTransport()
			b.Cleanup(tr.CloseIdleConnections)
			c, err := New(Config{BaseURL: srv.URL})
			if err != nil {
				b.Fatal(err)
			}
			c.lean = tr
			return c
		},
	}
	calls := map[string]func(b *testing.B, c *Client){
		"Post": func(b *testing.B, c *Client) {
			if _, err := c.Post(b.Context(), "/v1/completions", "r", body); err != nil {
				b.Error(err) // not Fatal: this may run in RunParallel's goroutines
			}
		},
		"Stream": func(b *testing.B, c *Client) {
			s, err := c.Stream(b.Context(), "/v1/chat/completions", "r", body)
			if err != nil {
				b.Error(err)
				return
			}
			defer s.Close()
			for {
				if _, err := s.Next(); err == io.EOF {
					return
				} else if err != nil {
					b.Error(err)
					return
				}
			}
		},
	}
	for _, call := range []string{"Post", "Stream"} {
		for _, name := range []string{"net-http", "lean"} {
			for _, callers := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%s/callers=%d", call, name, callers), func(b *testing.B) {
					c := clients[name](b)
					do := calls[call]
					b.ReportAllocs()
					start := cpuTime()
					if callers == 1 {
						for b.Loop() {
							do(b, c)
						}
					} else {
						b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								do(b, c)
							}
						})
					}
					b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
				})
			}
		}
	}
}
