package audioproc

import (
	"errors"
	"testing"
	"time"
)

// A MaxDuration of FramesDuration(f) lets through exactly the audio that
// gives at most f feature frames once resampled to 16 kHz and padded to the
// hop, at every sample rate: the longest clip the limit takes gives no more
// than f frames, and one sample more gives more.
func TestFramesDurationBoundsTheFrames(t *testing.T) {
	frames := func(n, rate int) int {
		m := ResampledLength(n, rate, SampleRate)
		return FrameCount((m + HopLength - 1) / HopLength * HopLength) // PadToHop's length
	}
	for _, f := range []int{1, 99, 30000} {
		limits := Limits{MaxDuration: FramesDuration(f), MaxSamples: 1 << 40}
		for _, rate := range []int{MinSampleRate, 7919, 8000, 11025, 16000, 22050, 44100, 48000, 96000, 352800, MaxSampleRate} {
			// The longest clip the limit takes, found from above.
			n := int(int64(f)*HopLength*int64(rate)/SampleRate) + 2
			for limits.check(int64(n), 1, rate) != nil {
				n--
			}
			if got := frames(n, rate); got > f {
				t.Errorf("%d frames' worth at %d Hz: %d samples pass and give %d frames", f, rate, n, got)
			}
			if err := limits.check(int64(n+1), 1, rate); !errors.Is(err, ErrLimitExceeded) {
				t.Errorf("%d frames' worth at %d Hz: %d samples: %v, want ErrLimitExceeded", f, rate, n+1, err)
			}
			if got := frames(n+1, rate); got <= f {
				t.Errorf("%d frames' worth at %d Hz: %d samples are refused but give only %d frames", f, rate, n+1, got)
			}
		}
	}
	if d := FramesDuration(30000); d != 300*time.Second {
		t.Errorf("FramesDuration(30000) = %v, want 5m0s", d)
	}
}

// An audio over the length limit is refused naming its length and the
// limit, with as many decimals as it takes for the two to differ.
func TestLengthOverTheLimitIsWorded(t *testing.T) {
	for _, c := range []struct {
		frames int64
		rate   int
		limit  time.Duration
		want   string
	}{
		{601000, 1000, 600 * time.Second, "the audio lasts 601 s, over the limit of 600 s"},
		{4800001, 16000, 300 * time.Second, "the audio lasts 300.0001 s, over the limit of 300 s"},
		{30001, 100000, 300 * time.Millisecond, "the audio lasts 0.30001 s, over the limit of 0.3 s"},
		{48001, 16000, 3 * time.Second, "the audio lasts 3.0001 s, over the limit of 3 s"},
	} {
		err := Limits{MaxDuration: c.limit}.check(c.frames, 1, c.rate)
		var in *inputError
		if !errors.As(err, &in) || in.ClientMessage() != c.want {
			t.Errorf("%d samples at %d Hz, limit %v: %v, want %q", c.frames, c.rate, c.limit, err, c.want)
		}
	}
}
