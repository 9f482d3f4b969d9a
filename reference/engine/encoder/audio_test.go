package encoder

import (
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// floorDiv is Python's //, which upstream's length formula relies on for
// negative operands ((0-1)//2 is -1, where Go's (0-1)/2 is 0).
func floorDiv(a, b int) int {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// upstreamAudioOutputLength transcribes _get_feat_extract_output_lengths of
// transformers' modeling_qwen3_omni_moe.py (n_window = 50) and of
// processing_qwen3_omni_moe.py token for token:
//
//	input_lengths_leave = input_lengths % 100
//	feat_lengths = (input_lengths_leave - 1) // 2 + 1
//	output_lengths = ((feat_lengths - 1) // 2 + 1 - 1) // 2 + 1 + (input_lengths // 100) * 13
func upstreamAudioOutputLength(frames int) int {
	leave := frames % 100
	feat := floorDiv(leave-1, 2) + 1
	return floorDiv(floorDiv(feat-1, 2)+1-1, 2) + 1 + frames/100*13
}

func TestAudioOutputLengthMatchesUpstreamFormula(t *testing.T) {
	for frames := 1; frames <= 5000; frames++ {
		if got, want := AudioOutputLength(frames), upstreamAudioOutputLength(frames); got != want {
			t.Fatalf("AudioOutputLength(%d) = %d, upstream formula %d", frames, got, want)
		}
	}
	if got := chunkTokens(audioChunkFrames); got != audioTokensPerChunk {
		t.Fatalf("chunkTokens(%d) = %d, the constant says %d", audioChunkFrames, got, audioTokensPerChunk)
	}
	// By hand: 100 → 50 → 25 → 13 per chunk; a remainder r goes through
	// ceil(r/2) three times.
	for _, tc := range []struct{ frames, want int }{
		{0, 0}, {-5, 0}, {1, 1}, {2, 1}, {8, 1}, {9, 2}, {50, 7}, {99, 13}, {100, 13},
		{101, 14}, {200, 26}, {800, 104}, {3000, 390},
	} {
		if got := AudioOutputLength(tc.frames); got != tc.want {
			t.Errorf("AudioOutputLength(%d) = %d, want %d", tc.frames, got, tc.want)
		}
	}
}

// microAudioConfig is the smallest encoder, cheap enough to encode every
// clip length from 1 to 1000 frames.
func microAudioConfig() AudioConfig {
	return AudioConfig{
		NumMelBins: 8, DModel: 4, Layers: 1, Heads: 1, FFNDim: 4, DownsampleChannels: 1,
		OutputDim: 3, LayerNormEps: 1e-5, MaxFrames: 2000,
	}
}

// randomMel draws a clip of log-mel-like values in [-1, 1) from seed.
func randomMel(bins, frames int, seed uint64) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	mel := make([][]float32, bins)
	for b := range mel {
		mel[b] = make([]float32, frames)
		for f := range mel[b] {
			mel[b][f] = 2*r.Float32() - 1
		}
	}
	return mel
}

// melRange copies frames from..to-1 of every bin.
func melRange(mel [][]float32, from, to int) [][]float32 {
	out := make([][]float32, len(mel))
	for b, r := range mel {
		out[b] = append([]float32(nil), r[from:to]...)
	}
	return out
}

func mustAudio(t testing.TB, c AudioConfig, seed uint64) *AudioEncoder {
	t.Helper()
	e, err := NewAudioEncoder(c, seed)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestAudioEncodeRowCountMatchesFormula(t *testing.T) {
	c := microAudioConfig()
	e := mustAudio(t, c, 1)
	mel := randomMel(c.NumMelBins, 1000, 3)
	for frames := 1; frames <= 1000; frames++ {
		rows, err := e.Encode(melRange(mel, 0, frames))
		if err != nil {
			t.Fatal(err)
		}
		if want := upstreamAudioOutputLength(frames); len(rows) != want {
			t.Fatalf("%d frames: %d rows, upstream formula %d", frames, len(rows), want)
		}
		for _, r := range rows {
			if len(r) != c.OutputDim {
				t.Fatalf("%d frames: row of %d values, want %d", frames, len(r), c.OutputDim)
			}
		}
	}
	// The default geometry, at the chunk and window boundaries.
	d := mustAudio(t, DefaultAudioConfig(64), 1)
	big := randomMel(128, 1601, 4)
	for _, frames := range []int{1, 99, 100, 101, 800, 801, 1601} {
		rows, err := d.Encode(melRange(big, 0, frames))
		if err != nil {
			t.Fatal(err)
		}
		if want := AudioOutputLength(frames); len(rows) != want {
			t.Errorf("default encoder, %d frames: %d rows, want %d", frames, len(rows), want)
		}
	}
}

func bitsEqual(a, b [][]float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return false
			}
		}
	}
	return true
}

