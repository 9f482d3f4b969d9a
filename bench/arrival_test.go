package bench

import (
	"math"
	"testing"
	"time"
)

// The gaps' mean is 1/rate and their squared coefficient of variation is
// 1/burstiness (1 for Poisson). Over n samples the sample mean's standard
// error is mean·sqrt(1/(k·n)); the bounds below are several standard errors
// wide, so a correct generator fails them with negligible probability while
// a wrong rate, scale or shape fails them surely.
func TestArrivalsStatistics(t *testing.T) {
	const n = 200_000
	for _, tt := range []struct{ rate, burstiness float64 }{{4, 1}, {50, 1}, {10, 0.5}, {10, 3}} {
		a := NewArrivals(tt.rate, tt.burstiness, 42)
		var sum, sq float64
		for range n {
			g := a.Next().Seconds()
			if g < 0 {
				t.Fatalf("negative gap %v", g)
			}
			sum += g
			sq += g * g
		}
		mean := sum / n
		cv2 := (sq/n - mean*mean) / (mean * mean)
		want := 1 / tt.rate
		if math.Abs(mean-want)/want > 0.02 {
			t.Errorf("rate %v, burstiness %v: mean gap %.5fs, want %.5fs", tt.rate, tt.burstiness, mean, want)
		}
		if wantCV2 := 1 / tt.burstiness; math.Abs(cv2-wantCV2)/wantCV2 > 0.08 {
			t.Errorf("rate %v, burstiness %v: squared CV %.3f, want %.3f", tt.rate, tt.burstiness, cv2, wantCV2)
		}
	}
}

func TestArrivalsSeeded(t *testing.T) {
	a, b, c := NewArrivals(3, 1, 7), NewArrivals(3, 1, 7), NewArrivals(3, 1, 8)
	same, differ := true, false
	for range 100 {
		x, y, z := a.Next(), b.Next(), c.Next()
		same = same && x == y
		differ = differ || x != z
	}
	if !same || !differ {
		t.Errorf("same seed same schedule: %v; other seed other schedule: %v", same, differ)
	}
	inf := NewArrivals(math.Inf(1), 1, 1)
	for range 10 {
		if g := inf.Next(); g != 0 {
			t.Fatalf("infinite rate: gap %v", g)
		}
	}
	if g := NewArrivals(1, 0, 1).Next(); g <= 0 || g > time.Hour {
		t.Errorf("burstiness 0 is taken as 1: gap %v", g)
	}
}
