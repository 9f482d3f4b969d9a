package audioproc

import "testing"

// BenchmarkLogMel30s extracts features for 30 s of 16 kHz audio (3000
// frames), Whisper's whole window.
func BenchmarkLogMel30s(b *testing.B) {
	x := sine(30*SampleRate, SampleRate, 440, 0.5)
	b.ResetTimer()
	for range b.N {
		if _, err := LogMel(x); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResample44k30s converts 30 s of 44.1 kHz audio to 16 kHz.
func BenchmarkResample44k30s(b *testing.B) {
	x := sine(30*44100, 44100, 440, 0.5)
	b.ResetTimer()
	for range b.N {
		if _, err := Resample(x, 44100, SampleRate); err != nil {
			b.Fatal(err)
		}
	}
}
