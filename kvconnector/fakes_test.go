package kvconnector

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"testing"
)

// Protocol fakes of vLLM KV connector pairs, as plain Go values. Each behaves
// like the real connector at the router boundary: the prefill engine checks
// what the real one reads from the prefill leg and answers exactly what the
// real one answers; the decode engine checks what the real one needs to find
// the prompt's KV (and "crashes" — fails the test — where the real one would),
// then finds it in the prefill's exports through the same key the real
// connector uses. settled checks that every transfer met its other half.

// leg is one call as an engine sees it, after the wire.
type leg struct {
	requestID string         // X-Request-Id
	params    map[string]any // kv_transfer_params as the engine's JSON decoder gives them; nil: none sent
	prompt    string         // stands for the prompt's tokens: the KV that must arrive
}

// pairFake is one prefill engine and one decode engine of a connector.
type pairFake interface {
	// prefill serves the prefill leg and returns the response's
	// kv_transfer_params exactly as the engine serializes them.
	prefill(t testing.TB, l leg) json.RawMessage
	// decode serves the decode leg.
	decode(t testing.TB, l leg)
	// settled fails t unless every export was imported by the decode that
	// asked for the same prompt.
	settled(t testing.TB)
}

// wire sends kv_transfer_params through JSON, as an HTTP body would: numbers
// arrive as float64, Go types are gone.
func wire(t testing.TB, params map[string]any) map[string]any {
	t.Helper()
	if params == nil {
		return nil
	}
	b, err := json.Marshal(params)
	if err != nil {
		t.Fatalf("kv_transfer_params do not marshal: %v", err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func kvAddr(p Peer) string { return net.JoinHostPort(p.KVHost, strconv.Itoa(p.KVPort)) }

func flag(params map[string]any, key string) bool { b, _ := params[key].(bool); return b }

// export is KV a prefill holds for a decode.
type export struct {
	prompt   string
	blocks   any            // as reported to the router
	response map[string]any // the kv_transfer_params the prefill answered, as decoded
	leg      leg            // the prefill leg
	imported bool
}

func settle(t testing.TB, name string, exports map[string]*export) {
	t.Helper()
	for key, e := range exports {
		if !e.imported {
			t.Errorf("%s: the KV of %q exported under %q was never imported; the prefill keeps it until its lease expires", name, e.prompt, key)
		}
	}
}

// pullFake is a NIXL-shaped pair: the prefill exports under its internal
// request id and answers where the decode pulls from.
type pullFake struct {
	name string
	p, d Peer
	// vllm: behave like vLLM's NixlConnector (randomized internal ids, block
	// ids as a list per KV-cache group, newer keys the router does not know).
	// Otherwise behave like omnipd's reference worker (worker/kv.go).
	vllm    bool
	n       int
	exports map[string]*export // by remote_request_id
}

func newPullFake(name string, h Handoff, vllm bool) *pullFake {
	return &pullFake{name: name, p: h.Prefill, d: h.Decode, vllm: vllm, exports: map[string]*export{}}
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
	if f.vllm {
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

// pushFake is a Mooncake-shaped pair: the prefill keeps its KV under
// transfer_id and answers null; the decode queries the prefill's bootstrap
// server for that transfer_id. Either may arrive first.
type pushFake struct {
	name    string
	p       Peer
	exports map[string]*export // by transfer_id
	waiting map[string]string  // transfer_id -> prompt of a decode that arrived first
}

func newPushFake(name string, h Handoff) *pushFake {
	return &pushFake{name: name, p: h.Prefill, exports: map[string]*export{}, waiting: map[string]string{}}
}

func (f *pushFake) prefill(t testing.TB, l leg) json.RawMessage {
	t.Helper()
	if !flag(l.params, "do_remote_decode") || flag(l.params, "do_remote_prefill") {
		t.Fatalf("%s prefill: kv_transfer_params %v do not ask for a remote decode", f.name, l.params)
	}
	id, _ := l.params["transfer_id"].(string)
	if id == "" {
		t.Fatalf("%s prefill: no transfer_id in %v; the decode could never claim the KV", f.name, l.params)
	}
	if _, dup := f.exports[id]; dup {
		t.Fatalf("%s prefill: transfer_id %q used twice", f.name, id)
	}
	e := &export{prompt: l.prompt, leg: l}
	if prompt, ok := f.waiting[id]; ok {
		e.imported = prompt == l.prompt
		if !e.imported {
			t.Fatalf("%s: transfer %q pushed the KV of %q to a decode of %q", f.name, id, l.prompt, prompt)
		}
		delete(f.waiting, id)
	}
	f.exports[id] = e
	return json.RawMessage("null")
}

func (f *pushFake) decode(t testing.TB, l leg) {
	t.Helper()
	p := l.params
	if !flag(p, "do_remote_prefill") || flag(p, "do_remote_decode") {
		t.Fatalf("%s decode: kv_transfer_params %v do not ask for a remote prefill", f.name, p)
	}
	id, _ := p["transfer_id"].(string)
	engine, _ := p["remote_engine_id"].(string)
	bootstrap, _ := p["remote_bootstrap_addr"].(string)
	if id == "" || engine == "" || bootstrap == "" {
		t.Fatalf("%s decode: transfer_id, remote_engine_id and remote_bootstrap_addr are all required; got %v", f.name, p)
	}
	u, err := url.Parse(bootstrap + "/query")
	if err != nil || u.Scheme != "http" || u.Host == "" {
		t.Fatalf("%s decode: remote_bootstrap_addr %q is not http://HOST:PORT", f.name, bootstrap)
	}
	if u.Host != kvAddr(f.p) {
		t.Fatalf("%s decode: bootstrap server %s: nothing listens there (the prefill is at %s)", f.name, u.Host, kvAddr(f.p))
	}
	if engine != f.p.EngineID {
		t.Fatalf("%s decode: bootstrap server at %s knows no engine %q (it serves %q)", f.name, u.Host, engine, f.p.EngineID)
	}
	if e, ok := f.exports[id]; ok {
		if e.imported || e.prompt != l.prompt {
			t.Fatalf("%s decode: transfer %q already claimed or of another prompt (%q, want %q)", f.name, id, e.prompt, l.prompt)
		}
		e.imported = true
		return
	}
	if _, dup := f.waiting[id]; dup {
		t.Fatalf("%s decode: two decodes wait for transfer %q", f.name, id)
	}
	f.waiting[id] = l.prompt
}

func (f *pushFake) settled(t testing.TB) {
	t.Helper()
	settle(t, f.name, f.exports)
	for id, prompt := range f.waiting {
		t.Errorf("%s: the decode of %q waits for transfer %q that no prefill pushed", f.name, prompt, id)
	}
}

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

// lmcacheFake is content-addressed: the KV is stored under the hash of the
// prompt's tokens, and the decode finds it by the same hash. Nothing of the
// router's reaches the store.
type lmcacheFake struct {
	store map[string]*export
}

func newLMCacheFake(Handoff) *lmcacheFake { return &lmcacheFake{store: map[string]*export{}} }

func contentKey(prompt string) string {
	sum := sha256.Sum256([]byte(prompt))
	return fmt.Sprintf("%x", sum[:8])
}

func (f *lmcacheFake) prefill(t testing.TB, l leg) json.RawMessage {
	t.Helper()
	if l.params != nil {
		t.Errorf("LMCache prefill: unexpected kv_transfer_params %v", l.params)
	}
	f.store[contentKey(l.prompt)] = &export{prompt: l.prompt, leg: l}
	return json.RawMessage("null")
}

func (f *lmcacheFake) decode(t testing.TB, l leg) {
	t.Helper()
	if l.params != nil {
		t.Errorf("LMCache decode: unexpected kv_transfer_params %v", l.params)
	}
	e, ok := f.store[contentKey(l.prompt)]
	if !ok {
		t.Fatalf("LMCache decode: no KV stored for %q; the decode would recompute the prompt", l.prompt)
	}
	e.imported = true
}

func (f *lmcacheFake) settled(t testing.TB) { t.Helper(); settle(t, "LMCache", f.store) }

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
