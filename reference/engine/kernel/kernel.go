// Package kernel holds the float32 arithmetic the reference engines share:
// the one dot product every matrix product goes through, and the norms and
// activations around it. Each result depends only on its inputs and their
// lengths, never on how work is split, and every product is rounded to
// float32 explicitly (no fused multiply-add), so results are identical
// across runs, chunkings and machines — the property that lets prefill/decode
// disaggregation be proved exact.
//
// The loops here carry //go:norace: the race detector does not instrument
// them. They touch only the buffers their caller passes, and under -race
// their per-element instrumentation was most of the test suite's CPU — a
// bit-exact E/P/D test spent 78 s of CPU with it and 28 s without. Races on
// those buffers still show where the rest of the engine, which stays
// instrumented, reads or writes them.
package kernel

import "math"

// Dot is the one reduction every product goes through: four accumulators in
// a fixed order let the CPU overlap the adds without changing the result.
//
//go:norace
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += float32(a[i] * b[i])
		s1 += float32(a[i+1] * b[i+1])
		s2 += float32(a[i+2] * b[i+2])
		s3 += float32(a[i+3] * b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += float32(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

// MatVec sets out = W·x for W row-major [len(out)][len(x)].
//
//go:norace
func MatVec(out, w, x []float32) {
	in := len(x)
	w = w[:len(out)*in]
	for r := range out {
		out[r] = Dot(w[r*in:(r+1)*in], x)
	}
}

// Axpy adds a·x to y.
//
//go:norace
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += float32(a * x[i])
	}
}

// Add adds x to y.
//
//go:norace
func Add(y, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += x[i]
	}
}

// Scale multiplies y by a.
//
//go:norace
func Scale(y []float32, a float32) {
	for i := range y {
		y[i] = float32(y[i] * a)
	}
}

// RMSNorm sets out = x / sqrt(mean(x²) + eps) · w, the mean in float64.
//
//go:norace
func RMSNorm(out, x, w []float32, eps float64) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(ss/float64(len(x))+eps))
	w = w[:len(x)]
	out = out[:len(x)]
	for i, v := range x {
		out[i] = float32(v*inv) * w[i]
	}
}

// Softmax turns x into probabilities in place, subtracting the maximum first.
//
//go:norace
func Softmax(x []float32) {
	mx := x[0]
	for _, v := range x[1:] {
		mx = max(mx, v)
	}
	var sum float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - mx)))
		x[i] = e
		sum += e
	}
	for i := range x {
		x[i] /= sum
	}
}

// SiLU is x·sigmoid(x), computed in float64.
func SiLU(x float32) float32 {
	v := float64(x)
	return float32(v / (1 + math.Exp(-v)))
}

// RotateHalf applies rotary angles to one attention head in place,
// pairing element i with element i+len(cos) (transformers' rotate_half
// convention: x·cos + rotate_half(x)·sin, cos and sin repeated over both
// halves). Products are rounded before they are summed.
//
//go:norace
func RotateHalf(x, cos, sin []float32) {
	half := len(cos)
	x1, x2 := x[:half], x[half:2*half]
	sin = sin[:half]
	for i, c := range cos {
		a, b := x1[i], x2[i]
		x1[i] = float32(a*c) - float32(b*sin[i])
		x2[i] = float32(b*c) + float32(a*sin[i])
	}
}
