package worker

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/mediafetch"
)

// A worker whose New fails after its KV side channel started listening —
// here on a media policy no fetcher takes — leaves nothing listening: its
// KV port can be bound again at once.
func TestFailedNewFreesTheKVPort(t *testing.T) {
	eng := runTestEngine(t, engine.Config{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	kv, err := ParseKVTransferConfig(fmt.Sprintf(`{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"prefill-0","kv_ip":"127.0.0.1","kv_port":%d}`, port))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Engine: eng, KV: kv, Logger: slog.New(slog.DiscardHandler), Media: MediaConfig{Policy: mediafetch.Policy{ImageTimeout: -1}}})
	if err == nil {
		srv.Close()
		t.Fatal("New took a negative media fetch timeout")
	}
	again, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("after New failed, the KV port %d is still held: %v", port, err)
	}
	again.Close()
}

// Closing an encoder worker frees the encoder outputs it keeps and stops
// their expiry: nothing is held after Close.
func TestClosingAnEncoderWorkerFreesItsOutputs(t *testing.T) {
	w := newTestWorkerWith(t, "", func(c *Config) { c.EC = &ECTransferConfig{Connector: ReferenceECConnector, Role: ECProducer} })
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}}]}],"max_tokens":1}`, b64(wavBytes(0.5)))
	if status, _, b := do(t, "POST", w.url+"/v1/chat/completions", body); status != 200 || !strings.Contains(b, openai.EncoderCacheMember) {
		t.Fatalf("encoder leg: %d %s", status, b)
	}
	if n := w.EncoderOutputs(); n != 1 {
		t.Fatalf("%d encoder outputs kept, want 1", n)
	}
	w.Close()
	if n := w.EncoderOutputs(); n != 0 {
		t.Errorf("%d encoder outputs held after Close", n)
	}
}
