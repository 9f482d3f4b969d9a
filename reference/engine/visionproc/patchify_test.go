package visionproc

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"math"
	"testing"
)

// identityConfig makes normalization the identity (value = 8-bit sample) so
// patch contents can be read back as coordinates.
func identityConfig(patch, temporal, merge int) Config {
	c := DefaultImageConfig()
	c.PatchSize, c.TemporalPatchSize, c.MergeSize = patch, temporal, merge
	c.RescaleFactor = 1
	c.Mean = [Channels]float32{0, 0, 0}
	c.Std = [Channels]float32{1, 1, 1}
	c.MinPixels, c.MaxPixels = 1, 1<<30
	return c
}

// coordFrames builds frames whose samples encode where they are: R = y·16+x,
// G = 100 + frame, B = 200 + channel marker, so a patch value names its
// source pixel, frame and channel.
func coordFrames(n, w, h int) []Frame {
	frames := make([]Frame, n)
	for i := range frames {
		f := newFrame(w, h)
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				f.plane(0)[y*w+x] = uint8(y*16 + x)
				f.plane(1)[y*w+x] = uint8(100 + i)
				f.plane(2)[y*w+x] = 200
			}
		}
		frames[i] = f
	}
	return frames
}

// referenceFlatten is an independent transcription of the processor's
//
//	patches.reshape(gt, tps, C, gh/m, m, p, gw/m, m, p)
//	       .transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
//	       .reshape(gt·gh·gw, C·tps·p·p)
//
// done the numpy way: walk the output in row-major order over the permuted
// axes and read the input at the un-permuted index.
func referenceFlatten(frames []Frame, tps, p, m int) []float32 {
	w, h := frames[0].Width, frames[0].Height
	for len(frames)%tps != 0 {
		frames = append(frames, frames[len(frames)-1])
	}
	gt, gh, gw := len(frames)/tps, h/p, w/p
	// Input axes (gt, tps, C, gh/m, m, p, gw/m, m, p).
	shape := []int{gt, tps, Channels, gh / m, m, p, gw / m, m, p}
	perm := []int{0, 3, 6, 4, 7, 2, 1, 5, 8}
	outShape := make([]int, len(perm))
	for i, a := range perm {
		outShape[i] = shape[a]
	}
	total := 1
	for _, s := range shape {
		total *= s
	}
	out := make([]float32, 0, total)
	idx := make([]int, len(outShape))
	for n := 0; n < total; n++ {
		// Un-permute into input coordinates.
		in := make([]int, len(shape))
		for i, a := range perm {
			in[a] = idx[i]
		}
		t, tt, c := in[0], in[1], in[2]
		y := (in[3]*m+in[4])*p + in[5]
		x := (in[6]*m+in[7])*p + in[8]
		out = append(out, float32(frames[t*tps+tt].plane(c)[y*w+x]))
		for i := len(idx) - 1; i >= 0; i-- {
			idx[i]++
			if idx[i] < outShape[i] {
				break
			}
			idx[i] = 0
		}
	}
	return out
}

func TestPatchifyOrderMatchesProcessorReshape(t *testing.T) {
	tests := []struct {
		name                 string
		frames, w, h         int
		patch, temporal, mrg int
	}{
		{"image repeated to 2 frames", 1, 8, 4, 2, 2, 2},
		{"two frames", 2, 8, 8, 2, 2, 2},
		{"odd frame count padded", 3, 4, 8, 2, 2, 2},
		{"merge 1", 2, 6, 4, 2, 2, 1},
		{"temporal 1", 2, 4, 4, 2, 1, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := identityConfig(tc.patch, tc.temporal, tc.mrg)
			frames := coordFrames(tc.frames, tc.w, tc.h)
			got, err := Patchify(frames, cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := referenceFlatten(frames, tc.temporal, tc.patch, tc.mrg)
			if len(got.Values) != len(want) {
				t.Fatalf("%d values, want %d", len(got.Values), len(want))
			}
			for i := range want {
				if got.Values[i] != want[i] {
					t.Fatalf("value %d = %v, want %v (row %d)", i, got.Values[i], want[i], i/got.Dim)
				}
			}
			wantGrid := Grid{T: (tc.frames + tc.temporal - 1) / tc.temporal, H: tc.h / tc.patch, W: tc.w / tc.patch}
			if got.Grid != wantGrid || got.Dim != Channels*tc.temporal*tc.patch*tc.patch {
				t.Fatalf("grid %+v dim %d, want %+v dim %d", got.Grid, got.Dim, wantGrid, Channels*tc.temporal*tc.patch*tc.patch)
			}
		})
	}
}

