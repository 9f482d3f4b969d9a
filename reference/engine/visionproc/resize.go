package visionproc

import (
	"fmt"
	"math"
)

// The resampler is a separable bicubic convolution (Keys cubic, a = −0.5)
// whose support widens by the scale factor when shrinking, so downscaling
// averages every source pixel instead of skipping some. This is the filter
// family PIL's Image.resize(BICUBIC) and torchvision's antialiased bicubic
// use, which the processors call; the result is close to theirs but not
// guaranteed bit-identical (PIL is not available to compare against here).
//
// Weights are computed once per axis in float64 with every product rounded
// explicitly, then quantized to fixed point; the convolution itself is
// integer arithmetic, so results are exact and identical on every
// architecture. Like PIL's 8-bit path, the horizontal pass runs first and its
// output is rounded and clamped to 8 bits before the vertical pass.

// resampleBits is the fixed-point precision of the weights: 32 bits minus 8
// for the sample minus 2 of headroom for the kernel's negative lobes.
const resampleBits = 22

// cubicA is the Keys cubic parameter of PIL's and torchvision's bicubic.
const cubicA = -0.5

// cubicSupport is the kernel radius in source pixels at scale 1.
const cubicSupport = 2.0

// cubic is the Keys kernel with a = −0.5.
func cubic(x float64) float64 {
	x = math.Abs(x)
	switch {
	case x < 1:
		// ((a+2)x − (a+3))x² + 1
		t := float64((cubicA+2)*x) - (cubicA + 3)
		t = float64(t * x)
		t = float64(t * x)
		return t + 1
	case x < 2:
		// (((x − 5)x + 8)x − 4)a
		t := float64((x-5)*x) + 8
		t = float64(t*x) - 4
		return float64(t * cubicA)
	}
	return 0
}

// axisTaps holds, for each output position, the first source index and the
// fixed-point weights of the source pixels it reads.
type axisTaps struct {
	start   []int
	count   []int
	weights []int64 // [out][stride]
	stride  int
}

// bicubicTaps computes the taps mapping inSize source pixels onto outSize.
func bicubicTaps(inSize, outSize int) axisTaps {
	scale := float64(inSize) / float64(outSize)
	filterScale := max(scale, 1)
	support := float64(cubicSupport * filterScale)
	stride := int(math.Ceil(support))*2 + 1
	t := axisTaps{
		start:   make([]int, outSize),
		count:   make([]int, outSize),
		weights: make([]int64, outSize*stride),
		stride:  stride,
	}
	inv := 1 / filterScale
	w := make([]float64, stride)
	for o := 0; o < outSize; o++ {
		// Pixel centres sit at +0.5: output o covers source [o·s, (o+1)·s).
		center := float64((float64(o) + 0.5) * scale)
		lo := max(int(center-support+0.5), 0)
		hi := min(int(center+support+0.5), inSize)
		n := min(hi-lo, stride)
		var sum float64
		for i := 0; i < n; i++ {
			w[i] = cubic(float64((float64(lo+i) - center + 0.5) * inv))
			sum += w[i]
		}
		t.start[o], t.count[o] = lo, n
		k := t.weights[o*stride : o*stride+n]
		for i := 0; i < n; i++ {
			v := w[i]
			if sum != 0 {
				v /= sum
			}
			// Round half away from zero into fixed point.
			q := float64(v * (1 << resampleBits))
			if q < 0 {
				k[i] = int64(q - 0.5)
			} else {
				k[i] = int64(q + 0.5)
			}
		}
	}
	return t
}

// clip8 turns a fixed-point accumulator (with the rounding half already
// added) into an 8-bit sample.
func clip8(acc int64) uint8 {
	v := acc >> resampleBits
	switch {
	case v < 0:
		return 0
	case v > 255:
		return 255
	}
	return uint8(v)
}

// resampleRows resizes each row of a plane from sw to dw pixels.
func resampleRows(src []uint8, sw, h int, dst []uint8, dw int, t axisTaps) {
	const half = int64(1) << (resampleBits - 1)
	for y := 0; y < h; y++ {
		in := src[y*sw : (y+1)*sw]
		out := dst[y*dw : (y+1)*dw]
		for x := range out {
			lo, n := t.start[x], t.count[x]
			k := t.weights[x*t.stride : x*t.stride+n]
			acc := half
			for i, wt := range k {
				acc += int64(in[lo+i]) * wt
			}
			out[x] = clip8(acc)
		}
	}
}

// resampleCols resizes each column of a plane from sh to dh pixels.
func resampleCols(src []uint8, w, sh int, dst []uint8, dh int, t axisTaps) {
	const half = int64(1) << (resampleBits - 1)
	for y := 0; y < dh; y++ {
		lo, n := t.start[y], t.count[y]
		k := t.weights[y*t.stride : y*t.stride+n]
		out := dst[y*w : (y+1)*w]
		for x := range out {
			acc := half
			for i, wt := range k {
				acc += int64(src[(lo+i)*w+x]) * wt
			}
			out[x] = clip8(acc)
		}
	}
}

// ResizeBicubic resamples f to width × height with the bicubic filter
// described above. A pass whose size does not change is skipped, so resizing
// to the same size returns an identical copy.
func ResizeBicubic(f Frame, width, height int) (Frame, error) {
	if width <= 0 || height <= 0 {
		return Frame{}, fmt.Errorf("%w: target size %d×%d", ErrInvalidArgument, width, height)
	}
	if f.Width <= 0 || f.Height <= 0 || len(f.Pix) != Channels*f.Width*f.Height {
		return Frame{}, fmt.Errorf("%w: frame %d×%d with %d samples", ErrInvalidArgument, f.Width, f.Height, len(f.Pix))
	}
	return newResizer(f.Width, f.Height, width, height).resize(f), nil
}

// resizer caches the taps for one source → target size, so the frames of a
// video share them.
type resizer struct {
	sw, sh, dw, dh int
	horizontal     axisTaps
	vertical       axisTaps
}

func newResizer(sw, sh, dw, dh int) *resizer {
	r := &resizer{sw: sw, sh: sh, dw: dw, dh: dh}
	if sw != dw {
		r.horizontal = bicubicTaps(sw, dw)
	}
	if sh != dh {
		r.vertical = bicubicTaps(sh, dh)
	}
	return r
}

// resize applies the cached taps; f must be sw × sh.
func (r *resizer) resize(f Frame) Frame {
	out := newFrame(r.dw, r.dh)
	var mid []uint8
	if r.sw != r.dw && r.sh != r.dh {
		mid = make([]uint8, r.dw*r.sh)
	}
	for c := 0; c < Channels; c++ {
		src, dst := f.plane(c), out.plane(c)
		switch {
		case r.sw == r.dw && r.sh == r.dh:
			copy(dst, src)
		case r.sh == r.dh:
			resampleRows(src, r.sw, r.sh, dst, r.dw, r.horizontal)
		case r.sw == r.dw:
			resampleCols(src, r.sw, r.sh, dst, r.dh, r.vertical)
		default:
			resampleRows(src, r.sw, r.sh, mid, r.dw, r.horizontal)
			resampleCols(mid, r.dw, r.sh, dst, r.dh, r.vertical)
		}
	}
	return out
}
