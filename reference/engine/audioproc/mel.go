package audioproc

import (
	"math"
	"time"
)

// Qwen3-Omni's feature extractor settings (preprocessor_config.json) and the
// WhisperFeatureExtractor constants they select. docs/multimodal/audio.md
// cites the upstream file of each.
const (
	// SampleRate is the rate the extractor expects (sampling_rate).
	SampleRate = 16000
	// NumMelBins is the number of mel filters (feature_size).
	NumMelBins = 128
	// FFTSize is the DFT length and window length, 25 ms (n_fft).
	FFTSize = 400
	// HopLength is the frame step, 10 ms (hop_length).
	HopLength = 160
	// MelMinHz and MelMaxHz bound the filter bank (mel_filter_bank's
	// min_frequency and max_frequency as the extractor calls it).
	MelMinHz = 0.0
	MelMaxHz = 8000.0

	// melFloor is the power floor before log10 (spectrogram's mel_floor).
	melFloor = 1e-10
	// dynamicRange is how far below the maximum, in log10 units, values are
	// clamped (log_spec.max() - 8.0).
	dynamicRange = 8.0
)

// Features is a log-mel spectrogram: Mel[b][t] is mel bin b of frame t.
type Features struct {
	// Frames is the number of valid frames, FrameCount of the sample count.
	Frames int
	// Mel has NumMelBins rows of Frames values each; the rows share one
	// backing array.
	Mel [][]float32
}

// FrameCount is the number of feature frames the extractor produces for
// numSamples samples: the centred STFT yields numSamples/HopLength + 1
// frames and the extractor drops the last one. It equals the sum of the
// feature_attention_mask the Qwen3-Omni processor returns for one unpadded
// audio (transformers after PR #39221; see docs/multimodal/audio.md), and is
// what the number of audio placeholder tokens is computed from.
func FrameCount(numSamples int) int {
	if numSamples <= 0 {
		return 0
	}
	return numSamples / HopLength
}

// FramesDuration is the length of audio that frames feature frames span,
// frames·HopLength/SampleRate (10 ms a frame). As Limits.MaxDuration it
// refuses exactly the audio that would give more than frames frames: audio
// of n samples at any rate r within that duration resamples to at most
// frames·HopLength samples at SampleRate (ResampledLength rounds up, and
// frames·HopLength is a whole number of hops, which PadToHop leaves as it
// is), and audio one sample longer resamples to at least one sample more,
// which PadToHop pads to one frame more.
func FramesDuration(frames int) time.Duration {
	return time.Duration(frames) * HopLength * time.Second / SampleRate
}

// PadToHop returns samples followed by zeros up to the next multiple of
// HopLength (samples itself when it is one already). vLLM pads every audio
// this way before calling the Qwen3-Omni processor, so under vLLM an audio
// of n samples yields FrameCount(len(PadToHop(x))) = ceil(n/HopLength)
// frames; call LogMel(PadToHop(x)) to reproduce that.
func PadToHop(samples []float32) []float32 {
	rem := len(samples) % HopLength
	if rem == 0 {
		return samples
	}
	out := make([]float32, len(samples)+HopLength-rem)
	copy(out, samples)
	return out
}

// LogMel computes the log-mel features of 16 kHz mono samples exactly as
// WhisperFeatureExtractor's NumPy path does for one unpadded audio:
//
//   - periodic Hann window of FFTSize, STFT with hop HopLength over the
//     signal reflect-padded by FFTSize/2 on both sides,
//   - power spectrum |X|² of the FFTSize/2+1 bins,
//   - Slaney mel filter bank (NumMelBins filters, MelMinHz–MelMaxHz,
//     area-normalised), floor at 1e-10, log10,
//   - the last frame dropped,
//   - clamp to (maximum over all bins and frames − 8), then (x + 4) / 4.
//
// The maximum is taken over this audio's frames only: the single-item,
// unpadded semantics of the Qwen3-Omni processor (padding=True with one
// audio pads nothing). It returns ErrTooShort below HopLength samples and
// ErrNonFiniteSample for NaN or infinite input.
func LogMel(samples []float32) (Features, error) {
	frames := FrameCount(len(samples))
	if frames == 0 {
		return Features{}, badAudio(ErrTooShort, "the audio is %d samples long; it needs at least %d",
			len(samples), HopLength)
	}
	for i, v := range samples {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return Features{}, badAudio(ErrNonFiniteSample, "audio sample %d is %v, not a number", i, v)
		}
	}

	window := hannWindow()
	bank := newMelFilterBank()
	dft := newRealFFT()

	data := make([]float32, NumMelBins*frames)
	var frame [FFTSize]float64
	var specR, specI [fftBins]float64
	var power [fftBins]float64
	for t := range frames {
		// Frame t of the padded signal starts at t·hop; in the original
		// signal that is t·hop - FFTSize/2.
		start := t*HopLength - FFTSize/2
		for j := range FFTSize {
			x := float64(samples[reflectIndex(start+j, len(samples))])
			frame[j] = float64(x * window[j])
		}
		dft.transform(specR[:], specI[:], &frame)
		for k := range fftBins {
			// NumPy stores the spectrum as complex64 before taking |X|²;
			// the squares of float32 values are exact in float64.
			re := float64(float32(specR[k]))
			im := float64(float32(specI[k]))
			power[k] = float64(re*re) + float64(im*im)
		}
		for b := range NumMelBins {
			e := bank.apply(b, power[:])
			data[b*frames+t] = float32(log10Det(max(e, melFloor)))
		}
	}

	peak := data[0]
	for _, v := range data[1:] {
		peak = max(peak, v)
	}
	floor := peak - dynamicRange
	for i, v := range data {
		data[i] = float32(max(v, floor)+4) / 4
	}

	mel := make([][]float32, NumMelBins)
	for b := range mel {
		mel[b] = data[b*frames : (b+1)*frames : (b+1)*frames]
	}
	return Features{Frames: frames, Mel: mel}, nil
}

