package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/stageclient"
)

// blockingStage answers like decodeAnswer once release is closed, and says
// on received when a request has arrived.
func blockingStage(release <-chan struct{}) *fakeStage {
	return &fakeStage{received: make(chan struct{}, 16), answer: func(w http.ResponseWriter, body map[string]any) {
		<-release
		decodeAnswer(w, body)
	}}
}

func received(f *fakeStage) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

func scrapeMetrics(t *testing.T, m *metrics.Orchestrator) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func wantQueueFull(t *testing.T, err error, stage string) {
	t.Helper()
	var oe *Error
	if !errors.As(err, &oe) || oe.Status != 429 || oe.Code != "stage_queue_full" || !errors.Is(err, ErrStageBusy) || !strings.Contains(oe.Msg, stage) {
		t.Fatalf("err = %v, want a 429 stage_queue_full naming %s", err, stage)
	}
	if r := oe.Response(); r.Detail.Type != "rate_limit_error" || r.Status != 429 {
		t.Errorf("client body %+v, want a rate_limit_error", r)
	}
}

// A stage whose every instance has MaxQueue legs in flight refuses the next
// request with a 429 naming it, counted, and sends it nothing; once a leg
// finishes there is room again.
func TestStageQueueBound(t *testing.T) {
	release := make(chan struct{})
	var stages []*fakeStage
	var instances []*Instance
	for range 2 {
		st := blockingStage(release)
		hs := httptest.NewServer(st)
		t.Cleanup(hs.Close)
		c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL})
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, st)
		instances = append(instances, &Instance{Client: c})
	}
	m := metrics.NewOrchestrator()
	o, err := New(Config{Decode: &Pool{Name: "thinker", MaxQueue: 2, Instances: instances}, Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	const inFlight = 4 // two instances, two each
	reqs := make([]*Request, inFlight+1)
	for i := range reqs {
		reqs[i] = chatRequest(t, fmt.Sprint("r", i), body)
	}
	results := make(chan error, inFlight)
	for _, req := range reqs[:inFlight] {
		go func() {
			res, err := o.Do(context.Background(), req)
			if err == nil {
				res.Close()
			}
			results <- err
		}()
	}
	for i := range inFlight {
		<-stages[i%2].received // both instances fill up, least loaded first
	}
	_, err = o.Do(context.Background(), reqs[inFlight])
	wantQueueFull(t, err, "thinker")
	close(release)
	for range inFlight {
		if err := <-results; err != nil {
			t.Errorf("a request within the bound: %v", err)
		}
	}
	for i, st := range stages {
		if n := received(st); n != 2 {
			t.Errorf("instance %d received %d requests, want 2 (none over its bound)", i, n)
		}
	}
	res, err := o.Do(context.Background(), chatRequest(t, "after", body))
	if err != nil {
		t.Fatalf("with room again: %v", err)
	}
	res.Close()
	if text := scrapeMetrics(t, m); !strings.Contains(text, `omnipd_stage_queue_full_total{stage="thinker"} 1`) {
		t.Errorf("the refusal is not counted:\n%s", text)
	}
}

// Under PD a request whose decode stage is full is refused before its
// prefill runs: no KV is exported for a decode that cannot take it.
func TestFullDecodeRefusedBeforePrefill(t *testing.T) {
	release := make(chan struct{})
	pre := &fakeStage{answer: nixlPrefillAnswer}
	dec := blockingStage(release)
	o := newOrch(t, pre, dec, "NixlConnector")
	o.cfg.Decode.MaxQueue = 1
	first := chatRequest(t, "r1", `{"messages":[{"role":"user","content":"hi"}]}`)
	second := chatRequest(t, "r2", `{"messages":[{"role":"user","content":"hi"}]}`)
	done := make(chan error, 1)
	go func() {
		res, err := o.Do(context.Background(), first)
		if err == nil {
			res.Close()
		}
		done <- err
	}()
	<-dec.received
	_, err := o.Do(context.Background(), second)
	wantQueueFull(t, err, "d0")
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := received(pre); n != 1 {
		t.Errorf("the prefill ran %d times, want once: the refused request must not reach it", n)
	}
}

// A stage that refuses omnipd's deployment secret is a 502 naming the
// stage, not a 401 the client would take for its own API key.
func TestStageRefusingTheSecretIs502(t *testing.T) {
	refuse := func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":"Unauthorized"}`)
	}
	for _, c := range []struct {
		name     string
		pre, dec *fakeStage
		code     string
	}{
		{"prefill", &fakeStage{answer: refuse}, &fakeStage{answer: decodeAnswer}, "prefill_unauthorized"},
		{"decode", &fakeStage{answer: nixlPrefillAnswer}, &fakeStage{answer: refuse}, "decode_unauthorized"},
	} {
		o := newOrch(t, c.pre, c.dec, "NixlConnector")
		_, err := o.Do(context.Background(), chatRequest(t, "r", `{"messages":[{"role":"user","content":"hi"}]}`))
		var oe *Error
		if !errors.As(err, &oe) || oe.Status != 502 || oe.Code != c.code || oe.Response().Status != 502 {
			t.Errorf("%s refuses: %v, want a 502 %s", c.name, err, c.code)
		}
	}
}

