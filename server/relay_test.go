package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/stageclient"
)

// countingListener counts the Write calls made on the connections it
// accepts: each is one write(2) of the server, so the count is how many
// times the relay flushed.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// thinkerOrchestrator is an orchestrator over one Thinker stage served by
// stage, and its metrics.
func thinkerOrchestrator(tb testing.TB, stage http.Handler) (*orchestrator.Orchestrator, *metrics.Orchestrator) {
	tb.Helper()
	up := httptest.NewServer(stage)
	tb.Cleanup(up.Close)
	c, err := stageclient.New(stageclient.Config{BaseURL: up.URL, Secret: secret})
	if err != nil {
		tb.Fatal(err)
	}
	m := metrics.NewOrchestrator()
	o, err := orchestrator.New(orchestrator.Config{
		Decode: &orchestrator.Pool{Name: "thinker", Instances: []*orchestrator.Instance{{Client: c}}}, Logger: quiet, Metrics: m,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return o, m
}

// relayServer is omnipd's handler over one Thinker stage, served on a
// listener that counts the handler's writes.
func relayServer(tb testing.TB, stage http.HandlerFunc) (string, *countingListener) {
	tb.Helper()
	o, m := thinkerOrchestrator(tb, stage)
	hs := httptest.NewUnstartedServer(New(Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: quiet, Metrics: m}))
	l := &countingListener{Listener: hs.Listener}
	hs.Listener = l
	hs.Start()
	tb.Cleanup(hs.Close)
	return hs.URL, l
}

func relayChunk(i int) string {
	return fmt.Sprintf(`{"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"omnipd-reference","choices":[{"index":0,"delta":{"content":"token %d"},"finish_reason":null}]}`, i)
}

// withoutID is a chunk with its id blanked: the orchestrator gives every
// relayed chunk omnipd's own id, so the bytes of the rest are what must
// pass through unchanged.
func withoutID(chunk []byte) string {
	return chunkID.ReplaceAllString(string(chunk), `"id":""`)
}

var chunkID = regexp.MustCompile(`"id":"[^"]*"`)

func sseEvents(payloads ...string) string {
	var b strings.Builder
	for _, p := range payloads {
		b.WriteString("data: " + p + "\n\n")
	}
	return b.String()
}

// Events that reach omnipd together leave together, in one write, and none
// waits for a later one: the stage sends a burst and then holds the stream
// open until the client has had everything it sent, so an event held back
// for more hangs the test (until the guard below) instead of passing.
func TestRelayCoalescesOnlyWhatArrivedTogether(t *testing.T) {
	tests := []struct {
		name   string
		burst  string // written in one write, then the stage waits
		before []string
		rest   string // written once the client has read before
		after  []string
	}{
		{
			name:   "three whole events",
			burst:  sseEvents(relayChunk(1), relayChunk(2), relayChunk(3)),
			before: []string{relayChunk(1), relayChunk(2), relayChunk(3)},
			rest:   sseEvents(relayChunk(4), "[DONE]"),
			after:  []string{relayChunk(4)},
		},
		{
			// A half-received event must not hold back the whole ones
			// queued before it.
			name:   "two whole events and half of the third",
			burst:  sseEvents(relayChunk(1), relayChunk(2)) + "data: " + relayChunk(3)[:40],
			before: []string{relayChunk(1), relayChunk(2)},
			rest:   relayChunk(3)[40:] + "\n\n" + sseEvents("[DONE]"),
			after:  []string{relayChunk(3)},
		},
		{
			// An event whose blank line has not arrived is not complete:
			// the next line could still continue its data.
			name:   "one event without its blank line",
			burst:  sseEvents(relayChunk(1)) + "data: " + relayChunk(2) + "\n",
			before: []string{relayChunk(1)},
			rest:   "\n" + sseEvents("[DONE]"),
			after:  []string{relayChunk(2)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			url, l := relayServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tt.burst)
				_ = http.NewResponseController(w).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, tt.rest)
			})
			// Only a guard against a hung test: no event may wait for the
			// release, so nothing here comes near it.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions",
				strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			sse := openai.NewSSEReader(resp.Body, 0)
			for i, want := range tt.before {
				got, err := sse.Next()
				if err != nil {
					t.Fatalf("event %d of the burst: %v (held back until the stage sent more?)", i+1, err)
				}
				if withoutID(got) != withoutID([]byte(want)) {
					t.Fatalf("event %d = %s, want %s (ids aside: omnipd puts its own)", i+1, got, want)
				}
			}
			// The stage is still waiting: every write so far carried the
			// burst (and the response's headers).
			if n := l.writes.Load(); n != 1 {
				t.Errorf("the burst left omnipd in %d writes, want 1", n)
			}
			close(release)
			for i, want := range tt.after {
				got, err := sse.Next()
				if err != nil || withoutID(got) != withoutID([]byte(want)) {
					t.Fatalf("event %d after the burst = %s, %v; want %s", i+1, got, err, want)
				}
			}
			if _, err := sse.Next(); err != io.EOF {
				t.Errorf("end of stream: %v, want [DONE]", err)
			}
			if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
				t.Errorf("after [DONE]: %q, %v; want the end of the body", rest, err)
			}
			// The rest of the stream, its [DONE] and the chunked body's end
			// left in one more write.
			if n := l.writes.Load(); n != 2 {
				t.Errorf("the stream left omnipd in %d writes, want 2", n)
			}
		})
	}
}

// BenchmarkRelay is one streamed request through omnipd's handler: an
// 18-event stream from a stage that sends its events burst at a time (one
// write each), relayed to an HTTP client on loopback. writes/op counts the
// relay's write calls.
func BenchmarkRelay(b *testing.B) {
	const events = 18
	var body []string
	for i := range events {
		body = append(body, relayChunk(i))
	}
	for _, burst := range []int{1, 3, 18} {
		b.Run(fmt.Sprintf("burst=%d", burst), func(b *testing.B) {
			url, l := relayServer(b, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				for i := 0; i < events; i += burst {
					_, _ = io.WriteString(w, sseEvents(body[i:min(i+burst, events)]...))
					_ = rc.Flush()
				}
				_, _ = io.WriteString(w, sseEvents("[DONE]"))
			})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			b.Cleanup(client.CloseIdleConnections)
			const reqBody = `{"messages":[{"role":"user","content":"hi"}],"stream":true}`
			want := withoutID([]byte(sseEvents(append(body, "[DONE]")...)))
			checked := false
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(reqBody))
				if err != nil {
					b.Fatal(err)
				}
				if !checked {
					var got []byte
					got, err = io.ReadAll(resp.Body)
					if err == nil && withoutID(got) != want {
						b.Fatalf("relayed %s, want %s (ids aside: omnipd puts its own)", got, want)
					}
					checked = true
				} else {
					_, err = io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					b.Fatalf("HTTP %d, %v", resp.StatusCode, err)
				}
			}
			b.ReportMetric(float64(l.writes.Load())/float64(b.N), "writes/op")
		})
	}
}