func TestAudioEncodeIsDeterministicAndStateless(t *testing.T) {
	c := DefaultAudioConfig(64)
	e := mustAudio(t, c, 1)
	clip := randomMel(128, 350, 5)
	other := randomMel(128, 1234, 6)

	first, err := e.Encode(clip)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Encode(other); err != nil {
		t.Fatal(err)
	}
	afterOther, err := e.Encode(clip)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := mustAudio(t, c, 1).Encode(clip)
	if err != nil {
		t.Fatal(err)
	}
	if !bitsEqual(first, afterOther) {
		t.Error("encoding another clip in between changed the rows")
	}
	if !bitsEqual(first, fresh) {
		t.Error("a second encoder from the same seed gives other rows")
	}
}

// TestAudioRowsDependOnlyOnTheirWindow follows upstream's structure:
// convolutions see one 100-frame chunk, attention one 800-frame window. So
// the rows of a 1000-frame clip are the rows of frames 0..799 encoded alone
// followed by the rows of frames 800..999 encoded alone.
func TestAudioRowsDependOnlyOnTheirWindow(t *testing.T) {
	e := mustAudio(t, DefaultAudioConfig(64), 1)
	clip := randomMel(128, 1000, 8)
	whole, err := e.Encode(clip)
	if err != nil {
		t.Fatal(err)
	}
	head, err := e.Encode(melRange(clip, 0, 800))
	if err != nil {
		t.Fatal(err)
	}
	tail, err := e.Encode(melRange(clip, 800, 1000))
	if err != nil {
		t.Fatal(err)
	}
	if len(head) != 104 || len(whole) != len(head)+len(tail) {
		t.Fatalf("rows: whole %d, head %d, tail %d", len(whole), len(head), len(tail))
	}
	if !bitsEqual(whole[:104], head) {
		t.Error("first window's rows differ from frames 0..799 encoded alone")
	}
	if !bitsEqual(whole[104:], tail) {
		t.Error("second window's rows differ from frames 800..999 encoded alone")
	}

	// Within a window attention mixes chunks: changing one frame of chunk 0
	// changes a row of chunk 1 (no constant or per-chunk-only function).
	changed := melRange(clip, 0, 800)
	changed[5][10] += 1
	moved, err := e.Encode(changed)
	if err != nil {
		t.Fatal(err)
	}
	if bitsEqual(moved[13:26], head[13:26]) {
		t.Error("a frame of chunk 0 did not reach chunk 1's rows through attention")
	}
}

// TestAudioShortChunkIsZeroPadded pins the padding choice: a chunk shorter
// than 100 frames is convolved as if zero-padded to 100 (what upstream does
// whenever its batch holds a full chunk), so without attention a 30-frame
// clip's 4 rows are the first 4 rows of the same frames followed by 70 zero
// frames.
func TestAudioShortChunkIsZeroPadded(t *testing.T) {
	c := DefaultAudioConfig(64)
	c.Layers = 0
	e := mustAudio(t, c, 1)
	short := randomMel(128, 30, 13)
	padded := make([][]float32, len(short))
	for b, r := range short {
		padded[b] = append(append([]float32(nil), r...), make([]float32, 70)...)
	}
	a, err := e.Encode(short)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Encode(padded)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 4 || len(b) != 13 || !bitsEqual(a, b[:4]) {
		t.Errorf("30 frames gave %d rows, padded 100 gave %d; the first 4 equal: %v", len(a), len(b), len(b) >= 4 && bitsEqual(a, b[:4]))
	}
}

