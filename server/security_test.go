package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/stageclient"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

const apiKey = "sk-omnipd-test-key"

// recordingStage is a Thinker stage that answers every request and keeps
// what it was sent; block, when set, holds each request until it is closed.
type recordingStage struct {
	mu     sync.Mutex
	bodies []map[string]any
	ids    []string
	calls  []string // "METHOD /path" of every request, in order
	block  chan struct{}
	got    chan struct{}
}

func (s *recordingStage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	s.bodies = append(s.bodies, body)
	s.ids = append(s.ids, r.Header.Get("X-Request-Id"))
	s.calls = append(s.calls, r.Method+" "+r.URL.Path)
	s.mu.Unlock()
	if s.got != nil {
		s.got <- struct{}{}
	}
	if s.block != nil {
		select {
		case <-s.block:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"omnipd-reference",
		"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],
		"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

func (s *recordingStage) received() ([]map[string]any, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.bodies...), append([]string(nil), s.ids...)
}

// behindStage is omnipd's handler over one recording Thinker stage.
func behindStage(t *testing.T, stage http.Handler, tune func(*orchestrator.Pool, *Config)) string {
	t.Helper()
	hs := httptest.NewServer(stage)
	t.Cleanup(hs.Close)
	c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	p := &orchestrator.Pool{Name: "thinker", Instances: []*orchestrator.Instance{{Client: c}}}
	cfg := Config{ModelName: "omnipd-reference", Logger: quiet, Metrics: metrics.NewOrchestrator()}
	tune(p, &cfg)
	o, err := orchestrator.New(orchestrator.Config{Decode: p, Logger: quiet, Metrics: cfg.Metrics})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Orchestrator = o
	srv := httptest.NewServer(New(cfg))
	t.Cleanup(srv.Close)
	return srv.URL
}

func send(t *testing.T, method, url, auth, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// syncBuffer is a log sink tests can read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// With an API key, /v1/* needs "Authorization: Bearer <key>": anything else
// is a 401 in OpenAI's shape with WWW-Authenticate, and nothing reaches a
// stage. /health and /metrics stay open unless asked; the key is never
// logged or echoed.
func TestAPIKey(t *testing.T) {
	stage := &recordingStage{}
	logs := &syncBuffer{}
	var m *metrics.Orchestrator
	url := behindStage(t, stage, func(_ *orchestrator.Pool, c *Config) {
		c.APIKey = apiKey
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		m = c.Metrics
	})
	chat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	const wantBody = `{"error":{"message":%q,"type":"invalid_request_error","param":null,"code":"invalid_api_key"}}` + "\n"
	for _, c := range []struct {
		name, auth, message string
	}{
		{"no key", "", `missing API key: send it as "Authorization: Bearer <key>"`},
		{"wrong key", "Bearer sk-wrong-key", "incorrect API key provided"},
		{"key with a suffix", "Bearer " + apiKey + "x", "incorrect API key provided"},
		{"other scheme", "Basic " + apiKey, `missing API key: send it as "Authorization: Bearer <key>"`},
		{"bare key", apiKey, `missing API key: send it as "Authorization: Bearer <key>"`},
	} {
		for _, target := range []struct{ method, path, body string }{
			{"POST", "/v1/chat/completions", chat},
			{"POST", "/v1/completions", `{"prompt":"hi","max_tokens":2}`},
			{"GET", "/v1/models", ""},
			{"GET", "/v1/no-such-route", ""},
		} {
			status, hdr, body := send(t, target.method, url+target.path, c.auth, target.body)
			if status != 401 || hdr.Get("WWW-Authenticate") != "Bearer" || body != fmt.Sprintf(wantBody, c.message) {
				t.Errorf("%s %s, %s: %d WWW-Authenticate %q %s", target.method, target.path, c.name, status, hdr.Get("WWW-Authenticate"), body)
			}
			if hdr.Get("X-Request-Id") == "" {
				t.Errorf("%s %s, %s: no X-Request-Id on the refusal", target.method, target.path, c.name)
			}
		}
	}
	if bodies, _ := stage.received(); len(bodies) != 0 {
		t.Fatalf("unauthenticated requests reached the stage: %v", bodies)
	}
	for _, path := range []string{"/health", "/metrics"} {
		if status, _, body := send(t, "GET", url+path, "", ""); status != 200 {
			t.Errorf("%s without a key: %d %s; want it open by default", path, status, body)
		}
	}
	if status, _, body := send(t, "POST", url+"/v1/chat/completions", "Bearer "+apiKey, chat); status != 200 {
		t.Errorf("with the key: %d %s", status, body)
	}
	if status, _, body := send(t, "GET", url+"/v1/models", "bearer "+apiKey, ""); status != 200 {
		t.Errorf("with the key, scheme in lower case: %d %s", status, body)
	}
	if bodies, _ := stage.received(); len(bodies) != 1 {
		t.Errorf("the stage received %d requests, want the 1 authenticated chat", len(bodies))
	}
	if text := scrape(t, m); !strings.Contains(text, `omnipd_requests_total{path="none",status="401"} 20`) {
		t.Errorf("refusals are not counted:\n%s", text)
	}

	// The official client sees OpenAI's error, and works with the key.
	ask := func(key string) error {
		client := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: "omnipd-reference", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(2),
		})
		return err
	}
	var oe *openai.Error
	if err := ask("sk-wrong-key"); !errors.As(err, &oe) || oe.StatusCode != 401 || oe.Code != "invalid_api_key" || oe.Type != "invalid_request_error" {
		t.Errorf("the official client with a wrong key: %v", err)
	}
	if err := ask(apiKey); err != nil {
		t.Errorf("the official client with the key: %v", err)
	}
	if l := logs.String(); strings.Contains(l, apiKey) || strings.Contains(l, "sk-wrong-key") {
		t.Errorf("a key reached the log:\n%s", l)
	}
}

// --auth-health and --auth-metrics put the probes behind the key too.
func TestAPIKeyOnHealthAndMetrics(t *testing.T) {
	url := behindStage(t, &recordingStage{}, func(_ *orchestrator.Pool, c *Config) {
		c.APIKey, c.AuthHealth, c.AuthMetrics = apiKey, true, true
	})
	for _, path := range []string{"/health", "/metrics"} {
		if status, hdr, body := send(t, "GET", url+path, "", ""); status != 401 || hdr.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("%s without the key: %d %s", path, status, body)
		}
		if status, _, body := send(t, "GET", url+path, "Bearer "+apiKey, ""); status != 200 {
			t.Errorf("%s with the key: %d %s", path, status, body)
		}
	}
}

