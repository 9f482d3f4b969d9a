package audioproc

import (
	"errors"
	"math"
	"testing"
)

func TestResampledLength(t *testing.T) {
	// ceil(n·to/from), librosa.resample(fix=True)'s length.
	for _, c := range []struct{ n, from, to, want int }{
		{0, 44100, 16000, 0},
		{44100, 44100, 16000, 16000},
		{1000, 44100, 16000, 363}, // 362.81…
		{3, 48000, 16000, 1},
		{4, 48000, 16000, 2}, // 1.33…
		{1, 8000, 16000, 2},
		{22050, 22050, 16000, 16000},
		{7, 16000, 16000, 7},
	} {
		if got := ResampledLength(c.n, c.from, c.to); got != c.want {
			t.Errorf("ResampledLength(%d, %d, %d) = %d, want %d", c.n, c.from, c.to, got, c.want)
		}
	}
}

func TestResampleSameRateIsUntouched(t *testing.T) {
	x := []float32{0.1, -0.2, 0.3, float32(math.Pi)}
	out, err := Resample(x, 16000, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(x) || &out[0] != &x[0] {
		t.Fatal("same-rate input must be returned as is")
	}
}

// A sine well inside the passband must come through as the same sine
// sampled at the new rate (the kernel is zero-phase, so output n is the
// input at time n·from/to). The bound, 2e-5 absolute on amplitude 0.5
// (-88 dB), is what a Kaiser β = 9 window (~90 dB) allows; the first and
// last 10 ms, where the zero-padded edge is inside the kernel (at most 34
// input samples wide at these rates), are excluded.
func TestResamplePassesSine(t *testing.T) {
	cases := []struct {
		from, to int
		hz       float64
	}{
		{44100, 16000, 1000},
		{48000, 16000, 3000},
		{22050, 16000, 440},
		{11025, 16000, 2500},
		{8000, 16000, 1000},
		{16000, 44100, 1000},
		{44101, 16000, 1000}, // 16000 phases: the interpolated table
		{96000, 16000, 6000},
	}
	for _, c := range cases {
		x := sine(c.from/2, c.from, c.hz, 0.5)
		out, err := Resample(x, c.from, c.to)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != ResampledLength(len(x), c.from, c.to) {
			t.Fatalf("%d→%d: %d samples, want %d", c.from, c.to, len(out), ResampledLength(len(x), c.from, c.to))
		}
		var worst float64
		edge := c.to / 100
		for n := edge; n < len(out)-edge; n++ {
			want := 0.5 * math.Sin(2*math.Pi*c.hz*float64(n)/float64(c.to))
			worst = max(worst, math.Abs(float64(out[n])-want))
		}
		t.Logf("%d→%d Hz, %v Hz tone: max error %.2e", c.from, c.to, c.hz, worst)
		if worst > 2e-5 {
			t.Errorf("%d→%d Hz, %v Hz tone: max error %.2e, want ≤ 2e-5", c.from, c.to, c.hz, worst)
		}
	}
}

// Tones above the new Nyquist frequency must be removed, not aliased:
// 9 kHz at 48 kHz would fold to 7 kHz at 16 kHz, 12 kHz at 44.1 kHz to
// 4 kHz. Both sit past the transition band (cutoff 7.6 kHz), so they must
// be at least 80 dB down (RMS ≤ 0.5/√2 · 1e-4).
func TestResampleRejectsAliases(t *testing.T) {
	for _, c := range []struct {
		from int
		hz   float64
	}{{48000, 9000}, {44100, 12000}} {
		out, err := Resample(sine(c.from/2, c.from, c.hz, 0.5), c.from, SampleRate)
		if err != nil {
			t.Fatal(err)
		}
		got := rms(out[160 : len(out)-160])
		t.Logf("%v Hz at %d Hz: residual RMS %.2e", c.hz, c.from, got)
		if got > 0.5/math.Sqrt2*1e-4 {
			t.Errorf("%v Hz at %d Hz: residual RMS %.2e", c.hz, c.from, got)
		}
	}
}

func TestResampleDCGainAndDeterminism(t *testing.T) {
	x := make([]float32, 4410)
	for i := range x {
		x[i] = 0.5
	}
	a, err := Resample(x, 44100, SampleRate)
	if err != nil {
		t.Fatal(err)
	}
	for n := 64; n < len(a)-64; n++ {
		if math.Abs(float64(a[n])-0.5) > 1e-4 {
			t.Fatalf("DC 0.5 came out as %v at %d", a[n], n)
		}
	}
	b, _ := Resample(x, 44100, SampleRate)
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("runs differ at %d", i)
		}
	}
}

func TestResampleErrors(t *testing.T) {
	if _, err := Resample([]float32{1}, 999, SampleRate); !errors.Is(err, ErrUnsupportedFormat) {
		t.Errorf("999 Hz: err = %v", err)
	}
	if _, err := Resample([]float32{1}, 44100, MaxSampleRate+1); !errors.Is(err, ErrUnsupportedFormat) {
		t.Errorf("too high: err = %v", err)
	}
	if _, err := Resample([]float32{float32(math.NaN())}, 44100, SampleRate); !errors.Is(err, ErrNonFiniteSample) {
		t.Errorf("NaN: err = %v", err)
	}
}

// numpy.mean over the channel axis of float32 data: a float32 sum in
// channel order, then one division.
func TestDownmix(t *testing.T) {
	stereo := Audio{SampleRate: 8000, Channels: 2, Samples: []float32{1, 0, 0.5, 0.5, -1, 1}}
	want := []float32{0.5, 0.5, 0}
	got := Downmix(stereo)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("stereo frame %d = %v, want %v", i, got[i], want[i])
		}
	}
	three := Audio{SampleRate: 8000, Channels: 3, Samples: []float32{0.1, 0.2, 0.3}}
	if got, want := Downmix(three)[0], (float32(0.1)+float32(0.2)+float32(0.3))/3; got != want {
		t.Errorf("3 channels = %v, want %v", got, want)
	}
	mono := Audio{SampleRate: 8000, Channels: 1, Samples: []float32{0.25}}
	if got := Downmix(mono); got[0] != 0.25 || &got[0] == &mono.Samples[0] {
		t.Error("mono must be copied unchanged")
	}
}
