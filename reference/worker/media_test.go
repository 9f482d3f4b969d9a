package worker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/mediafetch"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
)

func wavBytes(seconds float64) []byte {
	rate, n := 16000, int(seconds*16000)
	var b bytes.Buffer
	b.WriteString("RIFF")
	_ = binary.Write(&b, binary.LittleEndian, uint32(36+2*n))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(rate), uint32(rate * 2), uint16(2), uint16(16)} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, binary.LittleEndian, uint32(2*n))
	for i := range n {
		_ = binary.Write(&b, binary.LittleEndian, int16(i*37%20000-10000))
	}
	return b.Bytes()
}

func pngBytes(w, h int) []byte {
	var b bytes.Buffer
	_ = png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h)))
	return b.Bytes()
}

// pngDeclaring is a PNG whose header declares w×h pixels but that holds
// no image data: a decompression bomb's first bytes.
func pngDeclaring(w, h int) []byte {
	full := pngBytes(8, 8)
	binary.BigEndian.PutUint32(full[16:], uint32(w))
	binary.BigEndian.PutUint32(full[20:], uint32(h))
	return full[:33]
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// Bad media — corrupt, unsupported, too large, too many, a URL the policy
// does not allow — is a 400 naming the part, and the requests in flight
// meanwhile, media or not, are answered as if nothing happened.
func TestBadMedia(t *testing.T) {
	eng := runTestEngine(t, engine.Config{})
	local := t.TempDir()
	if err := os.WriteFile(filepath.Join(local, "tone.wav"), wavBytes(0.2), 0o600); err != nil {
		t.Fatal(err)
	}
	limits, err := openai.ParseMediaLimits(`{"image": 2, "audio": 2, "video": 1}`)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Engine: eng, Logger: slog.New(slog.DiscardHandler), Media: MediaConfig{
		Limits: limits,
		Policy: mediafetch.Policy{MaxBytes: 256 << 10, AllowedLocalPath: local},
	}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); srv.Close() })
	mp4, err := os.ReadFile("../engine/visionproc/testdata/mjpeg_32x32_2f.mp4")
	if err != nil {
		t.Fatal(err)
	}

	audio := func(data, format string) string {
		return fmt.Sprintf(`{"type":"input_audio","input_audio":{"data":%q,"format":%q}}`, data, format)
	}
	url := func(kind, u string) string { return fmt.Sprintf(`{"type":%q,%q:{"url":%q}}`, kind, kind, u) }
	image := func(b []byte) string { return url("image_url", "data:image/png;base64,"+b64(b)) }
	chat := func(parts ...string) string {
		return `{"messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"look"},` + strings.Join(parts, ",") + `]}],"max_tokens":4,"temperature":0}`
	}
	good := chat(audio(b64(wavBytes(0.5)), "wav"), image(pngBytes(40, 32)))

	cases := []struct {
		name, body, param string
	}{
		{"corrupt WAV", chat(audio(b64([]byte("RIFF\x00\x00\x00\x10WAVEjunkjunkjunk")), "wav")), "messages[1].content[1]"},
		{"bytes that are no audio", chat(audio(b64([]byte("hello, world")), "wav")), "messages[1].content[1]"},
		{"MP3 declared, WAV sent", chat(audio(b64(wavBytes(0.1)), "mp3")), "messages[1].content[1]"},
		{"a format vLLM does not take", chat(audio(b64(wavBytes(0.1)), "flac")), "messages[1].content[1].input_audio.format"},
		{"bad base64", chat(audio("@@@@", "wav")), "messages[1].content[1]"},
		{"corrupt PNG", chat(image([]byte("\x89PNG\r\n\x1a\nbroken"))), "messages[1].content[1]"},
		{"a decompression bomb", chat(image(pngDeclaring(100000, 100000))), "messages[1].content[1]"},
		{"an image too large to send", chat(image(bytes.Repeat([]byte{1}, 300<<10))), "messages[1].content[1].image_url.url"},
		{"an audio data URL in an image part", chat(url("image_url", "data:audio/wav;base64,"+b64(wavBytes(0.1)))), "messages[1].content[1]"},
		{"three images, two allowed", chat(image(pngBytes(8, 8)), image(pngBytes(8, 8)), image(pngBytes(8, 8))), "messages[1].content[3]"},
		{"http with no domain allowed", chat(url("image_url", "http://example.com/cat.png")), "messages[1].content[1]"},
		{"a file outside the allowed path", chat(url("audio_url", "file:///etc/passwd")), "messages[1].content[1]"},
		{"MP4, not AVI", chat(url("video_url", "data:video/mp4;base64,"+b64(mp4))), "messages[1].content[1]"},
		{"an AVI cut short", chat(url("video_url", "data:video/x-msvideo;base64,"+b64([]byte("RIFF\xff\xff\x00\x00AVI LIST")))), "messages[1].content[1]"},
		{"use_audio_in_video not a boolean", strings.Replace(good, `"max_tokens"`, `"mm_processor_kwargs":{"use_audio_in_video":"yes"},"max_tokens"`, 1), "mm_processor_kwargs.use_audio_in_video"},
	}

	// Good requests, text and media, run beside the bad ones; each must
	// come back whole, and the same as when it ran alone.
	alone := map[string]string{}
	goods := []string{good, chat(url("audio_url", "file://"+filepath.Join(local, "tone.wav"))), `{"messages":[{"role":"user","content":"plain text"}],"max_tokens":4,"temperature":0}`}
	for _, g := range goods {
		status, _, body := do(t, "POST", hs.URL+"/v1/chat/completions", g)
		if status != 200 {
			t.Fatalf("a good request alone: %d %s", status, body)
		}
		alone[g] = answerText(t, body)
	}
	var wg sync.WaitGroup
	for range 3 {
		for _, g := range goods {
			wg.Go(func() {
				status, _, body := do(t, "POST", hs.URL+"/v1/chat/completions", g)
				if status != 200 || answerText(t, body) != alone[g] {
					t.Errorf("a good request beside bad ones: %d %s", status, body)
				}
			})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, _, body := do(t, "POST", hs.URL+"/v1/chat/completions", c.body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if status != http.StatusBadRequest || json.Unmarshal([]byte(body), &e) != nil || e.Error.Message == "" {
				t.Fatalf("status %d, want 400 with an OpenAI error: %s", status, body)
			}
			if e.Error.Param == nil || *e.Error.Param != c.param {
				t.Errorf("param %v, want %q: %s", e.Error.Param, c.param, e.Error.Message)
			}
		})
	}
	wg.Wait()
	if u := eng.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks used after the requests", u)
	}
}

