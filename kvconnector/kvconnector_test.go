package kvconnector

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var (
	testPrefill = Peer{EngineID: "thinker-prefill-0", KVHost: "10.0.0.1", KVPort: 21001, HTTPAddr: "10.0.0.1:8100", TP: 2}
	testDecode  = Peer{EngineID: "thinker-decode-0", KVHost: "10.0.0.2", KVPort: 22001, HTTPAddr: "10.0.0.2:8200", TP: 4}
)

// Request ids hold ':' followed by digits and '_' on purpose: P2pNccl's
// address parsing breaks on them unless the id is encoded.
func testHandoffs() [2]Handoff {
	return [2]Handoff{
		NewHandoff("req:42_x", testPrefill, testDecode),
		NewHandoff("req:43_y", testPrefill, testDecode),
	}
}

var testPrompts = [2]string{"prompt one", "prompt two"}

// conformance is one contract under the shared suite: what the registry is
// asked for, the fake of the real connector pair, and the exact values the
// router must produce for the first test request.
type conformance struct {
	connector  string
	extra      map[string]any
	shape      string // which engine version the fake behaves like, when several
	fake       func(h Handoff) pairFake
	name       string
	dispatch   Dispatch
	required   []string
	prefillIDs [2]string      // X-Request-Id of the first request: prefill, decode
	prefill    map[string]any // exact prefill kv_transfer_params; nil: none
	decode     map[string]any // exact decode kv_transfer_params in the exchange; nil: none
	// ignoresResponse: a concurrent contract whose decode leg is sent before
	// the prefill answers, so nothing the prefill says may change it.
	ignoresResponse bool
}

func p2pID(h Handoff) string {
	return "___prefill_addr_10.0.0.1:21001___decode_addr_10.0.0.2:22001_" + hex.EncodeToString([]byte(h.RequestID))
}