func scrape(t *testing.T, m *metrics.Orchestrator) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// kv_transfer_params (and omnipd_conditioning) from a client are refused
// with a 400 naming where they were, in every shape the decoder accepts,
// and the stage receives nothing; a request without them reaches the stage
// without them.
func TestClientKVParamsNeverReachAnEngine(t *testing.T) {
	stage := &recordingStage{}
	url := behindStage(t, stage, func(*orchestrator.Pool, *Config) {})
	kv := `{"do_remote_prefill":true,"remote_engine_id":"p0","remote_block_ids":[1],"remote_host":"127.0.0.1","remote_port":1,"remote_request_id":"victim"}`
	for _, c := range []struct {
		path, fields, param string
	}{
		{"/v1/chat/completions", `"kv_transfer_params":` + kv, "kv_transfer_params"},
		{"/v1/completions", `"kv_transfer_params":` + kv, "kv_transfer_params"},
		{"/v1/chat/completions", `"kv_transfer_params":{}`, "kv_transfer_params"},
		{"/v1/chat/completions", `"vllm_xargs":{"kv_transfer_params":` + kv + `}`, "vllm_xargs.kv_transfer_params"},
		{"/v1/completions", `"vllm_xargs":{"kv_transfer_params":` + kv + `}`, "vllm_xargs.kv_transfer_params"},
		{"/v1/chat/completions", `"extra_body":{"kv_transfer_params":` + kv + `}`, "extra_body.kv_transfer_params"},
		{"/v1/completions", `"extra_body":{"kv_transfer_params":` + kv + `}`, "extra_body.kv_transfer_params"},
		{"/v1/chat/completions", `"omnipd_conditioning":{"key":"victim/decode","layer":2}`, "omnipd_conditioning"},
		{"/v1/chat/completions", `"extra_body":{"omnipd_conditioning":{"key":"k","layer":2}}`, "extra_body.omnipd_conditioning"},
	} {
		body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,` + c.fields + `}`
		if c.path == "/v1/completions" {
			body = `{"prompt":"hi","max_tokens":2,` + c.fields + `}`
		}
		status, _, resp := send(t, "POST", url+c.path, "", body)
		var e struct {
			Error struct{ Param, Type string } `json:"error"`
		}
		if status != 400 || json.Unmarshal([]byte(resp), &e) != nil || e.Error.Param != c.param || e.Error.Type != "invalid_request_error" {
			t.Errorf("%s with %.60s: %d %s; want 400 on %s", c.path, c.fields, status, resp, c.param)
		}
	}
	if bodies, _ := stage.received(); len(bodies) != 0 {
		t.Fatalf("refused requests reached the stage: %v", bodies)
	}
	// null is JSON for "not given"; other vllm_xargs pass on untouched.
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"kv_transfer_params":null}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"vllm_xargs":{"tenant":"a"}}`,
	} {
		if status, _, resp := send(t, "POST", url+"/v1/chat/completions", "", body); status != 200 {
			t.Errorf("%s: %d %s", body, status, resp)
		}
	}
	bodies, _ := stage.received()
	if len(bodies) != 2 {
		t.Fatalf("the stage received %d requests, want 2", len(bodies))
	}
	for _, b := range bodies {
		if _, ok := b["kv_transfer_params"]; ok {
			t.Errorf("the stage was sent kv_transfer_params: %v", b)
		}
		if xargs, ok := b["vllm_xargs"].(map[string]any); ok && xargs["kv_transfer_params"] != nil {
			t.Errorf("the stage was sent vllm_xargs.kv_transfer_params: %v", b)
		}
	}
	if xargs, _ := bodies[1]["vllm_xargs"].(map[string]any); xargs["tenant"] != "a" {
		t.Errorf("other vllm_xargs were lost: %v", bodies[1])
	}
}