func TestEncodeConcurrently(t *testing.T) {
	audio := mustAudio(t, DefaultAudioConfig(64), 1)
	vision := mustVision(t, DefaultVisionConfig(64), 1)
	clips := [][][]float32{randomMel(128, 250, 20), randomMel(128, 120, 21)}
	images := [][][][][]float32{randomFrames(1, 3, 64, 64, 22), randomFrames(2, 3, 32, 96, 23)}
	want := make([][][]float32, 4)
	for i := range 2 {
		want[i], _ = audio.Encode(clips[i])
		want[2+i] = encodeFrames(t, vision, images[i])
	}
	got := make([][][]float32, 4)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { got[i], _ = audio.Encode(clips[i]) })
		wg.Go(func() {
			patches, gt, gh, gw := processorPatches(images[i], vision.Config())
			got[2+i], _ = vision.Encode(patches, gt, gh, gw)
		})
	}
	wg.Wait()
	for i := range want {
		if !bitsEqual(got[i], want[i]) {
			t.Errorf("item %d: concurrent rows differ from serial ones", i)
		}
	}
}

func TestAudioDifferentInputsGiveDifferentRows(t *testing.T) {
	e := mustAudio(t, DefaultAudioConfig(64), 1)
	a, err := e.Encode(randomMel(128, 300, 10))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Encode(randomMel(128, 300, 11))
	if err != nil {
		t.Fatal(err)
	}
	// Different clips: rows differ by a sizeable fraction of their scale.
	if d, s := meanAbsDiff(a, b), meanAbs(a); d < 0.25*s {
		t.Errorf("two clips' rows differ by %v on average, their scale is %v", d, s)
	}
	// Different rows of one clip differ too, and the scale is O(1).
	if d, s := meanAbsDiff(a[:len(a)-1], a[1:]), meanAbs(a); d < 0.25*s || s < 0.05 || s > 20 {
		t.Errorf("neighbouring rows differ by %v, scale %v", d, s)
	}
	// A different seed is a different model.
	other, err := mustAudio(t, DefaultAudioConfig(64), 2).Encode(randomMel(128, 300, 10))
	if err != nil {
		t.Fatal(err)
	}
	if d := meanAbsDiff(a, other); d < 0.25*meanAbs(a) {
		t.Errorf("seeds 1 and 2 give rows %v apart", d)
	}
}

func meanAbs(a [][]float32) float64 {
	var s float64
	var n int
	for _, r := range a {
		for _, v := range r {
			s += math.Abs(float64(v))
			n++
		}
	}
	return s / float64(n)
}

func meanAbsDiff(a, b [][]float32) float64 {
	var s float64
	var n int
	for i := range a {
		for j := range a[i] {
			s += math.Abs(float64(a[i][j] - b[i][j]))
			n++
		}
	}
	return s / float64(n)
}

