package encoder

import (
	"math"

	"github.com/omnipd/omnipd/reference/engine/kernel"
)

// The layers both encoders share. Every product that is later added to
// something is rounded by an explicit conversion, which the Go spec
// guarantees prevents fusing it into an FMA; reductions go through
// kernel.Dot, whose order depends only on the lengths.

// layerNorm sets out = (x-mean)/sqrt(var+eps)·w + b, torch.nn.LayerNorm with
// the biased variance. Mean and variance are accumulated in float64 in index
// order. out may be x.
func layerNorm(out, x, w, b []float32, eps float64) {
	n := len(x)
	var sum float64
	for _, v := range x {
		sum += float64(v)
	}
	mean := sum / float64(n)
	var ss float64
	for _, v := range x {
		d := float64(v) - mean
		ss += float64(d * d)
	}
	inv := float32(1 / math.Sqrt(ss/float64(n)+eps))
	w, b, out = w[:n], b[:n], out[:n]
	for i, v := range x {
		d := float32(float64(v) - mean)
		out[i] = float32(float32(d*inv)*w[i]) + b[i]
	}
}

// geluErf is the exact GELU, x·Φ(x) = x/2·(1+erf(x/√2)): torch's
// F.gelu / nn.GELU() default and transformers' "gelu" (GELUActivation).
// Computed in float64 and rounded once.
func geluErf(x float32) float32 {
	v := float64(x)
	return float32(0.5 * v * (1 + math.Erf(v/math.Sqrt2)))
}

// sqrtTwoOverPi is √(2/π), the tanh approximation's constant.
const sqrtTwoOverPi = 0.7978845608028654

// geluTanh is the tanh approximation x/2·(1+tanh(√(2/π)·(x+0.044715·x³))):
// torch's gelu(approximate="tanh") and transformers' "gelu_pytorch_tanh".
func geluTanh(x float32) float32 {
	v := float64(x)
	cube := float64(float64(v*v) * v)
	inner := float64(sqrtTwoOverPi * (v + float64(0.044715*cube)))
	return float32(0.5 * v * (1 + math.Tanh(inner)))
}

// linear sets out = W·x + b for W row-major [len(out)][len(x)]; b may be nil
// (a bias-free layer such as the audio conv_out).
func linear(out, w, b, x []float32) {
	kernel.MatVec(out, w, x)
	if b != nil {
		kernel.Add(out, b)
	}
}

// attendSegment computes bidirectional multi-head attention of every query
// of one segment over the keys and values of the same segment — one entry of
// upstream's cu_seqlens (an audio window, a video frame group) — into out.
// q, k, v and out hold `tokens` rows of heads·headDim values, each head's
// slice contiguous (upstream's reshape(seq, heads, head_dim)). scores needs
// room for `tokens` values.
func attendSegment(out, q, k, v []float32, tokens, heads, headDim int, scores []float32) {
	dim := heads * headDim
	scale := float32(1 / math.Sqrt(float64(headDim)))
	scores = scores[:tokens]
	for i := range tokens {
		for h := range heads {
			off := h * headDim
			qh := q[i*dim+off : i*dim+off+headDim]
			for j := range tokens {
				scores[j] = float32(kernel.Dot(qh, k[j*dim+off:j*dim+off+headDim]) * scale)
			}
			kernel.Softmax(scores)
			oh := out[i*dim+off : i*dim+off+headDim]
			clear(oh)
			for j, p := range scores {
				kernel.Axpy(oh, p, v[j*dim+off:j*dim+off+headDim])
			}
		}
	}
}

// convOutLen is the output length of a kernel-3, stride-2, padding-1
// convolution over n inputs: floor((n+2-3)/2)+1, and 0 for no input (the
// value Python's floor division gives upstream's (n-1)//2+1 at n = 0).
func convOutLen(n int) int {
	if n <= 0 {
		return 0
	}
	return (n-1)/2 + 1
}
