package server

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/stageclient"
)

func ecConfig(role string) func(*worker.Config) {
	return func(c *worker.Config) {
		c.EC = &worker.ECTransferConfig{Connector: worker.ReferenceECConnector, Role: role}
	}
}

// epdDeployment adds encoder workers in front of a PD deployment's
// prefill, which becomes their ec_consumer.
type epdDeployment struct {
	*omniDeployment
	encoders []*refWorker
}

func newEPDDeployment(t *testing.T, encoders int, talkerTemperature float64, adjust ...func(*orchestrator.Config)) *epdDeployment {
	t.Helper()
	d := &epdDeployment{}
	for range encoders {
		d.encoders = append(d.encoders, startWorkerWith(t, "", "", ecConfig(worker.ECProducer)))
	}
	d.omniDeployment = newOmniDeploymentWithWorkers(t, talkerTemperature, func(role string) func(*worker.Config) {
		if role == "prefill" {
			return ecConfig(worker.ECConsumer)
		}
		return func(*worker.Config) {}
	}, append([]func(*orchestrator.Config){func(c *orchestrator.Config) {
		c.Encoder = pool(t, "encoder", d.encoders...)
	}}, adjust...)...)
	return d
}

// E/P/D gives the colocated pipeline's text and audio for audio, image,
// video and mixed prompts, greedy and seeded, with one encoder instance and
// with two; the prefill and the decode run no encoder, the encoders encode
// each item once, and every encoder output is released.
func TestEPDEqualsColocated(t *testing.T) {
	keep := func(*httptest.Server) {}
	wav, pic, avi := testWAV(t, 1.1, 16000, 500), testPNG(t, 56, 40), testAVI(t)
	cases := []struct {
		name  string
		parts []map[string]any
		extra string
		items int
	}{
		{"audio", []map[string]any{audioPart(wav), textPart("What was said?")}, "", 1},
		{"image", []map[string]any{imagePart(pic), textPart("Describe it")}, "", 1},
		{"video with its audio", []map[string]any{videoPart(avi)}, `,"mm_processor_kwargs":{"use_audio_in_video":true}`, 1},
		{"mixed", []map[string]any{textPart("First"), audioPart(wav), imagePart(pic), videoPart(avi)}, "", 3},
	}
	for _, encoders := range []int{1, 2} {
		for _, greedy := range []bool{true, false} {
			temp, sampling := 0.9, `,"temperature":0.8,"seed":13`
			if greedy {
				temp, sampling = 0, `,"temperature":0`
			}
			colocated := newOmniDeploymentFull(t, false, keep, temp)
			epd := newEPDDeployment(t, encoders, temp)
			items := 0
			for _, c := range cases {
				body := mmChat(t, c.parts, c.extra+sampling)
				want := omniWhole(t, colocated.url, body)
				got := omniWhole(t, epd.url, body)
				if got.text != want.text || !slices.Equal(got.samples, want.samples) {
					t.Errorf("%d encoders, %s%s: E/P/D %q and %d samples; colocated %q and %d samples", encoders, c.name, sampling, got.text, len(got.samples), want.text, len(want.samples))
				}
				items += c.items
			}
			encoded := 0.0
			for _, e := range epd.encoders {
				for _, n := range encoderRuns(t, e.url) {
					encoded += n
				}
			}
			// A video heard with its audio counts an audio run and a video run.
			if want := float64(items + 1); encoded != want {
				t.Errorf("%d encoders: %v encoder runs; want each item once (%v)", encoders, encoded, want)
			}
			for i, w := range epd.thinkers {
				if runs := encoderRuns(t, w.url); !equalCounts(runs, map[string]float64{"audio": 0, "image": 0, "video": 0}) {
					t.Errorf("Thinker worker %d (prefill, decode) ran encoders: %v", i, runs)
				}
			}
			waitNoEncoderOutputs(t, epd.encoders)
		}
	}
}

// A prefill that fails after it fetched the encoder outputs is retried on
// another prefill instance, which fetches them again: each item is encoded
// once, and the answer is the colocated one.
func TestEPDRetriedPrefillEncodesOnce(t *testing.T) {
	keep := func(*httptest.Server) {}
	colocated := newOmniDeploymentFull(t, false, keep, 0)
	var failed atomic.Bool
	var spare *refWorker
	epd := newEPDDeployment(t, 1, 0, func(c *orchestrator.Config) {
		spare = startWorkerWith(t, kvJSON("kv_producer", "prefill-1", "pull"), "prefill-1", ecConfig(worker.ECConsumer))
		// Whichever prefill gets the first leg fetches the encoder outputs
		// and computes; then its answer is lost.
		flaky := pool(t, "prefill")
		for _, in := range append(c.Prefill.Instances, pool(t, "prefill", spare).Instances...) {
			target, _ := url.Parse(in.Client.BaseURL())
			proxy := httputil.NewSingleHostReverseProxy(target)
			proxy.ModifyResponse = func(resp *http.Response) error {
				if resp.Request.Method == http.MethodPost && strings.HasPrefix(resp.Request.URL.Path, "/v1/chat") && failed.CompareAndSwap(false, true) {
					resp.StatusCode, resp.Status = http.StatusServiceUnavailable, "503 Service Unavailable"
				}
				return nil
			}
			front := httptest.NewServer(proxy)
			t.Cleanup(front.Close)
			flaky.Instances = append(flaky.Instances, proxyInstance(t, front.URL, in))
		}
		c.Prefill = flaky
	})
	body := mmChat(t, []map[string]any{audioPart(testWAV(t, 0.9, 16000, 250)), imagePart(testPNG(t, 40, 40))}, `,"temperature":0`)
	want := omniWhole(t, colocated.url, body)
	got := omniWhole(t, epd.url, body)
	if !failed.Load() {
		t.Fatal("the first prefill leg was not failed")
	}
	if got.text != want.text || !slices.Equal(got.samples, want.samples) {
		t.Errorf("E/P/D after a retried prefill: %q; colocated %q", got.text, want.text)
	}
	if runs := encoderRuns(t, epd.encoders[0].url); !equalCounts(runs, map[string]float64{"audio": 1, "image": 1, "video": 0}) {
		t.Errorf("encoder runs %v; want the audio and the image once each", runs)
	}
	for _, w := range append(epd.thinkers, spare) {
		if runs := encoderRuns(t, w.url); !equalCounts(runs, map[string]float64{"audio": 0, "image": 0, "video": 0}) {
			t.Errorf("a Thinker worker ran encoders: %v", runs)
		}
	}
	waitNoEncoderOutputs(t, epd.encoders)
}

// proxyInstance is an instance reached at url that stands for like (its
// KV peer).
func proxyInstance(t *testing.T, url string, like *orchestrator.Instance) *orchestrator.Instance {
	t.Helper()
	c, err := stageclient.New(stageclient.Config{BaseURL: url, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	return &orchestrator.Instance{Client: c, Peer: like.Peer}
}

// waitNoEncoderOutputs waits for the encoders to hold no outputs: every
// request released what it had encoded.
func waitNoEncoderOutputs(t *testing.T, encoders []*refWorker) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, e := range encoders {
		for e.srv.EncoderOutputs() != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := e.srv.EncoderOutputs(); n != 0 {
			t.Errorf("an encoder still holds %d outputs", n)
		}
	}
}
