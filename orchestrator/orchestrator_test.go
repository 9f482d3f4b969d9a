package orchestrator

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/stageclient"
)

// fakeStage records what the orchestrator sends and answers with a script.
type fakeStage struct {
	mu       sync.Mutex
	bodies   []map[string]any
	ids      []string
	answer   func(w http.ResponseWriter, body map[string]any)
	received chan struct{}
}

func (f *fakeStage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/version" {
		http.NotFound(w, r) // a reference worker does not say its release
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.ids = append(f.ids, r.Header.Get("X-Request-Id"))
	f.mu.Unlock()
	if f.received != nil {
		f.received <- struct{}{}
	}
	f.answer(w, body)
}

func (f *fakeStage) last() (map[string]any, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) == 0 {
		return nil, ""
	}
	return f.bodies[len(f.bodies)-1], f.ids[len(f.ids)-1]
}

func nixlPrefillAnswer(w http.ResponseWriter, _ map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"length"}],
		"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4},
		"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p0","remote_block_ids":[1,2],
		"remote_host":"127.0.0.1","remote_port":5600,"remote_request_id":"r-1","tp_size":1,"remote_num_tokens":3}}`)
}

func decodeAnswer(w http.ResponseWriter, _ map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"y","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],
		"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"kv_transfer_params":null}`)
}

func newOrch(t *testing.T, prefill, decode http.Handler, connector string) *Orchestrator {
	t.Helper()
	mk := func(h http.Handler, engineID string) *Pool {
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL})
		if err != nil {
			t.Fatal(err)
		}
		return &Pool{Name: engineID, Instances: []*Instance{{Client: c, Peer: kvconnector.Peer{EngineID: engineID, KVHost: "127.0.0.1", KVPort: 8998, TP: 1}}}}
	}
	contract, err := kvconnector.NewRegistry().Lookup(connector, nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := New(Config{Prefill: mk(prefill, "p0"), Decode: mk(decode, "d0"), Contract: contract, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wantNoLegsCounted(t, o.cfg.Prefill, o.cfg.Decode) })
	return o
}

// wantNoLegsCounted fails t unless every leg counted onto the pools'
// instances has been released once the test is over (a leg that outlives
// its test, such as a claim sent after the client left, gets a few
// seconds): a count that leaks would shrink an instance's queue bound for
// good.
func wantNoLegsCounted(t *testing.T, pools ...*Pool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range pools {
		for _, in := range p.Instances {
			for in.inflight.Load() != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := in.inflight.Load(); n != 0 {
				t.Errorf("%s instance %s still counts %d legs after the test", p.Name, in.Client.BaseURL(), n)
			}
		}
	}
}

