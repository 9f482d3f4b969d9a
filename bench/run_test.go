package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeServer streams max_tokens one-token chunks (and two WAV chunks when
// audio is asked for) and counts requests and the most seen in flight.
type fakeServer struct {
	*httptest.Server
	requests, inFlight, peak atomic.Int64
	mu                       sync.Mutex
	ids                      []string
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	f := &fakeServer{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		n := f.inFlight.Add(1)
		defer f.inFlight.Add(-1)
		for {
			p := f.peak.Load()
			if n <= p || f.peak.CompareAndSwap(p, n) {
				break
			}
		}
		f.mu.Lock()
		f.ids = append(f.ids, r.Header.Get("X-Request-Id"))
		f.mu.Unlock()
		var req struct {
			MaxTokens  int      `json:"max_tokens"`
			Modalities []string `json:"modalities"`
			Stream     bool     `json:"stream"`
			Prompt     string   `json:"prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream {
			http.Error(w, "bad request", 400)
			return
		}
		audio := slices.Contains(req.Modalities, "audio")
		mod := ""
		if audio {
			mod = `"modality":"text",`
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range req.MaxTokens {
			fmt.Fprintf(w, "data: {%s\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"text\":\"t%d \"}]}\n\n", mod, i, i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "data: {%s\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":%d}}\n\n", mod, req.MaxTokens)
		if audio {
			for range 2 {
				fmt.Fprintf(w, "data: {\"modality\":\"audio\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", wavChunk(t, 5))
			}
			fmt.Fprint(w, "data: {\"modality\":\"audio\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(f.Close)
	return f
}

func checkRecords(t *testing.T, res *Result, want int) {
	t.Helper()
	s := res.Summary
	if s.Completed != want || s.Failed != 0 || len(res.Requests) != want || res.Interrupted {
		t.Fatalf("completed %d, failed %d, records %d, interrupted %v; want %d completed: %+v", s.Completed, s.Failed, len(res.Requests), res.Interrupted, want, s.Errors)
	}
	for i, r := range res.Requests {
		if r.Index != i || !r.Success || r.TTFTMS > r.E2EMS || len(r.ITLMS) != r.TextChunks-1 || r.OutputTokens != r.MaxTokens || !r.OutputTokensReported {
			t.Errorf("request %d: %+v", i, r)
		}
	}
}

func TestRunClosedLoop(t *testing.T) {
	f := newFakeServer(t)
	res, err := Run(context.Background(), Config{
		Target:  Target{BaseURL: f.URL},
		Dataset: Random{InputLen: 8, OutputLen: 6},
		Load:    Load{Concurrency: 3, NumPrompts: 12},
		Warmup:  2,
		RunID:   "t",
	})
	if err != nil {
		t.Fatal(err)
	}
	checkRecords(t, res, 12)
	if got := f.requests.Load(); got != 14 {
		t.Errorf("server saw %d requests; want 12 measured + 2 warmup", got)
	}
	if p := f.peak.Load(); p > 3 {
		t.Errorf("%d requests in flight at once; the closed loop has 3 clients", p)
	}
	if res.Summary.TotalOutputTokens != 72 || res.Summary.TotalInputTokens != 84 || res.Summary.MetSLO != 12 {
		t.Errorf("summary %+v", res.Summary)
	}
	if !slices.Contains(f.ids, "t-0") || !slices.Contains(f.ids, "t-warmup-0") {
		t.Errorf("request ids %v", f.ids)
	}
}

func TestRunOpenLoopAudio(t *testing.T) {
	f := newFakeServer(t)
	res, err := Run(context.Background(), Config{
		Target:  Target{BaseURL: f.URL, Audio: true},
		Dataset: Random{InputLen: 8, OutputLen: 3},
		Load:    Load{RequestRate: 500, MaxConcurrency: 2, NumPrompts: 10},
		SLO:     SLO{RTF: 1000},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkRecords(t, res, 10)
	if p := f.peak.Load(); p > 2 {
		t.Errorf("%d in flight; --max-concurrency 2", p)
	}
	if s := res.Summary; s.AudioTTFP.Count != 10 || !near(s.TotalAudioS, 10*0.8) || s.AudioRTF.Count != 10 {
		t.Errorf("audio summary %+v", s)
	}
}

func TestRunCompletionsEndpoint(t *testing.T) {
	f := newFakeServer(t)
	res, err := Run(context.Background(), Config{
		Target:  Target{BaseURL: f.URL, Endpoint: EndpointCompletions},
		Dataset: Random{InputLen: 4, OutputLen: 2},
		Load:    Load{RequestRate: math.Inf(1), NumPrompts: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkRecords(t, res, 5)
}

// A duration bounds the run; every request it started is measured.
func TestRunDuration(t *testing.T) {
	f := newFakeServer(t)
	res, err := Run(context.Background(), Config{
		Target:  Target{BaseURL: f.URL},
		Dataset: Random{InputLen: 4, OutputLen: 2},
		Load:    Load{Concurrency: 2, Duration: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Requests); n == 0 || int64(n) != f.requests.Load() {
		t.Fatalf("%d records, server saw %d", n, f.requests.Load())
	}
	checkRecords(t, res, len(res.Requests))
}

// Errors are counted as failed requests with the OpenAI error's message,
// never as a crash.
func TestRunFailingServer(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) % 3 {
		case 0:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"error":{"message":"the prefill stage is unavailable","type":"upstream_error","param":null,"code":"prefill_upstream_unavailable"}}`)
		case 1:
			http.Error(w, "plain failure", http.StatusInternalServerError)
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n") // and no [DONE]
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{
		Target:  Target{BaseURL: srv.URL},
		Dataset: Random{InputLen: 4, OutputLen: 2},
		Load:    Load{Concurrency: 2, NumPrompts: 9},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summary
	if s.Completed != 0 || s.Failed != 9 || s.Goodput != 0 || s.SLOAttainment != 0 {
		t.Fatalf("summary %+v", s)
	}
	want := []string{
		"HTTP 500: plain failure",
		"HTTP 502: the prefill stage is unavailable (prefill_upstream_unavailable)",
		"reading the stream: openai: SSE stream ended without data: [DONE]: unexpected EOF",
	}
	var got []string
	for _, e := range s.Errors {
		if e.Count != 3 {
			t.Errorf("error %q counted %d times; want 3", e.Error, e.Count)
		}
		got = append(got, e.Error)
	}
	if !slices.Equal(got, want) {
		t.Errorf("errors %q\nwant   %q", got, want)
	}
	for _, r := range res.Requests {
		if r.Success || r.Error == "" {
			t.Errorf("%+v", r)
		}
	}
}

// An interrupt stops the run: requests in flight are cancelled and left out
// of the counts, and what finished is still reported.
func TestRunInterrupted(t *testing.T) {
	started := make(chan struct{}, 100)
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if calls.Add(1) == 1 {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
			return
		}
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		started <- struct{}{}
		<-r.Context().Done() // hang until the client gives up
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-started; cancel() }()
	res, err := Run(ctx, Config{
		Target:  Target{BaseURL: srv.URL},
		Dataset: Random{InputLen: 4, OutputLen: 1},
		Load:    Load{Concurrency: 1, NumPrompts: 50},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summary
	if !res.Interrupted || s.Completed != 1 || s.Canceled != 1 || s.Failed != 0 || len(res.Requests) != 2 {
		t.Errorf("interrupted %v, summary %+v, %d records", res.Interrupted, s, len(res.Requests))
	}
}

func TestRunRejectsUnboundedLoads(t *testing.T) {
	for name, l := range map[string]Load{
		"no bound":            {RequestRate: 1},
		"inf rate for a time": {RequestRate: math.Inf(1), Duration: time.Second},
		"zero rate":           {NumPrompts: 3},
		"negative burstiness": {RequestRate: 1, Burstiness: -1, NumPrompts: 1},
		"negative prompts":    {Concurrency: 1, NumPrompts: -1},
	} {
		if _, err := Run(context.Background(), Config{Target: Target{BaseURL: "http://127.0.0.1:1"}, Dataset: Random{InputLen: 1, OutputLen: 1}, Load: l}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Run(context.Background(), Config{Target: Target{BaseURL: "http://127.0.0.1:1", Endpoint: EndpointCompletions, Audio: true}, Dataset: Random{InputLen: 1, OutputLen: 1}, Load: Load{Concurrency: 1, NumPrompts: 1}}); err == nil {
		t.Error("audio over completions accepted")
	}
}

func TestSweep(t *testing.T) {
	f := newFakeServer(t)
	loads := []Load{{Concurrency: 1, NumPrompts: 4}, {Concurrency: 2, NumPrompts: 4}, {Concurrency: 4, NumPrompts: 4}}
	runs, err := Sweep(context.Background(), Config{Target: Target{BaseURL: f.URL}, Dataset: Random{InputLen: 4, OutputLen: 3}, Warmup: 1}, loads)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(f.ids, runs[0].Requests[0].RequestID) || !strings.Contains(runs[2].Requests[0].RequestID, "-p2-") {
		t.Errorf("request ids %v", f.ids)
	}
	if len(runs) != 3 || f.requests.Load() != 13 {
		t.Fatalf("%d runs, %d requests; want 3 runs of 4 and one warmup", len(runs), f.requests.Load())
	}
	for i, r := range runs {
		checkRecords(t, r, 4)
		if r.Load.Concurrency != loads[i].Concurrency {
			t.Errorf("run %d load %+v", i, r.Load)
		}
	}
}

// A server that ignores "stream" and answers one JSON body is measured
// too: its first token and its end coincide.
func TestRunWholeJSONAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: Target{BaseURL: srv.URL}, Dataset: Random{InputLen: 3, OutputLen: 2}, Load: Load{Concurrency: 2, NumPrompts: 4}})
	if err != nil {
		t.Fatal(err)
	}
	checkRecords(t, res, 4)
	for _, r := range res.Requests {
		if r.TTFTMS != r.E2EMS || r.PromptTokens != 5 {
			t.Errorf("%+v", r)
		}
	}
}

func TestFirstModel(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" || r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, `{"error":{"message":"invalid api key","type":"authentication_error"}}`, 401)
			return
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"omnipd-reference","object":"model"}]}`)
	}))
	defer srv.Close()
	hc := NewHTTPClient(1)
	if m, err := FirstModel(context.Background(), hc, srv.URL+"/", "k"); err != nil || m != "omnipd-reference" {
		t.Errorf("%q %v", m, err)
	}
	if _, err := FirstModel(context.Background(), hc, srv.URL, "wrong"); err == nil || !strings.Contains(err.Error(), "invalid api key") {
		t.Errorf("error %v", err)
	}
}

// A server may send [DONE] before the end of its body. The client reads on
// to that end, as the OpenAI SDKs do, so every request reuses the one
// connection: closing the body at [DONE] would drop the connection (the
// server sees its request cancelled) and make the next request dial anew,
// a cost of the client that would count against the server.
func TestRunReadsPastDoneAndReusesTheConnection(t *testing.T) {
	var conns, dropped atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		// The body's end follows a moment later, in a write of its own.
		select {
		case <-r.Context().Done():
			dropped.Add(1)
		case <-time.After(5 * time.Millisecond):
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: Target{BaseURL: srv.URL}, Dataset: Random{InputLen: 3, OutputLen: 1}, Load: Load{Concurrency: 1, NumPrompts: 6}})
	if err != nil {
		t.Fatal(err)
	}
	checkRecords(t, res, 6)
	if n, d := conns.Load(), dropped.Load(); n != 1 || d != 0 {
		t.Errorf("6 requests in a row used %d connections and dropped %d at [DONE]; want 1 and 0", n, d)
	}
}