func answerText(t *testing.T, body string) string {
	t.Helper()
	var r struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("not a chat answer: %s", body)
	}
	return r.Choices[0].Message.Content
}

// A prompt with audio, an image and video with its own audio: the
// conditioning the prefill and the decode workers stash, merged, is row for
// row and bit for bit the colocated worker's — the multimodal positions'
// rows included — and the decode encoded nothing.
func TestMultimodalConditioningMergeEqualsColocated(t *testing.T) {
	colocated := newTestWorker(t, kvConfig("kv_both", "both-0", HandshakePull))
	prefill := newTestWorker(t, kvConfig("kv_producer", "prefill-0", HandshakePull))
	decode := newTestWorker(t, kvConfig("kv_consumer", "decode-0", HandshakePull))
	avi, err := os.ReadFile("../engine/visionproc/testdata/mjpeg_pcm_64x48_8f.avi")
	if err != nil {
		t.Fatal(err)
	}
	parts := []any{
		map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": b64(wavBytes(0.6)), "format": "wav"}},
		map[string]any{"type": "text", "text": "and"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + b64(pngBytes(40, 32))}},
		map[string]any{"type": "video_url", "video_url": map[string]any{"url": "data:video/x-msvideo;base64," + b64(avi)}},
	}
	for i, temperature := range []float64{0, 0.8} {
		id := fmt.Sprintf("mm-cond-%d", i)
		b := map[string]any{"messages": []any{map[string]any{"role": "user", "content": parts}}, "max_tokens": 6, "temperature": temperature, "seed": 9,
			"mm_processor_kwargs": map[string]any{"use_audio_in_video": true}}
		with := keeping(b, id)
		if _, _, err := post(context.Background(), colocated.url, id, with("/colocated")); err != nil {
			t.Fatal(err)
		}
		if _, err := prefillDecodeWith(context.Background(), prefill, decode, id, with("/prefill"), with("/decode")); err != nil {
			t.Fatal(err)
		}
		got, want := mergedAndColocated(t, id, colocated, prefill, decode)
		if !reflect.DeepEqual(got.Embed, want.Embed) || !reflect.DeepEqual(got.Hidden, want.Hidden) || !reflect.DeepEqual(got.TokenIDs, want.TokenIDs) {
			t.Errorf("T=%v: merged %d rows differ from the colocated %d", temperature, len(got.Hidden), len(want.Hidden))
		}
		if len(want.PromptTokenIDs) < 100 {
			t.Errorf("T=%v: a prompt of %d tokens; the media's placeholders are missing", temperature, len(want.PromptTokenIDs))
		}
	}
	for name, w := range map[string]*testWorker{"prefill": prefill, "decode": decode} {
		runs := metricValue(t, scrape(t, w.url), `omnipd_encoder_runs_total{modality="video",model_name="omnipd-reference"}`)
		if want := map[string]float64{"prefill": 2, "decode": 0}[name]; runs != want {
			t.Errorf("%s worker encoded %v videos; want %v", name, runs, want)
		}
	}
}

