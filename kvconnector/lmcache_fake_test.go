package kvconnector

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
)

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
	importByContent(t, "LMCache", "stored", f.store, l)
}

// importByContent is an LMCache decode: its leg carries no
// kv_transfer_params, and it finds the prompt's KV in kv by content. how
// says, for the failure, how the KV should have got there.
func importByContent(t testing.TB, mode, how string, kv map[string]*export, l leg) {
	t.Helper()
	if l.params != nil {
		t.Errorf("%s decode: unexpected kv_transfer_params %v", mode, l.params)
	}
	e, ok := kv[contentKey(l.prompt)]
	if !ok {
		t.Fatalf("%s decode: no KV %s for %q; the decode would recompute the prompt", mode, how, l.prompt)
	}
	e.imported = true
}

func (f *lmcacheFake) settled(t testing.TB) { t.Helper(); settle(t, "LMCache", f.store) }

// lmcachePDFake is LMCache's PD mode: the prefill (sender) pushes the
// prompt's KV into the buffer of the receiver its disagg_spec names, one
// part per decode TP rank, and sends a done notice per rank under
// disagg_spec.req_id; the decode (receiver) finds the KV in its buffer by
// content. The router's leg carries no kv_transfer_params to the decode.
type lmcachePDFake struct {
	receiver Peer
	buffer   map[string]*export // the receiver's, by content
	notices  map[string]int     // done notices by req_id
}

func newLMCachePDFake(h Handoff) *lmcachePDFake {
	return &lmcachePDFake{receiver: h.Decode, buffer: map[string]*export{}, notices: map[string]int{}}
}

func (f *lmcachePDFake) prefill(t testing.TB, l leg) json.RawMessage {
	t.Helper()
	if l.params["ret_first_tok"] != true {
		t.Errorf("LMCache PD prefill: ret_first_tok %v; the answer would carry no first_tok", l.params["ret_first_tok"])
	}
	spec, ok := l.params["disagg_spec"].(map[string]any)
	if !ok {
		// update_state_after_alloc finds no disagg_spec: the sender has no
		// receiver, and the decode recomputes the prompt.
		t.Fatalf("LMCache PD prefill: no disagg_spec in %v", l.params)
	}
	reqID, _ := spec["req_id"].(string)
	if reqID == "" {
		t.Fatalf("LMCache PD prefill: disagg_spec req_id %v", spec["req_id"])
	}
	if spec["receiver_host"] != f.receiver.KVHost {
		t.Fatalf("LMCache PD prefill: receiver_host %v, the decoder is at %s", spec["receiver_host"], f.receiver.KVHost)
	}
	// pd_backend.py batched_submit_put_task: each sender TP rank indexes the
	// lists by its rank; the receiver's rank r binds init KVPort+r and alloc
	// KVPort+TP+r.
	n := tp(f.receiver)
	for _, k := range []string{"receiver_init_port", "receiver_alloc_port"} {
		ports, _ := spec[k].([]any)
		if len(ports) != n {
			t.Fatalf("LMCache PD prefill: %s %v, want one port per decode TP rank (%d)", k, spec[k], n)
		}
		for r, p := range ports {
			init, alloc := LMCacheReceiverPorts(f.receiver, r)
			want := init
			if k == "receiver_alloc_port" {
				want = alloc
			}
			if p != float64(want) {
				t.Fatalf("LMCache PD prefill: %s[%d] = %v; rank %d of the decoder listens on %d", k, r, p, r, want)
			}
		}
	}
	f.buffer[contentKey(l.prompt)] = &export{prompt: l.prompt, leg: l}
	f.notices[reqID] += n
	return json.RawMessage(`{"first_tok":42}`)
}

func (f *lmcachePDFake) decode(t testing.TB, l leg) {
	t.Helper()
	importByContent(t, "LMCache PD", "pushed", f.buffer, l)
}

func (f *lmcachePDFake) settled(t testing.TB) { t.Helper(); settle(t, "LMCache PD", f.buffer) }

// The router waits for the notices the sender really sends: under the
// disagg_spec req_id, one per decode TP rank.
func TestLMCachePDDoneNotices(t *testing.T) {
	c, err := NewRegistry().Lookup(LMCacheConnectorV1, map[string]any{"lmcache.enable_pd": true, "lmcache.pd_role": "sender"})
	if err != nil {
		t.Fatal(err)
	}
	dn, ok := c.(DoneNotifier)
	if !ok {
		t.Fatalf("the PD-mode contract %T does not wait for the sender's done notices", c)
	}
	for _, h := range testHandoffs() {
		f := newLMCachePDFake(h)
		f.prefill(t, leg{requestID: h.RequestID, params: wire(t, c.PrefillParams(h)), prompt: "p"})
		if len(f.notices) != 1 || f.notices[dn.DoneKey(h)] != dn.DoneCount(h) {
			t.Errorf("the sender sent %v; the router waits for %d under %q", f.notices, dn.DoneCount(h), dn.DoneKey(h))
		}
	}
	if _, ok := any(mustLookup(t, LMCacheConnectorV1, nil)).(DoneNotifier); ok {
		t.Error("storage mode waits for done notices no sender sends")
	}
}

func TestLMCachePDConfig(t *testing.T) {
	for _, tt := range []struct {
		extra map[string]any
		pd    bool
		err   bool
	}{
		{nil, false, false},
		{map[string]any{"lmcache.enable_pd": false}, false, false},
		{map[string]any{"lmcache.enable_pd": "True"}, true, false},
		{map[string]any{"lmcache.enable_pd": true}, true, false},
		{map[string]any{"lmcache.enable_pd": "yes please"}, false, true},
		{map[string]any{"lmcache.enable_pd": 1.5}, false, true},
		{map[string]any{"lmcache.enable_pd": true, "lmcache.pd_role": "receiver"}, false, true},
	} {
		c, err := NewRegistry().Lookup(LMCacheConnectorV1, tt.extra)
		if tt.err {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%v: err %v, want ErrInvalidConfig", tt.extra, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.extra, err)
			continue
		}
		if _, pd := c.(DoneNotifier); pd != tt.pd {
			t.Errorf("%v: PD mode %v, want %v", tt.extra, pd, tt.pd)
		}
	}
}

func mustLookup(t *testing.T, name string, extra map[string]any) Contract {
	t.Helper()
	c, err := NewRegistry().Lookup(name, extra)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
