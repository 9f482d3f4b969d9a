package server

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/audio"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/stageclient"
)

type omniDeployment struct {
	url      string
	thinkers []*refWorker
}

// omniDeployment is the full pipeline behind omnipd's handler: Thinker
// (disaggregated or not), Talker and Code2Wav workers.
func newOmniDeployment(t *testing.T, pd bool) *omniDeployment {
	t.Helper()
	return newOmniDeploymentWith(t, pd, func(*httptest.Server) {})
}

// newOmniDeploymentWithTalker is a PD deployment whose Talker server the
// caller may break.
func newOmniDeploymentWithTalker(t *testing.T, breakTalker func(*httptest.Server)) *omniDeployment {
	t.Helper()
	return newOmniDeploymentWith(t, true, breakTalker)
}

func newOmniDeploymentWith(t *testing.T, pd bool, breakTalker func(*httptest.Server)) *omniDeployment {
	t.Helper()
	return newOmniDeploymentFull(t, pd, breakTalker, 0.9)
}

func newOmniDeploymentFull(t *testing.T, pd bool, breakTalker func(*httptest.Server), talkerTemperature float64, adjust ...func(*orchestrator.Config)) *omniDeployment {
	t.Helper()
	return newOmniDeploymentOf(t, pd, breakTalker, talkerTemperature, func(string) func(*worker.Config) { return func(*worker.Config) {} }, adjust...)
}

// newOmniDeploymentWithWorkers is a PD deployment whose Thinker workers'
// configs are adjusted by role ("prefill", "decode").
func newOmniDeploymentWithWorkers(t *testing.T, talkerTemperature float64, workers func(role string) func(*worker.Config), adjust ...func(*orchestrator.Config)) *omniDeployment {
	t.Helper()
	return newOmniDeploymentOf(t, true, func(*httptest.Server) {}, talkerTemperature, workers, adjust...)
}

