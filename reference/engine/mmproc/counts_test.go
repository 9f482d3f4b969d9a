package mmproc

import (
	"errors"
	"testing"
)

// Expected audio token counts are derived by hand from transformers'
// _get_feat_extract_output_lengths (processing_qwen3_omni_moe.py, also
// vLLM's qwen3_omni_moe_thinker.py):
//
//	out = ⌊(f2−1)/2⌋+1, f2 = ⌊(f1−1)/2⌋+1, f1 = ⌊(r−1)/2⌋+1, r = n mod 100
//	      + 13·⌊n/100⌋
//
// For 1 ≤ r ≤ 99 the three halvings are ⌈r/2⌉, then ⌈·/2⌉ twice, i.e. ⌈r/8⌉;
// for r = 0 Python's floor division gives f1 = ⌊−1/2⌋+1 = 0 and the tail
// adds 0.
func TestAudioTokens(t *testing.T) {
	tests := []struct {
		frames, want int
		why          string
	}{
		{1, 1, "r=1: ⌈1/8⌉=1"},
		{2, 1, "r=2: 1→1→1"},
		{5, 1, "r=5: 3→2→1"},
		{8, 1, "r=8: 4→2→1"},
		{9, 2, "r=9: 5→3→2"},
		{32, 4, "r=32: 16→8→4"},
		{50, 7, "r=50: 25→13→7"},
		{64, 8, "r=64: 32→16→8"},
		{99, 13, "r=99: 50→25→13, one frame short of a window"},
		{100, 13, "exactly one window: r=0 adds 0, 13·1"},
		{101, 14, "one window and r=1: 13+1"},
		{150, 20, "13 + ⌈50/8⌉=7"},
		{200, 26, "two windows"},
		{650, 85, "6 windows + ⌈50/8⌉=7: the 85-token soundtrack of vLLM's draw.mp4 test"},
		{1000, 130, "10 s at 100 frames/s: 10 windows"},
		{3001, 391, "30 windows + 1"},
	}
	for _, tc := range tests {
		got, err := AudioTokens(tc.frames)
		if err != nil {
			t.Fatalf("AudioTokens(%d): %v", tc.frames, err)
		}
		if got != tc.want {
			t.Errorf("AudioTokens(%d) = %d, want %d (%s)", tc.frames, got, tc.want, tc.why)
		}
	}
}

func TestAudioTokensRejectsEmptyAndHugeClips(t *testing.T) {
	for _, frames := range []int{0, -1, -100, MaxItemTokens * 100} {
		if _, err := AudioTokens(frames); !errors.Is(err, ErrInvalidSize) {
			t.Errorf("AudioTokens(%d) error = %v, want ErrInvalidSize", frames, err)
		}
	}
}

// Expected vision counts: grid_thw.prod() // merge_size**2
// (processing_qwen3_omni_moe.py replace_multimodal_special_tokens).
func TestVisionTokens(t *testing.T) {
	tests := []struct {
		grid Grid
		want int
		why  string
	}{
		{Grid{1, 2, 2}, 1, "smallest image: 4/4"},
		{Grid{1, 4, 6}, 6, "24/4"},
		{Grid{1, 48, 48}, 576, "768×768 image at patch 16: 2304/4"},
		{Grid{2, 2, 2}, 2, "two temporal patches of one token"},
		{Grid{6, 36, 64}, 3456, "vLLM test video: 6 frames of 18·32 = 576"},
	}
	for _, tc := range tests {
		got, err := VisionTokens(tc.grid, Qwen3OmniSpatialMergeSize)
		if err != nil {
			t.Fatalf("VisionTokens(%v): %v", tc.grid, err)
		}
		if got != tc.want {
			t.Errorf("VisionTokens(%v) = %d, want %d (%s)", tc.grid, got, tc.want, tc.why)
		}
	}
}

func TestVisionTokensRejectsImpossibleGrids(t *testing.T) {
	tests := []struct {
		grid  Grid
		merge int
		want  error
	}{
		{Grid{1, 3, 4}, 2, ErrInvalidSize},             // H not divisible by the merge
		{Grid{1, 4, 5}, 2, ErrInvalidSize},             // W not divisible
		{Grid{0, 2, 2}, 2, ErrInvalidSize},             // no frames
		{Grid{1, -2, 2}, 2, ErrInvalidSize},            // negative side
		{Grid{1, 1 << 14, 1 << 14}, 1, ErrInvalidSize}, // over MaxItemTokens
		{Grid{1, 2, 2}, 0, ErrInvalidOptions},          // no merge size
	}
	for _, tc := range tests {
		if _, err := VisionTokens(tc.grid, tc.merge); !errors.Is(err, tc.want) {
			t.Errorf("VisionTokens(%v, %d) error = %v, want %v", tc.grid, tc.merge, err, tc.want)
		}
	}
}

// temporal_patch_size / fps, as the processor computes video_second_per_grid.
func TestSecondsPerGrid(t *testing.T) {
	tests := []struct {
		patch int
		fps   float64
		want  float64
	}{
		{2, 1, 2},   // the processor's default fps of 1.0
		{2, 2, 1},   // 2 fps: one temporal patch per second
		{2, 4, 0.5}, // 4 fps
	}
	for _, tc := range tests {
		got, err := SecondsPerGrid(tc.patch, tc.fps)
		if err != nil || got != tc.want {
			t.Errorf("SecondsPerGrid(%d, %v) = %v, %v; want %v", tc.patch, tc.fps, got, err, tc.want)
		}
	}
	for _, bad := range []struct {
		patch int
		fps   float64
	}{{0, 2}, {2, 0}, {2, -1}} {
		if _, err := SecondsPerGrid(bad.patch, bad.fps); !errors.Is(err, ErrInvalidSize) {
			t.Errorf("SecondsPerGrid(%d, %v) error = %v, want ErrInvalidSize", bad.patch, bad.fps, err)
		}
	}
}

func TestTokensValidate(t *testing.T) {
	if err := Qwen3Omni().Validate(); err != nil {
		t.Fatalf("Qwen3Omni().Validate() = %v", err)
	}
	dup := tiny
	dup.VideoPad = dup.ImagePad
	neg := tiny
	neg.AudioEnd = -1
	for name, tk := range map[string]Tokens{"duplicate": dup, "negative": neg} {
		if err := tk.Validate(); !errors.Is(err, ErrInvalidTokens) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidTokens", name, err)
		}
	}
}
