package audioproc

import (
	"math"
	"testing"
)

// naiveDFT is the textbook O(n²) DFT with the standard library's sin/cos,
// the yardstick for the mixed-radix transform.
func naiveDFT(x *[FFTSize]float64) (re, im [fftBins]float64) {
	for k := range fftBins {
		var sr, si float64
		for n, v := range x {
			angle := 2 * math.Pi * float64(k*n%FFTSize) / FFTSize
			sr += v * math.Cos(angle)
			si -= v * math.Sin(angle)
		}
		re[k], im[k] = sr, si
	}
	return re, im
}

func TestRealFFTMatchesNaiveDFT(t *testing.T) {
	impulse := func(x *[FFTSize]float64) { x[0] = 1 }
	shifted := func(x *[FFTSize]float64) { x[7] = 1 }
	dc := func(x *[FFTSize]float64) {
		for i := range x {
			x[i] = 0.25
		}
	}
	bin13 := func(x *[FFTSize]float64) {
		for i := range x {
			x[i] = math.Cos(2 * math.Pi * 13 * float64(i) / FFTSize)
		}
	}
	nyquist := func(x *[FFTSize]float64) {
		for i := range x {
			x[i] = float64(1 - 2*(i%2))
		}
	}
	noise := func(x *[FFTSize]float64) {
		state := uint32(12345)
		for i := range x {
			state = state*1664525 + 1013904223
			x[i] = float64(int32(state))/(1<<31) + 0.1*float64(i%5)
		}
	}
	cases := []struct {
		name string
		fill func(*[FFTSize]float64)
	}{
		{"impulse", impulse}, {"shifted impulse", shifted}, {"dc", dc},
		{"cosine at bin 13", bin13}, {"nyquist", nyquist}, {"noise", noise},
	}
	f := newRealFFT()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var x [FFTSize]float64
			c.fill(&x)
			var gotR, gotI [fftBins]float64
			f.transform(gotR[:], gotI[:], &x)
			wantR, wantI := naiveDFT(&x)
			for k := range fftBins {
				if math.Abs(gotR[k]-wantR[k]) > 1e-11 || math.Abs(gotI[k]-wantI[k]) > 1e-11 {
					t.Fatalf("bin %d = %v%+vi, want %v%+vi", k, gotR[k], gotI[k], wantR[k], wantI[k])
				}
			}
		})
	}
	// Closed forms: a unit impulse has a flat unit spectrum; a cosine at
	// integer bin 13 has X[13] = N/2 and (numerically) nothing else; the
	// constant 0.25 has X[0] = 0.25·N = 100.
	var x [FFTSize]float64
	bin13(&x)
	var r, i [fftBins]float64
	f.transform(r[:], i[:], &x)
	if math.Abs(r[13]-FFTSize/2) > 1e-11 || math.Abs(r[12]) > 1e-11 {
		t.Errorf("cosine at bin 13: X[13] = %v, X[12] = %v; want %v and 0", r[13], r[12], FFTSize/2)
	}
	dc(&x)
	f.transform(r[:], i[:], &x)
	if r[0] != 100 {
		t.Errorf("dc 0.25: X[0] = %v, want exactly 100", r[0])
	}
}
