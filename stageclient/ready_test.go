package stageclient

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// vllmWithKey behaves like vllm serve started with VLLM_API_KEY=key: /health
// answers anyone, every /v1 route wants the key (vLLM's authentication
// middleware, vllm/entrypoints/openai/api_server.py).
func vllmWithKey(key string, probes *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		switch {
		case r.URL.Path == "/health":
			w.WriteHeader(http.StatusOK)
		case strings.HasPrefix(r.URL.Path, "/v1") && r.Header.Get("Authorization") != "Bearer "+key:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
		case r.URL.Path == "/v1/models":
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","max_model_len":4096}]}`))
		default:
			http.NotFound(w, r)
		}
	}
}

// /health alone says nothing about the credential: an engine that refuses
// omnipd's secret is healthy and useless. Ready asks an authenticated route
// too.
func TestReadyRefusedSecret(t *testing.T) {
	var probes atomic.Int64
	for _, tc := range []struct {
		secret, want string
	}{
		{secret: "wrong", want: "refuses omnipd's deployment secret (401)"},
		{secret: "", want: "requires a deployment secret and omnipd has none (401)"},
	} {
		c := serve(t, Config{Secret: tc.secret}, vllmWithKey("right", &probes))
		if err := c.Health(testCtx(t)); err != nil {
			t.Fatalf("secret %q: /health is open on vLLM, got %v", tc.secret, err)
		}
		err := c.Ready(testCtx(t))
		if !errors.Is(err, ErrSecretRefused) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), c.BaseURL()) {
			t.Errorf("secret %q: Ready = %v; want ErrSecretRefused saying %q and the URL", tc.secret, err, tc.want)
		}
	}
	if err := serve(t, Config{Secret: "right"}, vllmWithKey("right", &probes)).Ready(testCtx(t)); err != nil {
		t.Errorf("the right secret: %v", err)
	}
}

// An omni stage (Talker, Code2Wav) has no /v1/models: past its front door
// the probe is a 404, which still says the credential was taken.
func TestReadyStageWithoutModelsRoute(t *testing.T) {
	c := serve(t, Config{Secret: "right"}, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" && r.Header.Get("Authorization") != "Bearer right" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/health" {
			return
		}
		http.NotFound(w, r)
	})
	if err := c.Ready(testCtx(t)); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

func TestReadinessCachesWithinTTL(t *testing.T) {
	var probes atomic.Int64
	bad := serve(t, Config{Secret: "wrong"}, vllmWithKey("right", &probes))
	good := serve(t, Config{Secret: "right"}, vllmWithKey("right", &probes))
	now := time.Unix(1000, 0)
	r := &Readiness{
		Targets: []ReadyTarget{{Stage: "stage 0 (thinker-prefill)", Client: good}, {Stage: "stage 1 (thinker-decode)", Client: bad}},
		TTL:     time.Second,
		Now:     func() time.Time { return now },
	}
	err := r.Check(testCtx(t))
	if !errors.Is(err, ErrSecretRefused) || !strings.Contains(err.Error(), "stage 1 (thinker-decode)") || strings.Contains(err.Error(), "stage 0") {
		t.Fatalf("Check = %v; want only stage 1's refusal", err)
	}
	after := probes.Load()
	if err2 := r.Check(testCtx(t)); err2 == nil || err2.Error() != err.Error() || probes.Load() != after {
		t.Errorf("within the TTL: %v, %d probes more; want the cached answer and none", err2, probes.Load()-after)
	}
	now = now.Add(time.Second)
	_ = r.Check(testCtx(t))
	if probes.Load() == after {
		t.Error("after the TTL the stages were not probed again")
	}
	// A caller that gave up does not leave its failure cached for others.
	now = now.Add(time.Second)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Check(canceled); err == nil {
		t.Error("Check with a canceled context succeeded")
	}
	r.Targets = r.Targets[:1]
	if err := r.Check(testCtx(t)); err != nil {
		t.Errorf("after a canceled check: %v; want a fresh probe", err)
	}
}
