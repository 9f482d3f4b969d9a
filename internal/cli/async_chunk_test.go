package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/stageapi"
)

// recordingTalker is a Talker stage that records the async_chunk of each
// request it is sent and refuses it: enough to see what the orchestrator
// asked for.
func recordingTalker(t *testing.T) (string, <-chan bool) {
	t.Helper()
	seen := make(chan bool, 4)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != stageapi.TalkerPath {
			w.WriteHeader(http.StatusOK) // /health, /metrics
			return
		}
		var req stageapi.TalkerRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err == nil {
			select {
			case seen <- req.AsyncChunk:
			default:
			}
		}
		http.Error(w, `{"error":{"message":"recording only","type":"server_error"}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(hs.Close)
	return hs.URL, seen
}

// --async-chunk overrides the config's async_chunk, both ways, and what it
// says is what the orchestrator asks of the Talker; without it the config
// decides.
func TestServeAsyncChunkFlag(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	thinker := runningWorker(t, "")
	code2wav := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(code2wav.Close)
	for _, tc := range []struct {
		config bool
		args   []string
		want   bool
	}{
		{config: true, want: true},
		{config: false, want: false},
		{config: true, args: []string{"--async-chunk=false"}, want: false},
		{config: false, args: []string{"--async-chunk"}, want: true},
	} {
		talker, seen := recordingTalker(t)
		cfg := filepath.Join(t.TempDir(), "deploy.yaml")
		err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
pipeline: qwen3_omni_moe
async_chunk: %t
stages:
  - stage_id: 0
    endpoints: [%q]
  - stage_id: 1
    endpoints: [%q]
  - stage_id: 2
    endpoints: [%q]
`, tc.config, thinker, talker, code2wav.URL)), 0o644)
		if err != nil {
			t.Fatal(err)
		}
		url := runServe(t, append([]string{"--config", cfg, "--pd=false"}, tc.args...)...)
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"messages":[{"role":"user","content":"Hello there"}],"max_tokens":4,"stream":true,"modalities":["text","audio"]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		select {
		case got := <-seen:
			if got != tc.want {
				t.Errorf("async_chunk: %t in the config, serve %q: the Talker was asked async_chunk=%t, want %t", tc.config, tc.args, got, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("async_chunk: %t in the config, serve %q: the Talker was never called", tc.config, tc.args)
		}
	}
}