// A client's X-Request-Id is echoed, but stage legs carry it with a
// suffix of omnipd's: two requests that share an id never share the id
// the engines key KV and conditioning by.
func TestClientRequestIDNeverReachesAStageBare(t *testing.T) {
	stage := &recordingStage{}
	url := behindStage(t, stage, func(*orchestrator.Pool, *Config) {})
	for range 2 {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
		req.Header.Set("X-Request-Id", "shared-id")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "shared-id" {
			t.Errorf("%d, X-Request-Id echoed as %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
		}
	}
	_, ids := stage.received()
	if len(ids) != 2 || ids[0] == ids[1] || !strings.HasPrefix(ids[0], "shared-id-") || !strings.HasPrefix(ids[1], "shared-id-") {
		t.Errorf("stage request ids %q: want two distinct ids that start with the client's", ids)
	}
}

// max_tokens and max_completion_tokens above --max-tokens-limit are a 400
// naming both numbers; at the limit they pass.
func TestMaxTokensLimit(t *testing.T) {
	stage := &recordingStage{}
	url := behindStage(t, stage, func(_ *orchestrator.Pool, c *Config) { c.MaxTokensLimit = 100 })
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":101}`, "max_tokens"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":101}`, "max_completion_tokens"},
		{"/v1/completions", `{"prompt":"hi","max_tokens":101}`, "max_tokens"},
	} {
		status, _, body := send(t, "POST", url+c.path, "", c.body)
		if status != 400 || !strings.Contains(body, `"param":"`+c.param+`"`) || !strings.Contains(body, "101") || !strings.Contains(body, "100") {
			t.Errorf("%s: %d %s", c.body, status, body)
		}
	}
	if bodies, _ := stage.received(); len(bodies) != 0 {
		t.Fatalf("refused requests reached the stage: %v", bodies)
	}
	if status, _, body := send(t, "POST", url+"/v1/chat/completions", "", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":100}`); status != 200 {
		t.Errorf("at the limit: %d %s", status, body)
	}
}

// When every instance of a stage is at --max-stage-queue the request gets
// a 429 with Retry-After naming the stage, and the stage is sent nothing.
func TestStageQueueFullThroughTheAPI(t *testing.T) {
	stage := &recordingStage{block: make(chan struct{}), got: make(chan struct{}, 4)}
	url := behindStage(t, stage, func(p *orchestrator.Pool, _ *Config) { p.MaxQueue = 1 })
	chat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	done := make(chan int, 1)
	go func() {
		status, _, _ := send(t, "POST", url+"/v1/chat/completions", "", chat)
		done <- status
	}()
	<-stage.got
	status, hdr, body := send(t, "POST", url+"/v1/chat/completions", "", chat)
	var e struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if status != 429 || hdr.Get("Retry-After") == "" || json.Unmarshal([]byte(body), &e) != nil ||
		e.Error.Type != "rate_limit_error" || e.Error.Code != "stage_queue_full" || !strings.Contains(e.Error.Message, "thinker") {
		t.Errorf("over the stage's bound: %d Retry-After %q %s", status, hdr.Get("Retry-After"), body)
	}
	close(stage.block)
	if s := <-done; s != 200 {
		t.Errorf("the request within the bound: %d", s)
	}
	if bodies, _ := stage.received(); len(bodies) != 1 {
		t.Errorf("the stage received %d requests, want 1", len(bodies))
	}
}

