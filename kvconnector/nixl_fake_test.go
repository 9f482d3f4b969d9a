package kvconnector

import (
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"testing"
)

// pullShape is which engine a pullFake behaves like.
type pullShape int

const (
	// shapeReference: omnipd's reference worker (reference/worker/kv.go), which keys
	// a pull by X-Request-Id and says so in remote_request_id.
	shapeReference pullShape = iota
	// shapeVLLM: vLLM's NixlConnector since remote_request_id (NIXL
	// connector version 2, ahead of the 0.14 request-id randomization):
	// randomized internal ids, block ids as a list per KV-cache group,
	// newer keys the router does not know, and a decode that reads tp_size
	// without a default (lease heartbeats, push mode).
	shapeVLLM
	// shapeVLLMLegacy: vLLM's NixlConnector before remote_request_id (NIXL
	// connector version 1): internal ids are X-Request-Id as sent, and the
	// decode notifies the prefill under its own request id.
	shapeVLLMLegacy
	// shapeLLMDSim: llm-d's inference simulator (pkg/api/response.go
	// @eec055a3, and as a built copy answered): do_remote_decode false,
	// do_remote_prefill, remote_engine_id, remote_block_ids, remote_host,
	// remote_port and tp_size, and no remote_request_id.
	shapeLLMDSim
)

func (s pullShape) String() string {
	return [...]string{"reference", "vllm", "vllm-legacy", "llm-d-sim"}[s]
}

// pullFake is a NIXL-shaped pair: the prefill exports under its internal
// request id and answers where the decode pulls from.
type pullFake struct {
	name    string
	p, d    Peer
	shape   pullShape
	n       int
	exports map[string]*export // by the key the decode finds them under
}

// newPullFake is a vLLM-shaped pair (vllm) or a reference-worker pair.
func newPullFake(name string, h Handoff, vllm bool) *pullFake {
	if vllm {
		return newShapedPullFake(name, h, shapeVLLM)
	}
	return newShapedPullFake(name, h, shapeReference)
}

func newShapedPullFake(name string, h Handoff, shape pullShape) *pullFake {
	return &pullFake{name: name, p: h.Prefill, d: h.Decode, shape: shape, exports: map[string]*export{}}
}

func (f *pullFake) prefill(t testing.TB, l leg) json.RawMessage {
	t.Helper()
	if !flag(l.params, "do_remote_decode") || flag(l.params, "do_remote_prefill") {
		t.Fatalf("%s prefill: kv_transfer_params %v do not ask for a remote decode; the KV would be freed at once", f.name, l.params)
	}
	f.n++
	internal := l.requestID // the reference worker keys pull transfers by X-Request-Id
	var blocks any = []int{f.n * 10, f.n*10 + 1, f.n*10 + 2}
	resp := map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_block_ids":  blocks,
		"remote_engine_id":  f.p.EngineID,
		"remote_host":       f.p.KVHost,
		"remote_port":       f.p.KVPort,
		"remote_request_id": internal,
		"tp_size":           1,
	}
	switch f.shape {
	case shapeVLLMLegacy:
		delete(resp, "remote_request_id")
		resp["tp_size"] = tp(f.p)
	case shapeLLMDSim:
		delete(resp, "remote_request_id")
		resp["do_remote_decode"] = false
		resp["tp_size"] = tp(f.p)
	case shapeVLLM:
		// vLLM ≥ 0.14 appends a random suffix the router cannot predict.
		internal = fmt.Sprintf("%s-%08x", l.requestID, f.n)
		blocks = [][]int{{f.n * 10, f.n*10 + 1, f.n*10 + 2}}
		resp["remote_request_id"] = internal
		resp["remote_block_ids"] = blocks
		resp["tp_size"] = tp(f.p)
		resp["remote_num_tokens"] = len(l.prompt)
		resp["pp_size"] = 1
		resp["dcp_size"] = 1
		resp["transfer_mode"] = "pull"
	}
	raw := mustJSON(t, resp)
	var decoded map[string]any
	_ = json.Unmarshal(raw, &decoded)
	f.exports[internal] = &export{prompt: l.prompt, blocks: decoded["remote_block_ids"], response: decoded, leg: l}
	return raw
}