func conformanceCases() []conformance {
	h := testHandoffs()[0]
	same := [2]string{h.RequestID, h.RequestID}
	nixlPrefill := map[string]any{"do_remote_decode": true, "do_remote_prefill": false}
	nixlDecode := map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": []any{[]any{10, 11, 12}}, "remote_engine_id": "thinker-prefill-0",
		"remote_request_id": "req:42_x-00000001", "remote_host": "10.0.0.1", "remote_port": 21001,
		"tp_size": 2, "remote_num_tokens": 10, "pp_size": 1, "dcp_size": 1, "transfer_mode": "pull",
	}
	pullRequired := []string{"remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port"}
	// NIXL without remote_request_id: vLLM before NIXL connector version 2
	// and llm-d's simulator; tp_size is the prefill's own.
	nixlRequired := []string{"remote_block_ids", "remote_engine_id", "remote_host", "remote_port"}
	nixlLegacyDecode := map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": []any{10, 11, 12}, "remote_engine_id": "thinker-prefill-0",
		"remote_host": "10.0.0.1", "remote_port": 21001, "tp_size": 2,
	}
	pushPrefill := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": "xfer-req:42_x"}
	pushDecode := map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false, "transfer_id": "xfer-req:42_x",
		"remote_engine_id": "thinker-prefill-0", "remote_bootstrap_addr": "http://10.0.0.1:21001",
	}
	// MoRIIO's prefill is told where the decode listens (TP 4: handshake
	// 22001-22004, notify 22005-22008) and reads the record keys by name.
	moriioPrefill := map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": "xfer-req:42_x",
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": "10.0.0.2", "remote_port": 22001,
		"remote_handshake_port": 22001, "remote_notify_port": 22005, "remote_dp_size": 1, "remote_tp_size": 4,
	}
	return []conformance{
		{
			connector: NixlConnector,
			fake:      func(h Handoff) pairFake { return newPullFake("NIXL", h, true) },
			name:      NixlConnector, dispatch: Sequential, required: nixlRequired, prefillIDs: same,
			prefill: nixlPrefill, decode: nixlDecode,
		},
		{
			connector: NixlConnector, shape: shapeVLLMLegacy.String(),
			fake: func(h Handoff) pairFake { return newShapedPullFake("NIXL", h, shapeVLLMLegacy) },
			name: NixlConnector, dispatch: Sequential, required: nixlRequired, prefillIDs: same,
			prefill: nixlPrefill, decode: nixlLegacyDecode,
		},
		{
			connector: NixlConnector, shape: shapeLLMDSim.String(),
			fake: func(h Handoff) pairFake { return newShapedPullFake("NIXL", h, shapeLLMDSim) },
			name: NixlConnector, dispatch: Sequential, required: nixlRequired, prefillIDs: same,
			prefill: nixlPrefill, decode: nixlLegacyDecode,
		},
		{
			connector: MooncakeConnector,
			fake:      func(h Handoff) pairFake { return newPushFake("Mooncake", h) },
			name:      MooncakeConnector, dispatch: Concurrent, prefillIDs: same,
			prefill: pushPrefill, decode: pushDecode,
		},
		{
			connector: P2pNcclConnector,
			fake:      func(h Handoff) pairFake { return newP2pNcclFake(h) },
			name:      P2pNcclConnector, dispatch: Sequential, prefillIDs: [2]string{p2pID(h), p2pID(h)},
		},
		{
			connector: LMCacheConnectorV1,
			fake:      func(h Handoff) pairFake { return newLMCacheFake(h) },
			name:      LMCacheConnectorV1, dispatch: Sequential, prefillIDs: same,
		},
		{
			// LMCache PD mode, selected by LMCache's enable_pd key given as a
			// kv_connector_extra_config override.
			connector: LMCacheConnectorV1, shape: "pd",
			extra: map[string]any{"lmcache.enable_pd": true, "lmcache.pd_role": "sender"},
			fake:  func(h Handoff) pairFake { return newLMCachePDFake(h) },
			name:  LMCacheConnectorV1, dispatch: Sequential, prefillIDs: same,
			prefill: map[string]any{"ret_first_tok": true, "disagg_spec": map[string]any{
				"req_id": "xfer-req:42_x", "receiver_host": "10.0.0.2",
				"receiver_init_port": []any{22001, 22002, 22003, 22004}, "receiver_alloc_port": []any{22005, 22006, 22007, 22008},
			}},
		},
		{
			connector: MoRIIOConnector, extra: map[string]any{"read_mode": true, "handshake_port": 21001},
			fake: func(h Handoff) pairFake { return newMoRIIOFake(h, false) },
			name: MoRIIOConnector, dispatch: Sequential, prefillIDs: same,
			required: []string{"remote_block_ids", "remote_engine_id", "transfer_id"},
			prefill:  moriioPrefill,
			decode: map[string]any{
				"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []any{10, 11, 12},
				"remote_engine_id": "10.0.0.1:21001", "remote_host": "10.0.0.1", "remote_port": 21001,
				"remote_handshake_port": 21001, "remote_notify_port": 21003, "remote_dp_size": 1,
				"tp_size": 2, "remote_tp_size": 2, "transfer_id": "xfer-req:42_x", "remote_dp_rank": 0,
			},
		},
		{
			connector: MoRIIOConnector, extra: map[string]any{"read_mode": false},
			fake: func(h Handoff) pairFake { return newMoRIIOFake(h, true) },
			name: MoRIIOConnector, dispatch: Concurrent, prefillIDs: same, ignoresResponse: true,
			prefill: moriioPrefill,
			decode: map[string]any{
				"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": nil,
				"remote_engine_id": nil, "remote_host": "10.0.0.1", "remote_port": 21001,
				"remote_handshake_port": 21001, "remote_notify_port": 21003, "remote_dp_size": 1,
				"tp_size": 2, "remote_tp_size": 2, "transfer_id": "xfer-req:42_x", "remote_dp_rank": 0,
			},
		},
		{
			connector: MultiConnector,
			extra: map[string]any{"connectors": []any{
				map[string]any{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
				map[string]any{"kv_connector": "NixlConnector", "kv_role": "kv_both"},
			}},
			fake: func(h Handoff) pairFake { return newPullFake("NIXL", h, true) },
			name: "MultiConnector(NixlConnector)", dispatch: Sequential, required: nixlRequired, prefillIDs: same,
			prefill: nixlPrefill, decode: nixlDecode,
		},
		{
			connector: ReferenceConnector, extra: map[string]any{"handshake": "pull"},
			fake: func(h Handoff) pairFake { return newPullFake("reference pull", h, false) },
			name: ReferenceConnector, dispatch: Sequential, required: pullRequired, prefillIDs: same,
			prefill: nixlPrefill,
			decode: map[string]any{
				"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "thinker-prefill-0",
				"remote_block_ids": []any{10, 11, 12}, "remote_host": "10.0.0.1", "remote_port": 21001,
				"remote_request_id": "req:42_x", "tp_size": 1,
			},
		},
		{
			connector: ReferenceConnector, extra: map[string]any{"handshake": "push"},
			fake: func(h Handoff) pairFake { return newPushFake("reference push", h) },
			name: ReferenceConnector, dispatch: Concurrent, prefillIDs: same,
			prefill: pushPrefill, decode: pushDecode,
		},
	}
}

func caseName(c conformance) string {
	if c.shape != "" {
		return c.connector + "/" + c.shape
	}
	if h, ok := c.extra["handshake"].(string); ok {
		return c.connector + "/" + h
	}
	if c.connector == MoRIIOConnector {
		if moriioReadMode(c.extra["read_mode"]) {
			return c.connector + "/read"
		}
		return c.connector + "/write"
	}
	return c.connector
}

