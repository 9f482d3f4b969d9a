package audioproc

import (
	"errors"
	"math"
	"os"
	"testing"
	"time"
)

// silentMP3Frames builds n MPEG-1 Layer III frames by hand: header FF FB 90
// C4 (MPEG-1, layer III, no CRC, 128 kbit/s, 44.1 kHz, no padding, mono),
// then all-zero side information and main data. Frame length is
// 144·128000/44100 = 417 bytes; every granule has zero coded values, so
// each frame decodes to 1152 zero samples.
func silentMP3Frames(n int) []byte {
	const frameBytes = 417
	out := make([]byte, 0, n*frameBytes)
	for range n {
		frame := make([]byte, frameBytes)
		copy(frame, []byte{0xFF, 0xFB, 0x90, 0xC4})
		out = append(out, frame...)
	}
	return out
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rms(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(len(x)))
}

func TestDecodeHandBuiltSilentMP3(t *testing.T) {
	a, err := Decode(silentMP3Frames(3), "mp3", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if a.SampleRate != 44100 || a.Channels != 1 || a.Frames() != 3*1152 {
		t.Fatalf("got %d Hz, %d ch, %d frames; want 44100 Hz, 1 ch, %d frames", a.SampleRate, a.Channels, a.Frames(), 3*1152)
	}
	for i, v := range a.Samples {
		if v != 0 {
			t.Fatalf("sample %d = %v, want 0", i, v)
		}
	}
}

// The fixtures (testdata/README.md) hold known tones, so the decoder, the
// resampler and the features can be checked against what was encoded.
func TestDecodeMP3Fixtures(t *testing.T) {
	cases := []struct {
		file            string
		rate, channels  int
		encodedFrames   int
		leftRMS         float64 // of the middle of channel 0: 0.5/√2 for a 0.5 sine
		rightSilent     bool
		melPeak         int // see TestLogMelTonePeaks for the bins
		resampledToRate bool
	}{
		{"tone1k-left-44k-stereo.mp3", 44100, 2, 22050, 0.5 / math.Sqrt2, true, 42, true},
		{"tone4k-16k-mono.mp3", 16000, 1, 8000, 0.5 / math.Sqrt2, false, 99, false},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			a, err := Decode(readFixture(t, c.file), "mp3", Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if a.SampleRate != c.rate || a.Channels != c.channels {
				t.Fatalf("got %d Hz %d ch, want %d Hz %d ch", a.SampleRate, a.Channels, c.rate, c.channels)
			}
			// LAME adds encoder delay and padding, and go-mp3 trims none of
			// it: the stream is at least as long as the input and at most
			// three frames longer.
			perFrame := 1152
			if c.rate < 32000 {
				perFrame = 576
			}
			if f := a.Frames(); f < c.encodedFrames || f > c.encodedFrames+3*perFrame {
				t.Fatalf("%d frames, want %d to %d", f, c.encodedFrames, c.encodedFrames+3*perFrame)
			}
			mid := a.Frames() / 2
			var left, right []float32
			for f := mid - 2000; f < mid+2000; f++ {
				left = append(left, a.Samples[f*a.Channels])
				if a.Channels == 2 {
					right = append(right, a.Samples[f*a.Channels+1])
				}
			}
			if got := rms(left); math.Abs(got-c.leftRMS) > 0.02 {
				t.Errorf("channel 0 RMS %.4f, want %.4f ± 0.02", got, c.leftRMS)
			}
			if c.rightSilent && rms(right) > 0.005 {
				t.Errorf("channel 1 RMS %.4f, want silence", rms(right))
			}
			mono, err := Mono16k(a)
			if err != nil {
				t.Fatal(err)
			}
			if want := ResampledLength(a.Frames(), a.SampleRate, SampleRate); len(mono) != want {
				t.Fatalf("16 kHz mono has %d samples, want %d", len(mono), want)
			}
			if !c.resampledToRate {
				for i := range mono {
					if mono[i] != a.Samples[i] {
						t.Fatalf("16 kHz mono input changed at %d", i)
					}
				}
			}
			feats, err := LogMel(mono)
			if err != nil {
				t.Fatal(err)
			}
			if got := peakBin(feats, feats.Frames/2); got != c.melPeak {
				t.Errorf("mel peak at bin %d, want %d", got, c.melPeak)
			}
		})
	}
}

func TestDecodeMP3Errors(t *testing.T) {
	fixture := readFixture(t, "tone1k-left-44k-stereo.mp3")
	layerII := silentMP3Frames(2)
	layerII[1] = 0xFD // layer bits 10: Layer II
	freeFormat := silentMP3Frames(2)
	freeFormat[2] = 0x00
	cases := []struct {
		name   string
		data   []byte
		limits Limits
		want   error
	}{
		{"no frame sync", []byte("ID3\x04\x00\x00\x00\x00\x00\x00just text, no audio frames at all"), Limits{}, ErrCorrupt},
		{"id3 size beyond input", []byte("ID3\x04\x00\x00\x7f\x7f\x7f\x7f\xff\xfb\x90\xc4"), Limits{}, ErrCorrupt},
		{"id3 size not synchsafe", []byte("ID3\x04\x00\x00\x00\x00\x80\x00\xff\xfb\x90\xc4"), Limits{}, ErrCorrupt},
		{"layer II", layerII, Limits{}, ErrUnsupportedFormat},
		{"free format", freeFormat, Limits{}, ErrUnsupportedFormat},
		{"over MaxDuration", fixture, Limits{MaxDuration: 100 * time.Millisecond}, ErrLimitExceeded},
		{"over MaxSamples", fixture, Limits{MaxSamples: 1000}, ErrLimitExceeded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			n := allocatedBy(func() { _, err = Decode(c.data, "mp3", c.limits) })
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if n > 1<<20 {
				t.Errorf("allocated %d bytes before failing", n)
			}
		})
	}
}

// Truncated and bit-flipped streams must come back as audio or as one of
// the package's errors, never as a panic or an unclassified error.
func TestDecodeMP3Damaged(t *testing.T) {
	fixture := readFixture(t, "tone1k-left-44k-stereo.mp3")
	classified := func(err error) bool {
		return err == nil || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnsupportedFormat) ||
			errors.Is(err, ErrLimitExceeded) || errors.Is(err, ErrFormatMismatch)
	}
	for _, cut := range []int{4, 100, 417, 1000, len(fixture) - 1} {
		a, err := Decode(fixture[:cut], "mp3", Limits{})
		if !classified(err) {
			t.Errorf("cut at %d: unclassified error %v", cut, err)
		}
		if err == nil && a.Frames() > 22050+3*1152 {
			t.Errorf("cut at %d: %d frames from a shorter stream", cut, a.Frames())
		}
	}
	state := uint32(2463534242)
	for trial := range 40 {
		damaged := append([]byte(nil), fixture...)
		for range 8 {
			state ^= state << 13
			state ^= state >> 17
			state ^= state << 5
			damaged[int(state%uint32(len(damaged)))] ^= byte(state >> 24)
		}
		if _, err := Decode(damaged, "mp3", Limits{}); !classified(err) {
			t.Errorf("trial %d: unclassified error %v", trial, err)
		}
	}
}
