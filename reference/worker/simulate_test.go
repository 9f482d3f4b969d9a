package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/simulate"
)

// simSecret is the deployment secret of simulate-mode test workers (the
// one the shared request helpers present).
const simSecret = "s3cret"

// newSimWorker is a worker whose engine runs in simulate mode.
func newSimWorker(t testing.TB, kv string, p *simulate.Profile, clock engine.Clock) *testWorker {
	t.Helper()
	eng := runTestEngine(t, engine.Config{Simulate: p, Clock: clock})
	cfg, err := ParseKVTransferConfig(kv)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Engine: eng, KV: cfg, Secret: simSecret, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); srv.Close() })
	return &testWorker{Server: srv, url: hs.URL, eng: eng}
}

func mustProfile(t testing.TB, name string) *simulate.Profile {
	t.Helper()
	p, err := simulate.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recordingClock is an engine.Clock whose time moves only when the engine
// waits; it records each wait.
type recordingClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func (c *recordingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *recordingClock) Sleep(_ context.Context, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
}

func (c *recordingClock) recorded() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sleeps)
}

// In simulate mode PD still moves the prefill's KV blocks over the real
// side channel, both handshakes: the decode checks every imported position
// against what the prefill wrote (a mismatch would fail the request),
// computes only the last prompt token, and answers exactly what one
// colocated worker answers, max_tokens long.
func TestSimulatedPDOverConnector(t *testing.T) {
	zero := mustProfile(t, "zero")
	for _, handshake := range []string{HandshakePull, HandshakePush} {
		t.Run(handshake, func(t *testing.T) {
			colocated := newSimWorker(t, kvConfig("kv_both", "both-0", handshake), zero, nil)
			prefill := newSimWorker(t, kvConfig("kv_producer", "prefill-0", handshake), zero, nil)
			decode := newSimWorker(t, kvConfig("kv_consumer", "decode-0", handshake), zero, nil)
			rng := rand.New(rand.NewPCG(31, 32))
			for i, n := range []int{1, 2, 16, 17, 33, 100} {
				prompt := make([]int, n)
				for j := range prompt {
					prompt[j] = rng.IntN(256)
				}
				id := fmt.Sprintf("sim-%s-%d", handshake, i)
				b := body(prompt, 24, 0.8, int64(i))
				want, _, err := post(context.Background(), colocated.url, id, b)
				if err != nil {
					t.Fatal(err)
				}
				got, err := prefillDecode(context.Background(), prefill, decode, id, b, handshake == HandshakePush)
				if err != nil {
					t.Fatalf("prompt of %d: %v", n, err)
				}
				if len(want.Choices[0].TokenIDs) != 24 || want.Usage.CompletionTokens != 24 {
					t.Errorf("prompt of %d: %d tokens, want max_tokens 24", n, len(want.Choices[0].TokenIDs))
				}
				if !slices.Equal(got.Choices[0].TokenIDs, want.Choices[0].TokenIDs) || got.Choices[0].Text != want.Choices[0].Text {
					t.Errorf("prompt of %d: PD %q, colocated %q", n, got.Choices[0].Text, want.Choices[0].Text)
				}
				if c := got.Usage.PromptTokensDetails.CachedTokens; c != n-1 {
					t.Errorf("prompt of %d: %d cached tokens, want %d imported", n, c, n-1)
				}
			}
			if s := decode.eng.Stats(); s.KVImportFailures != 0 {
				t.Errorf("%d KV imports failed", s.KVImportFailures)
			}
			for name, w := range map[string]*testWorker{"colocated": colocated, "prefill": prefill, "decode": decode} {
				if u := blocksHeldAtRest(w); u != 0 {
					t.Errorf("%s worker holds %d KV blocks", name, u)
				}
			}
		})
	}
}