func chatRequest(t *testing.T, id, body string) *Request {
	t.Helper()
	c, err := openai.DecodeChatRequest(strings.NewReader(body), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return &Request{ID: id, Chat: c}
}

// The prefill leg is the client's request with one token, no streaming, no
// stops, no minimum, one choice, and the connector's producer params in place
// of the client's; the decode leg carries the consumer params; both carry
// the same request id.
func TestLegsFollowTheProtocol(t *testing.T) {
	pre := &fakeStage{answer: nixlPrefillAnswer}
	dec := &fakeStage{answer: decodeAnswer}
	o := newOrch(t, pre, dec, "NixlConnector")
	req := chatRequest(t, "req-1", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,"max_completion_tokens":40,
		"stream":false,"n":1,"min_tokens":5,"stop":["x"],"stop_token_ids":[7],"temperature":0.7,"seed":3,"custom_field":{"kept":true},
		"modalities":["text"],"audio":{"format":"wav"},"kv_transfer_params":{"do_remote_prefill":true}}`)
	res, err := o.Do(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Close()
	if res.Path != PathDisaggregated || !strings.Contains(string(res.Body), "hello") || strings.Contains(string(res.Body), "remote_block_ids") {
		t.Errorf("result %s %s", res.Path, res.Body)
	}

	p, pid := pre.last()
	for key, want := range map[string]any{"max_tokens": 1.0, "max_completion_tokens": 1.0, "stream": false, "n": 1.0, "ignore_eos": true, "temperature": 0.7, "seed": 3.0} {
		if p[key] != want {
			t.Errorf("prefill %s = %v, want %v", key, p[key], want)
		}
	}
	for _, gone := range []string{"min_tokens", "stop", "stop_token_ids", "stream_options"} {
		if _, ok := p[gone]; ok {
			t.Errorf("prefill leg still has %s: %v", gone, p[gone])
		}
	}
	if kv, _ := p["kv_transfer_params"].(map[string]any); kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false {
		t.Errorf("prefill kv_transfer_params %v: the connector's, not the client's", p["kv_transfer_params"])
	}
	if p["custom_field"] == nil {
		t.Error("unknown client fields must pass through to the engines")
	}
	d, did := dec.last()
	kv, _ := d["kv_transfer_params"].(map[string]any)
	if kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "p0" || kv["remote_num_tokens"] != 3.0 || kv["remote_request_id"] != "r-1" {
		t.Errorf("decode kv_transfer_params %v", kv)
	}
	if d["max_tokens"] != 50.0 || d["min_tokens"] != 5.0 || d["stop"] == nil {
		t.Errorf("the decode leg must be the client's request: %v", d)
	}
	for _, leg := range []map[string]any{p, d} {
		if leg["modalities"] != nil || leg["audio"] != nil {
			t.Errorf("omni fields reach a Thinker leg: %v %v", leg["modalities"], leg["audio"])
		}
	}
	if pid != "req-1" || did != "req-1" {
		t.Errorf("request ids %q and %q, want req-1 on both legs", pid, did)
	}
}

// A prefill response without a key the connector needs is a 502
// invalid_prefill_handoff, and no decode is sent.
func TestMissingHandoffKey(t *testing.T) {
	pre := &fakeStage{answer: func(w http.ResponseWriter, _ map[string]any) {
		_, _ = io.WriteString(w, `{"choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p0"}}`)
	}}
	dec := &fakeStage{answer: decodeAnswer}
	o := newOrch(t, pre, dec, "NixlConnector")
	_, err := o.Do(context.Background(), chatRequest(t, "r", `{"messages":[{"role":"user","content":"hi"}]}`))
	oe, ok := err.(*Error)
	if !ok || oe.Status != 502 || oe.Code != "invalid_prefill_handoff" {
		t.Fatalf("err = %v, want a 502 invalid_prefill_handoff", err)
	}
	if b, _ := dec.last(); b != nil {
		t.Error("a decode was sent without a valid handoff")
	}
}

// A prefill answer that is JSON but not an object carries no handoff: a
// 502 invalid_prefill_handoff, and no decode is sent.
func TestPrefillAnswerNotAnObject(t *testing.T) {
	for _, answer := range []string{`[]`, `"done"`, `42`} {
		pre := &fakeStage{answer: func(w http.ResponseWriter, _ map[string]any) {
			_, _ = io.WriteString(w, answer)
		}}
		dec := &fakeStage{answer: decodeAnswer}
		o := newOrch(t, pre, dec, "NixlConnector")
		_, err := o.Do(context.Background(), chatRequest(t, "r", `{"messages":[{"role":"user","content":"hi"}]}`))
		oe, ok := err.(*Error)
		if !ok || oe.Status != 502 || oe.Code != "invalid_prefill_handoff" {
			t.Errorf("prefill answered %s: err = %v, want a 502 invalid_prefill_handoff", answer, err)
		}
		if b, _ := dec.last(); b != nil {
			t.Errorf("prefill answered %s: a decode was sent without a handoff", answer)
		}
	}
}

// Mooncake's prefill answers null; the decode still gets everything it
// needs from the orchestrator (the defect vllm-omni has).
func TestMooncakeNullPrefillResponse(t *testing.T) {
	pre := &fakeStage{answer: func(w http.ResponseWriter, _ map[string]any) {
		_, _ = io.WriteString(w, `{"choices":[],"kv_transfer_params":null}`)
	}}
	dec := &fakeStage{answer: decodeAnswer}
	o := newOrch(t, pre, dec, "MooncakeConnector")
	res, err := o.Do(context.Background(), chatRequest(t, "r9", `{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	d, _ := dec.last()
	kv, _ := d["kv_transfer_params"].(map[string]any)
	if kv["transfer_id"] != "xfer-r9" || kv["remote_engine_id"] != "p0" || kv["remote_bootstrap_addr"] != "http://127.0.0.1:8998" {
		t.Errorf("decode kv_transfer_params %v", kv)
	}
	p, _ := pre.last()
	if pkv, _ := p["kv_transfer_params"].(map[string]any); pkv["transfer_id"] != "xfer-r9" {
		t.Errorf("prefill kv_transfer_params %v", p["kv_transfer_params"])
	}
}

// A client that leaves between the legs does not strand the exported KV:
// the decode is still asked to claim it (one token, detached from the
// client) instead of leaving it to the lease.
func TestCancelBetweenLegsClaimsTheKV(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pre := &fakeStage{answer: nixlPrefillAnswer}
	dec := &fakeStage{answer: decodeAnswer, received: make(chan struct{}, 1)}
	o := newOrch(t, pre, dec, "NixlConnector")
	o.afterPrefill = cancel // the client goes away once the prefill answered
	_, err := o.Do(ctx, chatRequest(t, "r2", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":true}`))
	if err == nil {
		t.Fatal("a cancelled request succeeded")
	}
	select {
	case <-dec.received:
	case <-time.After(5 * time.Second):
		t.Fatal("the exported KV was left to its lease: no decode claimed it")
	}
	d, _ := dec.last()
	if d["max_tokens"] != 1.0 || d["stream"] != nil || d["kv_transfer_params"] == nil {
		t.Errorf("claiming decode %v: want one token, not streamed, with the handoff", d)
	}
}

// The health probe takes a dead instance out of rotation before a request
// finds it, and puts it back when it answers again.
func TestProbeEjectsAndRestores(t *testing.T) {
	var mu sync.Mutex
	up := true
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer hs.Close()
	c, _ := stageclient.New(stageclient.Config{BaseURL: hs.URL})
	in := &Instance{Client: c}
	p := &Pool{Name: "p", Instances: []*Instance{in}, Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Probe(ctx, 10*time.Millisecond)
	waitFor := func(healthy bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for in.Healthy(time.Now()) != healthy {
			if time.Now().After(deadline) {
				t.Fatalf("instance healthy = %v, want %v", in.Healthy(time.Now()), healthy)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(true)
	mu.Lock()
	up = false
	mu.Unlock()
	waitFor(false)
	mu.Lock()
	up = true
	mu.Unlock()
	waitFor(true)
}
