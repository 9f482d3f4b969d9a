package bench

import (
	"math"
	"slices"
)

// Dist summarises a sample: the figures every latency row of a report
// shows. Empty samples summarise to zeros with Count 0, so a report never
// carries NaN (which JSON cannot encode).
type Dist struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	Std   float64 `json:"std"`
	Min   float64 `json:"min"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// Describe computes Dist over xs. Std is the population standard deviation
// and percentiles interpolate linearly between order statistics, both as
// numpy computes them by default, so figures compare with vllm bench serve.
func Describe(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	mean := sum / float64(len(s))
	var sq float64
	for _, x := range s {
		sq += (x - mean) * (x - mean)
	}
	return Dist{
		Count: len(s),
		Mean:  mean,
		Std:   math.Sqrt(sq / float64(len(s))),
		Min:   s[0],
		P50:   percentileSorted(s, 50),
		P90:   percentileSorted(s, 90),
		P99:   percentileSorted(s, 99),
		Max:   s[len(s)-1],
	}
}

// Percentile is the p-th percentile (0 <= p <= 100) of xs with linear
// interpolation: the value at rank p/100·(n-1) of the sorted sample. It is
// 0 for an empty sample.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []float64, p float64) float64 {
	p = min(max(p, 0), 100)
	rank := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	if lo == hi {
		return s[lo]
	}
	frac := rank - float64(lo)
	return s[lo] + (s[hi]-s[lo])*frac
}

// CDF returns the empirical distribution of xs as step points: the sorted
// values and, for each, the fraction of the sample at or below it.
func CDF(xs []float64) (values, fractions []float64) {
	values = slices.Clone(xs)
	slices.Sort(values)
	fractions = make([]float64, len(values))
	for i := range values {
		fractions[i] = float64(i+1) / float64(len(values))
	}
	return values, fractions
}
