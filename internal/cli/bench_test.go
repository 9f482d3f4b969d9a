package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnipd/omnipd/bench"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/server"
	"github.com/omnipd/omnipd/stageclient"
)

// benchDeployment is omnipd's API in front of the whole reference pipeline,
// in this process as the server tests build it: Thinker prefill and decode
// workers over the reference KV connector, and a Talker and a Code2Wav
// worker run as omnipd worker runs them. It returns the API's base URL.
func benchDeployment(t *testing.T) string {
	t.Helper()
	const secret = "bench-test-secret"
	quiet := slog.New(slog.DiscardHandler)
	client := func(url string) *stageclient.Client {
		c, err := stageclient.New(stageclient.Config{BaseURL: url, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	thinker := func(role, engineID string) *orchestrator.Instance {
		eng, err := engine.New(model.Default(), tokenizer.Default(), engine.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { eng.Run(ctx); close(done) }()
		kv, err := worker.ParseKVTransferConfig(fmt.Sprintf(`{"kv_connector":"ReferenceConnector","kv_role":%q,"engine_id":%q,"kv_ip":"127.0.0.1","kv_port":0}`, role, engineID))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := worker.New(worker.Config{Engine: eng, KV: kv, Secret: secret, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv)
		t.Cleanup(func() { hs.Close(); srv.Close(); cancel(); <-done })
		peer := kvconnector.Peer{EngineID: engineID, HTTPAddr: strings.TrimPrefix(hs.URL, "http://"), TP: 1}
		if addr := srv.KVAddr(); addr != "" {
			host, port, _ := net.SplitHostPort(addr)
			peer.KVHost = host
			peer.KVPort, _ = strconv.Atoi(port)
		}
		return &orchestrator.Instance{Client: client(hs.URL), Peer: peer}
	}
	stage := func(name string) *orchestrator.Pool {
		url := runStageWorker(t, name, secret)
		return &orchestrator.Pool{Name: name, Instances: []*orchestrator.Instance{{Client: client(url)}}}
	}
	contract, err := kvconnector.NewRegistry().Lookup("ReferenceConnector", nil)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewOrchestrator()
	o, err := orchestrator.New(orchestrator.Config{
		Prefill:  &orchestrator.Pool{Name: "prefill", Instances: []*orchestrator.Instance{thinker("kv_producer", "prefill-0")}},
		Decode:   &orchestrator.Pool{Name: "decode", Instances: []*orchestrator.Instance{thinker("kv_consumer", "decode-0")}},
		Contract: contract, PrefillRetries: 1, Logger: quiet, Metrics: m,
		Omni: &orchestrator.Omni{
			Talker:            stage("talker"),
			Code2Wav:          stage("code2wav"),
			ConditioningLayer: 2, Temperature: 0.9, TopK: 50, MaxFrames: 12,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(server.New(server.Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: quiet, Metrics: m}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// runStageWorker runs "omnipd worker --stage name" in this process, as
// TestWorkerSimulate does, and returns its URL once it listens.
func runStageWorker(t *testing.T, name, secret string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &lockedBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"worker", "--stage", name, "--host", "127.0.0.1", "--port", "0", "--secret", secret}, io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("the %s worker did not stop", name)
		}
	})
	addr := regexp.MustCompile(`"worker listening" addr=(\S+)`)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addr.FindStringSubmatch(logs.String()); m != nil {
			return "http://" + m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("the %s worker exited %d:\n%s", name, code, logs.String())
		default:
		}
	}
	t.Fatalf("the %s worker did not start:\n%s", name, logs.String())
	return ""
}

// checkSVG decodes an SVG file as XML and reports its element counts.
func checkSVG(t *testing.T, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
	if counts["svg"] != 1 || counts["polyline"] == 0 || counts["text"] < 5 {
		t.Errorf("%s: elements %v", path, counts)
	}
	return counts
}

func readReport(t *testing.T, path string) (*bench.Report, []byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &rep, raw
}

// A short benchmark of the in-process omnipd, text and text+audio, checked
// for consistency: every request completes, each record agrees with itself
// and with the server's usage, and every output is well formed.
func TestBenchEndToEnd(t *testing.T) {
	url := benchDeployment(t)
	for _, mod := range []string{"text", "text,audio"} {
		t.Run(mod, func(t *testing.T) {
			dir := t.TempDir()
			jsonPath, plots := filepath.Join(dir, "out.json"), filepath.Join(dir, "plots")
			code, stdout, stderr := run(t, "bench", "--base-url", url, "--num-prompts", "12", "--concurrency", "3",
				"--input-len", "16", "--output-len", "8", "--modalities", mod, "--seed", "7", "--warmup", "2",
				"--slo", "ttft=1m,tpot=1m", "--output-json", jsonPath, "--plot-dir", plots, "--quiet")
			if code != 0 {
				t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
			}
			audio := mod == "text,audio"
			rows := []string{"| completed requests | 12 |", "| failed requests | 0 |", "| duration (s) |", "| total input tokens |", "| total output tokens | 96 |",
				"| request throughput (req/s) |", "| output token throughput (tok/s) |", "| total token throughput (tok/s) |", "| goodput (req/s) |",
				"| requests meeting SLO (%) | 100.0 |", "| TTFT (ms) |", "| TPOT (ms) |", "| ITL (ms) |", "| E2E (ms) |"}
			if audio {
				rows = append(rows, "| total audio (s) |", "| audio TTFP (ms) |", "| audio RTF |")
			}
			for _, row := range rows {
				if !strings.Contains(stdout, row) {
					t.Errorf("report lacks %q:\n%s", row, stdout)
				}
			}
			if strings.Contains(stdout, "audio") != audio {
				t.Errorf("audio rows present: %v; want %v:\n%s", !audio, audio, stdout)
			}

			rep, raw := readReport(t, jsonPath)
			if len(rep.Runs) != 1 || rep.Settings.Model != "omnipd-reference" || rep.Settings.Audio() != audio || !rep.Settings.IgnoreEOS {
				t.Fatalf("report settings %+v", rep.Settings)
			}
			run := rep.Runs[0]
			s := run.Summary
			if s.Completed != 12 || s.Failed != 0 || len(run.Requests) != 12 || s.MetSLO != 12 || s.TotalOutputTokens != 96 {
				t.Fatalf("summary %+v", s)
			}
			for _, r := range run.Requests {
				switch {
				case !r.Success || r.Status != 200:
					t.Errorf("request %d failed: %+v", r.Index, r)
				case !(r.TTFTMS > 0 && r.TTFTMS <= r.E2EMS):
					t.Errorf("request %d: TTFT %v, E2E %v", r.Index, r.TTFTMS, r.E2EMS)
				case len(r.ITLMS) != r.TextChunks-1:
					t.Errorf("request %d: %d ITLs for %d chunks", r.Index, len(r.ITLMS), r.TextChunks)
				case !r.OutputTokensReported || r.OutputTokens != 8 || !r.PromptTokensReported:
					t.Errorf("request %d: tokens %+v; want the server's usage, 8 (ignore_eos)", r.Index, r)
				}
				if audio && !(r.AudioChunks > 0 && r.AudioDurationS > 0 && r.AudioRTF > 0 && r.AudioTTFPMS >= r.TTFTMS && r.AudioTTFPMS <= r.E2EMS) {
					t.Errorf("request %d audio: %+v", r.Index, r)
				}
				if !audio && (r.AudioChunks != 0 || r.AudioDurationS != 0) {
					t.Errorf("request %d: audio in a text run: %+v", r.Index, r)
				}
			}
			if audio && (s.AudioTTFP.Count != 12 || s.AudioRTF.Count != 12 || s.TotalAudioS <= 0) {
				t.Errorf("audio summary %+v %+v", s.AudioTTFP, s.AudioRTF)
			}
			// The JSON round-trips: decoding and encoding it again gives the same bytes.
			var again bytes.Buffer
			if err := rep.WriteJSON(&again); err != nil || again.String() != string(raw) {
				t.Errorf("JSON does not round-trip (%v)", err)
			}
			want := []string{"ttft_cdf.svg", "e2e_cdf.svg", "tpot_itl_cdf.svg"}
			if audio {
				want = append(want, "audio_ttfp_cdf.svg", "audio_rtf_cdf.svg")
			}
			for _, f := range want {
				checkSVG(t, filepath.Join(plots, f))
			}
		})
	}
}

// --input-len is tokens as the server counts them, as in vllm bench
// serve: on completions every prompt is exactly that many
// (usage.prompt_tokens), on chat that many and the chat template's; the
// report shows what was asked for beside what was sent.
func TestBenchInputLenIsTokens(t *testing.T) {
	url := benchDeployment(t)
	// What the reference Thinker's template adds around a user message.
	template := len(tokenizer.Default().ApplyChatTemplate([]tokenizer.Message{{Role: "user"}}, true))
	for _, tc := range []struct {
		endpoint string
		want     int
		rows     []string
	}{
		{"completions", 64, nil},
		{"chat", 64 + template, []string{fmt.Sprintf("| chat template tokens per request | %d |", template),
			fmt.Sprintf("random (input 64 tokens and the chat template's %d, output 2 tokens)", template)}},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			jsonPath := filepath.Join(t.TempDir(), "out.json")
			code, stdout, stderr := run(t, "bench", "--base-url", url, "--endpoint", tc.endpoint, "--input-len", "64", "--output-len", "2",
				"--num-prompts", "6", "--concurrency", "3", "--seed", "5", "--quiet", "--output-json", jsonPath)
			if code != 0 {
				t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
			}
			rows := append([]string{"| input tokens per request, asked (--input-len) | 64 |",
				fmt.Sprintf("| input tokens per request, sent (mean usage.prompt_tokens) | %d.00 |", tc.want)}, tc.rows...)
			for _, row := range rows {
				if !strings.Contains(stdout, row) {
					t.Errorf("report lacks %q:\n%s", row, stdout)
				}
			}
			rep, _ := readReport(t, jsonPath)
			if f := rep.Settings.InputFit; f == nil || f.Added != tc.want-64 || f.AddedInInputLen != (tc.endpoint == "completions") {
				t.Errorf("input_fit %+v (%s); want %d tokens added", f, rep.Settings.InputFitError, tc.want-64)
			}
			for _, r := range rep.Runs[0].Requests {
				if !r.Success || !r.PromptTokensReported || r.PromptTokens != tc.want {
					t.Errorf("request %d: %d prompt tokens (reported %v); want %d", r.Index, r.PromptTokens, r.PromptTokensReported, tc.want)
				}
			}
		})
	}
}

// A sweep over request rates reports a row per rate and charts against
// the rate; a ShareGPT file drives the same server.
func TestBenchSweepAndShareGPT(t *testing.T) {
	url := benchDeployment(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "sharegpt.json")
	if err := os.WriteFile(data, []byte(`[
		{"conversations":[{"from":"human","value":"Tell me about disaggregated serving."},{"from":"gpt","value":"It splits prefill and decode across workers so each is batched for its own work."}]},
		{"conversations":[{"from":"human","value":"And audio?"},{"from":"gpt","value":"A Talker and Code2Wav turn the Thinker's states into speech."}]}
	]`), 0o644); err != nil {
		t.Fatal(err)
	}
	jsonPath, plots := filepath.Join(dir, "sweep.json"), filepath.Join(dir, "plots")
	code, stdout, stderr := run(t, "bench", "--base-url", url, "--model", "omnipd-reference", "--dataset", "sharegpt", "--dataset-path", data,
		"--output-len", "6", "--num-prompts", "4", "--sweep", "50,100", "--max-concurrency", "2", "--slo", "e2e=1m", "--output-json", jsonPath, "--plot-dir", plots)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"## Sweep", "| rate 50 | 4 | 0 |", "| rate 100 | 4 | 0 |", "## rate 50", "## rate 100"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "rate 100") || !strings.Contains(stderr, "4/4") {
		t.Errorf("no progress on stderr:\n%s", stderr)
	}
	rep, _ := readReport(t, jsonPath)
	if len(rep.Runs) != 2 || rep.Runs[1].Load.RequestRate != 100 || rep.Settings.Dataset != "sharegpt" || rep.Settings.IgnoreEOS {
		t.Fatalf("report %+v", rep.Settings)
	}
	for _, run := range rep.Runs {
		for _, r := range run.Requests {
			if !r.Success || r.MaxTokens > 6 || r.OutputTokens > r.MaxTokens {
				t.Errorf("%+v", r)
			}
		}
	}
	for _, f := range []string{"goodput_vs_rate.svg", "throughput_vs_rate.svg", "ttft_vs_rate.svg", "ttft_cdf.svg"} {
		checkSVG(t, filepath.Join(plots, f))
	}
}

// A server that fails every request: each is counted as failed with the
// OpenAI error's message, the report is still written, and the exit code
// says nothing succeeded.
func TestBenchFailingServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"the decode stage is unavailable","type":"upstream_error","param":null,"code":"decode_upstream_unavailable"}}`)
	}))
	defer srv.Close()
	jsonPath := filepath.Join(t.TempDir(), "out.json")
	code, stdout, stderr := run(t, "bench", "--base-url", srv.URL, "--model", "m", "--num-prompts", "5", "--request-rate", "1000", "--output-json", jsonPath, "--quiet",
		"--ready-check-timeout-sec", "0")
	if code != 1 || !strings.Contains(stderr, "every request failed") || !strings.Contains(stderr, "prompts not fitted to tokens") {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	for _, want := range []string{"| completed requests | 0 |", "| failed requests | 5 |", "| 5 | HTTP 503: the decode stage is unavailable (decode_upstream_unavailable) |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	rep, _ := readReport(t, jsonPath)
	for _, r := range rep.Runs[0].Requests {
		if r.Success || r.Status != 503 || !strings.Contains(r.Error, "decode stage is unavailable") {
			t.Errorf("%+v", r)
		}
	}
}

// A server still starting — it answers 503 until it is ready — is waited
// for, as vllm bench serve waits (--ready-check-timeout-sec): the run
// measures it once it answers, and none of its requests failed; a server
// that never comes up fails the run once the wait is over, saying so.
func TestBenchWaitsForTheServer(t *testing.T) {
	var probes atomic.Int64
	starting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if probes.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"not ready: the decode stage is starting","type":"service_unavailable"}}`)
			return
		}
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	}))
	defer starting.Close()
	code, stdout, stderr := run(t, "bench", "--base-url", starting.URL, "--num-prompts", "3", "--concurrency", "1")
	if code != 0 || !strings.Contains(stdout, "| completed requests | 3 |") || !strings.Contains(stdout, "| failed requests | 0 |") ||
		!strings.Contains(stderr, "to be ready") {
		t.Errorf("a server that is starting: exit %d\n%s\n%s", code, stdout, stderr)
	}

	never := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer never.Close()
	code, _, stderr = run(t, "bench", "--base-url", never.URL, "--model", "m", "--num-prompts", "3", "--quiet", "--ready-check-timeout-sec", "1")
	if code == 0 || !strings.Contains(stderr, "was not ready within 1s (--ready-check-timeout-sec)") {
		t.Errorf("a server that never comes up: exit %d, %s", code, stderr)
	}
}

