package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The binary, as a user runs it: two serves on the embedded default, one
// with prefill and decode, one colocated, both allowed to fetch media from
// a local web server (--allowed-media-domains, passed on to the workers
// they start). A spoken request with an input_audio part and an image_url
// on that server gets the same text and audio from both, and the decode
// worker's /metrics count no encoder run while the prefill's count them.
func TestMultimodalThroughTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	img := image.NewRGBA(image.Rect(0, 0, 40, 32))
	for y := range 32 {
		for x := range 40 {
			img.Set(x, y, color.RGBA{uint8(6 * x), uint8(8 * y), 90, 255})
		}
	}
	var pic bytes.Buffer
	if err := png.Encode(&pic, img); err != nil {
		t.Fatal(err)
	}
	media := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write(pic.Bytes())
	}))
	defer media.Close()
	host := strings.TrimPrefix(media.URL, "http://")
	host = host[:strings.LastIndexByte(host, ':')]

	bin := buildBinary(t)
	flags := []string{"--port", "0", "--allowed-media-domains", host, "--media-allow-private-networks"}
	pd := startServe(t, bin, flags...)
	colocated := startServe(t, bin, append(flags, "--pd=false")...)
	// And E/P/D: the default topology with two encoder instances.
	fixture, err := filepath.Abs("../../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml")
	if err != nil {
		t.Fatal(err)
	}
	epdConfig := filepath.Join(t.TempDir(), "epd.yaml")
	if err := os.WriteFile(epdConfig, []byte("base_config: "+fixture+"\npd:\n  encoder:\n    num_replicas: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	epd := startServe(t, bin, append(flags, "--config", epdConfig)...)
	pdURL, coURL, epdURL := pd.url(t), colocated.url(t), epd.url(t)

	var wav bytes.Buffer
	wav.WriteString("RIFF")
	_ = binary.Write(&wav, binary.LittleEndian, uint32(36+2*12000))
	wav.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(16000), uint32(32000), uint16(2), uint16(16)} {
		_ = binary.Write(&wav, binary.LittleEndian, v)
	}
	wav.WriteString("data")
	_ = binary.Write(&wav, binary.LittleEndian, uint32(2*12000))
	for i := range 12000 {
		_ = binary.Write(&wav, binary.LittleEndian, int16((i*91)%16000-8000))
	}
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}},{"type":"image_url","image_url":{"url":%q}},{"type":"text","text":"What is this?"}]}],"max_tokens":10,"temperature":0.7,"seed":4}`,
		base64.StdEncoding.EncodeToString(wav.Bytes()), media.URL+"/cat.png")
	ask := func(url string) (string, string) {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var c struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
					Audio   *struct {
						Data string `json:"data"`
					} `json:"audio"`
				} `json:"message"`
			} `json:"choices"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(raw, &c) != nil || len(c.Choices) != 2 || c.Choices[1].Message.Audio == nil {
			t.Fatalf("chat: %d %s", resp.StatusCode, raw)
		}
		return c.Choices[0].Message.Content, c.Choices[1].Message.Audio.Data
	}
	pdText, pdAudio := ask(pdURL)
	coText, coAudio := ask(coURL)
	if pdText != coText || pdAudio != coAudio {
		t.Errorf("PD %q (%d bytes of audio); colocated %q (%d bytes)", pdText, len(pdAudio), coText, len(coAudio))
	}
	if epdText, epdAudio := ask(epdURL); epdText != coText || epdAudio != coAudio {
		t.Errorf("E/P/D %q (%d bytes of audio); colocated %q (%d bytes)", epdText, len(epdAudio), coText, len(coAudio))
	}
	encoders := regexp.MustCompile(`stage \d \(thinker-encoder\): \S+ ready at (http://\S+)`).FindAllStringSubmatch(epd.out.String(), -1)
	epdThinkers := regexp.MustCompile(`stage \d \(thinker-(prefill|decode)\): \S+ ready at (http://\S+)`).FindAllStringSubmatch(epd.out.String(), -1)
	if len(encoders) != 2 || len(epdThinkers) != 2 {
		t.Fatalf("the E/P/D serve's workers:\n%s", epd.out.String())
	}
	total := map[string]int{}
	for _, e := range encoders {
		for k, v := range encoderRuns(t, e[1]) {
			total[k] += v
		}
	}
	if fmt.Sprint(total) != fmt.Sprint(map[string]int{"audio": 1, "image": 1, "video": 0}) {
		t.Errorf("the encoders encoded %v; want the audio and the image once", total)
	}
	for _, w := range epdThinkers {
		if runs := encoderRuns(t, w[2]); fmt.Sprint(runs) != fmt.Sprint(map[string]int{"audio": 0, "image": 0, "video": 0}) {
			t.Errorf("the E/P/D %s worker encoded %v", w[1], runs)
		}
	}

	workers := regexp.MustCompile(`stage \d \(thinker-(prefill|decode)\): \S+ ready at (http://\S+)`).FindAllStringSubmatch(pd.out.String(), -1)
	if len(workers) != 2 {
		t.Fatalf("the prefill and decode workers' lines:\n%s", pd.out.String())
	}
	for _, w := range workers {
		want := map[string]int{"audio": 1, "image": 1, "video": 0}
		if w[1] == "decode" {
			want = map[string]int{"audio": 0, "image": 0, "video": 0}
		}
		if got := encoderRuns(t, w[2]); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s worker's encoder runs %v; want %v", w[1], got, want)
		}
	}
}

// encoderRuns reads omnipd_encoder_runs_total by modality from a worker.
func encoderRuns(t *testing.T, url string) map[string]int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := map[string]int{}
	for _, r := range regexp.MustCompile(`omnipd_encoder_runs_total\{modality="(\w+)",model_name="[^"]*"\} (\d+)`).FindAllStringSubmatch(string(raw), -1) {
		n, _ := strconv.Atoi(r[2])
		got[r[1]] = n
	}
	return got
}