// TestConformance runs every built-in contract through the one suite.
func TestConformance(t *testing.T) {
	r := NewRegistry()
	for _, tc := range conformanceCases() {
		t.Run(caseName(tc), func(t *testing.T) {
			c, err := r.Lookup(tc.connector, tc.extra)
			if err != nil {
				t.Fatal(err)
			}
			runConformance(t, c, tc)
		})
	}
}

// equalJSON compares two values as the wire sees them.
func equalJSON(t testing.TB, got, want any) bool {
	t.Helper()
	return bytes.Equal(mustJSON(t, got), mustJSON(t, want))
}

// validResponse is a response of the fake that satisfies the contract, as
// the orchestrator decodes it: an object, or nil when the connector answers
// null.
func validResponse(t *testing.T, c Contract, tc conformance) map[string]any {
	t.Helper()
	h := testHandoffs()[0]
	f := tc.fake(h)
	pid, did := c.RequestIDs(h)
	if c.Dispatch() == Concurrent {
		// The decode is sent first, as the exchange sends it; a WRITE-mode
		// MoRIIO prefill needs the blocks it announces.
		params, err := c.DecodeParams(h, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.decode(t, leg{requestID: did, params: wire(t, params), prompt: testPrompts[0]})
	}
	raw := f.prefill(t, leg{requestID: pid, params: wire(t, c.PrefillParams(h)), prompt: testPrompts[0]})
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("the fake answered %s: %v", raw, err)
	}
	return m
}