// Ctrl-C mid-run: the requests that finished are still reported, and the
// exit code is 130.
func TestBenchInterrupted(t *testing.T) {
	hung := make(chan struct{}, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		// The first request, and those measuring the token counts, are
		// answered; the others hang until the interrupt.
		if id := r.Header.Get("X-Request-Id"); id == "" || strings.HasSuffix(id, "-0") || strings.Contains(id, "-fit-") {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
			return
		}
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		hung <- struct{}{}
		<-r.Context().Done()
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-hung; cancel() }()
	var out, errOut bytes.Buffer
	code := Run(ctx, []string{"bench", "--base-url", srv.URL, "--model", "m", "--concurrency", "1", "--num-prompts", "20"}, &out, &errOut)
	if code != 130 || !strings.Contains(out.String(), "**Interrupted:**") || !strings.Contains(out.String(), "| completed requests | 1 |") ||
		!strings.Contains(out.String(), "| canceled requests | 1 |") || !strings.Contains(errOut.String(), "interrupted") {
		t.Errorf("exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
}

func TestBenchFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--modalities", "audio"}, "want text or text,audio"},
		{[]string{"--dataset", "sharegpt"}, "needs --dataset-path"},
		{[]string{"--dataset", "sonnet"}, "want random, random-mm or sharegpt"},
		{[]string{"--concurrency", "2", "--request-rate", "4"}, "closed loop"},
		{[]string{"--sweep-concurrency"}, "needs --sweep"},
		{[]string{"--sweep", "1,x"}, "positive numbers"},
		{[]string{"--concurrency", "2", "--sweep", "1,2"}, "--sweep-concurrency"},
		{[]string{"--slo", "ttft=soon"}, "--slo"},
		{[]string{"--slo", "rtf=1"}, "needs --modalities text,audio"},
		{[]string{"--request-rate", "-1"}, "--request-rate"},
		{[]string{"--duration", "1s"}, "infinite request rate"},
		{[]string{"--endpoint", "completions", "--modalities", "text,audio"}, "chat endpoint"},
		{[]string{"--base-url", "localhost:8000"}, "want http://host:port"},
	} {
		args := append([]string{"bench", "--model", "m", "--base-url", "http://127.0.0.1:1"}, tt.args...)
		code, _, stderr := run(t, args...)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

// The report's destinations are made and checked before the load: a missing
// directory is created, and one that cannot be written to fails the run
// before a single request is sent, rather than after the load.
func TestBenchOutputsPreparedBeforeTheLoad(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"bench", "--base-url", srv.URL, "--model", "m", "--num-prompts", "3", "--concurrency", "1", "--quiet"}
	for _, tt := range []struct{ flag, path, want string }{
		{"--output-json", filepath.Join(notADir, "out.json"), "--output-json"},
		{"--output-json", dir, "is a directory"},
		{"--plot-dir", filepath.Join(notADir, "charts"), "--plot-dir"},
	} {
		code, _, stderr := run(t, append(args, tt.flag, tt.path)...)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s %s: exit %d, stderr %q; want 2 and %q", tt.flag, tt.path, code, stderr, tt.want)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests sent with an unwritable destination", n)
	}

	jsonPath := filepath.Join(dir, "new", "deeper", "out.json")
	plots := filepath.Join(dir, "new", "charts")
	if code, _, stderr := run(t, append(args, "--output-json", jsonPath, "--plot-dir", plots)...); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if rep, _ := readReport(t, jsonPath); len(rep.Runs) != 1 || len(rep.Runs[0].Requests) != 3 {
		t.Errorf("report: %+v", rep.Runs)
	}
	charts, _ := filepath.Glob(filepath.Join(plots, "*.svg"))
	leftovers, _ := filepath.Glob(filepath.Join(dir, "new", "deeper", ".omnipd-bench-*"))
	if len(charts) == 0 || len(leftovers) != 0 {
		t.Errorf("charts %v, temporary files left %v", charts, leftovers)
	}
}

