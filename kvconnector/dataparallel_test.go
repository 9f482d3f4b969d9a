package kvconnector

import (
	"fmt"
	"testing"
)

// NIXL over data-parallel instances: each prefill leg runs on the rank it
// is pinned to and answers with that rank's engine id and side channel, so
// the decode — on whichever of its own ranks — pulls from the rank that
// holds the KV when it gets the answer verbatim.
func TestNixlDataParallel(t *testing.T) {
	c, err := NewRegistry().Lookup(NixlConnector, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, d := testPrefill, testDecode
	p.DP, d.DP = 2, 2
	f := newDPPullFake("NIXL DP", NewHandoff("", p, d))
	var hs []Handoff
	var answers []any
	for i := range 4 {
		h := NewHandoff(fmt.Sprintf("req-%d", i), p, d)
		h.PrefillRank, h.DecodeRank = i%2, (i/2)%2
		hs = append(hs, h)
		pid, _ := c.RequestIDs(h)
		raw := f.prefill(t, leg{requestID: pid, params: wire(t, c.PrefillParams(h)), prompt: fmt.Sprint("prompt ", i)}, h.PrefillRank)
		answers = append(answers, raw)
	}
	for i := len(hs) - 1; i >= 0; i-- {
		h := hs[i]
		params, err := c.DecodeParams(h, answers[i])
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%s_dp%d", p.EngineID, h.PrefillRank); params["remote_engine_id"] != want {
			t.Errorf("request %d: remote_engine_id %v, want the prefill rank's %s", i, params["remote_engine_id"], want)
		}
		_, did := c.RequestIDs(h)
		f.decode(t, leg{requestID: did, params: wire(t, params), prompt: fmt.Sprint("prompt ", i)}, h.DecodeRank)
	}
	f.settled(t)
}

func TestPeerDataParallel(t *testing.T) {
	for _, tc := range []struct{ dp, want int }{{0, 1}, {1, 1}, {4, 4}} {
		if got := (Peer{DP: tc.dp}).DataParallel(); got != tc.want {
			t.Errorf("Peer{DP: %d}.DataParallel() = %d, want %d", tc.dp, got, tc.want)
		}
	}
}