func runConformance(t *testing.T, c Contract, tc conformance) {
	h := testHandoffs()[0]

	t.Run("identity", func(t *testing.T) {
		if c.Name() != tc.name {
			t.Errorf("Name() = %q, want %q", c.Name(), tc.name)
		}
		if c.Dispatch() != tc.dispatch {
			t.Errorf("Dispatch() = %v, want %v", c.Dispatch(), tc.dispatch)
		}
		if got := c.Required(); !slices.Equal(got, tc.required) {
			t.Errorf("Required() = %q, want %q", got, tc.required)
		}
	})

	t.Run("prefill-params", func(t *testing.T) {
		got := c.PrefillParams(h)
		if (got == nil) != (tc.prefill == nil) || !equalJSON(t, got, tc.prefill) {
			t.Fatalf("PrefillParams = %s, want %s", mustJSON(t, got), mustJSON(t, tc.prefill))
		}
		if got != nil {
			// The orchestrator may add to what it gets; the next request must
			// not see it.
			got["scribble"] = 1
			if _, ok := c.PrefillParams(h)["scribble"]; ok {
				t.Error("PrefillParams returns a shared map")
			}
		}
	})

	t.Run("request-ids", func(t *testing.T) {
		p, d := c.RequestIDs(h)
		if p != tc.prefillIDs[0] || d != tc.prefillIDs[1] {
			t.Errorf("RequestIDs = %q, %q; want %q, %q", p, d, tc.prefillIDs[0], tc.prefillIDs[1])
		}
		h2 := testHandoffs()[1]
		if p2, _ := c.RequestIDs(h2); p2 == p {
			t.Errorf("two requests share the X-Request-Id %q", p)
		}
	})

	// exchange runs two requests through the connector pair the way the
	// dispatch allows, interleaved so that a transfer keyed on the wrong id
	// meets the wrong request.
	t.Run("exchange", func(t *testing.T) {
		hs := testHandoffs()
		f := tc.fake(hs[0])
		var decodes [2]map[string]any
		prefill := func(i int) json.RawMessage {
			pid, _ := c.RequestIDs(hs[i])
			return f.prefill(t, leg{requestID: pid, params: wire(t, c.PrefillParams(hs[i])), prompt: testPrompts[i]})
		}
		decode := func(i int, resp any) {
			params, err := c.DecodeParams(hs[i], resp)
			if err != nil {
				t.Fatalf("DecodeParams(%s): %v", mustJSON(t, resp), err)
			}
			decodes[i] = params
			_, did := c.RequestIDs(hs[i])
			f.decode(t, leg{requestID: did, params: wire(t, params), prompt: testPrompts[i]})
		}
		switch c.Dispatch() {
		case Sequential:
			var resps [2]any
			for i := range 2 {
				if err := json.Unmarshal(prefill(i), &resps[i]); err != nil {
					t.Fatal(err)
				}
			}
			decode(1, resps[1])
			decode(0, resps[0])
		case Concurrent:
			// Decodes first: they must not need anything the prefill says.
			decode(0, nil)
			decode(1, nil)
			for _, i := range []int{1, 0} {
				var resp any
				if err := json.Unmarshal(prefill(i), &resp); err != nil {
					t.Fatal(err)
				}
				// Had the orchestrator waited for the prefill, it would have
				// sent the same decode.
				again, err := c.DecodeParams(hs[i], resp)
				if err != nil || !equalJSON(t, again, decodes[i]) {
					t.Errorf("DecodeParams after the prefill = %s, %v; before it %s", mustJSON(t, again), err, mustJSON(t, decodes[i]))
				}
			}
		default:
			t.Fatalf("unknown dispatch %v", c.Dispatch())
		}
		f.settled(t)
		if (decodes[0] == nil) != (tc.decode == nil) || !equalJSON(t, decodes[0], tc.decode) {
			t.Errorf("decode kv_transfer_params = %s\nwant %s", mustJSON(t, decodes[0]), mustJSON(t, tc.decode))
		}
	})

	t.Run("raw-json", func(t *testing.T) {
		resp := validResponse(t, c, tc)
		want, err := c.DecodeParams(h, resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.DecodeParams(h, json.RawMessage(mustJSON(t, resp)))
		if err != nil || !equalJSON(t, got, want) {
			t.Errorf("from json.RawMessage: %s, %v; from the decoded value: %s", mustJSON(t, got), err, mustJSON(t, want))
		}
	})

	if tc.decode == nil {
		// P2pNccl, LMCache: the decode leg carries nothing, whatever the
		// prefill said.
		t.Run("no-decode-params", func(t *testing.T) {
			for _, resp := range []any{nil, map[string]any{"remote_block_ids": []any{1}}, []any{1}, "x"} {
				if got, err := c.DecodeParams(h, resp); got != nil || err != nil {
					t.Errorf("DecodeParams(%v) = %v, %v; want nil, nil", resp, got, err)
				}
			}
		})
		return
	}

	if tc.ignoresResponse {
		t.Run("response-ignored", func(t *testing.T) {
			want, err := c.DecodeParams(h, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp := validResponse(t, c, tc)
			resp["remote_block_ids"] = []any{99.0}
			resp["do_remote_decode"] = true
			for _, in := range []any{resp, json.RawMessage(`[1]`), "x"} {
				if got, err := c.DecodeParams(h, in); err != nil || !equalJSON(t, got, want) {
					t.Errorf("DecodeParams(%v) = %s, %v; want %s whatever the prefill said", in, mustJSON(t, got), err, mustJSON(t, want))
				}
			}
		})
		return
	}

	t.Run("pass-through", func(t *testing.T) {
		resp := validResponse(t, c, tc)
		if resp == nil {
			resp = map[string]any{}
		}
		// Keys from a newer connector version, the prefill's own word on the
		// keys the router seeds, and flags the router must override.
		resp["x_newer_key"] = map[string]any{"nested": []any{1.0, "two"}}
		resp["remote_num_tokens"] = 7.0
		resp["do_remote_prefill"] = false
		resp["do_remote_decode"] = true
		seeded, err := c.DecodeParams(h, validResponse(t, c, tc))
		if err != nil {
			t.Fatal(err)
		}
		for k := range seeded {
			if _, ok := resp[k]; !ok {
				resp[k] = "from-prefill-" + k
			}
		}
		before := mustJSON(t, resp)
		got, err := c.DecodeParams(h, resp)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustJSON(t, resp), before) {
			t.Error("DecodeParams modified the prefill's response")
		}
		for k, v := range resp {
			if k == "do_remote_prefill" || k == "do_remote_decode" {
				continue
			}
			if !reflect.DeepEqual(got[k], v) {
				t.Errorf("%s = %v, the prefill returned %v (the prefill's word wins)", k, got[k], v)
			}
		}
		if got["do_remote_prefill"] != true || got["do_remote_decode"] != false {
			t.Errorf("flags do_remote_prefill=%v do_remote_decode=%v; want true, false whatever the prefill said", got["do_remote_prefill"], got["do_remote_decode"])
		}
	})

	for _, key := range c.Required() {
		for _, mut := range []struct {
			name string
			set  func(m map[string]any)
		}{
			{"missing", func(m map[string]any) { delete(m, key) }},
			{"null", func(m map[string]any) { m[key] = nil }},
			{"malformed", func(m map[string]any) { m[key] = map[string]any{"x": 1.0} }},
		} {
			t.Run(mut.name+"-"+key, func(t *testing.T) {
				resp := validResponse(t, c, tc)
				mut.set(resp)
				got, err := c.DecodeParams(h, resp)
				wantHandoffError(t, err, key)
				if got != nil {
					t.Errorf("DecodeParams returned params with an error: %v", got)
				}
			})
		}
	}

	t.Run("null-response", func(t *testing.T) {
		for _, resp := range []any{nil, json.RawMessage("null"), json.RawMessage(nil), map[string]any(nil)} {
			got, err := c.DecodeParams(h, resp)
			if len(c.Required()) > 0 {
				// NIXL-shaped: a null answer means the prefill kept nothing
				// for the decode (EOS as the one token, or a connector
				// mismatch); do_remote_prefill without blocks would crash it.
				wantHandoffError(t, err, c.Required()...)
				continue
			}
			// Mooncake-shaped: null is the normal answer (the defect that
			// makes vllm-omni fail every Mooncake request).
			if err != nil {
				t.Fatalf("DecodeParams(%#v): %v", resp, err)
			}
			if !equalJSON(t, got, tc.decode) {
				t.Errorf("DecodeParams(%#v) = %s, want %s", resp, mustJSON(t, got), mustJSON(t, tc.decode))
			}
		}
	})

	t.Run("non-object", func(t *testing.T) {
		for _, resp := range []any{[]any{1.0}, "remote_block_ids", 1.5, true, json.Number("3"),
			json.RawMessage(`[1]`), json.RawMessage(`{"remote_block_ids": [1]`), json.RawMessage(`{} {}`), struct{}{}} {
			got, err := c.DecodeParams(h, resp)
			wantHandoffError(t, err, c.Required()...)
			if got != nil {
				t.Errorf("DecodeParams(%#v) returned params with an error", resp)
			}
		}
	})
}

func wantHandoffError(t *testing.T, err error, keys ...string) {
	t.Helper()
	if !errors.Is(err, ErrInvalidHandoff) {
		t.Fatalf("err = %v, want one wrapping ErrInvalidHandoff", err)
	}
	var he *HandoffError
	if !errors.As(err, &he) {
		t.Fatalf("err = %T, want *HandoffError", err)
	}
	for _, k := range keys {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error %q does not name %s", err, k)
		}
	}
}

