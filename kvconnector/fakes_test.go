package kvconnector

import (
	"encoding/json"
	"net"
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