// colocatedPool is an orchestrator over n Thinker instances with the given
// queue bound, for tests of admission alone: nothing listens at their
// addresses.
func colocatedPool(t *testing.T, n, bound int) (*Orchestrator, *Pool) {
	t.Helper()
	p := &Pool{Name: "thinker", MaxQueue: bound}
	for i := range n {
		c, err := stageclient.New(stageclient.Config{BaseURL: fmt.Sprintf("http://127.0.0.1:%d", 1+i)})
		if err != nil {
			t.Fatal(err)
		}
		p.Instances = append(p.Instances, &Instance{Client: c})
	}
	o, err := New(Config{Decode: p, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return o, p
}

// Requests arriving together are each counted onto an instance with room:
// none is refused while any instance has a place left, none goes past the
// bound, and the one after them is refused.
func TestTakeFillsEveryPlaceUnderContention(t *testing.T) {
	const instances, bound = 3, 2
	o, p := colocatedPool(t, instances, bound)
	for round := range 1000 {
		var wg sync.WaitGroup
		errs := make(chan error, instances*bound)
		start := make(chan struct{})
		for range instances * bound {
			wg.Go(func() {
				<-start
				_, err := o.take(p, nil)
				errs <- err
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: refused with room left: %v", round, err)
			}
		}
		for i, in := range p.Instances {
			if n := in.inflight.Load(); n != bound {
				t.Fatalf("round %d: instance %d counts %d legs, want %d", round, i, n, bound)
			}
		}
		if _, err := o.take(p, nil); !errors.Is(err, ErrStageBusy) {
			t.Fatalf("round %d: a leg past every bound: err = %v, want ErrStageBusy", round, err)
		}
		for _, in := range p.Instances {
			for range bound {
				o.track(p, in, -1)
			}
		}
	}
}

// A full instance's request goes to another instance with room, but not
// to one sitting out after a failure: that request is refused instead.
func TestTakeSkipsFullButNotIntoEjected(t *testing.T) {
	o, p := colocatedPool(t, 2, 1)
	full, other := p.Instances[0], p.Instances[1]
	full.inflight.Store(1)
	if in, err := o.take(p, nil); err != nil || in != other {
		t.Fatalf("take = %v, %v; want the instance with room", in, err)
	}
	other.inflight.Store(0)
	other.eject(time.Now())
	if in, err := o.take(p, nil); !errors.Is(err, ErrStageBusy) {
		t.Fatalf("take = %v, %v; want ErrStageBusy rather than the instance sitting out", in, err)
	}
}

// Under PD the decode leg counts from the start of the request: while one
// request's prefill runs, a decode with room for one refuses the next
// request before its prefill is sent.
func TestDecodeCountedWhilePrefillRuns(t *testing.T) {
	release := make(chan struct{})
	pre := &fakeStage{received: make(chan struct{}, 4), answer: func(w http.ResponseWriter, body map[string]any) {
		<-release
		nixlPrefillAnswer(w, body)
	}}
	dec := &fakeStage{answer: decodeAnswer}
	o := newOrch(t, pre, dec, "NixlConnector")
	o.cfg.Decode.MaxQueue = 1
	done := make(chan error, 1)
	go func() {
		res, err := o.Do(context.Background(), chatRequest(t, "r1", `{"messages":[{"role":"user","content":"hi"}]}`))
		if err == nil {
			res.Close()
		}
		done <- err
	}()
	<-pre.received
	// Bounded, so that a second prefill waiting on release fails the test
	// rather than hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := o.Do(ctx, chatRequest(t, "r2", `{"messages":[{"role":"user","content":"hi"}]}`))
	close(release)
	wantQueueFull(t, err, "d0")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := received(pre); n != 1 {
		t.Errorf("the prefill ran %d times, want once", n)
	}
}

// A claim goes out even when the decode has no room left under the queue
// bound: it only frees KV the prefill holds, and refusing it would leave
// that KV to its lease. Here the decode refuses the client's leg after the
// prefill exported, while another request takes the decode's last place.
func TestClaimPastQueueBound(t *testing.T) {
	var o *Orchestrator
	dec := &fakeStage{received: make(chan struct{}, 4)}
	dec.answer = func(w http.ResponseWriter, body map[string]any) {
		if body["max_tokens"] == 1.0 {
			decodeAnswer(w, body) // the claim
			return
		}
		o.track(o.cfg.Decode, o.cfg.Decode.Instances[0], +1) // another request's leg
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"max_tokens is too large","type":"invalid_request_error","code":400}}`)
	}
	o = newOrch(t, &fakeStage{answer: nixlPrefillAnswer}, dec, "NixlConnector")
	o.cfg.Decode.MaxQueue = 1
	_, err := o.Do(context.Background(), chatRequest(t, "r1", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":100}`))
	if !rejected(err) {
		t.Fatalf("err = %v, want the decode's refusal", err)
	}
	<-dec.received
	select {
	case <-dec.received:
	case <-time.After(5 * time.Second):
		t.Fatal("no claim reached the full decode: the exported KV waits out its lease")
	}
	if d, _ := dec.last(); d["max_tokens"] != 1.0 || d["kv_transfer_params"] == nil {
		t.Errorf("claiming decode %v: want one token, with the handoff", d)
	}
	o.track(o.cfg.Decode, o.cfg.Decode.Instances[0], -1)
}
