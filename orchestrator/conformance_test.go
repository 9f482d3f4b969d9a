package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/openai"
)

// connectorCase is one connector deployment as the engines run it.
type connectorCase struct {
	name      string
	connector string
	extra     map[string]any // the prefill's kv_connector_extra_config
	model     func() engineModel
	// randomize: the engines append a random suffix to internal request
	// ids (vLLM ≥ 0.14 unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1,
	// which omnipd plan sets for the connectors that match by request id).
	randomize bool
	// alwaysClaims: the consumer claims every prompt's KV and waits for it
	// whatever the request carries, so a decode leg without a prefill
	// hangs.
	alwaysClaims bool
}

func connectorCases() []connectorCase {
	return []connectorCase{
		{name: "Nixl", connector: kvconnector.NixlConnector, randomize: true,
			model: func() engineModel { return nixlModel{shape: nixlMain} }},
		{name: "Nixl-without-remote_request_id", connector: kvconnector.NixlConnector,
			model: func() engineModel { return nixlModel{shape: nixlNoRequestID} }},
		{name: "Nixl-llm-d-inference-sim", connector: kvconnector.NixlConnector,
			model: func() engineModel { return nixlModel{shape: nixlSim} }},
		{name: "Mooncake", connector: kvconnector.MooncakeConnector, randomize: true,
			model: func() engineModel { return mooncakeModel{} }},
		{name: "P2pNccl", connector: kvconnector.P2pNcclConnector, alwaysClaims: true,
			model: func() engineModel { return p2pNcclModel{} }},
		{name: "LMCache-storage", connector: kvconnector.LMCacheConnectorV1, randomize: true,
			model: func() engineModel { return lmcacheModel{} }},
		// LMCache's PD mode is set in LMCache's own config; its
		// kv_connector_extra_config overrides are keys prefixed "lmcache."
		// (LMCache vllm_v1_adapter.py _apply_extra_config), which is where
		// the contract reads enable_pd and PD expansion writes it.
		{name: "LMCache-PD", connector: kvconnector.LMCacheConnectorV1, randomize: true,
			extra: map[string]any{"lmcache.enable_pd": true, "lmcache.pd_role": "sender"},
			model: func() engineModel { return lmcacheModel{pd: true} }},
		{name: "MoRIIO-read", connector: kvconnector.MoRIIOConnector, extra: map[string]any{"read_mode": true}, alwaysClaims: true,
			model: func() engineModel { return moriioModel{} }},
		{name: "Multi-Nixl-LMCache", connector: kvconnector.MultiConnector, randomize: true,
			extra: map[string]any{"connectors": []any{
				map[string]any{"kv_connector": kvconnector.NixlConnector},
				map[string]any{"kv_connector": kvconnector.LMCacheConnectorV1},
			}},
			model: func() engineModel { return nixlModel{shape: nixlMain} }},
		{name: "Reference-pull", connector: kvconnector.ReferenceConnector, extra: map[string]any{"handshake": "pull"},
			model: func() engineModel { return nixlModel{reference: true} }},
		{name: "Reference-push", connector: kvconnector.ReferenceConnector, extra: map[string]any{"handshake": "push"},
			model: func() engineModel { return mooncakeModel{} }},
	}
}

// Paths through the PD control path each connector is driven along.
const (
	scenarioPD         = "disaggregated"
	scenarioDecodeOnly = "decode-only"
	scenarioFallback   = "fallback-local"
)

// pair is one prefill engine and one decode engine of a connector, and an
// orchestrator in front of them.
type pair struct {
	orch            *Orchestrator
	prefill, decode *vllmEngine
}

func newPair(t *testing.T, c connectorCase, scenario string) *pair {
	t.Helper()
	contract, err := kvconnector.NewRegistry().Lookup(c.connector, c.extra)
	if err != nil {
		t.Fatalf("no contract for %s: %v", c.connector, err)
	}
	pp := kvconnector.Peer{EngineID: "thinker-prefill", KVHost: "127.0.0.1", KVPort: 5600, TP: 1}
	dp := kvconnector.Peer{EngineID: "thinker-decode", KVHost: "127.0.0.1", KVPort: 5601, TP: 1}
	fabric := &kvFabric{}
	model := c.model()
	pre := &vllmEngine{role: "prefill", peer: pp, other: dp, model: model, fabric: fabric, randomize: c.randomize,
		unavailable: scenario == scenarioFallback}
	dec := &vllmEngine{role: "decode", peer: dp, other: pp, model: model, fabric: fabric, randomize: c.randomize}
	pool := func(e *vllmEngine, name string) *Pool { return enginePool(t, e, name, e) }
	cfg := Config{Prefill: pool(pre, "thinker-prefill"), Decode: pool(dec, "thinker-decode"), Contract: contract,
		Logger: slog.New(slog.DiscardHandler)}
	if _, ok := contract.(kvconnector.DoneNotifier); ok {
		board := &noticeBoard{}
		cfg.KVReady, pre.notices, dec.notices = board, board, board
		t.Cleanup(func() {
			if n := board.Pending(); n != 0 {
				t.Errorf("the router still holds %d done-notice ids after the request", n)
			}
		})
	}
	switch scenario {
	case scenarioDecodeOnly:
		cfg.MinPrefillTokens = 1 << 20
	case scenarioFallback:
		cfg.FallbackLocal = true
	}
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wantNoLegsCounted(t, o.cfg.Prefill, o.cfg.Decode) })
	return &pair{orch: o, prefill: pre, decode: dec}
}