// TestPatchifyMergeGroups spells out the layout the vision encoder relies
// on, on an 8×4 image with patch 2, merge 2, temporal 2: grid 1×2×4, two
// merge groups across, one down.
func TestPatchifyMergeGroups(t *testing.T) {
	cfg := identityConfig(2, 2, 2)
	got, err := Patchify(coordFrames(1, 8, 4), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got.NumPatches() != 8 || got.Tokens() != 2 || got.Dim != 24 {
		t.Fatalf("patches %d tokens %d dim %d, want 8, 2, 24", got.NumPatches(), got.Tokens(), got.Dim)
	}
	// Rows 0..3 are the first merge group: the top-left 4×4 pixels, its
	// 2×2 patches in row-major order; rows 4..7 the group to its right.
	wantOrigins := [][2]int{{0, 0}, {0, 2}, {2, 0}, {2, 2}, {0, 4}, {0, 6}, {2, 4}, {2, 6}} // (y, x)
	for row, o := range wantOrigins {
		p := got.Patch(row)
		// Layout [channel][frame][py][px]; R encodes y·16+x.
		wantR := []float32{
			float32(o[0]*16 + o[1]), float32(o[0]*16 + o[1] + 1),
			float32((o[0]+1)*16 + o[1]), float32((o[0]+1)*16 + o[1] + 1),
		}
		for f := 0; f < 2; f++ { // the image is repeated: both frames equal
			for i, v := range wantR {
				if p[f*4+i] != v {
					t.Fatalf("row %d frame %d R[%d] = %v, want %v", row, f, i, p[f*4+i], v)
				}
			}
		}
		for i := 8; i < 16; i++ {
			if p[i] != 100 {
				t.Fatalf("row %d G[%d] = %v, want 100 (frame 0 repeated)", row, i-8, p[i])
			}
		}
		for i := 16; i < 24; i++ {
			if p[i] != 200 {
				t.Fatalf("row %d B[%d] = %v, want 200", row, i-16, p[i])
			}
		}
	}
}

// Normalized values worked by hand for the default mean = std = 0.5 and
// rescale 1/255 (float64 product cast to float32, then float32 arithmetic):
//
//	0   → (0 − 0.5)/0.5 = −1
//	255 → float32(255·(1/255)) = 1 → (1 − 0.5)/0.5 = 1
//	51  → float32(0.2) = 13421773·2⁻²⁶; − 0.5 = −20132659·2⁻²⁶ needs 25 bits,
//	      ties to even → −20132660·2⁻²⁶; /0.5 → float32(−0.6)
//	128 → float32(128/255) = 8421505·2⁻²⁴; − 0.5 = 32897·2⁻²⁴; /0.5 = 32897·2⁻²³
func TestNormalizationKnownPixels(t *testing.T) {
	table := normalizeTable(DefaultImageConfig())
	tests := []struct {
		v    uint8
		want float32
	}{
		{0, -1},
		{255, 1},
		{51, -0.6},
		{128, float32(32897) / (1 << 23)},
	}
	for _, tc := range tests {
		for c := 0; c < Channels; c++ {
			if got := table[c][tc.v]; math.Float32bits(got) != math.Float32bits(tc.want) {
				t.Errorf("channel %d value %d → %v (%#x), want %v (%#x)", c, tc.v, got, math.Float32bits(got), tc.want, math.Float32bits(tc.want))
			}
		}
	}
}

func TestProcessImageUniform(t *testing.T) {
	// A flat 64×48 (w×h) image: smart_resize gives 64×64 (48/32 = 1.5 rounds
	// to 2), grid 1×4×4, 16 patches of 3·2·16·16 = 1536 values, 4 tokens.
	// Resizing keeps a flat image flat, so every value is its channel's
	// normalized colour: (0, 51, 255) → (−1, −0.6, 1).
	img := image.NewRGBA(image.Rect(0, 0, 64, 48))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = 0, 51, 255, 255
	}
	p, err := ProcessImage(img, DefaultImageConfig())
	if err != nil {
		t.Fatal(err)
	}
	if p.Grid != (Grid{T: 1, H: 4, W: 4}) || p.Dim != 1536 || p.Width != 64 || p.Height != 64 || p.Tokens() != 4 {
		t.Fatalf("grid %+v dim %d size %d×%d", p.Grid, p.Dim, p.Width, p.Height)
	}
	want := [Channels]float32{-1, -0.6, 1}
	per := p.Dim / Channels
	for row := 0; row < p.NumPatches(); row++ {
		for i, v := range p.Patch(row) {
			if v != want[i/per] {
				t.Fatalf("row %d value %d = %v, want %v", row, i, v, want[i/per])
			}
		}
	}
}

