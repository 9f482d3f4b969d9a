package kvconnector

import (
	"encoding/json"
	"reflect"
	"testing"
)

// moriioFake is a MoRIIO pair as vLLM main (0158326) serves it, in READ or
// WRITE mode. Both engines' schedulers read transfer_id, remote_block_ids
// and remote_engine_id by key (a missing one is a KeyError that kills the
// engine), and take the peer's host, handshake and notify ports from
// kv_transfer_params, falling back to the request id, which a plain id
// cannot satisfy. The prefill answers what request_finished returns.
type moriioFake struct {
	p, d    Peer
	write   bool
	n       int
	exports map[string]*export // by transfer_id
	// allocs are the blocks WRITE decodes announced to the prefill's
	// notify port, by transfer_id.
	allocs map[string]leg
}

func newMoRIIOFake(h Handoff, write bool) *moriioFake {
	return &moriioFake{p: h.Prefill, d: h.Decode, write: write, exports: map[string]*export{}, allocs: map[string]leg{}}
}

// moriioEngineID is how vLLM names an engine: host_ip:handshake_port.
func moriioEngineID(p Peer) string { return kvAddr(p) }

// peerOf checks that params name the given engine's side channels, as the
// scheduler's add_new_req needs them.
func (f *moriioFake) peerOf(t testing.TB, side string, l leg, want Peer) {
	t.Helper()
	p := l.params
	for _, k := range []string{"transfer_id", "remote_block_ids", "remote_engine_id"} {
		if _, ok := p[k]; !ok {
			t.Fatalf("MoRIIO %s: KeyError: %q in %v", side, k, p)
		}
	}
	host, okH := p["remote_host"].(string)
	hs, okS := p["remote_handshake_port"].(float64)
	notify, okN := p["remote_notify_port"].(float64)
	if !okH || !okS || !okN {
		// add_new_req falls back to the request id: ___prefill_addr_..._<32 hex>.
		t.Fatalf("MoRIIO %s: ValueError: Cannot parse peer zmq_address from request_id %q (kv_transfer_params %v name no host, handshake and notify port)", side, l.requestID, p)
	}
	if host != want.KVHost || int(hs) != want.KVPort || int(notify) != MoRIIONotifyPort(want) {
		t.Fatalf("MoRIIO %s: peer host %s handshake %v notify %v; it listens at %s handshake %d notify %d",
			side, host, hs, notify, want.KVHost, want.KVPort, MoRIIONotifyPort(want))
	}
}

func (f *moriioFake) prefill(t testing.TB, l leg) json.RawMessage {
	t.Helper()
	p := l.params
	if !flag(p, "do_remote_decode") {
		t.Fatalf("MoRIIO prefill: no do_remote_decode in %v", p)
	}
	f.peerOf(t, "prefill", l, f.d)
	if got := p["remote_tp_size"]; got != float64(tp(f.d)) {
		t.Errorf("MoRIIO prefill: remote_tp_size %v, the decode runs TP %d", got, tp(f.d))
	}
	if got := p["remote_dp_size"]; got != float64(1) {
		t.Errorf("MoRIIO prefill: remote_dp_size %v, want 1", got)
	}
	id, _ := p["transfer_id"].(string)
	if id == "" {
		t.Fatalf("MoRIIO prefill: transfer_id %v", p["transfer_id"])
	}
	f.n++
	resp := map[string]any{
		"do_remote_prefill":     true,
		"do_remote_decode":      false,
		"remote_block_ids":      []int{f.n * 10, f.n*10 + 1, f.n*10 + 2},
		"remote_engine_id":      moriioEngineID(f.p),
		"remote_host":           f.p.KVHost,
		"remote_handshake_port": f.p.KVPort,
		"remote_notify_port":    MoRIIONotifyPort(f.p),
		"remote_dp_size":        1,
		"tp_size":               tp(f.p),
		"transfer_id":           id,
	}
	raw := mustJSON(t, resp)
	var decoded map[string]any
	_ = json.Unmarshal(raw, &decoded)
	e := &export{prompt: l.prompt, blocks: decoded["remote_block_ids"], response: decoded, leg: l}
	f.exports[id] = e
	if f.write {
		// The prefill writes into the blocks the decode announced for this
		// transfer; with none announced it would wait for them.
		d, ok := f.allocs[id]
		if !ok {
			t.Fatalf("MoRIIO prefill (WRITE): no decode announced blocks for transfer_id %q; the prefill waits for them", id)
		}
		if d.prompt != l.prompt {
			t.Fatalf("MoRIIO prefill (WRITE): wrote the KV of %q into the blocks of %q", l.prompt, d.prompt)
		}
		e.imported = true
	}
	return raw
}

func (f *moriioFake) decode(t testing.TB, l leg) {
	t.Helper()
	p := l.params
	if !flag(p, "do_remote_prefill") || flag(p, "do_remote_decode") {
		t.Fatalf("MoRIIO decode: kv_transfer_params %v do not ask for a remote prefill", p)
	}
	f.peerOf(t, "decode", l, f.p)
	if r, ok := p["remote_dp_rank"]; !ok || r != float64(0) {
		t.Errorf("MoRIIO decode: remote_dp_rank %v, want 0 (the prefill ran on DP rank 0)", r)
	}
	id, _ := p["transfer_id"].(string)
	if f.write {
		// update_state_after_alloc sends the allocated blocks to the
		// prefill's notify ports under transfer_id.
		if _, dup := f.allocs[id]; dup || id == "" {
			t.Fatalf("MoRIIO decode (WRITE): transfer_id %q announced twice or empty", id)
		}
		f.allocs[id] = l
		return
	}
	blocks, ok := p["remote_block_ids"].([]any)
	if !ok || len(blocks) == 0 {
		// "Got invalid KVTransferParams ... will not utilize KVTransfer":
		// the decode would compute on KV that never arrived.
		t.Fatalf("MoRIIO decode: no remote_block_ids in %v", p)
	}
	if eid, _ := p["remote_engine_id"].(string); eid != moriioEngineID(f.p) {
		t.Fatalf("MoRIIO decode: remote_engine_id %q, the prefill is %q", eid, moriioEngineID(f.p))
	}
	e, ok := f.exports[id]
	if !ok || e.imported {
		t.Fatalf("MoRIIO decode: no blocks exported under transfer_id %q", id)
	}
	if !reflect.DeepEqual(blocks, e.blocks) || e.prompt != l.prompt {
		t.Fatalf("MoRIIO decode: read blocks %v of %q for %q; exported %v", blocks, e.prompt, l.prompt, e.blocks)
	}
	e.imported = true
}

func (f *moriioFake) settled(t testing.TB) {
	t.Helper()
	settle(t, "MoRIIO", f.exports)
	if f.write {
		for id, l := range f.allocs {
			if _, ok := f.exports[id]; !ok {
				t.Errorf("MoRIIO (WRITE): the decode of %q waits for a prefill that never wrote transfer_id %q", l.prompt, id)
			}
		}
	}
}