func matrixRequest(t *testing.T, id string, chat, stream bool) *Request {
	t.Helper()
	if chat {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"why is the sky blue?"}],"max_tokens":16,"stream":%t}`, stream)
		c, err := openai.DecodeChatRequest(strings.NewReader(body), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		return &Request{ID: id, Chat: c}
	}
	body := fmt.Sprintf(`{"model":"m","prompt":"why is the sky blue?","max_tokens":16,"stream":%t}`, stream)
	c, err := openai.DecodeCompletionRequest(strings.NewReader(body), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return &Request{ID: id, Completion: c}
}

// answerDocs reads the client's answer whole: its body, or every chunk of
// its stream (at most 1000).
func answerDocs(res *Result) ([]json.RawMessage, error) {
	if !res.Streaming() {
		return []json.RawMessage{res.Body}, nil
	}
	var chunks []json.RawMessage
	for range 1000 {
		ev, err := res.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		chunks = append(chunks, ev)
	}
	return chunks, nil
}

// answerText reads the client's answer whole, streamed or not.
func answerText(t *testing.T, res *Result) (string, error) {
	t.Helper()
	chunks, err := answerDocs(res)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, c := range chunks {
		var v struct {
			Choices []struct {
				Text    string                   `json:"text"`
				Delta   struct{ Content string } `json:"delta"`
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(c, &v); err != nil {
			return "", fmt.Errorf("the answer %s is not a completion: %w", c, err)
		}
		for _, ch := range v.Choices {
			b.WriteString(ch.Text + ch.Delta.Content + ch.Message.Content)
		}
	}
	return b.String(), nil
}

// Every connector, through omnipd's orchestrator, against fakes of the vLLM
// engines it would drive: chat and completions, streamed and whole, on the
// disaggregated path, the decode-only path (pd.min_prefill_tokens) and
// pd.fallback: local after the prefill failed. The client must get the
// decode's text; the engines must see a well-formed handoff — the decode
// imports the KV the prefill exported for that prompt, or recomputes a
// prompt no prefill ran — and never a leg that would crash or hang them.
func TestConnectorMatrix(t *testing.T) {
	n := 0
	for _, c := range connectorCases() {
		for _, scenario := range []string{scenarioPD, scenarioDecodeOnly, scenarioFallback} {
			for _, api := range []string{"chat", "completions"} {
				for _, stream := range []bool{false, true} {
					mode := "whole"
					if stream {
						mode = "streamed"
					}
					n++
					id := fmt.Sprintf("req-%d", n)
					t.Run(strings.Join([]string{c.name, scenario, api, mode}, "/"), func(t *testing.T) {
						runMatrixCase(t, c, scenario, api == "chat", stream, id)
					})
				}
			}
		}
	}
}

func runMatrixCase(t *testing.T, c connectorCase, scenario string, chat, stream bool, id string) {
	p := newPair(t, c, scenario)
	res, err := p.orch.Do(context.Background(), matrixRequest(t, id, chat, stream))
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

	// What the client must get.
	wantError := scenario == scenarioFallback && c.alwaysClaims
	switch {
	case wantError:
		// The decode cannot prefill itself: its consumer would wait for KV
		// no prefill sends. The client gets the prefill's failure.
		var oe *Error
		if !errors.As(err, &oe) || oe.Status < 500 {
			t.Errorf("got %v (text %q); want the prefill's failure as a 5xx, not a decode that cannot work", err, text)
		}
		if len(decLegs) != 0 {
			t.Errorf("the decode was sent %d legs without a prefill; its consumer claims every prompt and waits for ever", len(decLegs))
		}
		return
	case err != nil:
		t.Fatalf("the client got %v, want 200 with the decode's text", err)
	case text != strings.Join(decodeText, ""):
		t.Errorf("the client got %q, want %q", text, strings.Join(decodeText, ""))
	}

	// What the engines must have seen.
	if len(decLegs) != 1 {
		t.Fatalf("the decode saw %d legs, want 1", len(decLegs))
	}
	disaggregated := scenario == scenarioPD || (scenario == scenarioDecodeOnly && c.alwaysClaims)
	if disaggregated {
		if len(preLegs) != 1 {
			t.Fatalf("the prefill saw %d legs, want 1", len(preLegs))
		}
		if len(outcomes) != 1 || outcomes[0] != outcomeImported {
			t.Errorf("the decode %v; want it to import the prefill's KV", outcomes)
		}
		if preLegs[0].xRequestID == "" || decLegs[0].xRequestID == "" {
			t.Errorf("a leg went without X-Request-Id (prefill %q, decode %q)", preLegs[0].xRequestID, decLegs[0].xRequestID)
		}
		if c.connector != kvconnector.P2pNcclConnector && (preLegs[0].xRequestID != id || decLegs[0].xRequestID != id) {
			t.Errorf("X-Request-Id prefill %q, decode %q; want the request's id %q on both legs", preLegs[0].xRequestID, decLegs[0].xRequestID, id)
		}
		return
	}
	if scenario == scenarioDecodeOnly && len(preLegs) != 0 {
		t.Errorf("decode-only: the prefill was sent %d legs", len(preLegs))
	}
	if len(outcomes) != 1 || outcomes[0] != outcomeRecomputed {
		t.Errorf("the decode %v; want it to prefill the prompt itself", outcomes)
	}
	if decLegs[0].params != nil {
		t.Errorf("the decode's leg carries kv_transfer_params %v with no prefill behind them", decLegs[0].params)
	}
}
