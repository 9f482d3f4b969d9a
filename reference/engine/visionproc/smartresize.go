package visionproc

import (
	"fmt"
	"math"
)

// maxAspectRatio is smart_resize's limit on max(h, w) / min(h, w).
const maxAspectRatio = 200

// maxSide keeps h̄·w̄ far from integer overflow; no decodable image is near it.
const maxSide = 1 << 24

// SmartResize returns the size an image of height × width is resized to, as
// transformers' Qwen2-VL smart_resize computes it: both sides multiples of
// factor (patch_size × merge_size), the area within [minPixels, maxPixels],
// the aspect ratio kept as closely as possible.
//
//	h̄ = round(h/f)·f, w̄ = round(w/f)·f              (round half to even, as Python's round)
//	if h̄·w̄ > max: β = √(h·w/max); h̄ = max(f, ⌊h/β/f⌋·f); w̄ = max(f, ⌊w/β/f⌋·f)
//	elif h̄·w̄ < min: β = √(min/(h·w)); h̄ = ⌈h·β/f⌉·f; w̄ = ⌈w·β/f⌉·f
//
// It refuses max(h, w)/min(h, w) > 200 with ErrAspectRatio. Upstream would
// return a zero side for a tiny image when minPixels is 0; that cannot be
// patchified, so it is ErrInvalidArgument here.
func SmartResize(height, width, factor, minPixels, maxPixels int) (resizedHeight, resizedWidth int, err error) {
	if height <= 0 || width <= 0 {
		return 0, 0, fmt.Errorf("%w: image size %d×%d", ErrInvalidArgument, height, width)
	}
	if height > maxSide || width > maxSide {
		return 0, 0, badInput(ErrTooLarge, "its size %d×%d is over the limit of %d per side", width, height, maxSide)
	}
	if factor <= 0 || factor > maxSide || minPixels < 0 || maxPixels <= 0 {
		return 0, 0, fmt.Errorf("%w: factor %d, min_pixels %d, max_pixels %d",
			ErrInvalidArgument, factor, minPixels, maxPixels)
	}
	long, short := max(height, width), min(height, width)
	if ratio := float64(long) / float64(short); ratio > maxAspectRatio {
		return 0, 0, badInput(ErrAspectRatio, "its size %d×%d has an aspect ratio of %.1f, over the limit of %d", width, height, ratio, maxAspectRatio)
	}
	h, w, f := float64(height), float64(width), float64(factor)
	hBar := int(math.RoundToEven(h/f)) * factor
	wBar := int(math.RoundToEven(w/f)) * factor
	area := float64(height) * float64(width)
	switch {
	case hBar*wBar > maxPixels:
		beta := math.Sqrt(area / float64(maxPixels))
		hBar = max(factor, int(math.Floor(h/beta/f))*factor)
		wBar = max(factor, int(math.Floor(w/beta/f))*factor)
	case hBar*wBar < minPixels:
		beta := math.Sqrt(float64(minPixels) / area)
		// Each product is rounded before the division so no compiler can fuse
		// it into something else.
		hBar = int(math.Ceil(float64(h*beta)/f)) * factor
		wBar = int(math.Ceil(float64(w*beta)/f)) * factor
	}
	if hBar <= 0 || wBar <= 0 {
		return 0, 0, fmt.Errorf("%w: %d×%d resizes to %d×%d (min_pixels %d)",
			ErrInvalidArgument, height, width, hBar, wBar, minPixels)
	}
	return hBar, wBar, nil
}
