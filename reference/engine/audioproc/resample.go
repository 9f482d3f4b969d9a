package audioproc

import (
	"math"
)

// Sample rates Decode and Resample accept. Below 1 kHz nothing is speech;
// the upper bound covers 352.8 kHz DXD and keeps the resampler's kernel
// table bounded (about 13 MB in the worst case, a rate coprime to 16 kHz).
const (
	MinSampleRate = 1000
	MaxSampleRate = 384000
)

// Resampler design: a Kaiser-windowed sinc evaluated on the exact rational
// time grid. Upstream resamples with soxr's "HQ" mode (librosa.resample's
// default, used by vLLM and by the HF/Qwen loaders); bit-matching soxr is
// not the goal, a band-limited interpolator of comparable quality is.
const (
	// resampleZeroCrossings is the kernel half-width in zero crossings of
	// the cutoff-frequency sinc.
	resampleZeroCrossings = 32
	// resampleRolloff places the cutoff at 95% of the lower Nyquist
	// frequency, leaving room for the window's transition band.
	resampleRolloff = 0.95
	// resampleKaiserBeta gives about 90 dB of stopband attenuation
	// (A ≈ β/0.1102 + 8.7).
	resampleKaiserBeta = 9.0
	// resampleMaxPhases bounds the kernel table. When the reduced ratio has
	// more output phases than this (rates nearly coprime to the target),
	// the kernel is interpolated linearly between table rows, with an
	// error near 1e-6 of full scale.
	resampleMaxPhases = 1024
)

// ResampledLength is the number of samples Resample returns for n input
// samples: ceil(n·toRate/fromRate), the length librosa.resample(fix=True)
// produces.
func ResampledLength(n, fromRate, toRate int) int {
	if n <= 0 || fromRate <= 0 || toRate <= 0 {
		return 0
	}
	num := int64(n) * int64(toRate)
	return int((num + int64(fromRate) - 1) / int64(fromRate))
}

// Resample converts mono samples from fromRate to toRate. Equal rates
// return samples itself, untouched. Output sample n is the band-limited
// interpolation of the input at time n·fromRate/toRate input samples; the
// input is taken as zero outside its ends. The same input gives the same
// bits on every machine.
func Resample(samples []float32, fromRate, toRate int) ([]float32, error) {
	for _, r := range [2]int{fromRate, toRate} {
		if r < MinSampleRate || r > MaxSampleRate {
			return nil, badAudio(ErrUnsupportedFormat, "audio cannot be resampled from %d Hz to %d Hz; rates must be within %d–%d Hz",
				fromRate, toRate, MinSampleRate, MaxSampleRate)
		}
	}
	if fromRate == toRate {
		return samples, nil
	}
	for i, v := range samples {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, badAudio(ErrNonFiniteSample, "audio sample %d is %v, not a number", i, v)
		}
	}
	k := newResampleKernel(fromRate, toRate)
	out := make([]float32, ResampledLength(len(samples), fromRate, toRate))
	taps := make([]float64, 2*k.halfTaps)
	for n := range out {
		pos := int64(n) * k.down // time of output n, in units of 1/up input samples
		center := int(pos / k.up)
		k.coefficients(taps, pos%k.up)
		var acc float64
		first := center - k.halfTaps + 1
		for j, c := range taps {
			idx := first + j
			if idx < 0 || idx >= len(samples) {
				continue
			}
			acc += float64(float64(samples[idx]) * c)
		}
		out[n] = float32(acc)
	}
	return out, nil
}

// resampleKernel is the windowed-sinc table for one rate pair.
type resampleKernel struct {
	up, down int64 // toRate/g and fromRate/g, g = gcd
	halfTaps int   // taps on each side of the output time
	phases   int64 // table rows (plus one when interpolating)
	exact    bool  // one row per output phase, no interpolation
	table    []float64
}

