package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/worker"
)

func runningWorker(t *testing.T, kv string) string {
	t.Helper()
	eng, err := engine.New(model.Default(), tokenizer.Default(), engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	cfg, err := worker.ParseKVTransferConfig(kv)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := worker.New(worker.Config{Engine: eng, KV: cfg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); srv.Close(); cancel(); <-done })
	return hs.URL
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A deploy config whose stages name endpoints: omnipd starts nothing and
// drives the engines already running there, as it would vllm serve.
func TestServeEndpoints(t *testing.T) {
	prefill := runningWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_producer","engine_id":"p0","kv_port":0}`)
	decode := runningWorker(t, `{"kv_connector":"ReferenceConnector","kv_role":"kv_consumer","engine_id":"d0"}`)
	cfg := writePipelineEndpointsConfig(t, "qwen3_omni_moe", prefill, decode)
	doc, _, err := deploy.LoadFile(cfg, deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, doc, serveOptions{host: "127.0.0.1", port: 0, drain: 5 * time.Second, model: "omnipd-reference",
			out: out, log: slog.New(slog.DiscardHandler), workerLog: io.Discard})
	}()
	addr := regexp.MustCompile(`on (http://\S+)`)
	var url string
	for deadline := time.Now().Add(10 * time.Second); url == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		}
	}
	if url == "" {
		t.Fatalf("serve did not start:\n%s", out.String())
	}
	if strings.Contains(out.String(), "starting reference worker") {
		t.Errorf("serve started workers for stages with endpoints:\n%s", out.String())
	}
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Hello there","max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Omnipd-Pd-Path") != "disaggregated" || !strings.Contains(string(body), `"cached_tokens":10`) {
		t.Errorf("%d %s %s", resp.StatusCode, resp.Header.Get("X-Omnipd-Pd-Path"), body)
	}
	if resp, err := http.Get(url + "/health"); err != nil || resp.StatusCode != 200 {
		t.Errorf("health: %v %v", resp, err)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("serve returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func TestKVCacheArgsFromEngineArgs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	cfg := `pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    model_stage: thinker
    final_output: true
    final_output_type: text
    devices: "0"
    engine_args:
      num_gpu_blocks_override: 9500
      block_size: 32
      max_num_seqs: 1
`
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var flags configFlags
	doc, err := loadConfig(path, flags.options(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := kvCacheArgs(doc.Stages[0])
	if want := []string{"--num-blocks", "9500", "--block-size", "32"}; !slices.Equal(got, want) {
		t.Errorf("worker flags %q, want %q (and not max_num_seqs)", got, want)
	}
}

func TestWorkerProcsShareTheHost(t *testing.T) {
	for _, tt := range []struct {
		host, workers int
		envSet        bool
		want          int
	}{
		{host: 2, workers: 2, want: 1},
		{host: 2, workers: 4, want: 1}, // never below one
		{host: 64, workers: 4, want: 16},
		{host: 8, workers: 3, want: 2},
		{host: 8, workers: 0, want: 0},               // nothing started here
		{host: 8, workers: 2, envSet: true, want: 0}, // the user chose
	} {
		if got := workerProcs(tt.host, tt.workers, tt.envSet); got != tt.want {
			t.Errorf("workerProcs(%d, %d, %v) = %d, want %d", tt.host, tt.workers, tt.envSet, got, tt.want)
		}
	}
}

// serve picks its own GOGC only when the environment has none: GOGC=off or
// any number the user set is theirs.
func TestServeGCPercentLeavesTheUsersChoice(t *testing.T) {
	for _, tt := range []struct {
		env  string
		want int
		set  bool
	}{
		{env: "", want: defaultServeGCPercent, set: true},
		{env: "100"},
		{env: "50"},
		{env: "off"},
	} {
		if got, set := serveGCPercent(tt.env); got != tt.want || set != tt.set {
			t.Errorf("serveGCPercent(%q) = %d, %v; want %d, %v", tt.env, got, set, tt.want, tt.set)
		}
	}
}
