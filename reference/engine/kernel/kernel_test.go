package kernel

import (
	"math"
	"testing"
)

func TestKernels(t *testing.T) {
	a := []float32{1, 2, 3, 4, 5}
	b := []float32{5, 4, 3, 2, 1}
	if got := Dot(a, b); got != 35 {
		t.Errorf("Dot = %v, want 35", got)
	}
	out := make([]float32, 2)
	MatVec(out, []float32{1, 0, 0, 0, 1, 0}, []float32{7, 8, 9})
	if out[0] != 7 || out[1] != 8 {
		t.Errorf("MatVec = %v", out)
	}
	y := []float32{1, 1}
	Axpy(y, 2, []float32{3, 4})
	Add(y, []float32{1, 1})
	Scale(y, 0.5)
	if y[0] != 4 || y[1] != 5 {
		t.Errorf("Axpy/Add/Scale = %v", y)
	}
	n := make([]float32, 2)
	RMSNorm(n, []float32{3, 4}, []float32{1, 2}, 0)
	want := float32(1 / math.Sqrt(12.5))
	if n[0] != 3*want || n[1] != 4*want*2 {
		t.Errorf("RMSNorm = %v", n)
	}
	p := []float32{1, 2, 3}
	Softmax(p)
	if s := p[0] + p[1] + p[2]; math.Abs(float64(s-1)) > 1e-6 || !(p[0] < p[1] && p[1] < p[2]) {
		t.Errorf("Softmax = %v", p)
	}
	if SiLU(0) != 0 || SiLU(10) < 9.99 {
		t.Errorf("SiLU")
	}
}

// The dot product's result depends on the order of its terms only through
// its fixed four-way split: the same inputs always give the same bits.
func TestDotIsDeterministic(t *testing.T) {
	a, b := make([]float32, 1001), make([]float32, 1001)
	for i := range a {
		a[i], b[i] = float32(math.Sin(float64(i))), float32(math.Cos(float64(i)*0.7))
	}
	first := Dot(a, b)
	for range 10 {
		if Dot(a, b) != first {
			t.Fatal("Dot differs between runs")
		}
	}
}

func TestRotateHalf(t *testing.T) {
	// Pair (x[0], x[2]) turns by 90°: (1,3) → (1·0-3·1, 3·0+1·1) = (-3, 1);
	// pair (x[1], x[3]) by 0° stays (2, 4).
	x := []float32{1, 2, 3, 4}
	RotateHalf(x, []float32{0, 1}, []float32{1, 0})
	want := []float32{-3, 2, 1, 4}
	for i := range want {
		if x[i] != want[i] {
			t.Fatalf("RotateHalf = %v, want %v", x, want)
		}
	}
}
