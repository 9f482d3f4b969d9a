package audioproc

import "math"

// The standard library's Sin, Cos, Exp and Log are not bit-identical across
// machines: Exp and Log run assembly on amd64 (Exp switches to an FMA path
// when the CPU has one), s390x has its own assembly for all four, and the
// pure-Go versions may be compiled with fused multiply-adds on arm64,
// ppc64 and riscv64. The filter bank, window, FFT twiddles and resampler
// kernel all feed the model, so they are computed with the functions below:
// range reduction that is exact, then a fixed-length polynomial evaluated
// with every product rounded explicitly. Floor, Frexp, Ldexp and Sqrt are
// exact or correctly rounded by definition, so any implementation of them
// gives the same bits.

// sinKernel returns sin(πy) for 0 ≤ y ≤ 1/4.
func sinKernel(y float64) float64 {
	// (-1)^k/(2k+1)!, highest order first; for |πy| ≤ π/4 the first
	// omitted term is below 2^-60 relative.
	sinCoeffs := [...]float64{
		-1.0 / 121645100408832000, // -1/19!
		1.0 / 355687428096000,     // 1/17!
		-1.0 / 1307674368000,      // -1/15!
		1.0 / 6227020800,          // 1/13!
		-1.0 / 39916800,           // -1/11!
		1.0 / 362880,              // 1/9!
		-1.0 / 5040,               // -1/7!
		1.0 / 120,                 // 1/5!
		-1.0 / 6,                  // -1/3!
	}
	z := float64(math.Pi * y)
	z2 := float64(z * z)
	p := sinCoeffs[0]
	for _, c := range sinCoeffs[1:] {
		p = float64(p*z2) + c
	}
	return z + float64(float64(z*z2)*p)
}

// cosKernel returns cos(πy) for 0 ≤ y ≤ 1/4.
func cosKernel(y float64) float64 {
	// (-1)^k/(2k)!, highest order first.
	cosCoeffs := [...]float64{
		-1.0 / 6402373705728000, // -1/18!
		1.0 / 20922789888000,    // 1/16!
		-1.0 / 87178291200,      // -1/14!
		1.0 / 479001600,         // 1/12!
		-1.0 / 3628800,          // -1/10!
		1.0 / 40320,             // 1/8!
		-1.0 / 720,              // -1/6!
		1.0 / 24,                // 1/4!
		-1.0 / 2,                // -1/2!
	}
	z := float64(math.Pi * y)
	z2 := float64(z * z)
	p := cosCoeffs[0]
	for _, c := range cosCoeffs[1:] {
		p = float64(p*z2) + c
	}
	return 1 + float64(z2*p)
}

// reduceHalfTurns returns x mod 2 in [0, 2). The subtraction is exact:
// both operands are multiples of the spacing of x's binade.
func reduceHalfTurns(x float64) float64 {
	return x - 2*math.Floor(x/2)
}

// sinPi returns sin(πx) for finite x.
func sinPi(x float64) float64 {
	if x < 0 {
		return -sinPi(-x)
	}
	r := reduceHalfTurns(x)
	sign := 1.0
	if r >= 1 {
		r -= 1 // sin(π(r+1)) = -sin(πr); exact
		sign = -1
	}
	if r > 0.5 {
		r = 1 - r // sin(π(1-r)) = sin(πr); exact (Sterbenz)
	}
	if r <= 0.25 {
		return sign * sinKernel(r)
	}
	return sign * cosKernel(0.5-r) // exact (Sterbenz)
}

// cosPi returns cos(πx) for finite x.
func cosPi(x float64) float64 {
	r := reduceHalfTurns(math.Abs(x))
	if r > 1 {
		r = 2 - r // cos(π(2-r)) = cos(πr); exact
	}
	sign := 1.0
	if r > 0.5 {
		r = 1 - r // cos(π(1-r)) = -cos(πr); exact
		sign = -1
	}
	if r <= 0.25 {
		return sign * cosKernel(r)
	}
	return sign * sinKernel(0.5-r)
}

// Natural-log constants: ln2Hi has its low 32 bits zero so e·ln2Hi is exact
// for any binary exponent e (the fdlibm split).
const (
	ln2Hi    = 6.93147180369123816490e-01
	ln2Lo    = 1.90821492927058770002e-10
	invLn2   = 1.44269504088896338700e+00
	invLn10  = 0.43429448190325182765
	sqrtHalf = 0.70710678118654752440
)

// logDet returns ln x for finite x > 0.
func logDet(x float64) float64 {
	// 1/(2k+1) for k = 11 … 1: ln m = 2s(1 + s²/3 + s⁴/5 + …) with
	// s = (m-1)/(m+1), |s| ≤ 0.1716, so the omitted s²⁴ term is below 2^-60.
	atanhCoeffs := [...]float64{
		1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13,
		1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3,
	}
	m, e := math.Frexp(x) // x = m·2^e, m in [0.5, 1)
	if m < sqrtHalf {
		m *= 2 // exact
		e--
	}
	s := (m - 1) / (m + 1) // m-1 exact: m is within a factor 2 of 1
	s2 := float64(s * s)
	p := atanhCoeffs[0]
	for _, c := range atanhCoeffs[1:] {
		p = float64(p*s2) + c
	}
	lnm := 2*s + float64(2*float64(float64(s*s2)*p))
	fe := float64(e)
	return float64(fe*ln2Hi) + (float64(fe*ln2Lo) + lnm)
}

// log10Det returns log10 x for finite x > 0.
func log10Det(x float64) float64 {
	return float64(logDet(x) * invLn10)
}

// expDet returns e^x for |x| ≤ 700.
func expDet(x float64) float64 {
	// 1/k! for k = 15 … 1; with |r| ≤ ln2/2 the omitted r^16/16! is below
	// 2^-65.
	expCoeffs := [...]float64{
		1.0 / 1307674368000, 1.0 / 87178291200, 1.0 / 6227020800, 1.0 / 479001600,
		1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040,
		1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1,
	}
	k := math.Floor(float64(x*invLn2) + 0.5)
	r := (x - float64(k*ln2Hi)) - float64(k*ln2Lo) // k*ln2Hi exact
	p := expCoeffs[0]
	for _, c := range expCoeffs[1:] {
		p = float64(p*r) + c
	}
	return math.Ldexp(1+float64(p*r), int(k))
}