// fingerprint hashes the bits of every value.
func fingerprint(rows [][]float32) uint64 {
	h := fnv.New64a()
	var buf [4]byte
	for _, r := range rows {
		for _, v := range r {
			u := math.Float32bits(v)
			buf[0], buf[1], buf[2], buf[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			h.Write(buf[:])
		}
	}
	return h.Sum64()
}

// TestAudioGolden pins the default encoder's weights and arithmetic: the
// value was recorded from this implementation, so it catches unintended
// changes and any platform whose arithmetic differs, not upstream mismatch.
func TestAudioGolden(t *testing.T) {
	rows, err := mustAudio(t, DefaultAudioConfig(64), 1).Encode(randomMel(128, 230, 12))
	if err != nil {
		t.Fatal(err)
	}
	const want = 0xec8c4d3cb42488c5
	if got := fingerprint(rows); got != want {
		t.Errorf("fingerprint %#x, want %#x (update only for a deliberate change)", got, uint64(want))
	}
}

func TestAudioEncodeRejects(t *testing.T) {
	c := microAudioConfig()
	c.MaxFrames = 150
	e := mustAudio(t, c, 1)
	ragged := randomMel(8, 20, 1)
	ragged[3] = ragged[3][:19]
	tests := []struct {
		name string
		mel  [][]float32
		want error
	}{
		{"no bins", nil, ErrInvalidInput},
		{"wrong bin count", randomMel(7, 20, 1), ErrInvalidInput},
		{"ragged", ragged, ErrInvalidInput},
		{"no frames", randomMel(8, 0, 1), ErrInvalidInput},
		{"over MaxFrames", randomMel(8, 151, 1), ErrInputTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.Encode(tc.mel); !errors.Is(err, tc.want) {
				t.Errorf("Encode: %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := e.Encode(randomMel(8, 150, 1)); err != nil {
		t.Errorf("Encode at MaxFrames: %v", err)
	}
}

func TestAudioConfigValidate(t *testing.T) {
	if err := DefaultAudioConfig(64).Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	tests := []struct {
		name   string
		change func(*AudioConfig)
	}{
		{"no mel bins", func(c *AudioConfig) { c.NumMelBins = 0 }},
		{"heads do not divide d_model", func(c *AudioConfig) { c.Heads = 3 }},
		{"odd d_model", func(c *AudioConfig) { c.DModel, c.Heads = 33, 1 }},
		{"d_model too small for sinusoids", func(c *AudioConfig) { c.DModel, c.Heads = 2, 1 }},
		{"negative layers", func(c *AudioConfig) { c.Layers = -1 }},
		{"no output", func(c *AudioConfig) { c.OutputDim = 0 }},
		{"huge width", func(c *AudioConfig) { c.FFNDim = maxDim + 1 }},
		{"zero eps", func(c *AudioConfig) { c.LayerNormEps = 0 }},
		{"NaN eps", func(c *AudioConfig) { c.LayerNormEps = math.NaN() }},
		{"no frames allowed", func(c *AudioConfig) { c.MaxFrames = 0 }},
		{"conv_out too wide", func(c *AudioConfig) { c.NumMelBins, c.DownsampleChannels = 60000, 60000 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultAudioConfig(64)
			tc.change(&c)
			if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Validate: %v, want ErrInvalidConfig", err)
			}
			if _, err := NewAudioEncoder(c, 1); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("NewAudioEncoder: %v, want ErrInvalidConfig", err)
			}
		})
	}
	zero := DefaultAudioConfig(64)
	zero.Layers = 0
	if err := zero.Validate(); err != nil {
		t.Errorf("zero layers: %v", err)
	}
}

func TestAudioWeightsHaveUpstreamShapes(t *testing.T) {
	// The shapes the real checkpoint has, at tiny widths: conv_out takes
	// channels · (((128+1)//2+1)//2+1)//2 = channels·16 inputs.
	e := mustAudio(t, DefaultAudioConfig(64), 1)
	want := map[string][]int{
		"conv2d1.weight":                   {8, 1, 3, 3},
		"conv2d3.weight":                   {8, 8, 3, 3},
		"conv_out.weight":                  {32, 128},
		"layers.1.self_attn.q_proj.weight": {32, 32},
		"layers.0.fc1.weight":              {128, 32},
		"proj2.weight":                     {64, 32},
		"proj2.bias":                       {64},
	}
	seen := 0
	for _, p := range e.params() {
		if w, ok := want[p.name]; ok {
			seen++
			if len(w) != len(p.shape) || len(*p.w) != p.size() {
				t.Errorf("%s: shape %v, storage %d", p.name, p.shape, len(*p.w))
				continue
			}
			for i := range w {
				if w[i] != p.shape[i] {
					t.Errorf("%s: shape %v, want %v", p.name, p.shape, w)
					break
				}
			}
		}
	}
	if seen != len(want) {
		t.Errorf("found %d of %d named tensors", seen, len(want))
	}
}

func BenchmarkAudioEncode30s(b *testing.B) {
	e := mustAudio(b, DefaultAudioConfig(64), 1)
	mel := randomMel(128, 3000, 1) // 30 s at the 10 ms hop
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Encode(mel); err != nil {
			b.Fatal(err)
		}
	}
}