// TestMooncakeNullPrefillResponse pins the fix of the vllm-omni defect: a
// Mooncake prefill answers null and the decode still gets everything it needs.
func TestMooncakeNullPrefillResponse(t *testing.T) {
	c, err := NewRegistry().Lookup(MooncakeConnector, map[string]any{"mooncake_bootstrap_port": 21001})
	if err != nil {
		t.Fatal(err)
	}
	if c.Required() != nil {
		t.Errorf("Mooncake requires %q of a prefill that answers null", c.Required())
	}
	got, err := c.DecodeParams(testHandoffs()[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"transfer_id", "remote_engine_id", "remote_bootstrap_addr"} {
		if _, ok := got[k]; !ok {
			t.Errorf("decode params lack %s: %v", k, got)
		}
	}
}

func TestHandoffErrorNamesEveryProblem(t *testing.T) {
	c, _ := NewRegistry().Lookup(NixlConnector, nil)
	_, err := c.DecodeParams(testHandoffs()[0], map[string]any{
		"remote_block_ids": "1,2,3",
		"remote_engine_id": "",
		"remote_port":      70000.0,
		"remote_host":      nil,
	})
	var he *HandoffError
	if !errors.As(err, &he) {
		t.Fatalf("err = %v", err)
	}
	if want := []string{"remote_host"}; !slices.Equal(he.Missing, want) {
		t.Errorf("Missing = %q, want %q", he.Missing, want)
	}
	if len(he.Invalid) != 3 {
		t.Errorf("Invalid = %q, want remote_block_ids, remote_engine_id and remote_port", he.Invalid)
	}
	want := `invalid prefill handoff: NixlConnector prefill response: missing remote_host: remote_block_ids: want a list of block ids, got a string: remote_engine_id: empty: remote_port: want a port number (1-65535), got 70000`
	if err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
}

func TestPortValues(t *testing.T) {
	for _, tc := range []struct {
		v  any
		ok bool
	}{
		{21001.0, true}, {json.Number("21001"), true}, {21001, true}, {uint16(80), true}, {float32(80), true},
		{0.0, false}, {65536.0, false}, {-1.0, false}, {1.5, false}, {json.Number("1e3"), true},
		{json.Number("1.5"), false}, {"21001", false}, {1e300, false}, {json.Number("99999999999999999999"), false},
	} {
		if got := isPort(tc.v) == ""; got != tc.ok {
			t.Errorf("isPort(%#v) ok = %v, want %v", tc.v, got, tc.ok)
		}
	}
}

func TestP2pNcclRequestIDRoundTrip(t *testing.T) {
	h := NewHandoff("chatcmpl-7:8_9___decode_addr_1.2.3.4:5", testPrefill, testDecode)
	id := p2pNcclRequestID(h)
	if got := p2pDecodeAddr.FindStringSubmatch(id); got == nil || got[1]+":"+got[2] != "10.0.0.2:22001" {
		t.Errorf("decode address parsed from %q: %q", id, got)
	}
	if got := p2pPrefillAddr.FindStringSubmatch(id); got == nil || got[1]+":"+got[2] != "10.0.0.1:21001" {
		t.Errorf("prefill address parsed from %q: %q", id, got)
	}
	// vLLM wraps the id as chatcmpl-<id>-<8 hex>; the parse must survive it.
	wrapped := "chatcmpl-" + id + "-1a2b3c4d"
	if got := p2pDecodeAddr.FindStringSubmatch(wrapped); got == nil || got[1]+":"+got[2] != "10.0.0.2:22001" {
		t.Errorf("decode address parsed from %q: %q", wrapped, got)
	}
	tail := id[strings.LastIndexByte(id, '_')+1:]
	if b, err := hex.DecodeString(tail); err != nil || string(b) != h.RequestID {
		t.Errorf("the id's tail %q does not decode to the request id: %q, %v", tail, b, err)
	}
}

func TestRegistryUnknownConnector(t *testing.T) {
	r := NewRegistry()
	_, err := r.Lookup("PyNcclConnector", nil)
	if !errors.Is(err, ErrUnknownConnector) {
		t.Fatalf("err = %v, want ErrUnknownConnector", err)
	}
	for _, n := range r.Names() {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not list %s", err, n)
		}
	}
	var zero Registry
	if _, err := zero.Lookup(NixlConnector, nil); !errors.Is(err, ErrUnknownConnector) {
		t.Errorf("zero registry: err = %v", err)
	}
}

