package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/stageapi"
	"github.com/omnipd/omnipd/stageclient"
)

// deadInstance is an instance whose engine is down: connecting to it is
// refused.
func deadInstance(t *testing.T, peer kvconnector.Peer) *Instance {
	t.Helper()
	c, err := stageclient.New(stageclient.Config{BaseURL: refusedURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	return &Instance{Client: c, Peer: peer}
}

// liveInstance serves h on loopback.
func liveInstance(t *testing.T, h http.Handler, peer kvconnector.Peer) *Instance {
	t.Helper()
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	return &Instance{Client: c, Peer: peer}
}

// pickFirst makes in the instance p's next pick visits first, so that a
// test knows the first leg goes to it.
func pickFirst(p *Pool, in *Instance) {
	n := len(p.Instances)
	for i, x := range p.Instances {
		if x == in {
			p.next.Store(uint64((i - 1 + n) % n))
		}
	}
}

// withMetrics gives o a registry of its own, read with series.
func withMetrics(o *Orchestrator) *metrics.Orchestrator {
	m := metrics.NewOrchestrator()
	o.cfg.Metrics = m
	o.releases.metrics = m
	return m
}

// series is the value of one series in m's exposition (0 when absent).
func series(t *testing.T, m *metrics.Orchestrator, name string) float64 {
	t.Helper()
	for line := range strings.Lines(scrapeMetrics(t, m)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// fakeTalker streams two codec frames and ends.
func fakeTalker(w http.ResponseWriter, _ map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	frame := strings.Repeat("7,", stageapi.Codebooks-1) + "7"
	fmt.Fprintf(w, "data: {\"frame\":[%s]}\n\ndata: {\"frame\":[%s]}\n\ndata: {\"done\":true,\"frames\":2}\n\ndata: [DONE]\n\n", frame, frame)
}

// fakeCode2Wav answers any frames with a few samples.
func fakeCode2Wav(w http.ResponseWriter, _ map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"samples_f32le":%q,"num_samples":4}`, stageapi.EncodeSamples([]float32{0, 0.25, -0.25, 0}))
}

// quietStage takes a request and sends nothing until the leg is abandoned
// (or a bound only a hang of the test reaches), as a stalled worker does.
func quietStage(stream bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	}
}

// brokenTalker sends one frame and dies mid-stream.
func brokenTalker(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = fmt.Fprintf(w, "data: {\"frame\":[%s]}\n\n", strings.Repeat("7,", stageapi.Codebooks-1)+"7")
	_ = http.NewResponseController(w).Flush()
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}

// omniOrch is a colocated omni deployment of fakes: a Thinker that answers
// tool calls, and the Talker and Code2Wav pools given.
func omniOrch(t *testing.T, talker, code2wav *Pool, idle time.Duration) *Orchestrator {
	t.Helper()
	thinker := &Pool{Name: "thinker", Instances: []*Instance{liveInstance(t, &fakeStage{answer: toolStage}, kvconnector.Peer{})}}
	o, err := New(Config{Decode: thinker, StageIdleTimeout: idle, Logger: slog.New(slog.DiscardHandler),
		Omni: &Omni{Talker: talker, Code2Wav: code2wav, ConditioningLayer: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wantNoLegsCounted(t, thinker, talker, code2wav) })
	return o
}

// drive sends each body once and returns the first failure, reading
// streams to their end.
func drive(t *testing.T, o *Orchestrator, bodies ...string) error {
	t.Helper()
	for i, body := range bodies {
		res, err := o.Do(t.Context(), chatRequest(t, fmt.Sprintf("r-%d", i), body))
		if err == nil {
			var docs []json.RawMessage
			docs, err = answerDocs(res)
			for _, doc := range docs {
				// An omni stream reports an audio failure as an error event.
				var ev struct {
					Error json.RawMessage `json:"error"`
				}
				if json.Unmarshal(doc, &ev) == nil && ev.Error != nil && err == nil {
					err = fmt.Errorf("error event %s", doc)
				}
			}
			res.Close()
		}
		if err != nil {
			return fmt.Errorf("request %d (%s): %w", i, body, err)
		}
	}
	return nil
}

const (
	wholeChat    = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	streamedChat = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	mediaChat    = `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},{"type":"text","text":"hi"}]}]}`
)

// A leg its instance refused at connect reached nothing, so it goes to
// another instance of its stage, whatever the stage: the client gets its
// answer, the retry is counted, and the dead instance, found once, sits
// out — the requests after it are not sent there again.
func TestRefusedLegGoesToAnotherInstance(t *testing.T) {
	bodies := []string{wholeChat, streamedChat, wholeChat, streamedChat}
	t.Run("colocated thinker", func(t *testing.T) {
		dead := deadInstance(t, kvconnector.Peer{})
		pool := &Pool{Name: "thinker", Instances: []*Instance{dead, liveInstance(t, &fakeStage{answer: toolStage}, kvconnector.Peer{})}}
		o, err := New(Config{Decode: pool, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		m := withMetrics(o)
		pickFirst(pool, dead)
		if err := drive(t, o, bodies...); err != nil {
			t.Fatal(err)
		}
		if n := series(t, m, `omnipd_stage_refused_retries_total{stage="thinker"}`); n != 1 {
			t.Errorf("%v refused retries counted, want 1: the dead instance found once, then sitting out", n)
		}
		wantNoLegsCounted(t, pool)
	})
	t.Run("prefill", func(t *testing.T) {
		// PrefillRetries is 0: a refused leg reached nothing, and needs no
		// retry budget.
		o := newOrch(t, &fakeStage{answer: toolStage}, &fakeStage{answer: toolStage}, kvconnector.NixlConnector)
		m := withMetrics(o)
		dead := deadInstance(t, kvconnector.Peer{EngineID: "prefill-dead", KVHost: "127.0.0.1", KVPort: 8997, TP: 1})
		o.cfg.Prefill.Instances = append([]*Instance{dead}, o.cfg.Prefill.Instances...)
		pickFirst(o.cfg.Prefill, dead)
		if err := drive(t, o, bodies...); err != nil {
			t.Fatal(err)
		}
		if n := series(t, m, `omnipd_stage_refused_retries_total{stage="`+o.cfg.Prefill.Name+`"}`); n != 1 {
			t.Errorf("%v refused retries counted, want 1", n)
		}
		if n := series(t, m, "omnipd_prefill_retries_total"); n != 1 {
			t.Errorf("%v prefill retries counted, want 1", n)
		}
		wantNoLegsCounted(t, o.cfg.Prefill, o.cfg.Decode)
	})
	t.Run("encoder", func(t *testing.T) {
		o := newOrch(t, &fakeStage{answer: toolStage}, &fakeStage{answer: toolStage}, kvconnector.NixlConnector)
		m := withMetrics(o)
		dead := deadInstance(t, kvconnector.Peer{})
		o.cfg.Encoder = &Pool{Name: "encoder", Instances: []*Instance{dead, liveInstance(t, &fakeStage{answer: toolStage}, kvconnector.Peer{})}}
		pickFirst(o.cfg.Encoder, dead)
		if err := drive(t, o, mediaChat, mediaChat, mediaChat); err != nil {
			t.Fatal(err)
		}
		if n := series(t, m, `omnipd_stage_refused_retries_total{stage="encoder"}`); n != 1 {
			t.Errorf("%v refused retries counted, want 1", n)
		}
		wantNoLegsCounted(t, o.cfg.Encoder, o.cfg.Prefill, o.cfg.Decode)
	})
	for _, stage := range []string{"talker", "code2wav"} {
		t.Run(stage, func(t *testing.T) {
			dead := deadInstance(t, kvconnector.Peer{})
			talker := &Pool{Name: "talker", Instances: []*Instance{liveInstance(t, &fakeStage{answer: fakeTalker}, kvconnector.Peer{})}}
			code2wav := &Pool{Name: "code2wav", Instances: []*Instance{liveInstance(t, &fakeStage{answer: fakeCode2Wav}, kvconnector.Peer{})}}
			p := map[string]*Pool{"talker": talker, "code2wav": code2wav}[stage]
			p.Instances = append([]*Instance{dead}, p.Instances...)
			o := omniOrch(t, talker, code2wav, 0)
			m := withMetrics(o)
			pickFirst(p, dead)
			if err := drive(t, o, bodies...); err != nil {
				t.Fatal(err)
			}
			if n := series(t, m, `omnipd_stage_refused_retries_total{stage="`+stage+`"}`); n != 1 {
				t.Errorf("%v refused retries counted, want 1", n)
			}
		})
	}
	t.Run("every instance refuses", func(t *testing.T) {
		a, b := deadInstance(t, kvconnector.Peer{}), deadInstance(t, kvconnector.Peer{})
		pool := &Pool{Name: "thinker", Instances: []*Instance{a, b}}
		o, err := New(Config{Decode: pool, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		err = drive(t, o, wholeChat)
		var oe *Error
		if !errors.As(err, &oe) || oe.Status != http.StatusServiceUnavailable || oe.Code != "decode_unavailable" ||
			!strings.Contains(oe.Msg, a.Client.BaseURL()) || !strings.Contains(oe.Msg, b.Client.BaseURL()) {
			t.Errorf("got %v; want a 503 decode_unavailable naming both instances", err)
		}
		wantNoLegsCounted(t, pool)
	})
}

// Under PD the decode instance is chosen before the prefill runs. When it
// then refuses the connection, the request still succeeds, for every
// connector: the decode leg goes to another decode instance when the
// prefill's leg did not name the one that refused; when it did (P2pNccl's
// request id, MoRIIO's kv_transfer_params), the request is planned again
// on another decode and the prefill runs again. The engines see well-formed
// legs throughout, and the moves are counted.
func TestRefusedDecodeAfterPrefill(t *testing.T) {
	n := 0
	for _, c := range connectorCases() {
		if c.name == "LMCache-PD" {
			// Its sender pushes the KV to the decode itself: a dead decode
			// shows as a done notice that never comes (504 at the prefill
			// timeout, docs/reliability.md), before any decode leg is sent.
			continue
		}
		for _, stream := range []bool{false, true} {
			n++
			id := fmt.Sprintf("req-%d", n)
			t.Run(fmt.Sprintf("%s/stream=%v", c.name, stream), func(t *testing.T) {
				p := newPair(t, c, scenarioPD)
				m := withMetrics(p.orch)
				dead := deadInstance(t, kvconnector.Peer{EngineID: "thinker-decode-dead", KVHost: "127.0.0.1", KVPort: 5602, TP: 1})
				p.prefill.down = append(p.prefill.down, dead.Peer)
				pool := p.orch.cfg.Decode
				pool.Instances = append([]*Instance{dead}, pool.Instances...)
				pickFirst(pool, dead)

				res, err := p.orch.Do(context.Background(), matrixRequest(t, id, true, stream))
				var text string
				if err == nil {
					text, err = answerText(t, res)
					res.Close()
				}
				preLegs, _, preProblems := p.prefill.snapshot()
				decLegs, outcomes, decProblems := p.decode.snapshot()
				for _, pr := range append(preProblems, decProblems...) {
					t.Errorf("%s", pr)
				}
				if err != nil || text != strings.Join(decodeText, "") {
					t.Fatalf("the client got %q, %v; want 200 with the decode's text", text, err)
				}
				if len(decLegs) != 1 || len(outcomes) != 1 || outcomes[0] != outcomeImported {
					t.Errorf("the live decode saw %d legs, %v; want one that imports the prefill's KV", len(decLegs), outcomes)
				}
				bound := c.connector == kvconnector.P2pNcclConnector || c.connector == kvconnector.MoRIIOConnector
				wantPrefills, wantReplans := 1, 0.0
				if bound {
					wantPrefills, wantReplans = 2, 1
				}
				if len(preLegs) != wantPrefills {
					t.Errorf("the prefill saw %d legs, want %d", len(preLegs), wantPrefills)
				}
				if got := series(t, m, `omnipd_stage_refused_retries_total{stage="thinker-decode"}`); got != 1 {
					t.Errorf("%v refused decode retries counted, want 1", got)
				}
				if got := series(t, m, "omnipd_pd_replans_total"); got != wantReplans {
					t.Errorf("%v replans counted, want %v", got, wantReplans)
				}
			})
		}
	}
}

// Whether a prefill leg names its decode instance, per connector: those
// that do must be planned again when that decode refuses the connection.
func TestBoundToDecode(t *testing.T) {
	d1 := kvconnector.Peer{EngineID: "d1", KVHost: "10.0.0.1", KVPort: 5601, TP: 1}
	d2 := kvconnector.Peer{EngineID: "d2", KVHost: "10.0.0.2", KVPort: 5601, TP: 1}
	pre := kvconnector.Peer{EngineID: "p", KVHost: "10.0.0.3", KVPort: 5600, TP: 1}
	for _, tc := range []struct {
		connector string
		extra     map[string]any
		bound     bool
	}{
		{kvconnector.NixlConnector, nil, false},
		{kvconnector.MooncakeConnector, nil, false},
		{kvconnector.LMCacheConnectorV1, nil, false},
		{kvconnector.LMCacheConnectorV1, map[string]any{"lmcache.enable_pd": true, "lmcache.pd_role": "sender"}, true},
		{kvconnector.P2pNcclConnector, nil, true},
		{kvconnector.MoRIIOConnector, map[string]any{"read_mode": true}, true},
		{kvconnector.MoRIIOConnector, nil, true},
		{kvconnector.ReferenceConnector, map[string]any{"handshake": "pull"}, false},
		{kvconnector.ReferenceConnector, map[string]any{"handshake": "push"}, false},
		{kvconnector.MultiConnector, map[string]any{"connectors": []any{
			map[string]any{"kv_connector": kvconnector.NixlConnector},
			map[string]any{"kv_connector": kvconnector.LMCacheConnectorV1},
		}}, false},
	} {
		c, err := kvconnector.NewRegistry().Lookup(tc.connector, tc.extra)
		if err != nil {
			t.Fatal(err)
		}
		h := kvconnector.NewHandoff("r", pre, d1)
		moved := h
		moved.Decode = d2
		if got := boundToDecode(c, h, moved); got != tc.bound {
			t.Errorf("%s %v: bound %v, want %v", tc.connector, tc.extra, got, tc.bound)
		}
	}
}

// A Talker or Code2Wav instance that goes quiet past the stage idle
// timeout, or whose stream breaks off, sits out as a Thinker instance does:
// only the request that found it fails; the ones after it go to the other
// instance. Only the fault reaches the idle timeout: the healthy fakes
// answer at once.
func TestQuietAudioInstanceSitsOut(t *testing.T) {
	const idle = 2 * time.Second
	for _, tc := range []struct {
		name, stage string
		bad         http.Handler
	}{
		{"talker quiet", "talker", quietStage(true)},
		{"talker breaks off", "talker", http.HandlerFunc(brokenTalker)},
		{"code2wav quiet", "code2wav", quietStage(false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bad := liveInstance(t, tc.bad, kvconnector.Peer{})
			talker := &Pool{Name: "talker", Instances: []*Instance{liveInstance(t, &fakeStage{answer: fakeTalker}, kvconnector.Peer{})}}
			code2wav := &Pool{Name: "code2wav", Instances: []*Instance{liveInstance(t, &fakeStage{answer: fakeCode2Wav}, kvconnector.Peer{})}}
			p := map[string]*Pool{"talker": talker, "code2wav": code2wav}[tc.stage]
			p.Instances = append([]*Instance{bad}, p.Instances...)
			o := omniOrch(t, talker, code2wav, idle)
			pickFirst(p, bad)
			failed := 0
			for i := range 5 {
				if err := drive(t, o, wholeChat); err != nil {
					failed++
					if i > 0 {
						t.Errorf("request %d: %v", i, err)
					}
				}
			}
			if failed != 1 {
				t.Errorf("%d of 5 requests failed; want only the first, which found the bad instance", failed)
			}
		})
	}
}

// A whole answer's early Talker (async chunk) starts once the Thinker leg
// that keeps the generated rows is with its instance, and reads there: a
// leg refused at connect announced nothing, so the Talker reads the stash
// of the instance the leg went to instead, never the dead one's.
func TestEarlyTalkerReadsWhereTheThinkerLegWent(t *testing.T) {
	var req *Request
	var announcedEarly atomic.Bool
	// The dead instance's dial looks, before it fails, at whether the stash
	// it was to keep had been announced to the Talker already.
	refusing := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case <-req.keep.sent:
			announcedEarly.Store(true)
		default:
		}
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}}}
	c, err := stageclient.New(stageclient.Config{BaseURL: refusedURL(t), HTTP: refusing})
	if err != nil {
		t.Fatal(err)
	}
	dead := &Instance{Client: c}
	live := liveInstance(t, &fakeStage{answer: toolStage}, kvconnector.Peer{})
	thinker := &Pool{Name: "thinker", Instances: []*Instance{dead, live}}
	talker := &fakeStage{answer: fakeTalker}
	talkers := &Pool{Name: "talker", Instances: []*Instance{liveInstance(t, talker, kvconnector.Peer{})}}
	code2wav := &Pool{Name: "code2wav", Instances: []*Instance{liveInstance(t, &fakeStage{answer: fakeCode2Wav}, kvconnector.Peer{})}}
	o, err := New(Config{Decode: thinker, Logger: slog.New(slog.DiscardHandler),
		Omni: &Omni{Talker: talkers, Code2Wav: code2wav, ConditioningLayer: 2, AsyncChunk: true}})
	if err != nil {
		t.Fatal(err)
	}
	pickFirst(thinker, dead)
	req = chatRequest(t, "r-early", wholeChat)
	res, err := o.Do(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	res.Close()
	if announcedEarly.Load() {
		t.Error("the Talker was told of the Thinker's stash before the leg reached its instance, which refused it")
	}
	body, _ := talker.last()
	hs, _ := json.Marshal(body["conditioning"])
	if !strings.Contains(string(hs), live.Client.BaseURL()) || strings.Contains(string(hs), dead.Client.BaseURL()) {
		t.Errorf("the Talker read the conditioning at %s; want the instance the leg went to, %s", hs, live.Client.BaseURL())
	}
	wantNoLegsCounted(t, thinker, talkers, code2wav)
}
