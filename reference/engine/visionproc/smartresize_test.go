package visionproc

import (
	"errors"
	"testing"
)

// Expected sizes are worked by hand from transformers' smart_resize
// (qwen2_vl/image_processing_qwen2_vl.py):
//
//	h̄ = round(h/f)·f, w̄ = round(w/f)·f   (Python round: half to even)
//	h̄·w̄ > max → β = √(h·w/max), side = max(f, ⌊side/β/f⌋·f)
//	h̄·w̄ < min → β = √(min/(h·w)), side = ⌈side·β/f⌉·f
//
// f = 32 (patch 16 × merge 2), image bounds [3136, 12845056], video bounds
// [131072, 786432] unless a row says otherwise.
func TestSmartResize(t *testing.T) {
	tests := []struct {
		name              string
		h, w, f, min, max int
		wantH, wantW      int
		wantErr           error
	}{
		// 48/32 = 1.5 → 2 (even), 64/32 = 2: 64×64 = 4096 is inside the bounds.
		{"round branch", 48, 64, 32, ImageMinPixels, ImageMaxPixels, 64, 64, nil},
		// 80/32 = 2.5 rounds half to even → 2, not 3: 64, not 96.
		{"half to even down", 80, 80, 32, ImageMinPixels, ImageMaxPixels, 64, 64, nil},
		// 112/32 = 3.5 → 4: 128.
		{"half to even up", 112, 112, 32, ImageMinPixels, ImageMaxPixels, 128, 128, nil},
		// round(10/32) = 0 → area 0 < 3136; β = √(3136/100) = 5.6,
		// ⌈10·5.6/32⌉ = ⌈1.75⌉ = 2 → 64.
		{"tiny image grows", 10, 10, 32, ImageMinPixels, ImageMaxPixels, 64, 64, nil},
		// 1×1: β = √3136 = 56, ⌈56/32⌉ = 2 → 64.
		{"single pixel", 1, 1, 32, ImageMinPixels, ImageMaxPixels, 64, 64, nil},
		// 4000/32 = 125, 3000/32 = 93.75 → 94 → 3008; 4000·3008 = 12,032,000 ≤ max.
		{"large within max", 4000, 3000, 32, ImageMinPixels, ImageMaxPixels, 4000, 3008, nil},
		// 8000·6016 > max; β = √(48e6/12845056) = 1.93309…;
		// 8000/β/32 = 129.33 → 129·32 = 4128; 6000/β/32 = 96.99 → 96·32 = 3072.
		{"floor branch", 8000, 6000, 32, ImageMinPixels, ImageMaxPixels, 4128, 3072, nil},
		// Ratio exactly 200 is allowed: β = √(3136/20000) = 0.39598;
		// ⌈10β/32⌉ = ⌈0.124⌉ = 1 → 32, ⌈2000β/32⌉ = ⌈24.75⌉ = 25 → 800.
		{"ratio 200 allowed", 10, 2000, 32, ImageMinPixels, ImageMaxPixels, 32, 800, nil},
		{"ratio 200 one pixel", 1, 200, 32, ImageMinPixels, ImageMaxPixels, 32, 800, nil},
		// 2001/10 = 200.1 > 200.
		{"ratio above 200", 10, 2001, 32, ImageMinPixels, ImageMaxPixels, 0, 0, ErrAspectRatio},
		{"ratio above 200 tall", 2001, 10, 32, ImageMinPixels, ImageMaxPixels, 0, 0, ErrAspectRatio},
		// max = 4096: 32·6016 > 4096; β = √(33·6000/4096) = 6.9527;
		// 33/β/32 = 0.148 → 0 → clamped to f = 32; 6000/β/32 = 26.97 → 26 → 832.
		{"floor clamps to factor", 33, 6000, 32, ImageMinPixels, 4096, 32, 832, nil},
		// Qwen2-VL's factor 28: 500/28 = 17.86 → 18 → 504; 375/28 = 13.39 → 13 → 364.
		{"factor 28", 500, 375, 28, ImageMinPixels, ImageMaxPixels, 504, 364, nil},
		// Video frame: 64×64 < 131072; β = √(131072/3072) = 6.53197;
		// ⌈48β/32⌉ = ⌈9.80⌉ = 10 → 320, ⌈64β/32⌉ = ⌈13.06⌉ = 14 → 448.
		{"video grows", 48, 64, 32, VideoMinPixels, VideoMaxPixels, 320, 448, nil},
		// 1088·1920 > 786432; β = √(1080·1920/786432) = 1.62380;
		// 1080/β/32 = 20.78 → 640, 1920/β/32 = 36.95 → 1152.
		{"video 1080p shrinks", 1080, 1920, 32, VideoMinPixels, VideoMaxPixels, 640, 1152, nil},
		{"absurd side", 1 << 25, 1 << 25, 32, ImageMinPixels, ImageMaxPixels, 0, 0, ErrTooLarge},
		{"zero height", 0, 10, 32, ImageMinPixels, ImageMaxPixels, 0, 0, ErrInvalidArgument},
		{"negative width", 10, -1, 32, ImageMinPixels, ImageMaxPixels, 0, 0, ErrInvalidArgument},
		{"zero factor", 10, 10, 0, ImageMinPixels, ImageMaxPixels, 0, 0, ErrInvalidArgument},
		{"zero max", 10, 10, 32, 0, 0, 0, 0, ErrInvalidArgument},
		// min_pixels 0 lets round(10/32) = 0 stand; upstream would return a
		// zero side, which cannot be patchified.
		{"zero side refused", 10, 10, 32, 0, ImageMaxPixels, 0, 0, ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, w, err := SmartResize(tc.h, tc.w, tc.f, tc.min, tc.max)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("SmartResize(%d, %d) error = %v, want %v", tc.h, tc.w, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("SmartResize(%d, %d): %v", tc.h, tc.w, err)
			}
			if h != tc.wantH || w != tc.wantW {
				t.Fatalf("SmartResize(%d, %d) = %d×%d, want %d×%d", tc.h, tc.w, h, w, tc.wantH, tc.wantW)
			}
			if h%tc.f != 0 || w%tc.f != 0 {
				t.Fatalf("result %d×%d not a multiple of %d", h, w, tc.f)
			}
		})
	}
}