func TestRegistryNames(t *testing.T) {
	want := []string{"LMCacheConnectorV1", "MoRIIOConnector", "MooncakeConnector", "MultiConnector", "NixlConnector", "P2pNcclConnector", "ReferenceConnector"}
	if got := NewRegistry().Names(); !slices.Equal(got, want) {
		t.Errorf("Names() = %q, want %q", got, want)
	}
}

func TestRegistryRegister(t *testing.T) {
	r := NewRegistry()
	custom := func(map[string]any) (Contract, error) { return lmcache(nil) }
	if err := r.Register(NixlConnector, custom); err == nil {
		t.Error("registering NixlConnector twice succeeded")
	}
	if err := r.Register("", custom); err == nil {
		t.Error("registering an empty name succeeded")
	}
	if err := r.Register("Custom", nil); err == nil {
		t.Error("registering a nil factory succeeded")
	}
	if err := r.Register("Custom", custom); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("Custom", custom); err == nil {
		t.Error("registering Custom twice succeeded")
	}
	if _, err := r.Lookup("Custom", nil); err != nil {
		t.Error(err)
	}
	// A registered connector can be a MultiConnector child.
	c, err := r.Lookup(MultiConnector, map[string]any{"connectors": []any{map[string]any{"kv_connector": "Custom"}}})
	if err != nil || c.Name() != "MultiConnector(LMCacheConnectorV1)" {
		t.Errorf("MultiConnector over Custom: %v, %v", c, err)
	}

	var zero Registry
	if err := zero.Register("Custom", custom); err != nil {
		t.Fatal(err)
	}
	if got := zero.Names(); !slices.Equal(got, []string{"Custom"}) {
		t.Errorf("zero registry Names() = %q", got)
	}

	failing := func(map[string]any) (Contract, error) { return nil, nil }
	_ = r.Register("Nil", failing)
	if _, err := r.Lookup("Nil", nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a factory returning no contract: err = %v", err)
	}
}

func TestReferenceHandshake(t *testing.T) {
	r := NewRegistry()
	for _, tc := range []struct {
		extra    map[string]any
		dispatch Dispatch
		required bool
		err      bool
	}{
		{nil, Sequential, true, false}, // the worker's default is pull
		{map[string]any{"handshake": "pull", "lease_seconds": 30.0}, Sequential, true, false},
		{map[string]any{"handshake": "push"}, Concurrent, false, false},
		{map[string]any{"handshake": "Push"}, 0, false, true},
		{map[string]any{"handshake": ""}, 0, false, true},
		{map[string]any{"handshake": true}, 0, false, true},
		{map[string]any{"handshake": nil}, 0, false, true},
	} {
		c, err := r.Lookup(ReferenceConnector, tc.extra)
		if tc.err {
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "handshake") {
				t.Errorf("%v: err = %v, want ErrInvalidConfig naming handshake", tc.extra, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.extra, err)
			continue
		}
		if c.Dispatch() != tc.dispatch || (len(c.Required()) > 0) != tc.required {
			t.Errorf("%v: dispatch %v required %q", tc.extra, c.Dispatch(), c.Required())
		}
	}
}

