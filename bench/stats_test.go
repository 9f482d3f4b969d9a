package bench

import (
	"math"
	"slices"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

// Percentiles interpolate linearly between order statistics (numpy's
// default); the expected values are worked by hand.
func TestDescribeHandComputed(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want Dist
	}{
		{"five unsorted", []float64{40, 15, 50, 35, 20}, Dist{
			Count: 5, Mean: 32, Std: math.Sqrt(166), Min: 15, Max: 50,
			P50: 35,   // rank 2
			P90: 46,   // rank 3.6: 40 + 0.6·10
			P99: 49.6, // rank 3.96: 40 + 0.96·10
		}},
		{"four", []float64{1, 2, 3, 4}, Dist{
			Count: 4, Mean: 2.5, Std: math.Sqrt(1.25), Min: 1, Max: 4,
			P50: 2.5,  // rank 1.5
			P90: 3.7,  // rank 2.7
			P99: 3.97, // rank 2.97
		}},
		{"one", []float64{7}, Dist{Count: 1, Mean: 7, Min: 7, Max: 7, P50: 7, P90: 7, P99: 7}},
		{"empty", nil, Dist{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.xs)
			got := Describe(tt.xs)
			if got.Count != tt.want.Count {
				t.Fatalf("count %d, want %d", got.Count, tt.want.Count)
			}
			for _, f := range []struct {
				name      string
				got, want float64
			}{{"mean", got.Mean, tt.want.Mean}, {"std", got.Std, tt.want.Std}, {"min", got.Min, tt.want.Min}, {"max", got.Max, tt.want.Max},
				{"p50", got.P50, tt.want.P50}, {"p90", got.P90, tt.want.P90}, {"p99", got.P99, tt.want.P99}} {
				if !near(f.got, f.want) {
					t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
				}
			}
			if !slices.Equal(in, tt.xs) {
				t.Errorf("Describe reordered its input: %v", tt.xs)
			}
		})
	}
}

func TestPercentileEdges(t *testing.T) {
	xs := []float64{10, 0, 5}
	for p, want := range map[float64]float64{0: 0, 25: 2.5, 50: 5, 75: 7.5, 100: 10, -3: 0, 140: 10} {
		if got := Percentile(xs, p); !near(got, want) {
			t.Errorf("Percentile(%v, %v) = %v, want %v", xs, p, got, want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("empty sample: %v", got)
	}
}

func TestCDF(t *testing.T) {
	v, f := CDF([]float64{3, 1, 2, 2})
	if !slices.Equal(v, []float64{1, 2, 2, 3}) || !slices.Equal(f, []float64{0.25, 0.5, 0.75, 1}) {
		t.Errorf("CDF = %v %v", v, f)
	}
}
