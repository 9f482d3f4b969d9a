package bench

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/adler32"
	"hash/crc32"
	"image"
	"image/png"
	"io"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine/audioproc"
)

func TestParseBucketConfig(t *testing.T) {
	bw := func(h, w, f int, p float64) BucketWeight { return BucketWeight{Bucket{[3]int{h, w, f}}, p} }
	for _, c := range []struct {
		in   string
		want []BucketWeight
	}{
		{DefaultMMBucketConfig, []BucketWeight{bw(256, 256, 1, 0.5), bw(720, 1280, 1, 0.5), bw(720, 1280, 16, 0)}},
		{"{(0, 30, 1): 1}", []BucketWeight{bw(0, 30, 1, 1)}},
		// vllm-omni's perf tests write the keys quoted, as JSON must.
		{`{"(256, 256, 1)": 0.34, "(720, 1280, 2)": 0.33, "(0, 60, 3)": 0.33}`, []BucketWeight{bw(256, 256, 1, 0.34), bw(720, 1280, 2, 0.33), bw(0, 60, 3, 0.33)}},
		{" { ( 64,32,1 ) :2.5e-1 , } ", []BucketWeight{bw(64, 32, 1, 0.25)}},
		{"{'(1, 2, 1)': 1}", []BucketWeight{bw(1, 2, 1, 1)}},
	} {
		got, err := ParseBucketConfig(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseBucketConfig(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for in, want := range map[string]string{
		"":                              `at the end (offset 0): want '{'`,
		"{}":                            "no buckets",
		"{(1, 2): 1}":                   "three integers",
		"{(1, 2, 3, 4): 1}":             "three integers",
		"{(1, x, 3): 1}":                "want an integer",
		"{(1, 2, 3) 1}":                 "want ':'",
		"{(1, 2, 3): high}":             "bucket (1, 2, 3): at \"high}\" (offset 12): want a probability",
		"{(1, 2, 3): -0.5}":             "want a finite number >= 0",
		"{(1, 2, 3): 1, (1, 2, 3): 2}":  "bucket (1, 2, 3) given twice",
		"{(1, 2, 3): 1} extra":          "after the closing '}'",
		"{(1, 2, 3): 1; (4, 5, 6): 1}":  "want ',' or '}'",
		`{"(1, 2, 3): 1}`:               "closing",
		"[(1, 2, 3), 1]":                "want '{'",
		"{1: 0.5}":                      "a bucket key is a tuple",
		"{(256, 256, 1): 0.5, (720, 12": "at the end (offset 29): want ','",
	} {
		_, err := ParseBucketConfig(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseBucketConfig(%q): error %v; want one containing %q", in, err, want)
		}
	}
}

func TestParseMMLimits(t *testing.T) {
	got, err := ParseMMLimits(DefaultMMLimitPerPrompt)
	if want := map[string]int{"image": 255, "video": 1, "audio": 1}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("default limits %v, %v", got, err)
	}
	for in, want := range map[string]string{
		`{"image": -1}`:  "want a whole number >= 0",
		`{"image": 1.5}`: "want a whole number >= 0",
		`{"text": 1}`:    `modality "text": want audio, image or video`,
		`image=1`:        "want a JSON object",
	} {
		if _, err := ParseMMLimits(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseMMLimits(%q): error %v; want %q", in, err, want)
		}
	}
}

func mmConfig(t *testing.T, base int, ratio float64, limits, buckets string) MMConfig {
	t.Helper()
	l, err := ParseMMLimits(limits)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseBucketConfig(buckets)
	if err != nil {
		t.Fatal(err)
	}
	return MMConfig{BaseItemsPerRequest: base, NumItemsRangeRatio: ratio, LimitPerPrompt: l, Buckets: b,
		AudioSampleRate: DefaultMMAudioSampleRate, AudioPart: AudioPartInputAudio}
}

// The item count range and the errors follow vLLM's
// get_mm_item_sampling_params.
func TestMMConfigPlan(t *testing.T) {
	for _, c := range []struct {
		base           int
		ratio          float64
		limits, bucket string
		lo, hi         int
	}{
		{1, 0, `{"image": 255}`, "{(8, 8, 1): 1}", 1, 1},
		{1, 0.5, `{"audio": 1}`, "{(0, 2, 1): 1}", 0, 1},                           // ceil(1.5) = 2, clamped to the one audio allowed
		{3, 0.5, `{"image": 1, "audio": 1}`, "{(8, 8, 1): 1, (0, 1, 1): 1}", 1, 2}, // floor(1.5) = 1
		{2, 1, `{"image": 9, "video": 0}`, "{(8, 8, 1): 1, (8, 8, 4): 0}", 0, 4},
	} {
		p, err := mmConfig(t, c.base, c.ratio, c.limits, c.bucket).plan()
		if err != nil || p.minItems != c.lo || p.maxItems != c.hi {
			t.Errorf("base %d ratio %v %s %s: plan %+v, %v; want items %d–%d", c.base, c.ratio, c.limits, c.bucket, p, err, c.lo, c.hi)
		}
	}
	for _, c := range []struct {
		cfg  MMConfig
		want string
	}{
		{mmConfig(t, 1, 1.5, `{"image": 1}`, "{(8, 8, 1): 1}"), "range-ratio 1.5: want a number in [0, 1]"},
		{mmConfig(t, -1, 0, `{"image": 1}`, "{(8, 8, 1): 1}"), "base-items-per-request -1"},
		{mmConfig(t, 1, 0, `{"audio": 1}`, "{(8, 8, 1): 1}"), "modality image of bucket (8, 8, 1) is not in --random-mm-limit-mm-per-prompt"},
		{mmConfig(t, 1, 0, `{"image": 1}`, "{(8, 8, 1): 0}"), "every probability is zero"},
		{mmConfig(t, 3, 0, `{"image": 2}`, "{(8, 8, 1): 1}"), "at least 3 items"},
		{mmConfig(t, 1, 0, `{"video": 1}`, "{(8, 8, 4): 1}"), "video buckets (frames > 1) are not synthesized"},
		{mmConfig(t, 1, 0, `{"image": 1}`, "{(8, 0, 1): 1}"), "height and width must be 1 to"},
		{mmConfig(t, 1, 0, `{"audio": 1}`, "{(0, 0, 1): 1}"), "0 seconds"},
		{mmConfig(t, 1, 0, `{"audio": 1}`, "{(0, 5, 9): 1}"), "9 channels"},
		{func() MMConfig {
			c := mmConfig(t, 1, 0, `{"audio": 1}`, "{(0, 5, 1): 1}")
			c.AudioPart = "wav"
			return c
		}(), `--random-mm-audio-part "wav"`},
		{func() MMConfig {
			c := mmConfig(t, 1, 0, `{"audio": 1}`, "{(0, 5, 1): 1}")
			c.AudioSampleRate = 100
			return c
		}(), "--random-mm-audio-sample-rate 100"},
	} {
		if _, err := c.cfg.plan(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v; want %q", c.cfg, err, c.want)
		}
	}
}

// decodeMedia parses a body as omnipd's API does and returns each media
// part's file.
func decodeMedia(t *testing.T, body []byte) (*openai.ChatCompletionRequest, []openai.MediaItem, [][]byte) {
	t.Helper()
	req, err := openai.DecodeChatRequest(bytes.NewReader(body), 1<<30)
	if err != nil {
		t.Fatalf("the API refuses the body: %v", err)
	}
	items, err := openai.MediaItems(req, 25<<20)
	if err != nil {
		t.Fatalf("the API refuses the media: %v", err)
	}
	var files [][]byte
	for _, it := range items {
		payload := it.Data
		if it.URL != "" {
			d, err := openai.ParseDataURL(it.URL)
			if err != nil || !d.Base64 {
				t.Fatalf("%s: %v", it.URL[:40], err)
			}
			if want := "image/png"; it.Kind == openai.MediaImage && d.MediaType != want {
				t.Errorf("image media type %q, want %q", d.MediaType, want)
			}
			payload = d.Data
		}
		f, err := base64.StdEncoding.Strict().DecodeString(payload)
		if err != nil {
			t.Fatalf("%s part: %v", it.Kind, err)
		}
		files = append(files, f)
	}
	return req, items, files
}

// checkPNG validates every chunk's CRC and the zlib stream's Adler-32 (the
// standard decoder need not read to the checksum) and decodes the image.
func checkPNG(t *testing.T, f []byte, w, h int) image.Image {
	t.Helper()
	if !bytes.HasPrefix(f, pngSignature) {
		t.Fatal("no PNG signature")
	}
	var idat []byte
	for rest := f[8:]; len(rest) > 0; {
		n := int(binary.BigEndian.Uint32(rest))
		typ, data := string(rest[4:8]), rest[8:8+n]
		if crc := binary.BigEndian.Uint32(rest[8+n:]); crc != crc32.ChecksumIEEE(rest[4:8+n]) {
			t.Errorf("%s chunk: bad CRC", typ)
		}
		if typ == "IDAT" {
			idat = append(idat, data...)
		}
		rest = rest[12+n:]
	}
	zr, err := zlib.NewReader(bytes.NewReader(idat))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil || len(raw) != h*(1+3*w) {
		t.Fatalf("image data: %d bytes, %v; want %d", len(raw), err, h*(1+3*w))
	}
	img, err := png.Decode(bytes.NewReader(f))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Errorf("image %v, want %dx%d", b, w, h)
	}
	return img
}

// checkWAV validates the header and decodes the clip as the reference
// Thinker does; it returns the RMS level.
func checkWAV(t *testing.T, f []byte, seconds, channels, rate int) float64 {
	t.Helper()
	le := binary.LittleEndian
	if string(f[:4]) != "RIFF" || string(f[8:16]) != "WAVEfmt " || int(le.Uint32(f[4:])) != len(f)-8 {
		t.Fatalf("RIFF header % x", f[:16])
	}
	tag, ch, sr, bits := le.Uint16(f[20:]), le.Uint16(f[22:]), le.Uint32(f[24:]), le.Uint16(f[34:])
	wantTag := uint16(1)
	if channels > 2 {
		wantTag = 0xFFFE
	}
	if tag != wantTag || int(ch) != channels || int(sr) != rate || bits != 16 || int(le.Uint16(f[32:])) != 2*channels {
		t.Errorf("fmt: tag %#x, %d channels, %d Hz, %d bits", tag, ch, sr, bits)
	}
	a, err := audioproc.Decode(f, "wav", audioproc.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if a.SampleRate != rate || a.Channels != channels || a.Frames() != seconds*rate {
		t.Errorf("decoded %d Hz, %d channels, %d frames", a.SampleRate, a.Channels, a.Frames())
	}
	sum := 0.0
	for _, v := range a.Samples {
		sum += float64(v) * float64(v)
	}
	return math.Sqrt(sum / float64(len(a.Samples)))
}

func TestRandomMMBody(t *testing.T) {
	cfg := mmConfig(t, 2, 0, `{"image": 1, "audio": 1}`, "{(24, 40, 1): 0.5, (0, 2, 1): 0.5}")
	ds, err := NewRandomMM(Random{InputLen: 8, OutputLen: 4, Seed: 7}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tg := Target{BaseURL: "http://x", Model: "m", IgnoreEOS: true}
	p := ds.Prompt(3)
	body, err := tg.Body(p)
	if err != nil {
		t.Fatal(err)
	}
	req, items, files := decodeMedia(t, body)
	// One user message: the text, then one item of each kind (each at its
	// limit of one, so two items are one of each).
	var msg struct {
		Messages []struct {
			Role    string            `json:"role"`
			Content []json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &msg); err != nil || len(msg.Messages) != 1 || msg.Messages[0].Role != "user" || len(msg.Messages[0].Content) != 3 {
		t.Fatalf("messages %+v, %v", msg, err)
	}
	var text struct{ Type, Text string }
	if json.Unmarshal(msg.Messages[0].Content[0], &text); text.Type != "text" || text.Text != p.Text || len(strings.Fields(text.Text)) != 8 {
		t.Errorf("first part %s", msg.Messages[0].Content[0])
	}
	if len(items) != 2 || items[0].Kind == items[1].Kind || req.MaxTokens == nil || *req.MaxTokens != 4 {
		t.Fatalf("items %+v", items)
	}
	for i, it := range items {
		switch it.Kind {
		case openai.MediaAudio:
			if it.Format != "wav" || it.Data == "" {
				t.Errorf("audio part %+v", it)
			}
			if rms := checkWAV(t, files[i], 2, 1, 16000); rms < 0.05 {
				t.Errorf("audio RMS %.3f: near silence", rms)
			}
		case openai.MediaImage:
			img := checkPNG(t, files[i], 40, 24)
			if img.At(3, 0) == img.At(4, 0) && img.At(3, 5) == img.At(4, 5) {
				t.Error("image pixels look constant")
			}
		}
		if p.Media[i].Bytes != len(files[i]) {
			t.Errorf("part %d: Bytes %d, file %d", i, p.Media[i].Bytes, len(files[i]))
		}
	}

	// Deterministic for a seed and index, in any order; another index or
	// seed draws other media.
	again, _ := NewRandomMM(Random{InputLen: 8, OutputLen: 4, Seed: 7}, cfg)
	_ = again.Prompt(9)
	if b2, _ := tg.Body(again.Prompt(3)); !bytes.Equal(b2, body) {
		t.Error("the same seed and index give another body")
	}
	_, _, other := decodeMedia(t, mustBody(t, tg, ds.Prompt(4)))
	reseeded, _ := NewRandomMM(Random{InputLen: 8, OutputLen: 4, Seed: 8}, cfg)
	_, _, otherSeed := decodeMedia(t, mustBody(t, tg, reseeded.Prompt(3)))
	for _, f := range append(other, otherSeed...) {
		for _, g := range files {
			if bytes.Equal(f, g) {
				t.Error("another request or seed sent the same media file")
			}
		}
	}
	// The bulk of an item is shared, not copied, between requests.
	a, b := ds.Prompt(5).Media[0], ds.Prompt(6).Media
	for _, m := range b {
		if m.Kind == a.Kind && &m.pieces[2][0] != &a.pieces[2][0] {
			t.Error("two requests' items of one bucket do not share its bulk")
		}
	}
}

func mustBody(t *testing.T, tg Target, p Prompt) []byte {
	t.Helper()
	b, err := tg.Body(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The draws honour the count range and each modality's limit, and the
// omni audio shapes (audio_url, many channels, 48 kHz) decode.
func TestRandomMMDraws(t *testing.T) {
	cfg := mmConfig(t, 3, 1, `{"image": 2, "audio": 1}`, `{"(6, 4, 1)": 3, "(0, 1, 3)": 1}`)
	cfg.AudioPart, cfg.AudioSampleRate = AudioPartAudioURL, 48000
	ds, err := NewRandomMM(Random{InputLen: 2, OutputLen: 1, Seed: 1}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := ds.Items(); lo != 0 || hi != 3 {
		t.Fatalf("items %d–%d, want 0–3 (floor(3·0) to min(ceil(3·2), 2+1))", lo, hi)
	}
	counts := map[int]int{}
	for i := range 200 {
		p := ds.Prompt(i)
		kinds := map[string]int{}
		for _, m := range p.Media {
			kinds[m.Kind]++
		}
		if kinds[ModalityImage] > 2 || kinds[ModalityAudio] > 1 {
			t.Fatalf("request %d: %v over the limits", i, kinds)
		}
		counts[len(p.Media)]++
		if i < 3 && kinds[ModalityAudio] == 1 {
			_, items, files := decodeMedia(t, mustBody(t, Target{BaseURL: "http://x"}, p))
			for k, it := range items {
				if it.Kind == openai.MediaAudio {
					if !strings.HasPrefix(it.URL, "data:audio/wav;base64,") {
						t.Errorf("audio_url %q", it.URL[:30])
					}
					checkWAV(t, files[k], 1, 3, 48000)
				}
			}
		}
	}
	for n := range 4 {
		if counts[n] == 0 {
			t.Errorf("no request drew %d items in 200: %v", n, counts)
		}
	}
	if s := ds.Settings(); s.ItemsPerRequest != [2]int{0, 3} || s.BucketConfig != "{(6, 4, 1): 3, (0, 1, 3): 1}" {
		t.Errorf("settings %+v", s)
	}
	p := ds.Prompt(0)
	for i := 1; len(p.Media) == 0; i++ {
		p = ds.Prompt(i)
	}
	if _, err := (Target{BaseURL: "http://x", Endpoint: EndpointCompletions}).Body(p); err == nil {
		t.Error("completions took media")
	}
}

func TestAdler32Combine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 5, 65520, 65521, 65522, 200000} {
		a := make([]byte, 7+n%13)
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		whole := adler32.Checksum(append(append([]byte{}, a...), b...))
		if got := adler32Combine(adler32.Checksum(a), adler32.Checksum(b), len(b)); got != whole {
			t.Errorf("len %d: combined %#x, whole %#x", n, got, whole)
		}
	}
}

// Large images cost a request only its first row: the body is one copy of
// the shared bulk.
func BenchmarkRandomMMBody720p(b *testing.B) {
	cfg := MMConfig{BaseItemsPerRequest: 1, LimitPerPrompt: map[string]int{"image": 1},
		Buckets: []BucketWeight{{Bucket{[3]int{720, 1280, 1}}, 1}}, AudioSampleRate: 16000, AudioPart: AudioPartInputAudio}
	ds, err := NewRandomMM(Random{InputLen: 100, OutputLen: 100}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	tg := Target{BaseURL: "http://x"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		body, err := tg.Body(ds.Prompt(i))
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(body)))
	}
}
