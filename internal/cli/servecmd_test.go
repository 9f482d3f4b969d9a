package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/mediafetch"
)

// vllm serve takes its model positionally; omnipd serve with a model id of
// the Hub says exactly which commands serve it instead, and starts
// nothing. A path that is no checkpoint directory, and a checkpoint beside
// --config, are refused as clearly.
func TestServeNamesWhatToRunForAHubModel(t *testing.T) {
	const hub = "Qwen/Qwen3-Omni-30B-A3B-Instruct"
	file := filepath.Join(t.TempDir(), "weights.bin")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"serve", hub}, []string{"downloads no model", "omnipd serve DIR",
			"omnipd plan --target vllm --model " + hub, "omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret --served-model-name " + hub,
			"a vllm-omni deploy config with a Talker", "omnipd plan --target vllm --model " + hub + " --pd --connector NixlConnector CONFIG", "vllm-omni stage worker"}},
		{[]string{"serve", t.TempDir()}, []string{"not a Hugging Face checkpoint directory (no config.json)"}},
		{[]string{"serve", file}, []string{"not a directory"}},
		{[]string{"serve", t.TempDir(), "--config", file}, []string{"not both"}},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(t.Context(), c.args, &stdout, &stderr)
		if code != 2 {
			t.Errorf("omnipd %s: exit %d, want 2\n%s", strings.Join(c.args, " "), code, stderr.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("omnipd %s: stderr %q should say %q", strings.Join(c.args, " "), stderr.String(), w)
			}
		}
		if strings.Contains(stderr.String(), "unknown command") || stdout.Len() != 0 {
			t.Errorf("omnipd %s: stdout %q, stderr %q", strings.Join(c.args, " "), stdout.String(), stderr.String())
		}
	}
}

// anyEngine answers every request an engine gets before serving: its
// /health, its /v1/models.
func anyEngine(t *testing.T) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"m","max_model_len":8192}]}`)
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// Over Mooncake only the prefill runs a bootstrap server: of engines that
// name no KV port, serve says it uses the default port for the prefill
// alone, never for the decode, which has none.
func TestMooncakeDecodeHasNoKVPortToDefault(t *testing.T) {
	prefill, decode := anyEngine(t), anyEngine(t)
	path := filepath.Join(t.TempDir(), "deploy.yaml")
	cfg := fmt.Sprintf(`pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    is_prefill_only: true
    endpoints: [%q]
    kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p0}
  - stage_id: 1
    is_decode_only: true
    endpoints: [%q]
    kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d0}
`, prefill, decode)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	doc, _, err := deploy.LoadFile(path, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, doc, serveOptions{host: "127.0.0.1", port: 0, drain: time.Second, model: "m",
			out: out, log: slog.New(slog.DiscardHandler), workerLog: io.Discard})
	}()
	for !strings.Contains(out.String(), "omnipd serving") {
		select {
		case err := <-served:
			t.Fatalf("serve ended: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	<-served
	if !strings.Contains(out.String(), "stage 0 (thinker-prefill): "+prefill+" names no KV port; using MooncakeConnector's default, 8998") {
		t.Errorf("the prefill's default bootstrap port is not said:\n%s", out.String())
	}
	if strings.Contains(out.String(), decode+" names no KV port") {
		t.Errorf("the decode, which runs no bootstrap server, was said to use a KV port:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "request bodies: up to ") {
		t.Errorf("serve does not say its body cap:\n%s", out.String())
	}
}

// The media item limit openai sizes bodies by is mediafetch's, and the
// workers serve starts take any leg of a body within serve's cap.
func TestBodyCapsAgree(t *testing.T) {
	if openai.DefaultMaxMediaItemBytes != mediafetch.DefaultMaxBytes {
		t.Errorf("openai sizes bodies for items of %d bytes, mediafetch allows %d", openai.DefaultMaxMediaItemBytes, mediafetch.DefaultMaxBytes)
	}
	for _, capBytes := range []int64{1, 1 << 20, openai.MaxBodyBytes(0, nil), 3<<30 + 7} {
		if got := legBodyMB(capBytes) << 20; got < openai.MaxLegBodyBytes(capBytes) {
			t.Errorf("a client cap of %d bytes gives workers %d bytes, less than a leg's %d", capBytes, got, openai.MaxLegBodyBytes(capBytes))
		}
	}
}
