package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/stageclient"
)

var (
	testModel     = model.Default()
	testTokenizer = tokenizer.Default()
	quiet         = slog.New(slog.DiscardHandler)
)

const secret = "deployment-secret"

type refWorker struct {
	url  string
	srv  *worker.Server
	eng  *engine.Engine
	http *httptest.Server
	peer kvconnector.Peer
}

func startWorker(t *testing.T, kv string, engineID string) *refWorker {
	t.Helper()
	return startWorkerWith(t, kv, engineID, func(*worker.Config) {})
}

// startWorkerWith is startWorker with the worker's config adjusted.
func startWorkerWith(t *testing.T, kv string, engineID string, adjust func(*worker.Config)) *refWorker {
	t.Helper()
	eng, err := engine.New(testModel, testTokenizer, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	cfg, err := worker.ParseKVTransferConfig(kv)
	if err != nil {
		t.Fatal(err)
	}
	wcfg := worker.Config{Engine: eng, KV: cfg, Secret: secret, Logger: quiet}
	adjust(&wcfg)
	srv, err := worker.New(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	w := &refWorker{url: hs.URL, srv: srv, eng: eng, http: hs}
	w.peer = kvconnector.Peer{EngineID: engineID, HTTPAddr: strings.TrimPrefix(hs.URL, "http://"), TP: 1}
	if addr := srv.KVAddr(); addr != "" {
		host, port, _ := net.SplitHostPort(addr)
		w.peer.KVHost = host
		w.peer.KVPort, _ = strconv.Atoi(port)
	}
	t.Cleanup(func() { hs.Close(); srv.Close(); cancel(); <-done })
	return w
}

func kvJSON(role, engineID, handshake string) string {
	return fmt.Sprintf(`{"kv_connector":"ReferenceConnector","kv_role":%q,"engine_id":%q,"kv_ip":"127.0.0.1","kv_port":0,
		"kv_connector_extra_config":{"handshake":%q,"lease_seconds":5}}`, role, engineID, handshake)
}

func pool(t *testing.T, name string, ws ...*refWorker) *orchestrator.Pool {
	t.Helper()
	p := &orchestrator.Pool{Name: name}
	for _, w := range ws {
		c, err := stageclient.New(stageclient.Config{BaseURL: w.url, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		p.Instances = append(p.Instances, &orchestrator.Instance{Client: c, Peer: w.peer})
	}
	return p
}

type deployment struct {
	url     string
	workers []*refWorker
}

// pdDeployment is omnipd's handler in front of prefill and decode workers.
func pdDeployment(t *testing.T, handshake string, prefills int) *deployment {
	t.Helper()
	return pdDeploymentWith(t, handshake, prefills, func(*orchestrator.Config, *Config) {})
}

func pdDeploymentWith(t *testing.T, handshake string, prefills int, tune func(*orchestrator.Config, *Config)) *deployment {
	t.Helper()
	d := &deployment{}
	var pre []*refWorker
	for i := range prefills {
		w := startWorker(t, kvJSON("kv_producer", fmt.Sprintf("prefill-%d", i), handshake), fmt.Sprintf("prefill-%d", i))
		pre = append(pre, w)
	}
	dec := startWorker(t, kvJSON("kv_consumer", "decode-0", handshake), "decode-0")
	contract, err := kvconnector.NewRegistry().Lookup("ReferenceConnector", map[string]any{"handshake": handshake})
	if err != nil {
		t.Fatal(err)
	}
	ocfg := orchestrator.Config{
		Prefill: pool(t, "prefill", pre...), Decode: pool(t, "decode", dec), Contract: contract,
		PrefillRetries: 1, PrefillTimeout: 10 * time.Second, Logger: quiet, Metrics: metrics.NewOrchestrator(),
	}
	scfg := Config{ModelName: "omnipd-reference", Logger: quiet, Metrics: ocfg.Metrics}
	tune(&ocfg, &scfg)
	o, err := orchestrator.New(ocfg)
	if err != nil {
		t.Fatal(err)
	}
	scfg.Orchestrator = o
	hs := httptest.NewServer(New(scfg))
	t.Cleanup(hs.Close)
	d.url = hs.URL
	d.workers = append(pre, dec)
	return d
}

func colocatedDeployment(t *testing.T) *deployment {
	t.Helper()
	w := startWorker(t, "", "")
	o, err := orchestrator.New(orchestrator.Config{Decode: pool(t, "thinker", w), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(New(Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: quiet}))
	t.Cleanup(hs.Close)
	return &deployment{url: hs.URL, workers: []*refWorker{w}}
}

func chatBody(content string, seed int, stream bool) string {
	return fmt.Sprintf(`{"model":"omnipd-reference","messages":[{"role":"user","content":%q}],"max_tokens":12,"temperature":0.8,"seed":%d,"stream":%v}`, content, seed, stream)
}

func postChat(ctx context.Context, url, body string) (int, http.Header, string, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}

// streamText reads an SSE chat stream and returns its text.
func streamText(t *testing.T, body string) string {
	t.Helper()
	var text strings.Builder
	sc := bufio.NewScanner(strings.NewReader(body))
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || c.Error != nil {
			t.Fatalf("bad chunk %s", data)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if !done {
		t.Fatalf("stream without [DONE]: %s", body)
	}
	return text.String()
}

func messageText(t *testing.T, body string) string {
	t.Helper()
	var c struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		KVTransferParams any `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("bad response %s", body)
	}
	if c.KVTransferParams != nil {
		t.Errorf("the client sees the engines' kv_transfer_params: %v", c.KVTransferParams)
	}
	return c.Choices[0].Message.Content
}

// Through omnipd's handler, PD text equals the colocated Thinker's text for
// the same seeded requests, streamed and not, in both handshakes.
func TestPDEqualsColocatedThroughTheAPI(t *testing.T) {
	colocated := colocatedDeployment(t)
	for _, handshake := range []string{"pull", "push"} {
		t.Run(handshake, func(t *testing.T) {
			pd := pdDeployment(t, handshake, 1)
			for i := range 12 {
				content := strings.Repeat("omni ", i*3) + fmt.Sprint(i)
				for _, stream := range []bool{false, true} {
					body := chatBody(content, i, stream)
					_, _, want, err := postChat(context.Background(), colocated.url, body)
					if err != nil {
						t.Fatal(err)
					}
					status, hdr, got, err := postChat(context.Background(), pd.url, body)
					if err != nil || status != 200 {
						t.Fatalf("PD: %d %v %s", status, err, got)
					}
					if p := hdr.Get("X-Omnipd-Pd-Path"); p != orchestrator.PathDisaggregated {
						t.Errorf("path header %q", p)
					}
					if stream {
						if g, w := streamText(t, got), streamText(t, want); g != w {
							t.Errorf("request %d streamed: PD %q, colocated %q", i, g, w)
						}
					} else if g, w := messageText(t, got), messageText(t, want); g != w {
						t.Errorf("request %d: PD %q, colocated %q", i, g, w)
					}
				}
			}
			for _, w := range pd.workers {
				if u := w.eng.Cache().Used(); u != 0 {
					t.Errorf("a worker holds %d KV blocks", u)
				}
			}
		})
	}
}

func TestConcurrentMixedRequests(t *testing.T) {
	pd := pdDeployment(t, "pull", 2)
	var wg sync.WaitGroup
	errs := make(chan string, 200)
	sem := make(chan struct{}, 32)
	for i := range 200 {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			status, _, body, err := postChat(context.Background(), pd.url, chatBody(fmt.Sprint("request ", i), i, i%2 == 0))
			if err != nil || status != 200 {
				errs <- fmt.Sprintf("request %d: %d %v %.200s", i, status, err, body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// A client that disconnects mid-stream leaves no KV block used anywhere.
func TestClientDisconnectMidStream(t *testing.T) {
	pd := pdDeployment(t, "pull", 1)
	for i := range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", pd.url+"/v1/chat/completions",
			strings.NewReader(fmt.Sprintf(`{"messages":[{"role":"user","content":"hi %d"}],"max_tokens":2000,"stream":true,"ignore_eos":true}`, i)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		for range 3 {
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		resp.Body.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		used := 0
		for _, w := range pd.workers {
			used += w.eng.Cache().Used()
		}
		if used == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, w := range pd.workers {
		if u := w.eng.Cache().Used(); u != 0 {
			t.Errorf("a worker holds %d KV blocks after its clients left", u)
		}
	}
}

// A dead prefill worker is retried on another instance; with none left the
// client gets a clean 502 naming the failure, never a hang.
func TestPrefillWorkerDies(t *testing.T) {
	pd := pdDeployment(t, "pull", 2)
	// One prefill instance dies while requests are in flight: each ends,
	// within its deadline, with an answer or a clean error.
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			status, _, body, err := postChat(ctx, pd.url, chatBody(fmt.Sprint("in flight ", i), i, i%2 == 0))
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			} else if status != 200 && status != 502 {
				t.Errorf("request %d: %d %s", i, status, body)
			}
		})
		if i == 8 {
			pd.workers[0].http.CloseClientConnections()
			pd.workers[0].http.Close()
		}
	}
	wg.Wait()
	for i := range 4 {
		status, _, body, err := postChat(context.Background(), pd.url, chatBody(fmt.Sprint("x", i), i, false))
		if err != nil || status != 200 {
			t.Fatalf("with one prefill left, request %d: %d %v %s", i, status, err, body)
		}
	}
	pd.workers[1].http.Close() // and the other
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	status, _, body, err := postChat(ctx, pd.url, chatBody("y", 1, false))
	if err != nil {
		t.Fatal(err)
	}
	if status != 502 || !strings.Contains(body, "prefill_upstream_unavailable") {
		t.Errorf("with no prefill left: %d %s", status, body)
	}
}

func TestAPIErrors(t *testing.T) {
	pd := pdDeployment(t, "pull", 1)
	for _, c := range []struct {
		body   string
		status int
	}{
		{`{"model":"other","messages":[{"role":"user","content":"x"}]}`, 404},
		{`{"messages":[]}`, 400},
		{`{"messages":`, 400},
		{`{"messages":[{"role":"user","content":"x"}],"max_tokens":-5}`, 400},
	} {
		status, hdr, body, err := postChat(context.Background(), pd.url, c.body)
		if err != nil || status != c.status || !strings.Contains(body, `"error"`) || hdr.Get("X-Request-Id") == "" {
			t.Errorf("%s: %d %v %s", c.body, status, err, body)
		}
	}
	// Client-sent kv_transfer_params never reach an engine: they are
	// refused, naming the field (TestClientKVParamsNeverReachAnEngine).
	status, _, body, _ := postChat(context.Background(), pd.url,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"kv_transfer_params":{"do_remote_prefill":true}}`)
	if status != 400 || !strings.Contains(body, `"param":"kv_transfer_params"`) {
		t.Errorf("client kv_transfer_params: %d %s", status, body)
	}
}

func metricsText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Prompts below pd.min_prefill_tokens skip the prefill, are counted, and say
// so in the path header; longer ones are disaggregated.
func TestConditionalDisaggregation(t *testing.T) {
	pd := pdDeploymentWith(t, "pull", 1, func(o *orchestrator.Config, _ *Config) { o.MinPrefillTokens = 40 })
	for _, c := range []struct {
		content, path string
	}{
		{"hi", orchestrator.PathDecodeOnly},                    // under the byte bound
		{strings.Repeat("a", 20), orchestrator.PathDecodeOnly}, // counted by /tokenize: 20 + 19 < 40
		{strings.Repeat("long prompt ", 10), orchestrator.PathDisaggregated},
	} {
		status, hdr, body, err := postChat(context.Background(), pd.url, chatBody(c.content, 1, false))
		if err != nil || status != 200 {
			t.Fatalf("%q: %d %v %s", c.content, status, err, body)
		}
		if got := hdr.Get("X-Omnipd-Pd-Path"); got != c.path {
			t.Errorf("%q: path %q, want %q", c.content, got, c.path)
		}
	}
	m := metricsText(t, pd.url)
	for _, want := range []string{"omnipd_pd_decode_only_total 2", `omnipd_requests_total{path="decode-only",status="200"} 2`, `omnipd_requests_total{path="disaggregated",status="200"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// With pd.fallback: local, a request whose prefill cannot be served is
// prefilled by the decode itself — counted and visible, never silent.
// Without it, the client gets the 502.
func TestFallbackIsVisible(t *testing.T) {
	for _, local := range []bool{false, true} {
		pd := pdDeploymentWith(t, "pull", 1, func(o *orchestrator.Config, _ *Config) { o.FallbackLocal = local })
		pd.workers[0].http.Close()
		status, hdr, body, err := postChat(context.Background(), pd.url, chatBody("fallback", 3, false))
		if err != nil {
			t.Fatal(err)
		}
		if !local {
			if status != 502 {
				t.Errorf("without fallback: %d %s", status, body)
			}
			continue
		}
		if status != 200 || hdr.Get("X-Omnipd-Pd-Path") != orchestrator.PathFallback {
			t.Errorf("with fallback: %d path %q %s", status, hdr.Get("X-Omnipd-Pd-Path"), body)
		}
		if m := metricsText(t, pd.url); !strings.Contains(m, "omnipd_pd_fallbacks_total 1") || !strings.Contains(m, "omnipd_prefill_retries_total") {
			t.Errorf("fallback not counted:\n%s", m)
		}
	}
}

func TestLimits(t *testing.T) {
	block := make(chan struct{})
	started := make(chan struct{}, 1)
	slow := orchestratorFunc(func(ctx context.Context, _ *orchestrator.Request) (*orchestrator.Result, error) {
		started <- struct{}{}
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	})
	hs := httptest.NewServer(New(Config{Orchestrator: slow, ModelName: "m", MaxConcurrent: 1, MaxBodyBytes: 1024, Logger: quiet}))
	defer hs.Close()
	defer close(block)

	status, _, body, _ := postChat(context.Background(), hs.URL, `{"messages":[{"role":"user","content":"`+strings.Repeat("x", 2048)+`"}]}`)
	if status != 413 || !strings.Contains(body, `"error"`) {
		t.Errorf("oversized body: %d %s", status, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go postChat(ctx, hs.URL, `{"messages":[{"role":"user","content":"x"}]}`)
	<-started
	req, _ := http.NewRequest("POST", hs.URL+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"y"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("over the concurrency limit: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

type orchestratorFunc func(context.Context, *orchestrator.Request) (*orchestrator.Result, error)

func (f orchestratorFunc) Do(ctx context.Context, r *orchestrator.Request) (*orchestrator.Result, error) {
	return f(ctx, r)
}

// With the push handshake (prefill and decode sent together) a dead prefill
// instance is retried too: both legs start again with another prefill.
func TestPushPrefillRetried(t *testing.T) {
	pd := pdDeployment(t, "push", 2)
	pd.workers[0].http.Close()
	for i := range 4 {
		status, _, body, err := postChat(context.Background(), pd.url, chatBody(fmt.Sprint("push ", i), i, i%2 == 0))
		if err != nil || status != 200 {
			t.Fatalf("request %d: %d %v %s", i, status, err, body)
		}
	}
	if m := metricsText(t, pd.url); !strings.Contains(m, "omnipd_prefill_retries_total 1") {
		t.Errorf("want exactly one retry (the dead instance is then ejected):\n%s", m)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range pd.workers[1:] {
		for w.eng.Cache().Used() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if u := w.eng.Cache().Used(); u != 0 {
			t.Errorf("a worker holds %d KV blocks", u)
		}
	}
}
