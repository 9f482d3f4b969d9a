package kvconnector

import (
	"encoding/json"
	"net"
	"reflect"
	"strconv"
	"testing"
)

// moriioFake is MoRIIO in READ mode, as vLLM main answers: the prefill
// reports its blocks, its engine id (host:handshake_port) and its side
// channel; the decode reads the blocks and acknowledges by transfer_id,
// which both engines map to the same request id.
type moriioFake struct {
	p, d    Peer
	n       int
	exports map[string]*export // by transfer_id
}

const moriioNotifyPort = 61005

func newMoRIIOFake(h Handoff) *moriioFake {
	return &moriioFake{p: h.Prefill, d: h.Decode, exports: map[string]*export{}}
}

func (f *moriioFake) engineID() string { return kvAddr(f.p) }

func (f *moriioFake) prefill(t testing.TB, l leg) json.RawMessage {
	t.Helper()
	p := l.params
	if !flag(p, "do_remote_decode") {
		t.Fatalf("MoRIIO prefill: no do_remote_decode in %v", p)
	}
	id, _ := p["transfer_id"].(string)
	if id == "" {
		t.Fatalf("MoRIIO prefill: KeyError: 'transfer_id' in %v", p)
	}
	if got := p["remote_tp_size"]; got != float64(tp(f.d)) {
		t.Errorf("MoRIIO prefill: remote_tp_size %v, the decode runs TP %d", got, tp(f.d))
	}
	if got := p["remote_dp_size"]; got != float64(1) {
		t.Errorf("MoRIIO prefill: remote_dp_size %v, want 1", got)
	}
	f.n++
	resp := map[string]any{
		"do_remote_prefill":     true,
		"do_remote_decode":      false,
		"remote_block_ids":      []int{f.n * 10, f.n*10 + 1, f.n*10 + 2},
		"remote_engine_id":      f.engineID(),
		"remote_host":           f.p.KVHost,
		"remote_handshake_port": f.p.KVPort,
		"remote_notify_port":    moriioNotifyPort,
		"remote_dp_size":        1,
		"tp_size":               tp(f.p),
		"transfer_id":           id,
	}
	raw := mustJSON(t, resp)
	var decoded map[string]any
	_ = json.Unmarshal(raw, &decoded)
	f.exports[id] = &export{prompt: l.prompt, blocks: decoded["remote_block_ids"], response: decoded, leg: l}
	return raw
}

func (f *moriioFake) decode(t testing.TB, l leg) {
	t.Helper()
	p := l.params
	if !flag(p, "do_remote_prefill") || flag(p, "do_remote_decode") {
		t.Fatalf("MoRIIO decode: kv_transfer_params %v do not ask for a remote prefill", p)
	}
	blocks, ok := p["remote_block_ids"].([]any)
	if !ok {
		t.Fatalf("MoRIIO decode: KeyError: 'remote_block_ids' in %v", p)
	}
	if id, _ := p["remote_engine_id"].(string); id != f.engineID() {
		t.Fatalf("MoRIIO decode: remote_engine_id %q, the prefill is %q", id, f.engineID())
	}
	if r, ok := p["remote_dp_rank"]; !ok || r != float64(0) {
		t.Errorf("MoRIIO decode: remote_dp_rank %v, want 0 (the prefill ran on DP rank 0)", r)
	}
	host, _ := p["remote_host"].(string)
	hs, _ := p["remote_handshake_port"].(float64)
	if net.JoinHostPort(host, strconv.Itoa(int(hs))) != kvAddr(f.p) {
		t.Fatalf("MoRIIO decode: handshake with %s:%v, the prefill is at %s", host, hs, kvAddr(f.p))
	}
	id, _ := p["transfer_id"].(string)
	e, ok := f.exports[id]
	if !ok || e.imported {
		t.Fatalf("MoRIIO decode: no blocks exported under transfer_id %q", id)
	}
	if !reflect.DeepEqual(blocks, e.blocks) || e.prompt != l.prompt {
		t.Fatalf("MoRIIO decode: read blocks %v of %q for %q; exported %v", blocks, e.prompt, l.prompt, e.blocks)
	}
	if l.requestID != e.leg.requestID {
		t.Fatalf("MoRIIO decode: request id %q, the prefill's was %q; the completion ack would be lost", l.requestID, e.leg.requestID)
	}
	e.imported = true
}

func (f *moriioFake) settled(t testing.TB) { t.Helper(); settle(t, "MoRIIO", f.exports) }
