package encoder

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// randomFrames draws frames[frame][channel][y][x] of normalised pixels in
// [-1, 1) from seed.
func randomFrames(frames, channels, height, width int, seed uint64) [][][][]float32 {
	r := rand.New(rand.NewPCG(seed, 11))
	out := make([][][][]float32, frames)
	for f := range out {
		out[f] = make([][][]float32, channels)
		for c := range out[f] {
			out[f][c] = make([][]float32, height)
			for y := range out[f][c] {
				out[f][c][y] = make([]float32, width)
				for x := range out[f][c][y] {
					out[f][c][y][x] = 2*r.Float32() - 1
				}
			}
		}
	}
	return out
}

// processorPatches lays frames out as Qwen2VLImageProcessor._preprocess does
// (transformers image_processing_qwen2_vl.py): a single image is repeated to
// temporal_patch_size frames, then
//
//	patches.reshape(grid_t, tp, c, gh/m, m, p, gw/m, m, p)
//	       .permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
//	       .reshape(grid_t·gh·gw, c·tp·p·p)
//
// so patch rows run (t, block row, block column, row in block, column in
// block) and each row's values run (channel, frame, y, x).
func processorPatches(frames [][][][]float32, c VisionConfig) (patches [][]float32, gridT, gridH, gridW int) {
	tp, p, m := c.TemporalPatchSize, c.PatchSize, c.SpatialMergeSize
	if len(frames) == 1 {
		for len(frames) < tp {
			frames = append(frames, frames[0])
		}
	}
	gridT = len(frames) / tp
	gridH, gridW = len(frames[0][0])/p, len(frames[0][0][0])/p
	for t := range gridT {
		for bh := range gridH / m {
			for bw := range gridW / m {
				for ih := range m {
					for iw := range m {
						row := make([]float32, 0, c.PatchDim())
						for ch := range c.InChannels {
							for f := range tp {
								for py := range p {
									for px := range p {
										y, x := (bh*m+ih)*p+py, (bw*m+iw)*p+px
										row = append(row, frames[t*tp+f][ch][y][x])
									}
								}
							}
						}
						patches = append(patches, row)
					}
				}
			}
		}
	}
	return patches, gridT, gridH, gridW
}