// hashValues fingerprints patch values bit for bit.
func hashValues(v []float32) string {
	h := sha256.New()
	var b [4]byte
	for _, x := range v {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
		h.Write(b[:])
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// gradientImage is a deterministic non-trivial picture.
func gradientImage(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.SetNRGBA(x, y, color.NRGBA{uint8(x * 255 / w), uint8(y * 255 / h), uint8((x*7 + y*13) % 256), 255})
		}
	}
	return img
}

func TestProcessImageDeterministic(t *testing.T) {
	// 70×50 resizes to 64×64 (70/32 = 2.19 → 2, 50/32 = 1.56 → 2), so both
	// resampling passes run.
	img := gradientImage(70, 50)
	a, err := ProcessImage(img, DefaultImageConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ProcessImage(img, DefaultImageConfig())
	if err != nil {
		t.Fatal(err)
	}
	if hashValues(a.Values) != hashValues(b.Values) {
		t.Fatal("two runs differ")
	}
	// Pinned so that a change of architecture, compiler or code that moves a
	// single bit is noticed. Pure integer resampling plus a table of
	// correctly rounded float32 values leaves no room for platform drift.
	const golden = "91b2050291b1f7b53a96c322261e44f294a6d1f372f1a63df27e711796cd79fb"
	if got := hashValues(a.Values); got != golden {
		t.Fatalf("fingerprint %s, want %s", got, golden)
	}
}

func TestPatchifyErrors(t *testing.T) {
	cfg := identityConfig(2, 2, 2)
	tests := []struct {
		name   string
		frames []Frame
		cfg    Config
		want   error
	}{
		{"no frames", nil, cfg, ErrInvalidArgument},
		{"not a multiple of the factor", coordFrames(1, 6, 4), cfg, ErrInvalidArgument},
		{"mixed sizes", append(coordFrames(1, 4, 4), coordFrames(1, 8, 4)...), cfg, ErrInvalidArgument},
		{"over the patch cap", coordFrames(2, 8, 8), func() Config { c := cfg; c.MaxPatches = 15; return c }(), ErrTooLarge},
		{"bad config", coordFrames(1, 4, 4), func() Config { c := cfg; c.Std[1] = 0; return c }(), ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Patchify(tc.frames, tc.cfg); !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
		})
	}
}
