package kvconnector

import (
	"encoding/json"
	"regexp"
	"strconv"
	"testing"
)

// p2pNcclFake: no kv_transfer_params. The prefill reads the decode's address
// from its request id and sends the KV there under that id; the decode reads
// the prefill's address from its own request id and receives by that id. The
// regular expressions are vLLM's (P2pNcclEngine.parse_request_id).
type p2pNcclFake struct {
	p, d  Peer
	inbox map[string]*export // decode side, by request id
}

var (
	p2pDecodeAddr  = regexp.MustCompile(`___decode_addr_(.*):(\d+)`)
	p2pPrefillAddr = regexp.MustCompile(`___prefill_addr_(.*):(\d+)___`)
)

func newP2pNcclFake(h Handoff) *p2pNcclFake {
	return &p2pNcclFake{p: h.Prefill, d: h.Decode, inbox: map[string]*export{}}
}

func parseP2pAddr(t testing.TB, re *regexp.Regexp, id string) string {
	t.Helper()
	m := re.FindStringSubmatch(id)
	if m == nil {
		t.Fatalf("P2pNccl: ValueError: Request id %s does not contain hostname and port", id)
	}
	return m[1] + ":" + m[2]
}

func (f *p2pNcclFake) prefill(t testing.TB, l leg) json.RawMessage {
	t.Helper()
	if l.params != nil {
		t.Errorf("P2pNccl prefill: unexpected kv_transfer_params %v", l.params)
	}
	if got, want := parseP2pAddr(t, p2pDecodeAddr, l.requestID), f.d.KVHost+":"+strconv.Itoa(f.d.KVPort); got != want {
		t.Fatalf("P2pNccl prefill: request id %q sends the KV to %s, the decode listens at %s", l.requestID, got, want)
	}
	f.inbox[l.requestID] = &export{prompt: l.prompt, leg: l}
	return json.RawMessage("null")
}

func (f *p2pNcclFake) decode(t testing.TB, l leg) {
	t.Helper()
	if l.params != nil {
		t.Errorf("P2pNccl decode: unexpected kv_transfer_params %v", l.params)
	}
	if got, want := parseP2pAddr(t, p2pPrefillAddr, l.requestID), f.p.KVHost+":"+strconv.Itoa(f.p.KVPort); got != want {
		t.Fatalf("P2pNccl decode: request id %q names the prefill %s, it is at %s", l.requestID, got, want)
	}
	e, ok := f.inbox[l.requestID]
	if !ok || e.imported {
		t.Fatalf("P2pNccl decode: no KV received under request id %q (the prefill and decode ids must be equal)", l.requestID)
	}
	if e.prompt != l.prompt {
		t.Fatalf("P2pNccl decode: received the KV of %q for %q", e.prompt, l.prompt)
	}
	e.imported = true
}

func (f *p2pNcclFake) settled(t testing.TB) { t.Helper(); settle(t, "P2pNccl", f.inbox) }