// TestMoRIIOMode: read_mode is read as vLLM reads it, and anything but a
// true value is vLLM's default, WRITE mode, which omnipd routes too.
func TestMoRIIOMode(t *testing.T) {
	r := NewRegistry()
	for _, v := range []any{true, "true", "True", " 1 ", 1.0, json.Number("1"), 1} {
		c, err := r.Lookup(MoRIIOConnector, map[string]any{"read_mode": v})
		if err != nil || c.Dispatch() != Sequential || len(c.Required()) == 0 {
			t.Errorf("read_mode %#v: %v, %v; want READ (sequential, blocks required)", v, c, err)
		}
	}
	for _, extra := range []map[string]any{nil, {"read_mode": false}, {"read_mode": "false"}, {"read_mode": 0.0}, {"read_mode": "yes"}} {
		c, err := r.Lookup(MoRIIOConnector, extra)
		if err != nil || c.Dispatch() != Concurrent || c.Required() != nil {
			t.Errorf("%v: %v, %v; want WRITE (concurrent, nothing required)", extra, c, err)
		}
	}
}

func TestMultiConnector(t *testing.T) {
	r := NewRegistry()
	child := func(name string, extra map[string]any) any {
		m := map[string]any{"kv_connector": name, "kv_role": "kv_both"}
		if extra != nil {
			m["kv_connector_extra_config"] = extra
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		children any
		want     string
		err      error
	}{
		{"pd child after offload", []any{child("LMCacheConnectorV1", nil), child("NixlConnector", nil)}, "MultiConnector(NixlConnector)", nil},
		{"pd child first", []any{child("MooncakeConnector", nil), child("LMCacheConnectorV1", nil)}, "MultiConnector(MooncakeConnector)", nil},
		{"child extra config", []any{child("ReferenceConnector", map[string]any{"handshake": "push"})}, "MultiConnector(ReferenceConnector)", nil},
		{"request-id coupling counts", []any{child("LMCacheConnectorV1", nil), child("P2pNcclConnector", nil)}, "MultiConnector(P2pNcclConnector)", nil},
		{"content-addressed only", []any{child("LMCacheConnectorV1", nil)}, "MultiConnector(LMCacheConnectorV1)", nil},
		{"nested", []any{child("MultiConnector", map[string]any{"connectors": []any{child("NixlConnector", nil)}})}, "MultiConnector(MultiConnector(NixlConnector))", nil},
		{"two pd children", []any{child("NixlConnector", nil), child("MooncakeConnector", nil)}, "", ErrInvalidConfig},
		{"unknown child", []any{child("NoSuchConnector", nil)}, "", ErrUnknownConnector},
		{"bad child config", []any{child("ReferenceConnector", map[string]any{"handshake": "Push"})}, "", ErrInvalidConfig},
		{"child not an object", []any{"NixlConnector"}, "", ErrInvalidConfig},
		{"child without a name", []any{map[string]any{"kv_role": "kv_both"}}, "", ErrInvalidConfig},
		{"child extra not an object", []any{map[string]any{"kv_connector": "NixlConnector", "kv_connector_extra_config": "x"}}, "", ErrInvalidConfig},
		{"empty", []any{}, "", ErrInvalidConfig},
		{"not a list", map[string]any{}, "", ErrInvalidConfig},
		{"unset", nil, "", ErrInvalidConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			extra := map[string]any{}
			if tc.children != nil {
				extra["connectors"] = tc.children
			}
			c, err := r.Lookup(MultiConnector, extra)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Name() != tc.want {
				t.Errorf("Name() = %q, want %q", c.Name(), tc.want)
			}
		})
	}
}

// TestContractsAreIndependent checks that no call leaks state into another:
// decode params are fresh maps and the seed is recomputed per handoff.
func TestContractsAreIndependent(t *testing.T) {
	c, _ := NewRegistry().Lookup(MooncakeConnector, nil)
	hs := testHandoffs()
	a, _ := c.DecodeParams(hs[0], nil)
	a["transfer_id"] = "scribbled"
	b, _ := c.DecodeParams(hs[1], nil)
	if b["transfer_id"] != "xfer-req:43_y" {
		t.Errorf("transfer_id = %v", b["transfer_id"])
	}
	if a2, _ := c.DecodeParams(hs[0], nil); a2["transfer_id"] != "xfer-req:42_x" {
		t.Errorf("transfer_id = %v", a2["transfer_id"])
	}
	// IPv6 side channels are bracketed in the bootstrap URL.
	v6 := NewHandoff("r", Peer{EngineID: "p", KVHost: "fd00::1", KVPort: 8998}, testDecode)
	if got, _ := c.DecodeParams(v6, nil); got["remote_bootstrap_addr"] != "http://[fd00::1]:8998" {
		t.Errorf("remote_bootstrap_addr = %v", got["remote_bootstrap_addr"])
	}
	// TP 0 means 1.
	m, _ := NewRegistry().Lookup(MoRIIOConnector, map[string]any{"read_mode": "1"})
	if got := m.PrefillParams(NewHandoff("r", testPrefill, Peer{}))["remote_tp_size"]; got != 1 {
		t.Errorf("remote_tp_size = %v, want 1", got)
	}
}