// Over the real connector, the decode waits out the modeled transfer of
// the prompt's KV (measured from when its import began), then one step for
// the last prompt position, then one decode step per further token; the
// prefill waits one prefill step.
func TestSimulatedTransferTimeOverConnector(t *testing.T) {
	p := mustProfile(t, "h100-qwen3-omni-30b-a3b")
	prefillClock, decodeClock := &recordingClock{}, &recordingClock{}
	prefill := newSimWorker(t, kvConfig("kv_producer", "prefill-0", HandshakePull), p, prefillClock)
	decode := newSimWorker(t, kvConfig("kv_consumer", "decode-0", HandshakePull), p, decodeClock)
	prompt := make([]int, 300)
	for i := range prompt {
		prompt[i] = 'a' + i%26
	}
	const maxTokens = 5
	got, err := prefillDecode(context.Background(), prefill, decode, "xfer", body(prompt, maxTokens, 0, 0), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Choices[0].TokenIDs) != maxTokens {
		t.Fatalf("%d tokens", len(got.Choices[0].TokenIDs))
	}
	if w, want := prefillClock.recorded(), []time.Duration{p.StepTime(300, 0)}; !slices.Equal(w, want) {
		t.Errorf("prefill waited %v, want %v", w, want)
	}
	want := []time.Duration{p.TransferTime(300), p.StepTime(1, 0)}
	for range maxTokens - 1 {
		want = append(want, p.StepTime(0, 1))
	}
	if w := decodeClock.recorded(); !slices.Equal(w, want) {
		t.Errorf("decode waited %v, want %v", w, want)
	}
	// 300 tokens x 96 KiB at 23.75 GB/s, plus 1 ms of setup.
	if tt := p.TransferTime(300); tt != time.Millisecond+1241735*time.Nanosecond {
		t.Errorf("modeled transfer of 300 tokens = %v", tt)
	}
}

// Streaming still happens per step: one SSE chunk per generated token,
// each with that token's text.
func TestSimulatedStreamsEveryToken(t *testing.T) {
	w := newSimWorker(t, "", mustProfile(t, "h100-qwen3-omni-30b-a3b"), &recordingClock{})
	const n = 12
	chunks := streamCompletion(t, w.url, `{"prompt":"Hello","max_tokens":12,"stream":true}`)
	var text strings.Builder
	for _, c := range chunks[:len(chunks)-1] {
		if len(c) != 1 {
			t.Errorf("chunk %q: want one token's text (one character)", c)
		}
		text.WriteString(c)
	}
	if len(chunks) != n {
		t.Errorf("%d chunks for %d tokens: %q", len(chunks), n, chunks)
	}
	whole, _, err := post(context.Background(), w.url, "whole", map[string]any{"prompt": "Hello", "max_tokens": n})
	if err != nil {
		t.Fatal(err)
	}
	if streamed := text.String() + chunks[len(chunks)-1]; streamed != whole.Choices[0].Text {
		t.Errorf("streamed %q, whole %q", streamed, whole.Choices[0].Text)
	}
}

// streamCompletion posts a streamed completion and returns each chunk's text.
func streamCompletion(t testing.TB, url, reqBody string) []string {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(reqBody))
	req.Header.Set("Authorization", "Bearer "+simSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("HTTP %d: %s", resp.StatusCode, b)
	}
	var texts []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			texts = append(texts, ch.Text)
		}
	}
	return texts
}

// BenchmarkZeroProfileWorker is omnipd's own cost per request and per
// token through a reference worker's HTTP API with the zero profile: what
// an overhead benchmark of the system measures, minus the network.
func BenchmarkZeroProfileWorker(b *testing.B) {
	w := newSimWorker(b, "", mustProfile(b, "zero"), nil)
	const tokens = 64
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			body := fmt.Appendf(nil, `{"prompt":"Hello, world","max_tokens":%d,"stream":%v}`, tokens, stream)
			client := &http.Client{}
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", w.url+"/v1/completions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+simSecret)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("HTTP %d", resp.StatusCode)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
		})
	}
}

// BenchmarkZeroProfilePD is one disaggregated request (prefill, KV over
// the side channel, decode) through two zero-profile workers.
func BenchmarkZeroProfilePD(b *testing.B) {
	zero := mustProfile(b, "zero")
	prefill := newSimWorker(b, kvConfig("kv_producer", "prefill-0", HandshakePull), zero, nil)
	decode := newSimWorker(b, kvConfig("kv_consumer", "decode-0", HandshakePull), zero, nil)
	prompt := make([]int, 200)
	for i := range prompt {
		prompt[i] = 'a' + i%26
	}
	i := 0
	for b.Loop() {
		i++
		if _, err := prefillDecode(context.Background(), prefill, decode, fmt.Sprint("bench-", i), body(prompt, 32, 0, 0), false); err != nil {
			b.Fatal(err)
		}
	}
}
