package bench

import (
	"math"
	"math/rand/v2"
	"time"
)

// Arrivals draws the gaps between request arrivals of an open-loop load: a
// Poisson process at Rate requests per second when Burstiness is 1, and
// gamma-distributed gaps with shape Burstiness and the same mean 1/Rate
// otherwise (below 1 burstier, above 1 more even), as vllm bench serve
// draws them. An infinite Rate sends everything at once. It is pure: the
// caller owns the clock.
type Arrivals struct {
	rate, shape float64
	rng         *rand.Rand
}

// NewArrivals returns a generator seeded for reproducible schedules.
// burstiness <= 0 is taken as 1.
func NewArrivals(rate, burstiness float64, seed uint64) *Arrivals {
	if !(burstiness > 0) {
		burstiness = 1
	}
	return &Arrivals{rate: rate, shape: burstiness, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Next is the gap before the next arrival.
func (a *Arrivals) Next() time.Duration {
	if math.IsInf(a.rate, 1) || !(a.rate > 0) {
		return 0
	}
	var seconds float64
	if a.shape == 1 {
		seconds = a.rng.ExpFloat64() / a.rate
	} else {
		// Gamma(k, θ) has mean kθ; θ = 1/(rate·k) keeps the mean at 1/rate.
		seconds = gamma(a.rng, a.shape) / (a.rate * a.shape)
	}
	return time.Duration(seconds * float64(time.Second))
}

// gamma draws from Gamma(shape, 1) by Marsaglia and Tsang's method; a shape
// below 1 is boosted to shape+1 and scaled back by U^(1/shape).
func gamma(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		u := rng.Float64()
		for u == 0 {
			u = rng.Float64()
		}
		return gamma(rng, shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	// Each round accepts with probability above 0.95; the bound only stops
	// a broken generator from spinning forever.
	for range 1000 {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
	return d
}