func (f *pullFake) decode(t testing.TB, l leg) {
	t.Helper()
	p := l.params
	if !flag(p, "do_remote_prefill") {
		t.Fatalf("%s decode: no do_remote_prefill in %v; it would recompute the prompt", f.name, p)
	}
	if flag(p, "do_remote_decode") {
		t.Fatalf("%s decode: do_remote_decode and do_remote_prefill both true", f.name)
	}
	blocks, ok := p["remote_block_ids"].([]any)
	if !ok {
		t.Fatalf("%s decode: engine crashed: do_remote_prefill with remote_block_ids %v", f.name, p["remote_block_ids"])
	}
	host, _ := p["remote_host"].(string)
	port, ok := p["remote_port"].(float64)
	if !ok || port != float64(int(port)) {
		t.Fatalf("%s decode: remote_port %v is not a port", f.name, p["remote_port"])
	}
	if addr := net.JoinHostPort(host, strconv.Itoa(int(port))); addr != kvAddr(f.p) {
		t.Fatalf("%s decode: side channel %s: nothing listens there (the prefill is at %s)", f.name, addr, kvAddr(f.p))
	}
	if id, _ := p["remote_engine_id"].(string); id != f.p.EngineID {
		t.Fatalf("%s decode: handshake with engine %q, but %s is engine %q", f.name, id, kvAddr(f.p), f.p.EngineID)
	}
	key, _ := p["remote_request_id"].(string)
	switch f.shape {
	case shapeVLLMLegacy, shapeLLMDSim:
		// The decode notifies the prefill under its own request id.
		key = l.requestID
	case shapeVLLM:
		// Lease heartbeats (and push mode) read tp_size without a default:
		// without it the prefill frees the KV after kv_lease_duration while
		// the decode still queues.
		if n, ok := p["tp_size"].(float64); !ok || int(n) != tp(f.p) {
			t.Fatalf("%s decode: tp_size %v; the prefill runs TP %d", f.name, p["tp_size"], tp(f.p))
		}
	}
	e, ok := f.exports[key]
	if !ok {
		t.Fatalf("%s decode: the prefill has no KV under remote_request_id %q", f.name, key)
	}
	if e.imported {
		t.Fatalf("%s decode: the KV under %q was already pulled", f.name, key)
	}
	if !reflect.DeepEqual(blocks, e.blocks) {
		t.Fatalf("%s decode: remote_block_ids %v, the prefill exported %v", f.name, blocks, e.blocks)
	}
	if e.prompt != l.prompt {
		t.Fatalf("%s decode: pulled the KV of %q for %q", f.name, e.prompt, l.prompt)
	}
	// NIXL wants the prefill's object verbatim: every key it returned, as
	// it returned it, apart from the two flags.
	for k, v := range e.response {
		if k == "do_remote_prefill" || k == "do_remote_decode" {
			continue
		}
		if !reflect.DeepEqual(p[k], v) {
			t.Errorf("%s decode: %s is %v, the prefill returned %v", f.name, k, p[k], v)
		}
	}
	e.imported = true
}

func (f *pullFake) settled(t testing.TB) { t.Helper(); settle(t, f.name, f.exports) }

// dpPullFake is a vLLM NIXL pair whose instances run data-parallel ranks
// behind one API server each. The API server runs a leg on the rank
// X-data-parallel-rank names; prefill rank k is its own KV engine,
// "<engine_id>_dp<k>" (vllm/v1/engine/core.py run_engine_core), with its
// own side channel at VLLM_NIXL_SIDE_CHANNEL_PORT + k
// (nixl/base_scheduler.py), and answers with both. Any decode rank can
// pull from any prefill rank; only the rank that ran the prefill holds
// the KV.
type dpPullFake struct {
	name  string
	p, d  Peer
	ranks []*pullFake // the prefill instance's ranks
}

func newDPPullFake(name string, h Handoff) *dpPullFake {
	f := &dpPullFake{name: name, p: h.Prefill, d: h.Decode}
	for k := range h.Prefill.DataParallel() {
		rank := h.Prefill
		rank.EngineID = fmt.Sprintf("%s_dp%d", h.Prefill.EngineID, k)
		rank.KVPort = h.Prefill.KVPort + k
		f.ranks = append(f.ranks, newShapedPullFake(fmt.Sprintf("%s prefill rank %d", name, k), Handoff{Prefill: rank, Decode: h.Decode}, shapeVLLM))
	}
	return f
}

// prefill serves a prefill leg pinned to rank.
func (f *dpPullFake) prefill(t testing.TB, l leg, rank int) json.RawMessage {
	t.Helper()
	if rank < 0 || rank >= len(f.ranks) {
		t.Fatalf("%s prefill: X-data-parallel-rank %d; the instance runs ranks 0-%d", f.name, rank, len(f.ranks)-1)
	}
	return f.ranks[rank].prefill(t, l)
}

// decode serves a decode leg pinned to rank of the decode instance: it
// handshakes with the side channel the params name and pulls from the
// engine there.
func (f *dpPullFake) decode(t testing.TB, l leg, rank int) {
	t.Helper()
	if rank < 0 || rank >= f.d.DataParallel() {
		t.Fatalf("%s decode: X-data-parallel-rank %d; the instance runs ranks 0-%d", f.name, rank, f.d.DataParallel()-1)
	}
	port, _ := l.params["remote_port"].(float64)
	host, _ := l.params["remote_host"].(string)
	for _, r := range f.ranks {
		if host == r.p.KVHost && int(port) == r.p.KVPort {
			r.decode(t, l)
			return
		}
	}
	t.Fatalf("%s decode: side channel %s:%v: no prefill rank listens there", f.name, host, l.params["remote_port"])
}

func (f *dpPullFake) settled(t testing.TB) {
	t.Helper()
	for _, r := range f.ranks {
		r.settled(t)
	}
}
