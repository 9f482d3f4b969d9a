package server

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// testWAV is a 16-bit mono WAV of seconds of a tone at rate Hz.
func testWAV(t *testing.T, seconds float64, rate int, freq float64) []byte {
	t.Helper()
	n := int(seconds * float64(rate))
	var data bytes.Buffer
	for i := range n {
		v := int16(8000 * math.Sin(2*math.Pi*freq*float64(i)/float64(rate)))
		_ = binary.Write(&data, binary.LittleEndian, v)
	}
	var b bytes.Buffer
	b.WriteString("RIFF")
	_ = binary.Write(&b, binary.LittleEndian, uint32(36+data.Len()))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(rate), uint32(rate * 2), uint16(2), uint16(16)} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, binary.LittleEndian, uint32(data.Len()))
	b.Write(data.Bytes())
	return b.Bytes()
}

// testPNG is a w×h picture whose pixels depend on their place.
func testPNG(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{uint8(x * 255 / w), uint8(y * 255 / h), uint8((x + y) % 256), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// testAVI is the Motion-JPEG AVI with 16-bit PCM audio ffmpeg made for the
// vision processor's tests (reference/engine/visionproc/testdata/README.md).
func testAVI(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../reference/engine/visionproc/testdata/mjpeg_pcm_64x48_8f.avi")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func dataURL(mime string, b []byte) string {
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(b)
}

// mmChat is a chat request body with a user turn of the given parts.
func mmChat(t *testing.T, parts []map[string]any, extra string) string {
	t.Helper()
	msgs := []map[string]any{
		{"role": "system", "content": "You are a careful listener."},
		{"role": "user", "content": parts},
	}
	raw, err := json.Marshal(msgs)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"messages":%s,"max_tokens":12%s}`, raw, extra)
}

func textPart(s string) map[string]any { return map[string]any{"type": "text", "text": s} }

func audioPart(b []byte) map[string]any {
	return map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": base64.StdEncoding.EncodeToString(b), "format": "wav"}}
}

func imagePart(b []byte) map[string]any {
	return map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL("image/png", b)}}
}

func videoPart(b []byte) map[string]any {
	return map[string]any{"type": "video_url", "video_url": map[string]any{"url": dataURL("video/x-msvideo", b)}}
}

// Prompts with audio, an image, video, video with its own audio, and media
// mixed with text turns: PD gives the colocated pipeline's text and audio,
// sample for sample, greedy and seeded; the media change the answer (the
// encoders' rows reach the Thinker); the decode worker runs no encoder
// while the prefill and the colocated Thinker encode each item once.
func TestMultimodalPDEqualsColocated(t *testing.T) {
	keep := func(*httptest.Server) {}
	// Greedy all the way (Thinker and Talker), and seeded (the request's
	// seed drives both).
	colocated := map[bool]*omniDeployment{true: newOmniDeploymentFull(t, false, keep, 0), false: newOmniDeploymentFull(t, false, keep, 0.9)}
	pds := map[bool]*omniDeployment{true: newOmniDeploymentFull(t, true, keep, 0), false: newOmniDeploymentFull(t, true, keep, 0.9)}
	wav, pic, avi := testWAV(t, 1.3, 16000, 440), testPNG(t, 64, 48), testAVI(t)
	cases := []struct {
		name  string
		parts []map[string]any
		extra string
	}{
		{"audio", []map[string]any{audioPart(wav), textPart("What did you hear?")}, ""},
		{"audio at 44.1 kHz", []map[string]any{audioPart(testWAV(t, 0.7, 44100, 300))}, ""},
		{"image", []map[string]any{textPart("Describe"), imagePart(pic)}, ""},
		{"video", []map[string]any{videoPart(avi), textPart("What happens?")}, ""},
		{"video with its audio", []map[string]any{videoPart(avi)}, `,"mm_processor_kwargs":{"use_audio_in_video":true}`},
		{"mixed", []map[string]any{imagePart(pic), textPart("and"), audioPart(wav), textPart("compare them")}, ""},
	}
	for _, c := range cases {
		for _, greedy := range []bool{true, false} {
			sampling := `,"temperature":0.8,"seed":5`
			if greedy {
				sampling = `,"temperature":0`
			}
			pd := pds[greedy]
			body := mmChat(t, c.parts, c.extra+sampling)
			want := omniWhole(t, colocated[greedy].url, body)
			got := omniWhole(t, pd.url, body)
			if got.text != want.text || !slices.Equal(got.samples, want.samples) {
				t.Errorf("%s%s: PD %q and %d samples; colocated %q and %d samples", c.name, sampling, got.text, len(got.samples), want.text, len(want.samples))
			}
			streamed := omniStreamOf(t, pd.url, strings.Replace(body, `"messages"`, `"stream":true,"messages"`, 1), false)
			if streamed.text != want.text || !slices.Equal(streamed.samples, want.samples) {
				t.Errorf("%s%s: PD streamed %q and %d samples; colocated %q", c.name, sampling, streamed.text, len(streamed.samples), want.text)
			}
		}
	}
	textOnly := omniWhole(t, colocated[true].url, mmChat(t, []map[string]any{textPart("What did you hear?")}, `,"temperature":0`))
	withAudio := omniWhole(t, colocated[true].url, mmChat(t, cases[0].parts, `,"temperature":0`))
	if textOnly.text == withAudio.text && slices.Equal(textOnly.samples, withAudio.samples) {
		t.Error("an audio part changes neither the text nor the audio")
	}
	runs := func(w *refWorker) map[string]float64 { return encoderRuns(t, w.url) }
	// Per PD deployment, whole and streamed: audio items 1+1+0+0+1 (the
	// video's)+1, images 1+1, videos 2.
	want := map[string]float64{"audio": 4 * 2, "image": 2 * 2, "video": 2 * 2}
	for _, pd := range pds {
		if got := runs(pd.thinkers[0]); !equalCounts(got, want) {
			t.Errorf("prefill encoder runs %v; want %v", got, want)
		}
		if got := runs(pd.thinkers[1]); !equalCounts(got, map[string]float64{"audio": 0, "image": 0, "video": 0}) {
			t.Errorf("decode encoder runs %v; want none", got)
		}
		waitNoStashes(t, pd.thinkers)
	}
}

// encoderRuns reads omnipd_encoder_runs_total by modality from a Thinker
// worker's /metrics.
func encoderRuns(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "omnipd_encoder_runs_total{") {
			continue
		}
		_, rest, _ := strings.Cut(line, `modality="`)
		modality, _, _ := strings.Cut(rest, `"`)
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		out[modality] = v
	}
	return out
}

func equalCounts(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
