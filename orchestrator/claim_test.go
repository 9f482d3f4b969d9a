package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
)

// The engine fakes of vllmfake_test.go, per vLLM release, when a decode
// refuses a leg before admission. vLLM's frontend refuses such a leg (a
// max_tokens past the context, say) before the engine core sees it; since
// PR #41269 (first in v0.21.0) it then submits the request pre-aborted
// (async_llm.py notify_kv_transfer_request_rejected, EngineCoreRequest
// abort_immediately), so the consumer's request_finished, finding
// do_remote_prefill still set, tells the prefill to free the blocks:
// NIXL's since PR #19223, Mooncake's since the connector came (PR #24718).
// Older releases tell nobody: the prefill keeps the blocks until its own
// timeout.
var freesOnRejection = map[string]bool{"0.21.0": true, "0.22.1": true, "0.20.2": false, "0.11.0": false}

const outcomeRejected = "rejected"

func (e *vllmEngine) serveVersion(w http.ResponseWriter) {
	if e.version == "" {
		http.NotFound(w, nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"version":%q}`, e.version)
}

// reject is vLLM's frontend refusing a decode leg with 400.
func (e *vllmEngine) reject(w http.ResponseWriter, l engineLeg) {
	if flagOf(l.params, "do_remote_prefill") && freesOnRejection[e.version] {
		e.fabric.free(exportKey(l))
	}
	e.record(l, outcomeRejected, "")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}})
	_, _ = w.Write(b)
}

// exportKey is the key a decode leg's KV was exported under.
func exportKey(l engineLeg) string {
	if id, _ := l.params["remote_request_id"].(string); id != "" {
		return id
	}
	if id, _ := l.params["transfer_id"].(string); id != "" {
		return id
	}
	return l.internalID // NIXL before remote_request_id
}

// free is the prefill freeing what it exported under key, exported yet or not.
func (f *kvFabric) free(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entry(key).freed = true
}

// claimPair is a prefill and a decode engine of one vLLM release, an
// orchestrator in front, and how often the decode was asked its version.
type claimPair struct {
	*pair
	versionAsked *atomic.Int64
}

func newClaimPair(t *testing.T, c connectorCase, version string) claimPair {
	t.Helper()
	contract, err := kvconnector.NewRegistry().Lookup(c.connector, c.extra)
	if err != nil {
		t.Fatal(err)
	}
	pp := kvconnector.Peer{EngineID: "thinker-prefill", KVHost: "127.0.0.1", KVPort: 5600, TP: 1}
	dp := kvconnector.Peer{EngineID: "thinker-decode", KVHost: "127.0.0.1", KVPort: 5601, TP: 1}
	fabric := &kvFabric{}
	model := c.model()
	pre := &vllmEngine{role: "prefill", peer: pp, other: dp, model: model, fabric: fabric, randomize: c.randomize, version: version}
	dec := &vllmEngine{role: "decode", peer: dp, other: pp, model: model, fabric: fabric, randomize: c.randomize, version: version}
	var asked atomic.Int64
	pool := func(e *vllmEngine, name string) *Pool {
		return enginePool(t, e, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/version" && e.role == "decode" {
				asked.Add(1)
			}
			e.ServeHTTP(w, r)
		}))
	}
	o, err := New(Config{Prefill: pool(pre, "thinker-prefill"), Decode: pool(dec, "thinker-decode"), Contract: contract,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	prefillIn := o.cfg.Prefill.Instances[0]
	// The decode refuses a leg that asks for more than 8 tokens, and only
	// once the prefill has answered omnipd: the KV is exported, and a
	// concurrent prefill is not cancelled by the refusal.
	dec.rejects = func(l engineLeg) bool {
		if n, _ := l.body["max_tokens"].(float64); n <= 8 {
			return false
		}
		deadline := time.Now().Add(awaitBound)
		for prefillIn.inflight.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		return true
	}
	t.Cleanup(func() { wantNoLegsCounted(t, o.cfg.Prefill, o.cfg.Decode) })
	return claimPair{pair: &pair{orch: o, prefill: pre, decode: dec}, versionAsked: &asked}
}

func claimCases() []connectorCase {
	// The matrix's setups of the connectors whose engines free a refused
	// decode's KV themselves in newer releases.
	var out []connectorCase
	for _, c := range connectorCases() {
		switch c.name {
		case "Nixl", "Nixl-without-remote_request_id", "Mooncake", "Multi-Nixl-LMCache":
			out = append(out, c)
		}
	}
	if len(out) != 4 {
		panic(fmt.Sprintf("claimCases: %d of the 4 setups are in the matrix", len(out)))
	}
	return out
}

// A decode that refuses what the prefill accepted: a release that frees
// the prefill's blocks itself gets no second decode (with Mooncake it would
// wait for a transfer the prefill released, with NIXL it would read freed
// blocks); an older release, or an engine that does not say its version,
// gets the one-token claim that frees them before their timeout.
func TestRejectedDecodeClaimsOnlyWhereTheEngineDoesNot(t *testing.T) {
	for _, c := range claimCases() {
		for _, v := range []struct {
			version string
			claim   bool
		}{{"0.21.0", false}, {"0.22.1", false}, {"0.20.2", true}, {"0.11.0", true}, {"", true}} {
			name := c.name + "/" + v.version
			if v.version == "" {
				name = c.name + "/unknown"
			}
			t.Run(name, func(t *testing.T) {
				p := newClaimPair(t, c, v.version)
				req := matrixRequest(t, "rj1", true, false)
				_, err := p.orch.Do(context.Background(), req)
				var oe *Error
				if !errorsAs(err, &oe) || oe.Code != "decode_rejected" {
					t.Fatalf("want the decode's refusal, got %v", err)
				}
				wantNoLegsCounted(t, p.orch.cfg.Prefill, p.orch.cfg.Decode)
				legs, outcomes, problems := p.decode.snapshot()
				if len(problems) != 0 {
					t.Errorf("decode engine problems: %v", problems)
				}
				want := []string{outcomeRejected}
				if v.claim {
					want = append(want, outcomeImported)
				}
				if len(legs) != len(want) || fmt.Sprint(outcomes) != fmt.Sprint(want) {
					t.Errorf("decode legs %d with outcomes %v, want %v", len(legs), outcomes, want)
				}
				if v.claim {
					if n, _ := legs[len(legs)-1].body["max_tokens"].(float64); n != 1 {
						t.Errorf("claim asks for %v tokens, want 1", legs[len(legs)-1].body["max_tokens"])
					}
				}
			})
		}
	}
}

// A client that leaves between the legs: no decode saw the request, so no
// engine frees the KV on its own, whatever its release — the claim goes out.
func TestClientLeftBetweenLegsClaimsOnEveryRelease(t *testing.T) {
	for _, version := range []string{"0.21.0", "0.20.2", ""} {
		t.Run("Nixl/"+version, func(t *testing.T) {
			p := newClaimPair(t, claimCases()[0], version)
			ctx, cancel := context.WithCancel(context.Background())
			p.orch.afterPrefill = cancel
			if _, err := p.orch.Do(ctx, matrixRequest(t, "lf1", true, true)); err == nil {
				t.Fatal("a cancelled request succeeded")
			}
			wantNoLegsCounted(t, p.orch.cfg.Prefill, p.orch.cfg.Decode)
			_, outcomes, problems := p.decode.snapshot()
			if len(problems) != 0 || fmt.Sprint(outcomes) != fmt.Sprint([]string{outcomeImported}) {
				t.Errorf("decode outcomes %v, problems %v: want one claim that imports the KV", outcomes, problems)
			}
			if n := p.versionAsked.Load(); n != 0 {
				t.Errorf("asked the decode's version %d times; the choice does not depend on it", n)
			}
		})
	}
}

func errorsAs(err error, target **Error) bool { return errors.As(err, target) }

func TestParseRelease(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    vllmRelease
		atLeast bool // at least 0.21.0
	}{
		{"0.21.0", vllmRelease{0, 21, 0, false, true}, true},
		{"v0.22.1", vllmRelease{0, 22, 1, false, true}, true},
		{"1.0.0", vllmRelease{1, 0, 0, false, true}, true},
		{"0.21.0+cu128", vllmRelease{0, 21, 0, false, true}, true},
		{"0.21.0.post1", vllmRelease{0, 21, 0, false, true}, true},
		{"0.21.0rc1", vllmRelease{0, 21, 0, true, true}, false},
		{"0.21.1.dev3+g1234abc", vllmRelease{0, 21, 1, true, true}, true},
		{"0.20.2.dev12+g1234abc", vllmRelease{0, 20, 2, true, true}, false},
		{"0.20.2", vllmRelease{0, 20, 2, false, true}, false},
		{"0.9.2", vllmRelease{0, 9, 2, false, true}, false},
		{"", vllmRelease{}, false},
		{"dev", vllmRelease{}, false},
		{"0.21", vllmRelease{}, false},
	} {
		got := parseRelease(c.in)
		if got != c.want || got.atLeast(refusalFreesKV) != c.atLeast {
			t.Errorf("parseRelease(%q) = %+v (at least 0.21.0: %t), want %+v (%t)", c.in, got, got.atLeast(refusalFreesKV), c.want, c.atLeast)
		}
	}
}

// The rule per connector, cause and release.
func TestClaimAfter(t *testing.T) {
	newer, older, unknown := parseRelease("0.21.0"), parseRelease("0.20.2"), vllmRelease{}
	for _, c := range []struct {
		connector string
		cause     claimCause
		release   vllmRelease
		claim     bool
	}{
		{kvconnector.NixlConnector, claimRejected, newer, false},
		{kvconnector.MooncakeConnector, claimRejected, newer, false},
		{"MultiConnector(NixlConnector)", claimRejected, newer, false},
		{kvconnector.NixlConnector, claimRejected, older, true},
		{kvconnector.MooncakeConnector, claimRejected, older, true},
		{kvconnector.NixlConnector, claimRejected, unknown, true},
		{kvconnector.MooncakeConnector, claimRejected, unknown, true},
		// Connectors whose refused-request path is not established stay
		// as they were.
		{kvconnector.MoRIIOConnector, claimRejected, newer, true},
		{kvconnector.P2pNcclConnector, claimRejected, newer, true},
		// Nobody saw a request the client abandoned between the legs.
		{kvconnector.NixlConnector, claimAbandoned, newer, true},
		{kvconnector.MooncakeConnector, claimAbandoned, newer, true},
		{kvconnector.NixlConnector, claimAbandoned, older, true},
	} {
		if got := claimAfter(c.connector, c.cause, c.release); got != c.claim {
			t.Errorf("claimAfter(%s, %v, %+v) = %t, want %t", c.connector, c.cause, c.release, got, c.claim)
		}
	}
}

// The decode's version is asked once, and again only once the instance has
// come back from an ejection (a restart may have changed its release).
func TestDecodeVersionCachedUntilTheInstanceComesBack(t *testing.T) {
	p := newClaimPair(t, claimCases()[0], "0.21.0")
	dec := p.orch.cfg.Decode.Instances[0]
	refuse := func(id string) {
		t.Helper()
		if _, err := p.orch.Do(context.Background(), matrixRequest(t, id, true, false)); err == nil {
			t.Fatal("the decode did not refuse")
		}
		wantNoLegsCounted(t, p.orch.cfg.Prefill, p.orch.cfg.Decode)
	}
	refuse("vc1")
	refuse("vc2")
	if n := p.versionAsked.Load(); n != 1 {
		t.Fatalf("asked the version %d times for two refusals, want 1", n)
	}
	dec.eject(time.Now())
	dec.ok()
	p.decode.version = "0.20.2" // restarted as an older release
	refuse("vc3")
	if n := p.versionAsked.Load(); n != 2 {
		t.Errorf("asked the version %d times, want it asked again after the instance came back", n)
	}
	_, outcomes, problems := p.decode.snapshot()
	want := []string{outcomeRejected, outcomeRejected, outcomeRejected, outcomeImported}
	if fmt.Sprint(outcomes) != fmt.Sprint(want) || len(problems) != 0 {
		t.Errorf("decode outcomes %v, problems %v; want %v: the older release is claimed", outcomes, problems, want)
	}
}
