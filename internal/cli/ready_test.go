package cli

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// runServeLogged runs `omnipd serve args...` until the test ends and returns
// its base URL and what it writes on stderr (its log).
func runServeLogged(t *testing.T, args ...string) (string, *lockedBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan int, 1)
	go func() { done <- Run(ctx, append([]string{"serve", "--port", "0"}, args...), out, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	})
	addr := regexp.MustCompile(`on (http://\S+)`)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			return m[1], logs
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d:\n%s\n%s", code, out.String(), logs.String())
		default:
		}
	}
	t.Fatalf("serve did not start:\n%s", out.String())
	return "", nil
}

// writeEndpointsConfig writes a thinker-only PD config whose stages are the
// running workers at prefill and decode.
func writeEndpointsConfig(t *testing.T, prefill, decode string) string {
	t.Helper()
	return writePipelineEndpointsConfig(t, "qwen3_omni_moe_thinker", prefill, decode)
}

// writePipelineEndpointsConfig writes a PD config of pipeline whose Thinker
// stages are the running workers at prefill and decode.
func writePipelineEndpointsConfig(t *testing.T, pipeline, prefill, decode string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "deploy.yaml")
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
pipeline: %s
stages:
  - stage_id: 0
    is_prefill_only: true
    endpoints: [%q]
    kv_transfer_config: {kv_connector: ReferenceConnector, kv_role: kv_producer, engine_id: p0}
  - stage_id: 1
    is_decode_only: true
    endpoints: [%q]
    kv_transfer_config: {kv_connector: ReferenceConnector, kv_role: kv_consumer, engine_id: d0}
`, pipeline, prefill, decode)), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func getHealth(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/health", nil)
	if err != nil {
		t.Fatal(err)
	}
	return roundTrip(t, req)
}

// Readiness means a request can succeed: engines that refuse omnipd's
// deployment secret answer their own /health (vLLM's is open to anyone),
// yet every request through them fails, so omnipd's /health is 503 and says
// which stage, where, and why; serve says so loudly when it starts.
func TestHealthNotReadyWhenAStageRefusesTheSecret(t *testing.T) {
	const secret = "deployment-s3cret"
	prefill := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"p0","kv_port":0}`, secret)
	decode := securedWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_consumer","engine_id":"d0"}`, secret)
	cfg := writeEndpointsConfig(t, prefill, decode)
	wrong := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(wrong, []byte("not-the-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	right := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(right, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")

	url, logs := runServeLogged(t, "--config", cfg, "--secret-file", wrong)
	if status, body := askCompletion(t, url, ""); status != 502 {
		t.Fatalf("the request itself: %d %s, want 502", status, body)
	}
	status, body := getHealth(t, url)
	for _, want := range []string{"stage 0 (thinker-prefill)", prefill, "refuses omnipd's deployment secret (401)", "stage 1 (thinker-decode)", decode} {
		if status != http.StatusServiceUnavailable || !strings.Contains(body, want) {
			t.Errorf("/health = %d %q; want 503 naming %q", status, body, want)
		}
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "refuses omnipd's deployment secret") {
		t.Errorf("serve did not warn at start-up that the stages refuse its secret:\n%s", l)
	}
	if strings.Contains(logs.String(), "not-the-secret") || strings.Contains(body, "not-the-secret") {
		t.Error("the secret was printed")
	}

	url, _ = runServeLogged(t, "--config", cfg, "--secret-file", right)
	if status, body := getHealth(t, url); status != 200 {
		t.Errorf("with the right secret /health = %d %q", status, body)
	}
}