func TestDispatchString(t *testing.T) {
	if Sequential.String() != "sequential" || Concurrent.String() != "concurrent" || Dispatch(7).String() != "Dispatch(7)" {
		t.Error(Sequential, Concurrent, Dispatch(7))
	}
}

// fuzzContracts are the built-in contracts the fuzzer runs.
func fuzzContracts(t testing.TB) []Contract {
	r := NewRegistry()
	var cs []Contract
	for _, tc := range conformanceCases() {
		c, err := r.Lookup(tc.connector, tc.extra)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

// FuzzDecodeParams feeds arbitrary JSON as the prefill's kv_transfer_params:
// the result is an error wrapping ErrInvalidHandoff or params that carry
// every required key and the forced flags; never a panic.
func FuzzDecodeParams(f *testing.F) {
	for _, s := range []string{
		`null`, `{}`, `[]`, `"x"`, `1`, `true`, `{"remote_block_ids": null}`,
		`{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[1, 2]], "remote_engine_id": "e", "remote_request_id": "r", "remote_host": "h", "remote_port": 5600, "tp_size": 1}`,
		`{"remote_block_ids": [1], "remote_engine_id": "e", "transfer_id": "t", "remote_port": 1e400}`,
		`{"remote_port": 12345678901234567890, "remote_host": {"a": [1]}}`,
		`{"remote_block_ids": "AAEC", "remote_port": -0.0}`, `{"a":1} trailing`, ``,
	} {
		f.Add([]byte(s))
	}
	h := testHandoffs()[0]
	cs := fuzzContracts(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var decoded any
		inputs := []any{json.RawMessage(data)}
		if json.Unmarshal(data, &decoded) == nil {
			inputs = append(inputs, decoded)
		}
		for _, c := range cs {
			for _, in := range inputs {
				var snapshot []byte
				if m, ok := in.(map[string]any); ok {
					snapshot, _ = json.Marshal(m)
				}
				got, err := c.DecodeParams(h, in)
				if err != nil {
					if !errors.Is(err, ErrInvalidHandoff) {
						t.Fatalf("%s: error %v does not wrap ErrInvalidHandoff", c.Name(), err)
					}
					if got != nil {
						t.Fatalf("%s: params with an error", c.Name())
					}
					continue
				}
				if m, ok := in.(map[string]any); ok {
					if now, _ := json.Marshal(m); !bytes.Equal(now, snapshot) {
						t.Fatalf("%s: DecodeParams modified its input", c.Name())
					}
				}
				if got == nil {
					continue // P2pNccl, LMCache
				}
				if got["do_remote_prefill"] != true || got["do_remote_decode"] != false {
					t.Fatalf("%s: flags not forced: %v", c.Name(), got)
				}
				for _, k := range c.Required() {
					if got[k] == nil {
						t.Fatalf("%s: accepted a response without %s", c.Name(), k)
					}
				}
				if _, err := json.Marshal(got); err != nil {
					t.Fatalf("%s: params do not marshal: %v", c.Name(), err)
				}
			}
		}
	})
}

// A MultiConnector whose PD child claims every prompt claims it too: vLLM
// gives the request to that child, whatever the other children match.
func TestMultiConnectorClaimsAsItsPDChild(t *testing.T) {
	r := NewRegistry()
	for _, tt := range []struct {
		child string
		extra map[string]any
		want  bool
	}{
		{P2pNcclConnector, nil, true},
		{MoRIIOConnector, map[string]any{"read_mode": true}, true},
		{NixlConnector, nil, false},
	} {
		child := map[string]any{"kv_connector": tt.child}
		if tt.extra != nil {
			child["kv_connector_extra_config"] = tt.extra
		}
		c, err := r.Lookup(MultiConnector, map[string]any{"connectors": []any{child, map[string]any{"kv_connector": LMCacheConnectorV1}}})
		if err != nil {
			t.Fatalf("%s: %v", tt.child, err)
		}
		pc, ok := c.(PromptClaimer)
		if got := ok && pc.ClaimsEveryPrompt(); got != tt.want {
			t.Errorf("MultiConnector(%s, LMCache) claims every prompt: %v, want %v", tt.child, got, tt.want)
		}
	}
}
