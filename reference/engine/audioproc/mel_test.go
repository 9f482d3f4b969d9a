package audioproc

import (
	"errors"
	"hash/fnv"
	"math"
	"testing"
)

func sine(n, rate int, hz, amp float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(amp * math.Sin(2*math.Pi*hz*float64(i)/float64(rate)))
	}
	return out
}

func peakBin(f Features, frame int) int {
	best := 0
	for b := range NumMelBins {
		if f.Mel[b][frame] > f.Mel[best][frame] {
			best = b
		}
	}
	return best
}

// FrameCount = n // hop: the centred STFT gives 1 + n//160 frames and the
// extractor drops the last. Published anchors: Whisper's 30 s window
// (n_samples 480000) has nb_max_frames 3000, and Qwen3-Omni's
// preprocessor_config pairs n_samples 4800000 with nb_max_frames 30000.
func TestFrameCount(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{-5, 0}, {0, 0}, {1, 0}, {159, 0}, {160, 1}, {161, 1}, {319, 1}, {320, 2},
		{16000, 100}, {480000, 3000}, {4800000, 30000},
	} {
		if got := FrameCount(c.n); got != c.want {
			t.Errorf("FrameCount(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

func TestPadToHop(t *testing.T) {
	x := make([]float32, 160)
	if got := PadToHop(x); &got[0] != &x[0] {
		t.Error("a multiple of the hop must come back as is")
	}
	y := []float32{1, 2, 3}
	got := PadToHop(y)
	if len(got) != 160 || got[0] != 1 || got[2] != 3 || got[159] != 0 {
		t.Errorf("PadToHop(3 samples) = %d samples, head %v", len(got), got[:3])
	}
	if FrameCount(len(PadToHop(make([]float32, 161)))) != 2 {
		t.Error("vLLM-style padding of 161 samples must give ceil(161/160) = 2 frames")
	}
}

// numpy's own documentation example: np.pad([1, 2, 3, 4, 5], (2, 3),
// 'reflect') is [3, 2, 1, 2, 3, 4, 5, 4, 3, 2]; pads longer than the signal
// keep reflecting: np.pad([1, 2, 3], (4, 0), 'reflect') is
// [1, 2, 3, 2, 1, 2, 3]; a single sample is repeated (numpy's legacy
// singleton rule).
func TestReflectIndex(t *testing.T) {
	values := func(signal []int, padLeft, total int) []int {
		out := make([]int, total)
		for i := range out {
			out[i] = signal[reflectIndex(i-padLeft, len(signal))]
		}
		return out
	}
	cases := []struct {
		signal         []int
		padLeft, total int
		want           []int
	}{
		{[]int{1, 2, 3, 4, 5}, 2, 10, []int{3, 2, 1, 2, 3, 4, 5, 4, 3, 2}},
		{[]int{1, 2, 3}, 4, 7, []int{1, 2, 3, 2, 1, 2, 3}},
		{[]int{7}, 2, 5, []int{7, 7, 7, 7, 7}},
	}
	for _, c := range cases {
		got := values(c.signal, c.padLeft, c.total)
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("reflect pad of %v = %v, want %v", c.signal, got, c.want)
				break
			}
		}
	}
}

func TestLogMelShapeAndErrors(t *testing.T) {
	for _, n := range []int{160, 161, 399, 400, 1000, 16000} {
		f, err := LogMel(sine(n, SampleRate, 440, 0.3))
		if err != nil {
			t.Fatalf("%d samples: %v", n, err)
		}
		if f.Frames != FrameCount(n) || len(f.Mel) != NumMelBins {
			t.Fatalf("%d samples: %d frames × %d bins, want %d × %d", n, f.Frames, len(f.Mel), FrameCount(n), NumMelBins)
		}
		for b, row := range f.Mel {
			if len(row) != f.Frames {
				t.Fatalf("%d samples: bin %d has %d frames", n, b, len(row))
			}
		}
	}
	for _, n := range []int{0, 1, 159} {
		if _, err := LogMel(make([]float32, n)); !errors.Is(err, ErrTooShort) {
			t.Errorf("%d samples: err = %v, want ErrTooShort", n, err)
		}
	}
	bad := make([]float32, 400)
	bad[17] = float32(math.Inf(1))
	if _, err := LogMel(bad); !errors.Is(err, ErrNonFiniteSample) {
		t.Errorf("infinite sample: err = %v", err)
	}
}

// Silence: every mel energy is 0, floored at 1e-10, log10 = -10, which is
// also the maximum, so the clamp does nothing and (x+4)/4 = -1.5 exactly.
func TestLogMelSilence(t *testing.T) {
	f, err := LogMel(make([]float32, 1600))
	if err != nil {
		t.Fatal(err)
	}
	for b, row := range f.Mel {
		for i, v := range row {
			if v != -1.5 {
				t.Fatalf("bin %d frame %d = %v, want -1.5", b, i, v)
			}
		}
	}
}

// The peak bins, by hand from the Slaney formulas (audio_utils.hertz_to_mel
// and mel_to_hertz): mel_max = hertz_to_mel(8000) = 15 + ln 8·27/ln 6.4 =
// 45.24564, so the 130 filter edges are Δ = 45.24564/129 = 0.350741 mel
// apart and filter b is centred on edge b+1.
//
// 1000 Hz = 15 mel = 42.77 Δ: between the centres of edges 42 (14.731 mel =
// 200/3·14.731 = 982.1 Hz) and 43 (15.082 mel = 1000·e^(0.082·ln6.4/27) =
// 1005.7 Hz); nearer edge 43, so filter 42: its rising slope gives the tone
// weight (1000-982.1)/23.6 = 0.76 against filter 41's falling 0.24.
//
// 4000 Hz = 15 + ln 4·27/ln 6.4 = 35.164 mel = 100.26 Δ: between edges 100
// (3975.4 Hz) and 101 (4072.5 Hz), nearer 100, so filter 99.
//
// Both tones sit on FFT bins (40 Hz spacing), where a periodic Hann window
// puts 1/4 of the centre bin's power in each neighbour and none further, so
// the triangle weights at f0 and f0±40 Hz decide the peak as above.
func TestLogMelTonePeaks(t *testing.T) {
	for _, c := range []struct {
		hz   float64
		want int
	}{
		{1000, 42},
		{4000, 99},
	} {
		f, err := LogMel(sine(SampleRate, SampleRate, c.hz, 0.5))
		if err != nil {
			t.Fatal(err)
		}
		for _, frame := range []int{10, 50, 90} {
			if got := peakBin(f, frame); got != c.want {
				t.Errorf("%v Hz frame %d: peak at bin %d, want %d", c.hz, frame, got, c.want)
			}
		}
	}
}

// A pure tone leaves far bins more than 80 dB down, so the clamp to
// (max - 8) is active: after (x+4)/4 the spread is exactly 8/4 = 2.
func TestLogMelClamp(t *testing.T) {
	f, err := LogMel(sine(SampleRate, SampleRate, 1000, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
	for _, row := range f.Mel {
		for _, v := range row {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if math.Abs(float64(hi-lo)-2) > 1e-6 {
		t.Errorf("max %v - min %v = %v, want 2", hi, lo, hi-lo)
	}
}

// mel_max for 8 kHz is the constant the original WhisperFeatureExtractor
// hard-coded (max_mel = 45.245640471924965) before it moved to
// audio_utils.mel_filter_bank.
func TestMelScaleConstants(t *testing.T) {
	if got := hertzToMelSlaney(8000); math.Abs(got-45.245640471924965) > 1e-13 {
		t.Errorf("hertz_to_mel(8000) = %.17g, want 45.245640471924965", got)
	}
	for _, hz := range []float64{0, 200, 999, 1000, 1001, 4000, 8000} {
		if back := melToHertzSlaney(hertzToMelSlaney(hz)); math.Abs(back-hz) > 1e-9 {
			t.Errorf("mel round trip of %v Hz = %v", hz, back)
		}
	}
}

// Filter 0 by hand: edges 0, 23.3828 and 46.7655 Hz (linear region,
// 200/3 Hz per mel, Δ = 0.3507414 mel). Only FFT bin 1 (40 Hz) falls
// inside, on the falling slope: (46.7655-40)/23.3828 = 0.289338, times the
// Slaney norm 2/(46.7655-0) = 0.0427666, is 0.0123740.
//
// Filter 99 in the log region: edges 99, 100, 101 are 1000·e^((iΔ-15)·
// ln6.4/27) = 3880.712, 3975.430 and 4072.459 Hz. FFT bin 100 (4000 Hz) is
// on the falling slope: (4072.459-4000)/(4072.459-3975.430) = 0.746767,
// times 2/(4072.459-3880.712) = 0.0104304, is 0.0077892.
func TestMelFilterBankByHand(t *testing.T) {
	bank := newMelFilterBank()
	if bank.first[0] != 1 || len(bank.weights[0]) != 1 {
		t.Fatalf("filter 0 covers bins %d..%d, want only bin 1", bank.first[0], bank.first[0]+len(bank.weights[0])-1)
	}
	if got := bank.weights[0][0]; math.Abs(got-0.0123740) > 1e-7 {
		t.Errorf("filter 0 weight at 40 Hz = %.7f, want 0.0123740", got)
	}
	if k := 100 - bank.first[99]; k < 0 || k >= len(bank.weights[99]) {
		t.Fatal("filter 99 does not cover bin 100")
	} else if got := bank.weights[99][k]; math.Abs(got-0.0077892) > 1e-7 {
		t.Errorf("filter 99 weight at 4000 Hz = %.7f, want 0.0077892", got)
	}
	for b := range NumMelBins {
		if len(bank.weights[b]) == 0 {
			t.Errorf("filter %d is empty", b)
		}
	}
	// The last filter's upper edge is 8000 Hz exactly at the Nyquist bin,
	// where the triangle reaches 0.
	last := NumMelBins - 1
	if end := bank.first[last] + len(bank.weights[last]) - 1; end >= fftBins-1 {
		t.Errorf("last filter reaches bin %d, want it to stop before the Nyquist bin", end)
	}
}

func TestLogMelDeterministic(t *testing.T) {
	x := sine(3*SampleRate, SampleRate, 523.25, 0.4)
	for i := range x {
		x[i] += float32(0.05 * math.Sin(float64(i)*0.37))
	}
	a, err := LogMel(x)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := LogMel(x)
	for bin := range a.Mel {
		for t2 := range a.Mel[bin] {
			if math.Float32bits(a.Mel[bin][t2]) != math.Float32bits(b.Mel[bin][t2]) {
				t.Fatalf("bin %d frame %d differs between runs", bin, t2)
			}
		}
	}
}

// TestLogMelPinnedBits pins the exact output bits of a fixed input. The
// value was recorded on linux/amd64; because every operation in the
// pipeline is rounded explicitly and no library transcendental is used, the
// same bits must come out on every architecture. A change here means the
// numerics changed and needs a deliberate update.
func TestLogMelPinnedBits(t *testing.T) {
	x := sine(SampleRate, 44100, 1234.5, 0.3)
	resampled, err := Resample(x, 44100, SampleRate)
	if err != nil {
		t.Fatal(err)
	}
	f, err := LogMel(resampled)
	if err != nil {
		t.Fatal(err)
	}
	h := fnv.New64a()
	var buf [4]byte
	for _, row := range f.Mel {
		for _, v := range row {
			bits := math.Float32bits(v)
			buf[0], buf[1], buf[2], buf[3] = byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24)
			h.Write(buf[:])
		}
	}
	const want = 0xca6d699e64d5a4cb
	if got := h.Sum64(); got != want {
		t.Errorf("log-mel bits hash = %#x, want %#x", got, uint64(want))
	}
}
