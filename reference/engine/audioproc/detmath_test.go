package audioproc

import (
	"math"
	"testing"
)

// The deterministic functions must agree with the standard library (whose
// results are within an ulp or so of the true values) to near float64
// precision; the standard library is only the yardstick here, never used
// by the pipeline.
func TestDeterministicMathMatchesStdlib(t *testing.T) {
	const tol = 4e-16
	relErr := func(got, want float64) float64 {
		if want == 0 {
			return math.Abs(got)
		}
		return math.Abs(got-want) / math.Abs(want)
	}
	trig := []float64{0, 1e-9, 0.01, 0.1, 0.2, 0.25, 0.3, 0.49, 0.5, 0.51, 0.75, 0.999,
		1, 1.25, 1.5, 1.75, 2, 2.5, 3.3, 17.125, 1001.37, -0.3, -1.5, -7.77}
	for _, x := range trig {
		// math.Mod is exact; reducing first keeps π·x's rounding out of
		// the yardstick.
		xr := math.Mod(x, 2)
		if got, want := sinPi(x), math.Sin(math.Pi*xr); math.Abs(got-want) > tol*2 {
			t.Errorf("sinPi(%v) = %v, want %v", x, got, want)
		}
		if got, want := cosPi(x), math.Cos(math.Pi*xr); math.Abs(got-want) > tol*2 {
			t.Errorf("cosPi(%v) = %v, want %v", x, got, want)
		}
	}
	// Exact values the range reduction must hit exactly.
	exact := []struct {
		name      string
		got, want float64
	}{
		{"sinPi(0)", sinPi(0), 0},
		{"sinPi(0.5)", sinPi(0.5), 1},
		{"sinPi(1)", sinPi(1), 0},
		{"sinPi(1.5)", sinPi(1.5), -1},
		{"cosPi(0)", cosPi(0), 1},
		{"cosPi(0.5)", cosPi(0.5), 0},
		{"cosPi(1)", cosPi(1), -1},
		{"cosPi(2)", cosPi(2), 1},
	}
	for _, e := range exact {
		if e.got != e.want {
			t.Errorf("%s = %v, want exactly %v", e.name, e.got, e.want)
		}
	}
	for _, x := range []float64{1e-300, 1e-10, 0.001, 0.5, 0.7071, 0.99999, 1, 1.0001, 2, 6.4, 8, 1e10, 1e300} {
		if got, want := logDet(x), math.Log(x); relErr(got, want) > tol && math.Abs(got-want) > 1e-16 {
			t.Errorf("logDet(%v) = %v, want %v", x, got, want)
		}
		if got, want := log10Det(x), math.Log10(x); relErr(got, want) > tol && math.Abs(got-want) > 1e-16 {
			t.Errorf("log10Det(%v) = %v, want %v", x, got, want)
		}
	}
	if got := log10Det(1e-10); math.Abs(got+10) > 2e-15 {
		t.Errorf("log10Det(1e-10) = %v, want -10", got)
	}
	for _, x := range []float64{-700, -20, -1, -1e-9, 0, 1e-9, 0.3, 1, 2.0794, 10, 100, 700} {
		if got, want := expDet(x), math.Exp(x); relErr(got, want) > tol {
			t.Errorf("expDet(%v) = %v, want %v", x, got, want)
		}
	}
}
