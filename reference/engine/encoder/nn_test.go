package encoder

import (
	"math"
	"testing"
)

// near reports whether got is within tol of want.
func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

func TestLayerNorm(t *testing.T) {
	// [1,2,3,4]: mean 2.5, biased variance 1.25, so (x-2.5)/√1.25 =
	// ±0.4472136, ±1.3416408 (torch.nn.LayerNorm divides by n, not n-1).
	tests := []struct {
		name string
		w, b []float32
		eps  float64
		want []float64
	}{
		{"unit", []float32{1, 1, 1, 1}, []float32{0, 0, 0, 0}, 0,
			[]float64{-1.3416408, -0.4472136, 0.4472136, 1.3416408}},
		{"affine", []float32{2, 2, 2, 2}, []float32{1, 1, 1, 1}, 0,
			[]float64{-1.6832816, 0.1055728, 1.8944272, 3.6832816}},
		// eps 1.25 doubles the variance: (x-2.5)/√2.5.
		{"eps", []float32{1, 1, 1, 1}, []float32{0, 0, 0, 0}, 1.25,
			[]float64{-0.9486833, -0.3162278, 0.3162278, 0.9486833}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := []float32{1, 2, 3, 4}
			out := make([]float32, 4)
			layerNorm(out, x, tc.w, tc.b, tc.eps)
			for i, w := range tc.want {
				if !near(float64(out[i]), w, 1e-6) {
					t.Fatalf("layerNorm = %v, want %v", out, tc.want)
				}
			}
			layerNorm(x, x, tc.w, tc.b, tc.eps) // in place gives the same bits
			for i := range x {
				if x[i] != out[i] {
					t.Fatalf("in-place layerNorm = %v, out-of-place %v", x, out)
				}
			}
		})
	}
}

func TestGELU(t *testing.T) {
	// Exact GELU x·Φ(x): Φ(1) = 0.8413447, 2·Φ(2) = 1.9544997.
	// Tanh form x/2·(1+tanh(√(2/π)(x+0.044715x³))) at 1 and -2, by hand.
	tests := []struct {
		x             float32
		erf, tanhForm float64
	}{
		{0, 0, 0},
		{1, 0.8413447460685429, 0.8411919906082768},
		{-1, -0.15865525393145707, -0.1588080093917232},
		{2, 1.9544997361036416, 1.954597694087775},
		{-2, -0.04550026389635842, -0.04540230591222494},
	}
	for _, tc := range tests {
		if got := geluErf(tc.x); !near(float64(got), tc.erf, 1e-7) {
			t.Errorf("geluErf(%v) = %v, want %v", tc.x, got, tc.erf)
		}
		if got := geluTanh(tc.x); !near(float64(got), tc.tanhForm, 1e-7) {
			t.Errorf("geluTanh(%v) = %v, want %v", tc.x, got, tc.tanhForm)
		}
	}
	// The two variants must differ somewhere, or a mix-up would go unseen.
	if geluErf(1) == geluTanh(1) {
		t.Error("geluErf(1) == geluTanh(1)")
	}
}

func TestConvOutLen(t *testing.T) {
	// floor((n + 2·1 - 3)/2) + 1 for kernel 3, stride 2, padding 1.
	for _, tc := range []struct{ n, want int }{
		{0, 0}, {1, 1}, {2, 1}, {3, 2}, {4, 2}, {25, 13}, {50, 25}, {100, 50}, {128, 64}, {16, 8},
	} {
		if got := convOutLen(tc.n); got != tc.want {
			t.Errorf("convOutLen(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestAttendSegment(t *testing.T) {
	// One head of width 4 (scale 1/2), two tokens with the same query
	// [1,0,0,0]; keys [2,0,0,0] and 0 give scores 1 and 0, so weights
	// e/(1+e) = 0.7310586 and 0.2689414 on values [1,0,0,0] and [0,1,0,0].
	q := []float32{1, 0, 0, 0, 1, 0, 0, 0}
	k := []float32{2, 0, 0, 0, 0, 0, 0, 0}
	v := []float32{1, 0, 0, 0, 0, 1, 0, 0}
	out := make([]float32, 8)
	attendSegment(out, q, k, v, 2, 1, 4, make([]float32, 2))
	want := []float64{0.7310586, 0.2689414, 0, 0, 0.7310586, 0.2689414, 0, 0}
	for i, w := range want {
		if !near(float64(out[i]), w, 1e-6) {
			t.Fatalf("attendSegment = %v, want %v", out, want)
		}
	}

	// Two heads of width 2: head 1 sees only its own slices, so a key that
	// differs only in head 0 moves head 0's weights and not head 1's.
	q = []float32{1, 0, 1, 0, 1, 0, 1, 0}
	k = []float32{4, 0, 0, 0, 0, 0, 0, 0}
	v = []float32{1, 0, 1, 0, 0, 1, 0, 1}
	attendSegment(out, q, k, v, 2, 2, 2, make([]float32, 2))
	// Head 0: scores 4/√2 and 0; head 1: equal scores, weights 1/2.
	p := 1 / (1 + math.Exp(-4/math.Sqrt2))
	want = []float64{p, 1 - p, 0.5, 0.5, p, 1 - p, 0.5, 0.5}
	for i, w := range want {
		if !near(float64(out[i]), w, 1e-6) {
			t.Fatalf("two-head attendSegment = %v, want %v", out, want)
		}
	}
}

func TestSinusoids(t *testing.T) {
	// channels 8: h = 4, ω_k = exp(-k·ln(10000)/3) = 1, 10000^(-1/3),
	// 10000^(-2/3), 10000^(-1); row t = [sin(tω), cos(tω)].
	table := sinusoids(3, 8)
	omega := []float64{1, 0.046415888336127795, 0.0021544346900318843, 1e-4}
	for tt := range 3 {
		for k, w := range omega {
			if got, want := table[tt*8+k], math.Sin(float64(tt)*w); !near(float64(got), want, 1e-7) {
				t.Errorf("row %d sin[%d] = %v, want %v", tt, k, got, want)
			}
			if got, want := table[tt*8+4+k], math.Cos(float64(tt)*w); !near(float64(got), want, 1e-7) {
				t.Errorf("row %d cos[%d] = %v, want %v", tt, k, got, want)
			}
		}
	}
}