// A prompt longer than the Thinker's max model length is a 400
// context_length_exceeded naming both numbers — the worker's answer passed
// through the PD path, not a 502 — streamed or not, refused by the prefill
// (prompt too long) or by the decode (prompt plus max_tokens too long).
func TestPromptTooLongThroughPD(t *testing.T) {
	startShort := func(kv, engineID string) *refWorker {
		eng, err := engine.New(testModel, testTokenizer, engine.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { eng.Run(ctx); close(done) }()
		cfg, _ := worker.ParseKVTransferConfig(kv)
		srv, err := worker.New(worker.Config{Engine: eng, KV: cfg, Secret: secret, MaxModelLen: 64, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv)
		t.Cleanup(func() { hs.Close(); srv.Close(); cancel(); <-done })
		w := &refWorker{url: hs.URL, srv: srv, eng: eng, http: hs}
		w.peer = kvconnector.Peer{EngineID: engineID, HTTPAddr: strings.TrimPrefix(hs.URL, "http://"), TP: 1}
		return w
	}
	pre := startShort(kvJSON("kv_producer", "prefill-0", "pull"), "prefill-0")
	dec := startShort(kvJSON("kv_consumer", "decode-0", "pull"), "decode-0")
	contract, err := kvconnector.NewRegistry().Lookup("ReferenceConnector", nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := orchestrator.New(orchestrator.Config{Prefill: pool(t, "prefill", pre), Decode: pool(t, "decode", dec), Contract: contract, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(New(Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: quiet}))
	defer hs.Close()
	tokens := func(n int) string {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprint(i + 1)
		}
		return "[" + strings.Join(ids, ",") + "]"
	}
	for _, c := range []struct {
		name, body string
		numbers    []string
	}{
		{"prompt too long", `{"prompt":` + tokens(100) + `,"max_tokens":4}`, []string{"64", "100"}},
		{"prompt too long, streamed", `{"prompt":` + tokens(100) + `,"max_tokens":4,"stream":true}`, []string{"64", "100"}},
		{"no room for max_tokens", `{"prompt":` + tokens(50) + `,"max_tokens":30}`, []string{"64", "50", "30"}},
	} {
		status, _, body := send(t, "POST", hs.URL+"/v1/completions", "", c.body)
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		if status != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != worker.CodeContextLengthExceeded {
			t.Errorf("%s: %d %s; want 400 %s", c.name, status, body, worker.CodeContextLengthExceeded)
			continue
		}
		for _, n := range c.numbers {
			if !strings.Contains(e.Error.Message, n) {
				t.Errorf("%s: %q does not name %s", c.name, e.Error.Message, n)
			}
		}
	}
}

// An audio request is refused with the Talker's 429 before its Thinker leg
// runs when every Talker instance is at its bound: no conditioning is kept
// for a Talker that cannot take it.
func TestFullTalkerRefusedBeforeTheThinker(t *testing.T) {
	thinker := &recordingStage{}
	talker := &recordingStage{block: make(chan struct{}), got: make(chan struct{}, 4)}
	code2wav := &recordingStage{}
	pool := func(name string, h http.Handler, maxQueue int) *orchestrator.Pool {
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		return &orchestrator.Pool{Name: name, MaxQueue: maxQueue, Instances: []*orchestrator.Instance{{Client: c}}}
	}
	o, err := orchestrator.New(orchestrator.Config{
		Decode: pool("thinker", thinker, 0), Logger: quiet,
		Omni: &orchestrator.Omni{Talker: pool("talker", talker, 1), Code2Wav: pool("code2wav", code2wav, 0), ConditioningLayer: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(New(Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: quiet}))
	defer hs.Close()
	chat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}` // text and audio
	done := make(chan struct{})
	go func() {
		send(t, "POST", hs.URL+"/v1/chat/completions", "", chat)
		close(done)
	}()
	<-talker.got
	status, hdr, body := send(t, "POST", hs.URL+"/v1/chat/completions", "", chat)
	if status != 429 || hdr.Get("Retry-After") == "" || !strings.Contains(body, "stage_queue_full") || !strings.Contains(body, "talker") {
		t.Errorf("with the Talker full: %d Retry-After %q %s", status, hdr.Get("Retry-After"), body)
	}
	close(talker.block)
	<-done
	// Count generations only: the first request's conditioning is released
	// on the Thinker (a DELETE) when its Talker leg fails, at a time of its own.
	thinker.mu.Lock()
	calls := slices.Clone(thinker.calls)
	thinker.mu.Unlock()
	if n := slices.Index(calls, "POST /v1/chat/completions"); n < 0 || slices.Contains(calls[n+1:], "POST /v1/chat/completions") {
		t.Errorf("the Thinker was asked %q, want one chat completion: the refused request must not reach it", calls)
	}
}
