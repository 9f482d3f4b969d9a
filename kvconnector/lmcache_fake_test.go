package kvconnector

import (
	"crypto/sha256"
	"encoding/json"
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