// reflectIndex maps an index of the reflect-padded signal to the original
// signal of length n, as numpy.pad(mode="reflect") does: the edge sample is
// not repeated, and pads longer than the signal keep reflecting (the
// extension is periodic with period 2(n-1)).
func reflectIndex(i, n int) int {
	if n == 1 {
		return 0
	}
	period := 2 * (n - 1)
	i %= period
	if i < 0 {
		i += period
	}
	if i >= n {
		i = period - i
	}
	return i
}

// hannWindow returns the periodic Hann window of FFTSize points,
// numpy.hanning(FFTSize+1)[:-1] = 0.5 + 0.5·cos(π(2i - FFTSize)/FFTSize).
func hannWindow() *[FFTSize]float64 {
	var w [FFTSize]float64
	for i := range FFTSize {
		w[i] = 0.5 + float64(0.5*cosPi(float64(2*i-FFTSize)/FFTSize))
	}
	return &w
}

// melFilterBank is the Slaney-style filter bank in sparse form: filter b is
// weights[b] applied to the power bins first[b], first[b]+1, ….
type melFilterBank struct {
	first   [NumMelBins]int
	weights [NumMelBins][]float64
}

// apply returns filter b's energy, summed in ascending bin order. Zero
// weights are skipped; with non-negative powers that changes no bit.
func (f *melFilterBank) apply(b int, power []float64) float64 {
	w := f.weights[b]
	p := power[f.first[b] : f.first[b]+len(w)]
	var e float64
	for i, v := range w {
		e += float64(v * p[i])
	}
	return e
}

// newMelFilterBank builds transformers' mel_filter_bank(num_frequency_bins=
// FFTSize/2+1, num_mel_filters=NumMelBins, min_frequency=MelMinHz,
// max_frequency=MelMaxHz, sampling_rate=SampleRate, norm="slaney",
// mel_scale="slaney"), step by step in the same order of operations.
func newMelFilterBank() *melFilterBank {
	dense := melFilterWeights()
	f := &melFilterBank{}
	for b := range NumMelBins {
		lo, hi := -1, -1
		for k := range fftBins {
			if dense[k][b] != 0 {
				if lo < 0 {
					lo = k
				}
				hi = k
			}
		}
		if lo < 0 {
			continue // an empty filter contributes 0 to every frame
		}
		f.first[b] = lo
		f.weights[b] = make([]float64, hi-lo+1)
		for k := lo; k <= hi; k++ {
			f.weights[b][k-lo] = dense[k][b]
		}
	}
	return f
}

// melFilterWeights returns the dense [FFTSize/2+1][NumMelBins] matrix.
func melFilterWeights() *[fftBins][NumMelBins]float64 {
	const numPoints = NumMelBins + 2
	melMin := hertzToMelSlaney(MelMinHz)
	melMax := hertzToMelSlaney(MelMaxHz)
	// numpy.linspace(melMin, melMax, numPoints): i·step + start, the last
	// point set to stop exactly.
	var filterHz [numPoints]float64
	step := (melMax - melMin) / (numPoints - 1)
	for i := range numPoints {
		mel := float64(float64(i)*step) + melMin
		if i == numPoints-1 {
			mel = melMax
		}
		filterHz[i] = melToHertzSlaney(mel)
	}
	// numpy.linspace(0, sampling_rate // 2, FFTSize/2+1); the step, 40 Hz,
	// is exact.
	var fftHz [fftBins]float64
	fftStep := float64(SampleRate/2) / (fftBins - 1)
	for k := range fftBins {
		fftHz[k] = float64(float64(k) * fftStep)
	}
	var w [fftBins][NumMelBins]float64
	for b := range NumMelBins {
		lowDiff := filterHz[b+1] - filterHz[b]
		highDiff := filterHz[b+2] - filterHz[b+1]
		enorm := 2 / (filterHz[b+2] - filterHz[b])
		for k := range fftBins {
			down := -(filterHz[b] - fftHz[k]) / lowDiff
			up := (filterHz[b+2] - fftHz[k]) / highDiff
			tri := max(0, min(down, up))
			w[k][b] = float64(tri * enorm)
		}
	}
	return &w
}

// hertzToMelSlaney is audio_utils.hertz_to_mel(freq, mel_scale="slaney"):
// linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
func hertzToMelSlaney(hz float64) float64 {
	const (
		minLogHertz = 1000.0
		minLogMel   = 15.0
	)
	logStep := 27.0 / logDet(6.4)
	mels := float64(3.0*hz) / 200.0
	if hz >= minLogHertz {
		mels = minLogMel + float64(logDet(hz/minLogHertz)*logStep)
	}
	return mels
}

// melToHertzSlaney is audio_utils.mel_to_hertz(mels, mel_scale="slaney").
func melToHertzSlaney(mels float64) float64 {
	const (
		minLogHertz = 1000.0
		minLogMel   = 15.0
	)
	logStep := logDet(6.4) / 27.0
	hz := float64(200.0*mels) / 3.0
	if mels >= minLogMel {
		hz = float64(minLogHertz * expDet(float64(logStep*(mels-minLogMel))))
	}
	return hz
}
