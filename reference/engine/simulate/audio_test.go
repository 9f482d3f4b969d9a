package simulate

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseAudio(t *testing.T) {
	src := `decode: {base: 1ms}
talker:
  first_frame: {base: 15ms, per_request: 40ms}
  frame: {base: 6.7ms, per_request: 370us}
  code_predictor: {base: 13.1ms, per_request: 780us}
code2wav:
  chunk: {base: 2ms, per_request: 100us}
  frame: {base: 2.6ms, per_request: 450us}
`
	p, err := Parse("audio.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	wantT := Talker{
		FirstFrame:    Linear{15 * ms, 40 * ms},
		Frame:         Linear{6700 * us, 370 * us},
		CodePredictor: Linear{13100 * us, 780 * us},
	}
	wantC := Code2Wav{Chunk: Linear{2 * ms, 100 * us}, Frame: Linear{2600 * us, 450 * us}}
	if p.Talker != wantT || p.Code2Wav != wantC {
		t.Errorf("parsed talker %+v, code2wav %+v\nwant %+v, %+v", p.Talker, p.Code2Wav, wantT, wantC)
	}
	// A profile without the audio sections (every profile written before
	// them) loads as it did: its audio stages cost nothing.
	old, err := Parse("old.yaml", []byte("prefill: {base: 5ms, per_token: 27us}\ndecode: {base: 5ms, per_sequence: 400us}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !old.Talker.IsZero() || !old.Code2Wav.IsZero() || old.Prefill.Base != 5*ms {
		t.Errorf("a profile without audio sections: %+v", old)
	}
	for _, c := range []struct{ src, want string }{
		{"talker: {frames: 1ms}\n", "bad.yaml:1:10: talker.frames: unknown field; want first_frame, frame or code_predictor"},
		{"talker:\n  frame: {base: 5}\n", "bad.yaml:2:17: talker.frame.base: \"5\" has no unit"},
		{"code2wav: {frame: {per_sequence: 1ms}}\n", "bad.yaml:1:20: code2wav.frame.per_sequence: unknown field; want base or per_request"},
	} {
		_, err := Parse("bad.yaml", []byte(c.src))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: error %v, want prefix %q", c.src, err, c.want)
		}
	}
}

func TestAudioCosts(t *testing.T) {
	tk := Talker{FirstFrame: Linear{10 * ms, 20 * ms}, Frame: Linear{6 * ms, 1 * ms}, CodePredictor: Linear{12 * ms, 2 * ms}}
	// The first frame is the backbone's first step and its residual
	// codebooks; a later frame is one backbone step and its codebooks.
	if got, want := tk.FirstFrameTime(3), 70*ms+18*ms; got != want {
		t.Errorf("FirstFrameTime(3) = %v, want %v", got, want)
	}
	if got, want := tk.FrameTime(3), 9*ms+18*ms; got != want {
		t.Errorf("FrameTime(3) = %v, want %v", got, want)
	}
	cw := Code2Wav{Chunk: Linear{2 * ms, 1 * ms}, Frame: Linear{3 * ms, 500 * us}}
	if got, want := cw.ChunkTime(25, 2), 4*ms+25*4*ms; got != want {
		t.Errorf("ChunkTime(25, 2) = %v, want %v", got, want)
	}
	if got := cw.ChunkTime(0, 2); got != 0 {
		t.Errorf("an empty chunk costs %v", got)
	}
	if got := (Code2Wav{Frame: Linear{time.Hour, time.Hour}}).ChunkTime(math.MaxInt, 1); got != math.MaxInt64 {
		t.Errorf("overflowing chunk = %v, want saturation", got)
	}
	// In-flight counts below one are one: the request being timed.
	if tk.FrameTime(0) != tk.FrameTime(1) || cw.ChunkTime(4, -1) != cw.ChunkTime(4, 1) {
		t.Error("a count below one is not timed as one request")
	}
}

// The calibrated audio stages reproduce the figures of the Qwen3-Omni
// technical report (arXiv 2509.17765, Table 2) within the residuals
// docs/simulate.md states for them.
func TestCalibratedAudio(t *testing.T) {
	h, err := Load("h100-qwen3-omni-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	within := func(what string, n int, got time.Duration, wantMS, tol float64) {
		t.Helper()
		g := float64(got) / float64(ms)
		if rel := g/wantMS - 1; math.Abs(rel) > tol {
			t.Errorf("%s at concurrency %d: %.2f ms, published %.2f ms: %+.0f%%, stated residual ±%.0f%%", what, n, g, wantMS, 100*rel, 100*tol)
		}
	}
	for _, c := range []struct {
		n                                             int
		talkerFirst, predictor, codec, talkerTokPerS  float64
		firstPacket, tailPrep, thinkerTTFT, thinkerTS float64
		rtf                                           float64
		firstTol, codecTol, packetTol                 float64
	}{
		{1, 57, 14, 3, 140, 234, 72, 88, 75, 0.47, 0.05, 0.05, 0.02},
		{4, 145, 16, 5, 125, 728, 94, 468, 63, 0.56, 0.22, 0.13, 0.05},
		{6, 376, 18, 5, 110, 1172, 100, 673, 53, 0.65, 0.33, 0.07, 0.11},
	} {
		tk, cw := h.Talker, h.Code2Wav
		within("Talker time to first token", c.n, tk.FirstFrame.At(c.n), c.talkerFirst, c.firstTol)
		within("code predictor per frame", c.n, tk.CodePredictor.At(c.n), c.predictor, 0.02)
		within("codec decoder per code", c.n, cw.ChunkTime(1, c.n), c.codec, c.codecTol)
		within("Talker time per token", c.n, tk.Frame.At(c.n), 1000/c.talkerTokPerS, 0.03)
		// First packet: the report's sum of tail-packet preprocessing,
		// the Thinker's first token, the Talker's first token, its
		// residual codebooks and one code decoded.
		packet := time.Duration((c.tailPrep+c.thinkerTTFT)*float64(ms)) + tk.FirstFrameTime(c.n) + cw.ChunkTime(1, c.n)
		within("first packet", c.n, packet, c.firstPacket, c.packetTol)
		// RTF: per 80 ms frame of speech, one Thinker token, one Talker
		// step with its codebooks and one code decoded.
		perFrame := time.Duration(1000/c.thinkerTS*float64(ms)) + tk.FrameTime(c.n) + cw.ChunkTime(1, c.n)
		within("RTF × 80 ms", c.n, perFrame, c.rtf*80, 0.03)
	}
}