func newResampleKernel(fromRate, toRate int) *resampleKernel {
	g := gcd(fromRate, toRate)
	k := &resampleKernel{up: int64(toRate / g), down: int64(fromRate / g)}
	// Cutoff in cycles per input sample, relative to the input Nyquist.
	cutoff := resampleRolloff
	if toRate < fromRate {
		cutoff = float64(resampleRolloff*float64(toRate)) / float64(fromRate)
	}
	halfWidth := resampleZeroCrossings / cutoff // in input samples
	k.halfTaps = int(math.Ceil(halfWidth))
	rows := k.up
	k.exact = rows <= resampleMaxPhases
	if !k.exact {
		k.phases = resampleMaxPhases
		rows = resampleMaxPhases + 1 // the extra row is phase 1.0
	} else {
		k.phases = k.up
	}
	width := 2 * k.halfTaps
	k.table = make([]float64, int(rows)*width)
	i0Beta := besselI0(resampleKaiserBeta)
	for row := range rows {
		phase := float64(row) / float64(k.phases) // fraction of an input sample
		for j := range width {
			// Tap j multiplies input sample center-halfTaps+1+j, which sits
			// phase-(j-halfTaps+1) input samples before the output time.
			tau := phase - float64(j-k.halfTaps+1)
			k.table[int(row)*width+j] = kernelAt(tau, cutoff, halfWidth, i0Beta)
		}
	}
	return k
}

// coefficients fills taps for an output whose time lies frac/up input
// samples past an input sample.
func (k *resampleKernel) coefficients(taps []float64, frac int64) {
	width := len(taps)
	if k.exact {
		copy(taps, k.table[int(frac)*width:int(frac+1)*width])
		return
	}
	scaled := frac * k.phases
	row := int(scaled / k.up)
	alpha := float64(scaled%k.up) / float64(k.up)
	a := k.table[row*width : (row+1)*width]
	b := k.table[(row+1)*width : (row+2)*width]
	for j := range taps {
		taps[j] = a[j] + float64(alpha*(b[j]-a[j]))
	}
}

// kernelAt is the low-pass interpolation kernel at tau input samples from
// the output time: cutoff·sinc(cutoff·tau) under a Kaiser window of
// half-width halfWidth. Its taps sum to about 1 at every phase, so DC passes
// with unit gain.
func kernelAt(tau, cutoff, halfWidth, i0Beta float64) float64 {
	v := tau / halfWidth
	if v <= -1 || v >= 1 {
		return 0
	}
	u := float64(cutoff * tau)
	sinc := 1.0
	if u != 0 {
		sinc = sinPi(u) / float64(math.Pi*u)
	}
	window := besselI0(float64(resampleKaiserBeta*math.Sqrt(1-float64(v*v)))) / i0Beta
	return float64(float64(cutoff*sinc) * window)
}

// besselI0 is the modified Bessel function of order zero by its power
// series Σ ((x/2)^k / k!)², summed until the terms stop mattering.
func besselI0(x float64) float64 {
	q := float64(float64(x/2) * float64(x/2))
	sum, term := 1.0, 1.0
	for k := 1; k < 100; k++ {
		term = float64(term*q) / float64(k*k)
		sum += term
		if term < float64(sum*0x1p-60) {
			break
		}
	}
	return sum
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Downmix averages the channels of a into one, as librosa.to_mono and
// vLLM's ChannelReduction.MEAN do (numpy.mean over the channel axis: a
// float32 sum in channel order, then one division). Mono audio is returned
// as a copy.
func Downmix(a Audio) []float32 {
	if a.Channels <= 1 {
		return append([]float32(nil), a.Samples...)
	}
	frames := a.Frames()
	out := make([]float32, frames)
	ch := float32(a.Channels)
	for f := range frames {
		row := a.Samples[f*a.Channels : (f+1)*a.Channels]
		sum := row[0]
		for _, v := range row[1:] {
			sum += v
		}
		out[f] = sum / ch
	}
	return out
}

// Mono16k turns decoded audio into what LogMel reads: channels averaged,
// then resampled to SampleRate (audio already at SampleRate is not
// touched by the resampler).
func Mono16k(a Audio) ([]float32, error) {
	return Resample(Downmix(a), a.SampleRate, SampleRate)
}
