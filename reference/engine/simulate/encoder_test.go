package simulate

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseEncoder(t *testing.T) {
	src := `encoder:
  audio: {per_item: 14ms, per_token: 7us}
  image:
    base: 1ms
    per_item: 12ms
    per_token: 15.5us
    attention_1k: 8.7ms
`
	p, err := Parse("enc.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := Encoder{
		Audio: EncoderCost{PerItem: 14 * ms, PerToken: 7 * us},
		Image: EncoderCost{Base: ms, PerItem: 12 * ms, PerToken: 15500 * time.Nanosecond, Attention1K: 8700 * us},
	}
	if p.Encoder != want {
		t.Errorf("parsed %+v\nwant %+v", p.Encoder, want)
	}
	// An encoder-only profile makes the engine wait; one without (every
	// profile written before the section) costs nothing there.
	if p.IsZero() {
		t.Error("a profile with encoder costs is zero")
	}
	old, _ := Parse("old.yaml", []byte("decode: {base: 1ms}\n"))
	if !old.Encoder.IsZero() {
		t.Errorf("a profile without encoder: %+v", old.Encoder)
	}
	for _, c := range []struct{ src, want string }{
		{"encoder:\n  speech: {per_item: 1ms}\n", "bad.yaml:2:3: encoder.speech: unknown field; want audio, image or video"},
		{"encoder:\n  audio: {per_second: 1ms}\n", "bad.yaml:2:11: encoder.audio.per_second: unknown field; want base, per_item, per_token or attention_1k"},
		{"encoder:\n  image:\n    per_token: 15\n", `bad.yaml:3:16: encoder.image.per_token: "15" has no unit`},
		{"encoder:\n  video: {attention_1k: -1ms}\n", "bad.yaml:2:25: encoder.video.attention_1k: -1ms is negative"},
		{"encoder: 14ms\n", "bad.yaml:1:10: encoder: want a mapping of audio, image or video"},
		{"encoder:\n  audio: {per_item: 1ms}\n  audio: {per_item: 2ms}\n", "bad.yaml:3:3: encoder.audio: given twice (first at line 2)"},
	} {
		_, err := Parse("bad.yaml", []byte(c.src))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: error %v, want prefix %q", c.src, err, c.want)
		}
	}
}

func TestEncoderArithmetic(t *testing.T) {
	e := Encoder{
		Audio: EncoderCost{PerItem: 10 * ms, PerToken: 10 * us},
		Image: EncoderCost{Base: 2 * ms, PerItem: 5 * ms, PerToken: 20 * us, Attention1K: 8 * ms},
		Video: EncoderCost{PerItem: 5 * ms, PerToken: 20 * us, Attention1K: 8 * ms},
	}
	for _, c := range []struct {
		name  string
		items []EncoderItem
		want  time.Duration
	}{
		{"one 30 s clip: 390 tokens", []EncoderItem{{"audio", 390, 1}}, 10*ms + 3900*us},
		{"an image of 500 tokens: a quarter of the 1k attention", []EncoderItem{{"image", 500, 1}}, 2*ms + 5*ms + 10*ms + 2*ms},
		{"segments 0 is one", []EncoderItem{{"image", 500, 0}}, 19 * ms},
		{"two images share one base", []EncoderItem{{"image", 500, 1}, {"image", 500, 1}}, 2*ms + 2*17*ms},
		// 2000 tokens in 4 temporal groups of 500: 4 × 8ms × 0.25.
		{"a video attends per group", []EncoderItem{{"video", 2000, 4}}, 5*ms + 40*ms + 8*ms},
		{"mixed modalities add", []EncoderItem{{"audio", 13, 1}, {"image", 500, 1}}, 10130*us + 19*ms},
		{"rounded up to the nanosecond", []EncoderItem{{"image", 1, 1}}, 2*ms + 5*ms + 20*us + 8},
		{"no tokens, unknown kinds and no items cost nothing", []EncoderItem{{"audio", 0, 1}, {"text", 100, 1}}, 0},
		{"empty", nil, 0},
	} {
		if got := e.BatchTime(c.items); got != c.want {
			t.Errorf("%s: BatchTime = %v, want %v", c.name, got, c.want)
		}
	}
	if got, want := e.Time("image", 500), 19*ms; got != want {
		t.Errorf("Time(image, 500) = %v, want %v (base and item)", got, want)
	}
	if got := e.Time("smell", 5); got != 0 {
		t.Errorf("an unknown kind costs %v", got)
	}
	if _, ok := e.For("video"); !ok {
		t.Error("For(video)")
	}
	huge := EncoderCost{PerToken: time.Hour, Attention1K: time.Hour}
	if got := huge.ItemTime(math.MaxInt, 1); got != math.MaxInt64 {
		t.Errorf("overflow: %v, want saturation", got)
	}
	if got := (EncoderCost{Attention1K: time.Hour}).ItemTime(1<<40, 1); got != math.MaxInt64 {
		t.Errorf("attention overflow: %v, want saturation", got)
	}
}

// The calibrated encoders reproduce the published audio measurements and
// the vision derivation within the residuals docs/simulate.md states.
func TestCalibratedEncoder(t *testing.T) {
	h, err := Load("h100-qwen3-omni-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	e := h.Encoder
	within := func(what string, got time.Duration, wantMS, tol float64) {
		t.Helper()
		g := float64(got) / float64(ms)
		if rel := g/wantMS - 1; math.Abs(rel) > tol {
			t.Errorf("%s: %.2f ms, want %.2f ms: %+.1f%%, stated ±%.0f%%", what, g, wantMS, 100*rel, 100*tol)
		}
	}
	// vLLM PR 30735's single clips, scaled by PR 32167's speed-up.
	scale := 341.7019844055176 / 381.1814785003662
	for _, c := range []struct {
		seconds   int
		published float64
		tol       float64
	}{{4, 15.56, 0.03}, {15, 17.96, 0.06}, {30, 18.23, 0.03}} {
		within("audio clip", e.Time("audio", 13*c.seconds), c.published*scale, c.tol)
	}
	// PR 32167: 21 clips of 30 s in one encoder call.
	batch := make([]EncoderItem, 21)
	for i := range batch {
		batch[i] = EncoderItem{"audio", 390, 1}
	}
	within("21 audio clips", e.BatchTime(batch), 341.70, 0.03)
	// The vision derivation: 64 and 880 tokens (256x256 and 720x1280).
	flops := 229e12
	for _, c := range []struct {
		tokens int
	}{{64}, {880}} {
		n := float64(c.tokens)
		want := 11.7 + 1e3*(3.548e9*n+1.9907e6*n*n)/flops
		within("image", e.Time("image", c.tokens), want, 0.02)
		if e.Time("video", c.tokens) != e.Time("image", c.tokens) {
			t.Error("a one-group video costs other than the image")
		}
	}
	within("256x256 image", e.Time("image", 64), 12.7, 0.01)
	within("720x1280 image", e.Time("image", 880), 32.1, 0.01)
}
