package audio

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestEncodeWAVHeaderExact(t *testing.T) {
	got := EncodeWAV([]float32{0, 1, -1, 0.5})
	want, _ := hex.DecodeString("" +
		"52494646" + "2c000000" + "57415645" + // "RIFF", 36+8, "WAVE"
		"666d7420" + "10000000" + // "fmt ", 16
		"0100" + "0100" + // PCM, mono
		"c05d0000" + "80bb0000" + // 24000 Hz, 48000 bytes/s
		"0200" + "1000" + // block align 2, 16 bits
		"64617461" + "08000000" + // "data", 8
		"0000" + "ff7f" + "0180" + "0040") // 0, 32767, -32767, 16384 (16383.5 rounds up)
	if !bytes.Equal(got, want) {
		t.Fatalf("EncodeWAV =\n%x\nwant\n%x", got, want)
	}
	if pcm := EncodePCM([]float32{0, 1, -1, 0.5}); !bytes.Equal(pcm, want[44:]) {
		t.Fatalf("EncodePCM = %x; want %x", pcm, want[44:])
	}
}

func TestEncodeWAVEmpty(t *testing.T) {
	b := EncodeWAV(nil)
	if len(b) != 44 {
		t.Fatalf("len = %d; want 44", len(b))
	}
	s, rate, ch, err := DecodeWAV(b)
	if err != nil || len(s) != 0 || rate != SampleRate || ch != 1 {
		t.Fatalf("DecodeWAV = %v, %d, %d, %v", s, rate, ch, err)
	}
}

func TestSample16(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want int16
	}{
		{0, 0},
		{1, 32767},
		{-1, -32767},
		{1.5, 32767},
		{-7, -32767},
		{float32(math.Inf(1)), 32767},
		{float32(math.Inf(-1)), -32767},
		{float32(math.NaN()), 0},
		{0.5, 16384},   // 16383.5 → away from zero
		{-0.5, -16384}, // -16383.5 → away from zero
		{0.25, 8192},   // 8191.75
		{-0.25, -8192},
		{1.0 / 32767, 1},
		{0.4 / 32767, 0},
		{-0.6 / 32767, -1},
		{0.75, 24575},     // 24575.25
		{-0.0001, -3},     // -3.2767
		{0.00015, 5},      // 4.91505
		{0.999999, 32767}, // 32766.967...
	} {
		if got := Sample16(tc.in); got != tc.want {
			t.Errorf("Sample16(%v) = %d; want %d", tc.in, got, tc.want)
		}
	}
}

func TestWAVRoundTrip(t *testing.T) {
	in := make([]float32, 3*SamplesPerFrame+7)
	for i := range in {
		in[i] = float32(math.Sin(float64(i) * 0.01 * float64(i%13+1)))
	}
	s, rate, ch, err := DecodeWAV(EncodeWAV(in))
	if err != nil {
		t.Fatal(err)
	}
	if rate != SampleRate || ch != 1 || len(s) != len(in) {
		t.Fatalf("rate %d channels %d len %d; want %d 1 %d", rate, ch, len(s), SampleRate, len(in))
	}
	for i, v := range in {
		if s[i] != Sample16(v) {
			t.Fatalf("sample %d = %d; want %d", i, s[i], Sample16(v))
		}
	}
}

func TestDecodeWAVRejects(t *testing.T) {
	good := EncodeWAV([]float32{0.1, 0.2})
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"short":        good[:10],
		"not riff":     mutate(func(b []byte) []byte { copy(b, "RIFX"); return b }),
		"not wave":     mutate(func(b []byte) []byte { copy(b[8:], "AVI "); return b }),
		"riff size":    mutate(func(b []byte) []byte { b[4]++; return b }),
		"truncated":    mutate(func(b []byte) []byte { b = b[:len(b)-2]; b[4] -= 2; return b }),
		"trailing":     mutate(func(b []byte) []byte { b = append(b, 0, 0); b[4] += 2; return b }),
		"format":       mutate(func(b []byte) []byte { b[20] = 3; return b }),
		"bits":         mutate(func(b []byte) []byte { b[34] = 8; return b }),
		"block align":  mutate(func(b []byte) []byte { b[32] = 4; return b }),
		"byte rate":    mutate(func(b []byte) []byte { b[28]++; return b }),
		"fmt size":     mutate(func(b []byte) []byte { b[16] = 18; return b }),
		"no data":      mutate(func(b []byte) []byte { copy(b[36:], "junk"); return b }),
		"odd data":     mutate(func(b []byte) []byte { b = b[:len(b)-1]; b[4]--; b[40]--; return b }),
		"data first":   mutate(func(b []byte) []byte { copy(b[12:], "data"); return b }),
		"no fmt chunk": []byte("RIFF\x04\x00\x00\x00WAVE"),
	} {
		if _, _, _, err := DecodeWAV(b); !errors.Is(err, ErrMalformedWAV) {
			t.Errorf("%s: err = %v; want ErrMalformedWAV", name, err)
		}
	}
}

func TestEncodeFormats(t *testing.T) {
	if got := strings.Join(Formats(), ","); got != "wav,pcm" {
		t.Fatalf("Formats = %s", got)
	}
	in := []float32{0.3, -0.3}
	for format, want := range map[string][]byte{"wav": EncodeWAV(in), "pcm": EncodePCM(in)} {
		got, err := Encode(format, in)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Encode(%q) = %x, %v; want %x", format, got, err, want)
		}
	}
	for _, format := range []string{"mp3", "flac", "opus", "WAV", ""} {
		_, err := Encode(format, in)
		if err == nil || !strings.Contains(err.Error(), "wav") || !strings.Contains(err.Error(), "pcm") {
			t.Errorf("Encode(%q) err = %v; want one naming wav and pcm", format, err)
		}
	}
}