// The random-mm flags: vLLM's names and semantics, omnipd's audio flags,
// and a usage error (exit 2) naming the flag for every bad value.
func TestBenchRandomMMFlags(t *testing.T) {
	mm := []string{"--dataset", "random-mm"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--random-mm-base-items-per-request", "2"}, "--random-mm-base-items-per-request: the random-mm flags need --dataset random-mm"},
		{[]string{"--dataset", "sharegpt", "--dataset-path", "x.json", "--random-mm-audio-part", "audio_url"}, "need --dataset random-mm"},
		{append(mm, "--endpoint", "completions"), "random-mm needs the chat endpoint"},
		{append(mm, "--random-mm-num-mm-items-range-ratio", "1.5"), "--random-mm-num-mm-items-range-ratio 1.5: want a number in [0, 1]"},
		{append(mm, "--random-mm-base-items-per-request", "-1"), "--random-mm-base-items-per-request -1: want >= 0"},
		{append(mm, "--random-mm-limit-mm-per-prompt", "image=2"), "--random-mm-limit-mm-per-prompt image=2: want a JSON object"},
		{append(mm, "--random-mm-limit-mm-per-prompt", `{"image": -2}`), `image: -2; want a whole number >= 0`},
		{append(mm, "--random-mm-limit-mm-per-prompt", `{"audio": 1}`), "modality image of bucket (256, 256, 1) is not in --random-mm-limit-mm-per-prompt"},
		{append(mm, "--random-mm-bucket-config", "{(256, 256): 1}"), "--random-mm-bucket-config {(256, 256): 1}: at"},
		{append(mm, "--random-mm-bucket-config", "{(0, 30, 1): 0}"), "every probability is zero"},
		{append(mm, "--random-mm-bucket-config", "{(720, 1280, 16): 1}"), "video buckets (frames > 1) are not synthesized yet"},
		{append(mm, "--random-mm-bucket-config", "{(0, 30, 1): 1}", "--random-mm-limit-mm-per-prompt", `{"audio": 1}`, "--random-mm-base-items-per-request", "2"), "at least 2 items"},
		{append(mm, "--random-mm-audio-part", "wav"), `--random-mm-audio-part "wav": want input_audio or audio_url`},
		{append(mm, "--random-mm-audio-sample-rate", "1000"), "--random-mm-audio-sample-rate 1000"},
		{append(mm, "--input-len", "0"), "--input-len and --output-len: want >= 1"},
	} {
		args := append([]string{"bench", "--model", "m", "--base-url", "http://127.0.0.1:1"}, tt.args...)
		code, _, stderr := run(t, args...)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr, tt.want)
		}
	}
}