func mustVision(t testing.TB, c VisionConfig, seed uint64) *VisionEncoder {
	t.Helper()
	e, err := NewVisionEncoder(c, seed)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func encodeFrames(t testing.TB, e *VisionEncoder, frames [][][][]float32) [][]float32 {
	t.Helper()
	patches, gt, gh, gw := processorPatches(frames, e.Config())
	rows, err := e.Encode(patches, gt, gh, gw)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.Config().OutputLength(gt, gh, gw); len(rows) != want {
		t.Fatalf("%d rows for a %d×%d×%d grid, want %d", len(rows), gt, gh, gw, want)
	}
	return rows
}

func TestPatchRowCol(t *testing.T) {
	// A 4×4 grid, merge 2: upstream's
	// arange(h)[:,None].expand(h,w).reshape(2,2,2,2).permute(0,2,1,3)
	// (and the same for columns) enumerate blocks row-major and, inside a
	// block, its 2×2 patches row-major.
	want := [][2]int{
		{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3},
		{2, 0}, {2, 1}, {3, 0}, {3, 1}, {2, 2}, {2, 3}, {3, 2}, {3, 3},
	}
	for j, w := range want {
		if r, c := patchRowCol(j, 4, 2); r != w[0] || c != w[1] {
			t.Errorf("patchRowCol(%d) = (%d,%d), want %v", j, r, c, w)
		}
	}
	// The decode inverts the processor's layout: a frame whose pixel value
	// is its own y·W+x puts patch j's top-left pixel at (row·16, col·16).
	c := DefaultVisionConfig(64)
	const hPix, wPix = 64, 96 // a 4×6 grid
	frame := make([][][]float32, c.InChannels)
	for ch := range frame {
		frame[ch] = make([][]float32, hPix)
		for y := range frame[ch] {
			frame[ch][y] = make([]float32, wPix)
			for x := range frame[ch][y] {
				frame[ch][y][x] = float32(y*wPix + x)
			}
		}
	}
	patches, _, gh, gw := processorPatches([][][][]float32{frame}, c)
	if gh != 4 || gw != 6 || len(patches) != 24 {
		t.Fatalf("grid %d×%d, %d patches", gh, gw, len(patches))
	}
	for j, p := range patches {
		r, col := patchRowCol(j, gw, 2)
		if want := float32(r*16*wPix + col*16); p[0] != want {
			t.Errorf("patch %d starts at pixel %v, decoded (%d,%d) → %v", j, p[0], r, col, want)
		}
	}
}

func TestInterpolationTaps(t *testing.T) {
	// align_corners=True: src = index·(side-1)/(size-1), taps floor and
	// floor+1 (clamped to side-1), weights 1-frac and frac.
	tests := []struct {
		index, size, side int
		lo, hi            int
		wLo, wHi          float64
	}{
		{0, 15, 8, 0, 1, 1, 0},
		{1, 15, 8, 0, 1, 0.5, 0.5},          // 7/14
		{14, 15, 8, 7, 7, 1, 0},             // the last index lands on the last row
		{0, 1, 8, 0, 1, 1, 0},               // a one-patch axis reads row 0
		{3, 28, 48, 5, 6, 7.0 / 9, 2.0 / 9}, // 3·47/27 = 5.222…
		{5, 8, 8, 5, 6, 1, 0},               // same size: the identity
	}
	for _, tc := range tests {
		lo, hi, wLo, wHi := interpolationTaps(tc.index, tc.size, tc.side)
		if lo != tc.lo || hi != tc.hi || !near(float64(wLo), tc.wLo, 1e-6) || !near(float64(wHi), tc.wHi, 1e-6) {
			t.Errorf("interpolationTaps(%d, %d, %d) = %d, %d, %v, %v; want %d, %d, %v, %v",
				tc.index, tc.size, tc.side, lo, hi, wLo, wHi, tc.lo, tc.hi, tc.wLo, tc.wHi)
		}
	}
}

func TestFramePositions(t *testing.T) {
	c := DefaultVisionConfig(64) // an 8×8 table
	e := mustVision(t, c, 1)
	h := c.Hidden
	// An 8×8 grid reads the table unchanged, in the processor's order.
	pos := e.framePositions(8, 8)
	for j := range 64 {
		r, col := patchRowCol(j, 8, 2)
		for k := range h {
			if pos[j*h+k] != e.posEmbed[(r*8+col)*h+k] {
				t.Fatalf("8×8 grid, patch %d (%d,%d): position differs from table row %d", j, r, col, r*8+col)
			}
		}
	}
	// A 16×2 grid: patch 2 is (row 1, col 0); row 1 of 16 maps to
	// src 7/15 between table rows 0 and 1, col 0 of 2 to table column 0.
	pos = e.framePositions(16, 2)
	f := 7.0 / 15
	for k := range h {
		want := (1-f)*float64(e.posEmbed[0*h+k]) + f*float64(e.posEmbed[8*h+k])
		if !near(float64(pos[2*h+k]), want, 1e-6) {
			t.Fatalf("16×2 grid, patch 2, element %d = %v, want %v", k, pos[2*h+k], want)
		}
	}
}

func TestFrameRotary(t *testing.T) {
	// head_dim 16: the frequencies of an 8-wide RoPE, 1/10000^(2k/8) =
	// 1, 0.1, 0.01, 0.001; angles [row·ω, col·ω] per patch.
	e := mustVision(t, DefaultVisionConfig(64), 1)
	cos, sin := e.frameRotary(4, 4)
	const half = 8
	omega := []float64{1, 0.1, 0.01, 0.001}
	// Patch 6 of a 4×4 grid is (row 1, col 2).
	for k, w := range omega {
		for i, ang := range []float64{1 * w, 2 * w} {
			idx := 6*half + i*4 + k
			if !near(float64(cos[idx]), math.Cos(ang), 1e-7) || !near(float64(sin[idx]), math.Sin(ang), 1e-7) {
				t.Errorf("element %d: cos %v sin %v, want angle %v", i*4+k, cos[idx], sin[idx], ang)
			}
		}
	}
}

// TestVisionMergeGroupsFollowProcessorOrder: with no blocks, a merged row
// depends only on its own merge group, so a pixel change must move exactly
// the row of the 32×32-pixel block that holds it.
func TestVisionMergeGroupsFollowProcessorOrder(t *testing.T) {
	c := DefaultVisionConfig(64)
	c.Layers = 0
	e := mustVision(t, c, 1)
	img := randomFrames(1, 3, 64, 96, 1) // 4×6 patches, 2×3 merge blocks
	base := encodeFrames(t, e, img)
	for _, px := range []struct{ y, x int }{{40, 5}, {3, 70}, {63, 95}, {20, 33}} {
		changed := randomFrames(1, 3, 64, 96, 1)
		changed[0][1][px.y][px.x] += 0.5
		rows := encodeFrames(t, e, changed)
		target := px.y/32*3 + px.x/32
		for r := range rows {
			moved := !bitsEqual(rows[r:r+1], base[r:r+1])
			if moved != (r == target) {
				t.Errorf("pixel (%d,%d): row %d moved=%v, only row %d should move", px.y, px.x, r, moved, target)
			}
		}
	}

	// With blocks, attention spreads the change over the whole frame.
	full := mustVision(t, DefaultVisionConfig(64), 1)
	base = encodeFrames(t, full, img)
	changed := randomFrames(1, 3, 64, 96, 1)
	changed[0][1][40][5] += 0.5
	rows := encodeFrames(t, full, changed)
	for r := range rows {
		if bitsEqual(rows[r:r+1], base[r:r+1]) {
			t.Errorf("with attention, row %d did not see a pixel of row 2's block", r)
		}
	}
}

// TestVisionFrameGroupsAttendSeparately: upstream's cu_seqlens give each
// temporal patch group its own attention segment with the same positions,
// so a video's rows are its frame groups' rows encoded one at a time.
func TestVisionFrameGroupsAttendSeparately(t *testing.T) {
	e := mustVision(t, DefaultVisionConfig(64), 1)
	video := randomFrames(4, 3, 64, 64, 2) // two frame groups of 4×4 patches
	whole := encodeFrames(t, e, video)
	first := encodeFrames(t, e, video[:2])
	second := encodeFrames(t, e, video[2:])
	if len(whole) != 8 || !bitsEqual(whole[:4], first) || !bitsEqual(whole[4:], second) {
		t.Error("a video's rows differ from its frame groups encoded alone")
	}
	if bitsEqual(first, second) {
		t.Error("two different frame groups gave the same rows")
	}
}

func TestVisionEncodeIsDeterministicAndStateless(t *testing.T) {
	c := DefaultVisionConfig(64)
	e := mustVision(t, c, 1)
	img := randomFrames(1, 3, 64, 128, 3)
	first := encodeFrames(t, e, img)
	encodeFrames(t, e, randomFrames(1, 3, 96, 32, 4))
	again := encodeFrames(t, e, img)
	fresh := encodeFrames(t, mustVision(t, c, 1), img)
	if !bitsEqual(first, again) {
		t.Error("encoding another image in between changed the rows")
	}
	if !bitsEqual(first, fresh) {
		t.Error("a second encoder from the same seed gives other rows")
	}
}

func TestVisionDifferentInputsGiveDifferentRows(t *testing.T) {
	e := mustVision(t, DefaultVisionConfig(64), 1)
	a := encodeFrames(t, e, randomFrames(1, 3, 64, 64, 5))
	b := encodeFrames(t, e, randomFrames(1, 3, 64, 64, 6))
	if d, s := meanAbsDiff(a, b), meanAbs(a); d < 0.25*s || s < 0.05 || s > 20 {
		t.Errorf("two images' rows differ by %v on average, their scale is %v", d, s)
	}
	if d, s := meanAbsDiff(a[:len(a)-1], a[1:]), meanAbs(a); d < 0.25*s {
		t.Errorf("neighbouring rows differ by %v, scale %v", d, s)
	}
	other := encodeFrames(t, mustVision(t, DefaultVisionConfig(64), 2), randomFrames(1, 3, 64, 64, 5))
	if d := meanAbsDiff(a, other); d < 0.25*meanAbs(a) {
		t.Errorf("seeds 1 and 2 give rows %v apart", d)
	}
}

// TestVisionGolden pins the default encoder's weights and arithmetic (a
// value recorded from this implementation, see TestAudioGolden).
func TestVisionGolden(t *testing.T) {
	rows := encodeFrames(t, mustVision(t, DefaultVisionConfig(64), 1), randomFrames(1, 3, 64, 96, 7))
	const want = 0x9ce8c5435c58aecf
	if got := fingerprint(rows); got != want {
		t.Errorf("fingerprint %#x, want %#x (update only for a deliberate change)", got, uint64(want))
	}
}

func TestVisionEncodeRejects(t *testing.T) {
	c := DefaultVisionConfig(64)
	c.MaxPatches = 64
	e := mustVision(t, c, 1)
	patches, _, _, _ := processorPatches(randomFrames(1, 3, 64, 64, 1), c) // 4×4
	short := append([][]float32(nil), patches...)
	short[5] = short[5][:100]
	tests := []struct {
		name    string
		patches [][]float32
		t, h, w int
		want    error
	}{
		{"empty axis", patches, 0, 4, 4, ErrInvalidInput},
		{"negative axis", patches, 1, -4, 4, ErrInvalidInput},
		{"odd height", patches[:12], 1, 3, 4, ErrInvalidInput},
		{"odd width", patches[:12], 1, 4, 3, ErrInvalidInput},
		{"count mismatch", patches[:15], 1, 4, 4, ErrInvalidInput},
		{"short patch", short, 1, 4, 4, ErrInvalidInput},
		{"over MaxPatches", patches, 1, 4, 18, ErrInputTooLarge},
		{"overflowing grid", patches, 1 << 40, 1 << 40, 2, ErrInputTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.Encode(tc.patches, tc.t, tc.h, tc.w); !errors.Is(err, tc.want) {
				t.Errorf("Encode: %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := e.Encode(patches, 1, 4, 4); err != nil {
		t.Errorf("valid input: %v", err)
	}
}

func TestVisionConfigValidate(t *testing.T) {
	if err := DefaultVisionConfig(64).Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	tests := []struct {
		name   string
		change func(*VisionConfig)
	}{
		{"no patch", func(c *VisionConfig) { c.PatchSize = 0 }},
		{"heads do not divide hidden", func(c *VisionConfig) { c.Heads = 3 }},
		{"head_dim not a multiple of 4", func(c *VisionConfig) { c.Hidden, c.Heads = 24, 4 }},
		{"position table not square", func(c *VisionConfig) { c.NumPositionEmbeddings = 60 }},
		{"negative depth", func(c *VisionConfig) { c.Layers = -1 }},
		{"no merge", func(c *VisionConfig) { c.SpatialMergeSize = 0 }},
		{"huge patch", func(c *VisionConfig) { c.PatchSize = 300 }},
		{"huge merge", func(c *VisionConfig) { c.SpatialMergeSize = 300 }},
		{"rotary base 1", func(c *VisionConfig) { c.RopeTheta = 1 }},
		{"zero eps", func(c *VisionConfig) { c.LayerNormEps = 0 }},
		{"MaxPatches below one group", func(c *VisionConfig) { c.MaxPatches = 3 }},
		{"no output", func(c *VisionConfig) { c.OutHidden = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultVisionConfig(64)
			tc.change(&c)
			if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Validate: %v, want ErrInvalidConfig", err)
			}
			if _, err := NewVisionEncoder(c, 1); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("NewVisionEncoder: %v, want ErrInvalidConfig", err)
			}
		})
	}
	one := DefaultVisionConfig(64)
	one.NumPositionEmbeddings = 1 // a 1×1 table is square
	if err := one.Validate(); err != nil {
		t.Errorf("1×1 position table: %v", err)
	}
}

func TestVisionOutputLength(t *testing.T) {
	c := DefaultVisionConfig(64)
	// A 448×448 image: 28×28 patches, one frame group, 784/4 tokens; a
	// 4-frame 64×96 clip: 2 groups of 4×6 patches, 48/4.
	for _, tc := range []struct{ t, h, w, want int }{{1, 28, 28, 196}, {2, 4, 6, 12}, {1, 2, 2, 1}} {
		if got := c.OutputLength(tc.t, tc.h, tc.w); got != tc.want {
			t.Errorf("OutputLength(%d,%d,%d) = %d, want %d", tc.t, tc.h, tc.w, got, tc.want)
		}
	}
	if c.PatchDim() != 1536 { // 3 channels · 2 frames · 16 · 16
		t.Errorf("PatchDim = %d, want 1536", c.PatchDim())
	}
}

func BenchmarkVisionEncode448(b *testing.B) {
	c := DefaultVisionConfig(64)
	e := mustVision(b, c, 1)
	patches, gt, gh, gw := processorPatches(randomFrames(1, 3, 448, 448, 1), c) // 28×28 patches
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.Encode(patches, gt, gh, gw); err != nil {
			b.Fatal(err)
		}
	}
}
