package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/stageapi"
)

// scrapeSamples reads a worker's /metrics without credentials, as a Prometheus
// server does, and returns sample name{labels} -> value.
func scrapeSamples(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics without the secret: %d %s", resp.StatusCode, b)
	}
	out := map[string]float64{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z0-9_:]+)(\{[^}]*\})? (\S+)$`).FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseFloat(string(m[3]), 64)
		// Keep only the labels that vary, so that lookups read well.
		key := string(m[1])
		if o := regexp.MustCompile(`(outcome|status)="([^"]*)"`).FindSubmatch(m[2]); o != nil {
			key += "{" + string(o[1]) + "=" + string(o[2]) + "}"
		}
		out[key] = v
	}
	return out
}

// The Talker and Code2Wav workers serve /metrics without the deployment
// secret, like the Thinker's: requests by outcome, latency, in flight, and
// the frames or samples they produced.
func TestStageWorkersExposeMetrics(t *testing.T) {
	thinker := newTestWorker(t, "")
	tk := httptest.NewServer(NewTalker(talker.Default(), talker.DefaultSegmenter(), testSecret, slog.New(slog.DiscardHandler)))
	defer tk.Close()
	c2w := httptest.NewServer(NewCode2Wav(code2wav.Default(), testSecret, slog.New(slog.DiscardHandler)))
	defer c2w.Close()

	prompt := testTokenizer.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "Hello!"}}, true)
	b := body(prompt, 6, 0, 1)
	b["omnipd_conditioning"] = map[string]any{"key": "m/thinker", "layer": 2}
	if _, _, err := post(context.Background(), thinker.url, "m", b); err != nil {
		t.Fatal(err)
	}
	frames := readFrames(t, tk.URL, stageapi.TalkerRequest{Conditioning: []stageapi.ConditioningHandle{{URL: thinker.url, Key: "m/thinker"}}})
	// The stash is gone now: the same handle again is conditioning_unavailable.
	again, _ := json.Marshal(stageapi.TalkerRequest{Conditioning: []stageapi.ConditioningHandle{{URL: thinker.url, Key: "m/thinker"}}})
	if status, _, _ := call(t, "POST", tk.URL+stageapi.TalkerPath, "Bearer "+testSecret, string(again)); status != http.StatusNotFound {
		t.Fatalf("a fetched stash again: %d, want 404", status)
	}
	if status, _, _ := call(t, "POST", tk.URL+stageapi.TalkerPath, "Bearer "+testSecret, `{"conditioning":[]}`); status != 400 {
		t.Fatalf("no conditioning: %d, want 400", status)
	}
	tm := settledSamples(t, tk.URL)
	for name, want := range map[string]float64{
		"omnipd_stage_requests_total{outcome=ok}":                       1,
		"omnipd_stage_requests_total{outcome=conditioning_unavailable}": 1,
		"omnipd_stage_requests_total{outcome=invalid_request}":          1,
		"omnipd_stage_requests_total{outcome=failed}":                   0,
		"omnipd_talker_frames_total":                                    float64(len(frames)),
		"vllm:e2e_request_latency_seconds_count":                        3,
		"omnipd_stage_time_to_first_output_seconds_count":               1,
		"vllm:num_requests_running":                                     0,
	} {
		if got, ok := tm[name]; !ok || got != want {
			t.Errorf("talker %s = %v (present %v), want %v", name, got, ok, want)
		}
	}

	req, _ := json.Marshal(stageapi.Code2WavRequest{Codes: stageapi.FramesToWire(frames), NumFrames: len(frames)})
	hr, _ := http.NewRequest("POST", c2w.URL+stageapi.Code2WavPath, bytes.NewReader(req))
	hr.Header.Set("Authorization", "Bearer "+testSecret)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	var out stageapi.Code2WavResponse
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&out) != nil {
		t.Fatalf("code2wav: %d", resp.StatusCode)
	}
	resp.Body.Close()
	if status, _, _ := call(t, "POST", c2w.URL+stageapi.Code2WavPath, "Bearer "+testSecret, `{"codes":"", "num_frames": 3}`); status != 400 {
		t.Fatalf("bad codes: %d, want 400", status)
	}
	// A request is counted once its handler returns, just after the answer
	// is written: wait for the last one to be out of flight.
	cm := settledSamples(t, c2w.URL)
	for name, want := range map[string]float64{
		"omnipd_stage_requests_total{outcome=ok}":              1,
		"omnipd_stage_requests_total{outcome=invalid_request}": 1,
		"omnipd_code2wav_samples_total":                        float64(out.NumSamples),
		"vllm:e2e_request_latency_seconds_count":               2,
		"vllm:num_requests_running":                            0,
	} {
		if got, ok := cm[name]; !ok || got != want {
			t.Errorf("code2wav %s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	if _, ok := cm["process_resident_memory_bytes"]; !ok {
		t.Error("code2wav /metrics lacks the process metrics")
	}

	// The Thinker counts the requests it refused, by status.
	if status, _, _ := call(t, "POST", thinker.url+"/v1/completions", "Bearer "+testSecret, `{"prompt":"hi","n":2}`); status != 400 {
		t.Fatalf("n=2: %d, want 400", status)
	}
	if got := scrapeSamples(t, thinker.url)["omnipd_request_errors_total{status=400}"]; got != 1 {
		t.Errorf("thinker omnipd_request_errors_total{status=400} = %v, want 1", got)
	}
}

// settledSamples scrapes a stage worker once no request is in flight.
func settledSamples(t *testing.T, url string) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m := scrapeSamples(t, url)
		if m["vllm:num_requests_running"] == 0 || time.Now().After(deadline) {
			return m
		}
		time.Sleep(2 * time.Millisecond)
	}
}
