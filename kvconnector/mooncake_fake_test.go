package kvconnector

import (
	"encoding/json"
	"net/url"
	"testing"
)

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