// E/P/D at the workers: an encoder worker encodes each media item (one
// request per item, as the orchestrator sends them) and the prefill,
// handed the keys, fetches the rows instead of encoding; the merged
// conditioning is the colocated worker's bit for bit, and only the encoder
// ran an encoder.
func TestEPDConditioningEqualsColocated(t *testing.T) {
	colocated := newTestWorker(t, kvConfig("kv_both", "both-0", HandshakePull))
	encoderWorker := newTestWorkerWith(t, "", func(c *Config) { c.EC = &ECTransferConfig{Connector: ReferenceECConnector, Role: ECProducer} })
	prefill := newTestWorkerWith(t, kvConfig("kv_producer", "prefill-0", HandshakePull), func(c *Config) {
		c.EC = &ECTransferConfig{Connector: ReferenceECConnector, Role: ECConsumer}
	})
	decode := newTestWorker(t, kvConfig("kv_consumer", "decode-0", HandshakePull))
	parts := []any{
		map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": b64(wavBytes(0.5)), "format": "wav"}},
		map[string]any{"type": "text", "text": "and"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + b64(pngBytes(48, 32))}},
	}
	id := "epd-cond"
	var handles []EncoderCacheHandle
	for i, p := range []any{parts[0], parts[2]} {
		item := map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{p}}}, "max_tokens": 1,
			openai.EncoderCacheMember: map[string]any{"lease": id}}
		raw, _ := json.Marshal(item)
		status, _, body := do(t, "POST", encoderWorker.url+"/v1/chat/completions", string(raw))
		var ans struct {
			Kept []EncoderCacheHandle `json:"omnipd_encoder_cache"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &ans) != nil || len(ans.Kept) != 1 {
			t.Fatalf("encoder leg %d: %d %s", i, status, body)
		}
		handles = append(handles, EncoderCacheHandle{URL: encoderWorker.url, Key: ans.Kept[0].Key})
	}
	b := map[string]any{"messages": []any{map[string]any{"role": "user", "content": parts}}, "max_tokens": 6, "temperature": 0.8, "seed": 5}
	with := keeping(b, id)
	if _, _, err := post(context.Background(), colocated.url, id, with("/colocated")); err != nil {
		t.Fatal(err)
	}
	pre := with("/prefill")
	pre[openai.EncoderCacheMember] = handles
	if _, err := prefillDecodeWith(context.Background(), prefill, decode, id, pre, with("/decode")); err != nil {
		t.Fatal(err)
	}
	got, want := mergedAndColocated(t, id, colocated, prefill, decode)
	if !reflect.DeepEqual(got.Embed, want.Embed) || !reflect.DeepEqual(got.Hidden, want.Hidden) || !reflect.DeepEqual(got.TokenIDs, want.TokenIDs) {
		t.Errorf("E/P/D: merged %d rows differ from the colocated %d", len(got.Hidden), len(want.Hidden))
	}
	for name, w := range map[string]*testWorker{"encoder": encoderWorker, "prefill": prefill, "decode": decode} {
		exp := scrape(t, w.url)
		runs := metricValue(t, exp, `omnipd_encoder_runs_total{modality="audio",model_name="omnipd-reference"}`) +
			metricValue(t, exp, `omnipd_encoder_runs_total{modality="image",model_name="omnipd-reference"}`)
		if want := map[string]float64{"encoder": 2}[name]; runs != want {
			t.Errorf("%s worker encoded %v items; want %v", name, runs, want)
		}
	}
	if status, _, _ := do(t, "DELETE", encoderWorker.url+"/v1/omnipd/encoder-leases/"+id, ""); status != 204 || encoderWorker.EncoderOutputs() != 0 {
		t.Errorf("releasing the lease: %d, %d outputs left", status, encoderWorker.EncoderOutputs())
	}
}

// mergedAndColocated fetches request id's stashes — id+"/prefill" and
// id+"/decode", merged, and id+"/colocated" — from the workers.
func mergedAndColocated(t *testing.T, id string, colocated, prefill, decode *testWorker) (merged, want *stageapi.Conditioning) {
	t.Helper()
	fetch := func(w *testWorker, key string) *stageapi.Conditioning {
		st, err := stageconn.Fetch(context.Background(), nil, w.url, id+key, testSecret)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	want = fetch(colocated, "/colocated")
	merged, err := stageapi.MergeConditioning(fetch(prefill, "/prefill"), fetch(decode, "/decode"))
	if err != nil {
		t.Fatal(err)
	}
	return merged, want
}

// keeping returns b, cloned, asking to keep its conditioning under id+key.
func keeping(b map[string]any, id string) func(key string) map[string]any {
	return func(key string) map[string]any {
		c := maps.Clone(b)
		c["omnipd_conditioning"] = map[string]any{"key": id + key, "layer": 2}
		return c
	}
}