// random-mm against the reference pipeline: omnipd's API takes every
// synthetic image and clip (a bad media part is a 400), and the report
// counts the media sent.
func TestBenchRandomMMEndToEnd(t *testing.T) {
	url := benchDeployment(t)
	jsonPath := filepath.Join(t.TempDir(), "mm.json")
	code, stdout, stderr := run(t, "bench", "--base-url", url, "--model", "omnipd-reference", "--dataset", "random-mm",
		"--random-mm-bucket-config", "{(32, 48, 1): 0.5, (0, 1, 1): 0.5}", "--random-mm-limit-mm-per-prompt", `{"image": 1, "audio": 1}`,
		"--random-mm-base-items-per-request", "2", "--input-len", "8", "--output-len", "4", "--num-prompts", "3", "--concurrency", "2",
		"--seed", "3", "--quiet", "--output-json", jsonPath)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	template := len(tokenizer.Default().ApplyChatTemplate([]tokenizer.Message{{Role: "user"}}, true))
	for _, want := range []string{fmt.Sprintf("random-mm (input 8 tokens and the chat template's %d, output 4 tokens; 2 media items a request from {(32, 48, 1): 0.5, (0, 1, 1): 0.5})", template),
		"| completed requests | 3 |", "| media items sent | 6 |", "| media sent (MB) |", "| request bodies sent (MB) |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	rep, raw := readReport(t, jsonPath)
	mm := rep.Settings.RandomMM
	if mm == nil || mm.ItemsPerRequest != [2]int{2, 2} || mm.AudioPart != "input_audio" || mm.AudioSampleRate != 16000 || !bytes.Contains(raw, []byte(`"total_media_items": 6`)) {
		t.Fatalf("settings %+v", mm)
	}
	for _, r := range rep.Runs[0].Requests {
		// 2 items: a 32x48 PNG and a one-second 16 kHz clip (32,044 bytes).
		if !r.Success || r.MediaItems != 2 || r.MediaBytes < 32044+4608 || r.RequestBytes < 4*r.MediaBytes/3 {
			t.Errorf("%+v", r)
		}
	}
}
