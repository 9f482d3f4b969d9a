package kvconnector

import (
	"encoding/json"
	"testing"
)

// TestNixlWithoutRemoteRequestID: vLLM's NixlConnector before
// remote_request_id existed, and llm-d's inference simulator, answer a
// prefill without it; their decode finds the KV under its own request id,
// which omnipd keeps equal on both legs. The handoff must go through, and be
// reported as one without remote_request_id.
func TestNixlWithoutRemoteRequestID(t *testing.T) {
	c, err := NewRegistry().Lookup(NixlConnector, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, shape := range []pullShape{shapeVLLMLegacy, shapeLLMDSim} {
		t.Run(shape.String(), func(t *testing.T) {
			hs := testHandoffs()
			f := newShapedPullFake("NIXL "+shape.String(), hs[0], shape)
			var resps [2]any
			for i := range 2 {
				pid, _ := c.RequestIDs(hs[i])
				raw := f.prefill(t, leg{requestID: pid, params: wire(t, c.PrefillParams(hs[i])), prompt: testPrompts[i]})
				if err := json.Unmarshal(raw, &resps[i]); err != nil {
					t.Fatal(err)
				}
			}
			for _, i := range []int{1, 0} {
				params, err := c.DecodeParams(hs[i], resps[i])
				if err != nil {
					t.Fatalf("DecodeParams: %v", err)
				}
				if got := Absent(c, params); len(got) != 1 || got[0] != "remote_request_id" {
					t.Errorf("Absent = %q, want [remote_request_id]", got)
				}
				_, did := c.RequestIDs(hs[i])
				f.decode(t, leg{requestID: did, params: wire(t, params), prompt: testPrompts[i]})
			}
			f.settled(t)
		})
	}
}

// TestNixlRemoteRequestIDStillChecked: optional does not mean unchecked — a
// remote_request_id that is present must be a usable string.
func TestNixlRemoteRequestIDStillChecked(t *testing.T) {
	c, _ := NewRegistry().Lookup(NixlConnector, nil)
	resp := validResponse(t, c, conformanceCases()[0])
	if got := Absent(c, resp); got != nil {
		t.Errorf("Absent of a full vLLM answer = %q, want none", got)
	}
	for _, bad := range []any{"", 7.0, map[string]any{}} {
		resp["remote_request_id"] = bad
		if _, err := c.DecodeParams(testHandoffs()[0], resp); err == nil {
			t.Errorf("remote_request_id %#v accepted", bad)
		} else {
			wantHandoffError(t, err, "remote_request_id")
		}
	}
}

// TestNixlTPSizeSupplied: vLLM's decode reads tp_size without a default in
// push mode and for its lease heartbeats; a prefill that leaves it out gets
// the prefill peer's configured TP, and a prefill that says it wins.
func TestNixlTPSizeSupplied(t *testing.T) {
	c, _ := NewRegistry().Lookup(NixlConnector, nil)
	h := testHandoffs()[0]
	resp := validResponse(t, c, conformanceCases()[0])
	delete(resp, "tp_size")
	got, err := c.DecodeParams(h, resp)
	if err != nil {
		t.Fatal(err)
	}
	if got["tp_size"] != testPrefill.TP {
		t.Errorf("tp_size = %v, want the prefill's TP %d", got["tp_size"], testPrefill.TP)
	}
	resp["tp_size"] = 8.0
	if got, _ := c.DecodeParams(h, resp); got["tp_size"] != 8.0 {
		t.Errorf("tp_size = %v, want the prefill's own 8", got["tp_size"])
	}
	// TP unset in the config means 1.
	h.Prefill.TP = 0
	delete(resp, "tp_size")
	if got, _ := c.DecodeParams(h, resp); got["tp_size"] != 1 {
		t.Errorf("tp_size = %v, want 1", got["tp_size"])
	}
}
