package audioproc

// The Whisper extractor takes a 400-point DFT per frame (n_fft 400, not a
// power of two). realFFT computes exactly that transform: the 400 real
// samples are packed into 200 complex ones (even samples real, odd samples
// imaginary), a mixed-radix 200-point FFT (200 = 2·2·2·5·5) runs over them,
// and the two interleaved half-length spectra are separated and combined
// into the 201 non-negative-frequency bins. Each stage adds its products in
// a fixed order, every product rounded explicitly, so the output bits do
// not depend on the machine.

const (
	halfFFT  = FFTSize / 2 // complex points after packing
	fftBins  = FFTSize/2 + 1
	maxRadix = 5
)

// realFFT holds the twiddles of the 400-point real transform. It is built
// per LogMel call (a few microseconds) rather than shared, so the package
// keeps no state.
type realFFT struct {
	// radices factor halfFFT; the recursion peels them off in this order.
	radices [5]int
	// wr, wi: W_200^j = exp(-2πij/200) for j in [0, 200).
	wr, wi [halfFFT]float64
	// pr, pi: W_400^k for k in [0, 200], the split step's twiddles.
	pr, pi [fftBins]float64
	// zr, zi: the packed input, then its 200-point spectrum.
	zr, zi [halfFFT]float64
}

func newRealFFT() *realFFT {
	f := &realFFT{radices: [5]int{2, 2, 2, 5, 5}}
	for j := range halfFFT {
		turns := float64(2*j) / halfFFT // angle 2πj/200 in half-turns
		f.wr[j] = cosPi(turns)
		f.wi[j] = -sinPi(turns)
	}
	for k := range fftBins {
		turns := float64(2*k) / FFTSize
		f.pr[k] = cosPi(turns)
		f.pi[k] = -sinPi(turns)
	}
	return f
}

// transform sets outR/outI (length FFTSize/2+1) to the DFT of the FFTSize
// real samples in x.
func (f *realFFT) transform(outR, outI []float64, x *[FFTSize]float64) {
	for m := range halfFFT {
		f.zr[m] = x[2*m]
		f.zi[m] = x[2*m+1]
	}
	var sr, si [halfFFT]float64
	f.fft(sr[:], si[:], 0, 1, halfFFT, 0)
	for k := range fftBins {
		a := k % halfFFT
		b := (halfFFT - k) % halfFFT
		ar, ai := sr[a], si[a]
		br, bi := sr[b], si[b]
		// E = (Z[k] + conj Z[M-k]) / 2 is the spectrum of the even samples,
		// O = (Z[k] - conj Z[M-k]) / 2i that of the odd ones.
		// Halving is exact, but the compiler turns it into a multiply by 0.5
		// it could fuse with the add below; the conversions pin it.
		er := float64((ar + br) / 2)
		ei := float64((ai - bi) / 2)
		or := float64((ai + bi) / 2)
		oi := float64(-(ar - br) / 2)
		c, s := f.pr[k], f.pi[k]
		// X[k] = E[k] + W_400^k · O[k]
		outR[k] = er + (float64(c*or) - float64(s*oi))
		outI[k] = ei + (float64(c*oi) + float64(s*or))
	}
}

// fft writes into outR/outI[0:m] the m-point DFT of the packed input taken
// at f.z[off], f.z[off+stride], …; depth indexes radices. Decimation in
// time: the f sub-transforms of every f-th sample are computed into
// consecutive blocks of out, then combined in place.
func (f *realFFT) fft(outR, outI []float64, off, stride, m, depth int) {
	if m == 1 {
		outR[0] = f.zr[off]
		outI[0] = f.zi[off]
		return
	}
	radix := f.radices[depth]
	q := m / radix
	for r := range radix {
		f.fft(outR[r*q:(r+1)*q], outI[r*q:(r+1)*q], off+r*stride, stride*radix, q, depth+1)
	}
	step := halfFFT / m // W_m^j = W_200^(j·step)
	var tr, ti [maxRadix]float64
	for k := range q {
		for r := range radix {
			xr, xi := outR[r*q+k], outI[r*q+k]
			w := (r * k * step) % halfFFT
			wr, wi := f.wr[w], f.wi[w]
			tr[r] = float64(xr*wr) - float64(xi*wi)
			ti[r] = float64(xr*wi) + float64(xi*wr)
		}
		for s := range radix {
			accR, accI := tr[0], ti[0]
			for r := 1; r < radix; r++ {
				w := ((r * s) % radix) * (halfFFT / radix) // W_radix^(rs)
				wr, wi := f.wr[w], f.wi[w]
				accR += float64(tr[r]*wr) - float64(ti[r]*wi)
				accI += float64(tr[r]*wi) + float64(ti[r]*wr)
			}
			outR[k+s*q] = accR
			outI[k+s*q] = accI
		}
	}
}