func newOmniDeploymentOf(t *testing.T, pd bool, breakTalker func(*httptest.Server), talkerTemperature float64, workers func(role string) func(*worker.Config), adjust ...func(*orchestrator.Config)) *omniDeployment {
	t.Helper()
	d := &omniDeployment{}
	ocfg := orchestrator.Config{PrefillRetries: 1, Logger: quiet, Metrics: metrics.NewOrchestrator()}
	if pd {
		pre := startWorkerWith(t, kvJSON("kv_producer", "prefill-0", "pull"), "prefill-0", workers("prefill"))
		dec := startWorkerWith(t, kvJSON("kv_consumer", "decode-0", "pull"), "decode-0", workers("decode"))
		contract, _ := kvconnector.NewRegistry().Lookup("ReferenceConnector", nil)
		ocfg.Prefill, ocfg.Decode, ocfg.Contract = pool(t, "prefill", pre), pool(t, "decode", dec), contract
		d.thinkers = []*refWorker{pre, dec}
	} else {
		w := startWorkerWith(t, "", "", workers("thinker"))
		ocfg.Decode = pool(t, "thinker", w)
		d.thinkers = []*refWorker{w}
	}
	stage := func(h *httptest.Server) *orchestrator.Pool {
		t.Cleanup(h.Close)
		c, err := stageclient.New(stageclient.Config{BaseURL: h.URL, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		return &orchestrator.Pool{Name: h.URL, Instances: []*orchestrator.Instance{{Client: c}}}
	}
	talkerServer := httptest.NewServer(worker.NewTalker(talker.Default(), talker.DefaultSegmenter(), secret, quiet))
	talkerPool := stage(talkerServer)
	breakTalker(talkerServer)
	ocfg.Omni = &orchestrator.Omni{
		Talker:            talkerPool,
		Code2Wav:          stage(httptest.NewServer(worker.NewCode2Wav(code2wav.Default(), secret, quiet))),
		ConditioningLayer: 2, Temperature: talkerTemperature, TopK: 50,
	}
	for _, f := range adjust {
		f(&ocfg)
	}
	o, err := orchestrator.New(ocfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(New(Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: quiet, Metrics: ocfg.Metrics}))
	t.Cleanup(hs.Close)
	d.url = hs.URL
	return d
}

type omniAnswer struct {
	text    string
	samples []int16
}

func omniWhole(t *testing.T, url, body string) omniAnswer {
	t.Helper()
	status, _, raw, err := postChat(context.Background(), url, body)
	if err != nil || status != 200 {
		t.Fatalf("%d %v %s", status, err, raw)
	}
	var resp struct {
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				Content *string `json:"content"`
				Audio   *struct {
					ID   string `json:"id"`
					Data string `json:"data"`
				} `json:"audio"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(raw), &resp); err != nil {
		t.Fatal(err)
	}
	var a omniAnswer
	for _, c := range resp.Choices {
		if c.Index != 0 {
			t.Errorf("choice index %d; vllm-omni returns both choices with index 0", c.Index)
		}
		if c.Message.Audio != nil {
			if !strings.HasPrefix(c.Message.Audio.ID, "audio-") || len(c.Message.Audio.ID) != len("audio-")+16 {
				t.Errorf("audio id %q", c.Message.Audio.ID)
			}
			wav, err := base64.StdEncoding.DecodeString(c.Message.Audio.Data)
			if err != nil {
				t.Fatal(err)
			}
			samples, rate, channels, err := audio.DecodeWAV(wav)
			if err != nil || rate != 24000 || channels != 1 || len(samples)%audio.SamplesPerFrame != 0 || len(samples) == 0 {
				t.Fatalf("WAV: %v, %d Hz, %d channels, %d samples (want whole 80 ms frames)", err, rate, channels, len(samples))
			}
			a.samples = samples
		} else if c.Message.Content != nil {
			a.text = *c.Message.Content
		}
	}
	return a
}

func omniStream(t *testing.T, url, body string) omniAnswer {
	t.Helper()
	return omniStreamOf(t, url, body, false)
}

// omniStreamOf reads a streamed omni answer; interleaved allows text after
// the first audio chunk, as async chunk streams them.
func omniStreamOf(t *testing.T, url, body string, interleaved bool) omniAnswer {
	t.Helper()
	status, _, raw, err := postChat(context.Background(), url, body)
	if err != nil || status != 200 {
		t.Fatalf("%d %v %s", status, err, raw)
	}
	var a omniAnswer
	finishes, audioStarted := 0, false
	sc := bufio.NewScanner(strings.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Modality string `json:"modality"`
			Choices  []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || c.Error != nil {
			t.Fatalf("chunk %.200s", data)
		}
		for _, ch := range c.Choices {
			if ch.FinishReason != nil {
				finishes++
			}
			switch c.Modality {
			case "text":
				if audioStarted && !interleaved {
					t.Error("text after audio")
				}
				a.text += ch.Delta.Content
			case "audio":
				if ch.Delta.Content == "" {
					continue
				}
				if !audioStarted && ch.Delta.Role != "assistant" {
					t.Error("the first audio chunk carries no role")
				}
				audioStarted = true
				wav, _ := base64.StdEncoding.DecodeString(ch.Delta.Content)
				s, _, _, err := audio.DecodeWAV(wav)
				if err != nil {
					t.Fatalf("audio chunk is not a WAV file: %v", err)
				}
				a.samples = append(a.samples, s...)
			default:
				t.Fatalf("chunk without modality: %.200s", data)
			}
		}
	}
	if finishes != 2 {
		t.Errorf("%d finish reasons; want two, one on the last chunk of each modality (vllm-omni's rule)", finishes)
	}
	return a
}

// Text and audio through omnipd's API: the disaggregated pipeline answers
// exactly what the colocated one does, whole and streamed, and the streamed
// audio chunks (left context trimmed) are the whole audio.
func TestOmniPDEqualsColocated(t *testing.T) {
	colocated := newOmniDeployment(t, false)
	pd := newOmniDeployment(t, true)
	for i, content := range []string{"Hello!", "Say something about disaggregation, please."} {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":10,"temperature":0.8,"seed":%d}`, content, i)
		want := omniWhole(t, colocated.url, body)
		got := omniWhole(t, pd.url, body)
		if got.text != want.text || !slices.Equal(got.samples, want.samples) {
			t.Errorf("%q: PD text %q and %d samples; colocated %q and %d samples", content, got.text, len(got.samples), want.text, len(want.samples))
		}
		streamBody := strings.Replace(body, `"seed"`, `"stream":true,"seed"`, 1)
		streamed := omniStream(t, pd.url, streamBody)
		if streamed.text != want.text || !slices.Equal(streamed.samples, want.samples) {
			t.Errorf("%q: streamed %q and %d samples; whole %q and %d samples", content, streamed.text, len(streamed.samples), want.text, len(want.samples))
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, w := range pd.thinkers {
		for w.srv.Stashes() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := w.srv.Stashes(); n != 0 {
			t.Errorf("a Thinker worker still holds %d conditioning stashes", n)
		}
	}
}

func TestOmniRequestOptions(t *testing.T) {
	pd := newOmniDeployment(t, true)
	status, _, body, _ := postChat(context.Background(), pd.url, `{"messages":[{"role":"user","content":"x"}],"audio":{"format":"mp3"}}`)
	if status != 400 || !strings.Contains(body, "wav, pcm") || !strings.Contains(body, `"audio.format"`) {
		t.Errorf("mp3: %d %s", status, body)
	}
	a := omniWhole(t, pd.url, `{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"modalities":["text"]}`)
	if a.samples != nil || a.text == "" {
		t.Errorf("text only: %d samples, text %q", len(a.samples), a.text)
	}
	a = omniWhole(t, pd.url, `{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"modalities":["audio"]}`)
	if a.samples == nil || a.text != "" {
		t.Errorf("audio only: %d samples, text %q", len(a.samples), a.text)
	}
	for _, w := range pd.thinkers {
		if n := w.srv.Stashes(); n != 0 {
			t.Errorf("a Thinker worker holds %d stashes", n)
		}
	}
}

// A Talker that fails after the text was streamed ends the stream with an
// error event for audio; the text stands, and no conditioning is left on
// the Thinker workers.
func TestTalkerFailureAfterText(t *testing.T) {
	pd := newOmniDeploymentWithTalker(t, func(h *httptest.Server) { h.Close() })
	status, _, raw, err := postChat(context.Background(), pd.url, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`)
	if err != nil || status != 200 {
		t.Fatalf("%d %v %s", status, err, raw)
	}
	text, audioErr := false, false
	for _, line := range strings.Split(raw, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Modality string `json:"modality"`
			Error    any    `json:"error"`
		}
		_ = json.Unmarshal([]byte(data), &c)
		text = text || c.Modality == "text"
		audioErr = audioErr || (c.Modality == "audio" && c.Error != nil)
	}
	if !text || !audioErr || !strings.HasSuffix(strings.TrimSpace(raw), "data: [DONE]") {
		t.Errorf("want text chunks, then an audio error event, then [DONE]:\n%s", raw)
	}
	waitNoStashes(t, pd.thinkers)

	status, _, raw, _ = postChat(context.Background(), pd.url, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	if status != 502 || !strings.Contains(raw, "talker_failed") {
		t.Errorf("non-streaming with the Talker down: %d %s", status, raw)
	}
	waitNoStashes(t, pd.thinkers)
}

// A client that leaves mid-stream leaves no conditioning behind.
func TestOmniClientLeaves(t *testing.T) {
	pd := newOmniDeployment(t, true)
	for i := range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i*15)*time.Millisecond)
		_, _, _, _ = postChat(ctx, pd.url, `{"messages":[{"role":"user","content":"a longer story please"}],"max_tokens":60,"stream":true}`)
		cancel()
	}
	waitNoStashes(t, pd.thinkers)
	for _, w := range pd.thinkers {
		deadline := time.Now().Add(10 * time.Second)
		for w.eng.Cache().Used() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if u := w.eng.Cache().Used(); u != 0 {
			t.Errorf("a Thinker worker holds %d KV blocks", u)
		}
	}
}

func waitNoStashes(t *testing.T, ws []*refWorker) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range ws {
		for w.srv.Stashes() != 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := w.srv.Stashes(); n != 0 {
			t.Errorf("a Thinker worker holds %d conditioning stashes", n)
		}
	}
}

// Greedy all the way (Thinker and Talker): PD equals colocated without a seed.
func TestOmniGreedyPDEqualsColocated(t *testing.T) {
	colocated := newOmniDeploymentFull(t, false, func(*httptest.Server) {}, 0)
	pd := newOmniDeploymentFull(t, true, func(*httptest.Server) {}, 0)
	body := `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Greedy, please."}],"max_tokens":9,"temperature":0}`
	want, got := omniWhole(t, colocated.url, body), omniWhole(t, pd.url, body)
	if got.text != want.text || !slices.Equal(got.samples, want.samples) {
		t.Errorf("greedy: PD %q and %d samples, colocated %q and %d samples", got.text, len(got.samples), want.text, len(want.samples))
	}
}
