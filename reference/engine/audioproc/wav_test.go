package audioproc

import (
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"
)

// wavSpec describes a WAV file for buildWAV; the tests write every header
// byte themselves rather than trusting an encoder.
type wavSpec struct {
	tag        uint16 // wFormatTag; wavTagExtensible wraps subTag
	subTag     uint16
	channels   int
	rate       int
	bits       int
	blockAlign int // 0: channels × container bytes
	before     []byte
	data       []byte
	dataSize   uint32 // 0: len(data)
	noFmt      bool
	dataFirst  bool
}

func chunk(id string, body []byte) []byte {
	out := append([]byte(id), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(out[4:], uint32(len(body)))
	out = append(out, body...)
	if len(body)%2 == 1 {
		out = append(out, 0) // pad byte
	}
	return out
}

func buildWAV(s wavSpec) []byte {
	block := s.blockAlign
	if block == 0 {
		block = s.channels * ((s.bits + 7) / 8)
	}
	fmtBody := make([]byte, 16)
	binary.LittleEndian.PutUint16(fmtBody[0:], s.tag)
	binary.LittleEndian.PutUint16(fmtBody[2:], uint16(s.channels))
	binary.LittleEndian.PutUint32(fmtBody[4:], uint32(s.rate))
	binary.LittleEndian.PutUint32(fmtBody[8:], uint32(s.rate*block))
	binary.LittleEndian.PutUint16(fmtBody[12:], uint16(block))
	binary.LittleEndian.PutUint16(fmtBody[14:], uint16(s.bits))
	if s.tag == wavTagExtensible {
		ext := make([]byte, 24)
		binary.LittleEndian.PutUint16(ext[0:], 22)             // cbSize
		binary.LittleEndian.PutUint16(ext[2:], uint16(s.bits)) // valid bits
		binary.LittleEndian.PutUint32(ext[4:], 0x3)            // FL|FR
		binary.LittleEndian.PutUint16(ext[8:], s.subTag)
		copy(ext[10:], ksdataformatSubtypeTail)
		fmtBody = append(fmtBody, ext...)
	}
	dataChunk := chunk("data", s.data)
	if s.dataSize != 0 {
		binary.LittleEndian.PutUint32(dataChunk[4:], s.dataSize)
	}
	body := []byte("WAVE")
	body = append(body, s.before...)
	if s.dataFirst {
		body = append(body, dataChunk...)
	}
	if !s.noFmt {
		body = append(body, chunk("fmt ", fmtBody)...)
	}
	if !s.dataFirst {
		body = append(body, dataChunk...)
	}
	out := append([]byte("RIFF"), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(out[4:], uint32(len(body)))
	return append(out, body...)
}

func le16(v ...int16) []byte {
	out := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(out[2*i:], uint16(x))
	}
	return out
}

func le24(v ...int32) []byte {
	var out []byte
	for _, x := range v {
		u := uint32(x)
		out = append(out, byte(u), byte(u>>8), byte(u>>16))
	}
	return out
}

func le32(v ...int32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], uint32(x))
	}
	return out
}

func f32le(v ...float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func f64le(v ...float64) []byte {
	out := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(x))
	}
	return out
}

// Expected values follow libsndfile's sf_read_float scaling (src/pcm.c):
// 8-bit unsigned (x-128)/0x80, 16-bit x/0x8000, 24-bit x/0x800000, 32-bit
// x/0x80000000; floats as stored.
func TestDecodeWAVVariants(t *testing.T) {
	cases := []struct {
		name     string
		spec     wavSpec
		channels int
		rate     int
		want     []float32
	}{
		{
			name: "pcm16 mono",
			spec: wavSpec{tag: wavTagPCM, channels: 1, rate: 16000, bits: 16, data: le16(0, 16384, -32768, 32767)},
			want: []float32{0, 0.5, -1, 32767.0 / 32768},
		},
		{
			name: "pcm8 unsigned",
			spec: wavSpec{tag: wavTagPCM, channels: 1, rate: 8000, bits: 8, data: []byte{128, 192, 0, 255}},
			want: []float32{0, 0.5, -1, 127.0 / 128},
		},
		{
			name: "pcm24",
			spec: wavSpec{tag: wavTagPCM, channels: 1, rate: 48000, bits: 24, data: le24(0, 1<<22, -1<<23, 1<<23-1, -1)},
			want: []float32{0, 0.5, -1, float32(8388607.0 / 8388608), -1.0 / 8388608},
		},
		{
			name: "pcm32",
			spec: wavSpec{tag: wavTagPCM, channels: 1, rate: 44100, bits: 32, data: le32(0, 1<<30, -1<<31, 1)},
			want: []float32{0, 0.5, -1, 1.0 / (1 << 31)},
		},
		{
			name: "float32 keeps out-of-range values",
			spec: wavSpec{tag: wavTagIEEEFloat, channels: 1, rate: 22050, bits: 32, data: f32le(0, 0.25, -1.5, 1)},
			want: []float32{0, 0.25, -1.5, 1},
		},
		{
			name: "float64 rounds to float32",
			spec: wavSpec{tag: wavTagIEEEFloat, channels: 1, rate: 22050, bits: 64, data: f64le(0.1, -0.75)},
			want: []float32{float32(0.1), -0.75},
		},
		{
			name:     "pcm16 stereo interleaved",
			spec:     wavSpec{tag: wavTagPCM, channels: 2, rate: 44100, bits: 16, data: le16(16384, -16384, 8192, 0)},
			channels: 2,
			want:     []float32{0.5, -0.5, 0.25, 0},
		},
		{
			name:     "extensible pcm24 stereo",
			spec:     wavSpec{tag: wavTagExtensible, subTag: wavTagPCM, channels: 2, rate: 96000, bits: 24, data: le24(1<<22, -1<<22)},
			channels: 2,
			want:     []float32{0.5, -0.5},
		},
		{
			name: "extensible float32",
			spec: wavSpec{tag: wavTagExtensible, subTag: wavTagIEEEFloat, channels: 1, rate: 32000, bits: 32, data: f32le(-0.125)},
			want: []float32{-0.125},
		},
		{
			// 12 valid bits left-justified in a 16-bit container.
			name: "pcm12 in 16-bit container",
			spec: wavSpec{tag: wavTagPCM, channels: 1, rate: 16000, bits: 12, blockAlign: 2, data: le16(0x7FF0, -0x8000)},
			want: []float32{float32(0x7FF0) / 32768, -1},
		},
		{
			name: "odd LIST chunk before fmt is skipped with its pad byte",
			spec: wavSpec{tag: wavTagPCM, channels: 1, rate: 16000, bits: 16,
				before: chunk("LIST", []byte("INFOabc")), data: le16(-16384)},
			want: []float32{-0.5},
		},
		{
			name: "streamed data size 0xFFFFFFFF runs to the end",
			spec: wavSpec{tag: wavTagPCM, channels: 1, rate: 16000, bits: 16, data: le16(1, 2, 3), dataSize: 0xFFFFFFFF},
			want: []float32{1.0 / 32768, 2.0 / 32768, 3.0 / 32768},
		},
		{
			name:     "trailing partial frame dropped",
			spec:     wavSpec{tag: wavTagPCM, channels: 2, rate: 16000, bits: 16, data: le16(16384, 16384, 1)},
			channels: 2,
			want:     []float32{0.5, 0.5},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := Decode(buildWAV(c.spec), "wav", Limits{})
			if err != nil {
				t.Fatal(err)
			}
			wantCh := max(c.channels, 1)
			if a.Channels != wantCh || a.SampleRate != c.spec.rate {
				t.Fatalf("got %d ch at %d Hz, want %d ch at %d Hz", a.Channels, a.SampleRate, wantCh, c.spec.rate)
			}
			if len(a.Samples) != len(c.want) {
				t.Fatalf("got %d samples %v, want %v", len(a.Samples), a.Samples, c.want)
			}
			for i, v := range c.want {
				if math.Float32bits(a.Samples[i]) != math.Float32bits(v) {
					t.Errorf("sample %d = %v, want %v", i, a.Samples[i], v)
				}
			}
		})
	}
}

func TestDecodeWAVErrors(t *testing.T) {
	valid := wavSpec{tag: wavTagPCM, channels: 1, rate: 16000, bits: 16, data: le16(1, 2)}
	with := func(edit func(*wavSpec)) []byte {
		s := valid
		edit(&s)
		return buildWAV(s)
	}
	riff := buildWAV(valid)
	rifx := append([]byte("RIFX"), riff[4:]...)
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"riff header only", riff[:8], ErrCorrupt},
		{"not wave", append([]byte("RIFF\x04\x00\x00\x00AVI "), make([]byte, 32)...), ErrCorrupt},
		{"big-endian RIFX", rifx, ErrUnsupportedFormat},
		{"no fmt chunk", with(func(s *wavSpec) { s.noFmt = true }), ErrCorrupt},
		{"data before fmt", with(func(s *wavSpec) { s.dataFirst = true }), ErrCorrupt},
		{"adpcm tag", with(func(s *wavSpec) { s.tag = 0x0002; s.bits = 4; s.blockAlign = 1 }), ErrUnsupportedFormat},
		{"mu-law tag", with(func(s *wavSpec) { s.tag = 0x0007; s.bits = 8 }), ErrUnsupportedFormat},
		{"extensible with foreign GUID", func() []byte {
			b := with(func(s *wavSpec) { s.tag = wavTagExtensible; s.subTag = wavTagPCM })
			b[12+8+16+10+2] ^= 0xFF // a byte of the sub-format GUID tail
			return b
		}(), ErrUnsupportedFormat},
		{"float16", with(func(s *wavSpec) { s.tag = wavTagIEEEFloat; s.bits = 16 }), ErrUnsupportedFormat},
		{"zero channels", with(func(s *wavSpec) { s.channels = 0; s.blockAlign = 2 }), ErrCorrupt},
		{"100 channels", with(func(s *wavSpec) { s.channels = 100 }), ErrUnsupportedFormat},
		{"zero rate", with(func(s *wavSpec) { s.rate = 0 }), ErrCorrupt},
		{"500 Hz", with(func(s *wavSpec) { s.rate = 500 }), ErrUnsupportedFormat},
		{"block align mismatch", with(func(s *wavSpec) { s.blockAlign = 3 }), ErrCorrupt},
		{"data chunk larger than file", with(func(s *wavSpec) { s.dataSize = 1000 }), ErrCorrupt},
		{"truncated fmt chunk", riff[:12+8+10], ErrCorrupt},
		{"NaN in float data", with(func(s *wavSpec) {
			s.tag = wavTagIEEEFloat
			s.bits = 32
			s.data = f32le(0, float32(math.NaN()))
		}), ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(c.data, "wav", Limits{})
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
}

// allocatedBy reports the bytes f allocates; the runtime counter is
// cumulative, so the delta is what f (and any stray runtime work) asked for.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestDecodeWAVHostileSizesDoNotAllocate(t *testing.T) {
	const budget = 256 << 10
	// A header claiming 4 GiB of samples in a 60-byte file.
	huge := buildWAV(wavSpec{tag: wavTagPCM, channels: 2, rate: 48000, bits: 16, data: le16(1, 2), dataSize: 0xFFFFFF00})
	// A genuine 2 MiB payload that the limits refuse: the check must come
	// before the 4 MiB float buffer.
	big := buildWAV(wavSpec{tag: wavTagPCM, channels: 1, rate: 16000, bits: 16, data: make([]byte, 2<<20)})
	cases := []struct {
		name   string
		data   []byte
		limits Limits
		want   error
	}{
		{"data size beyond input", huge, Limits{}, ErrCorrupt},
		{"over MaxSamples", big, Limits{MaxSamples: 1000}, ErrLimitExceeded},
		{"over MaxDuration", big, Limits{MaxDuration: time.Second}, ErrLimitExceeded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			n := allocatedBy(func() { _, err = Decode(c.data, "wav", c.limits) })
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if n > budget {
				t.Errorf("allocated %d bytes before failing, budget %d", n, budget)
			}
		})
	}
}

func TestLimits(t *testing.T) {
	// One second at 8 kHz mono is 8000 frames.
	data := buildWAV(wavSpec{tag: wavTagPCM, channels: 1, rate: 8000, bits: 16, data: make([]byte, 16000)})
	cases := []struct {
		limits Limits
		ok     bool
	}{
		{Limits{}, true},
		{Limits{MaxDuration: time.Second}, true},
		{Limits{MaxDuration: time.Second - time.Millisecond}, false},
		{Limits{MaxSamples: 8000}, true},
		{Limits{MaxSamples: 7999}, false},
	}
	for _, c := range cases {
		a, err := Decode(data, "wav", c.limits)
		if c.ok && (err != nil || a.Frames() != 8000 || a.Duration() != time.Second) {
			t.Errorf("%+v: err %v, %d frames, %v", c.limits, err, a.Frames(), a.Duration())
		}
		if !c.ok && !errors.Is(err, ErrLimitExceeded) {
			t.Errorf("%+v: err = %v, want ErrLimitExceeded", c.limits, err)
		}
	}
}

func TestDecodePCM16LE(t *testing.T) {
	a, err := DecodePCM16LE(append(le16(16384, -16384, -32768, 8192), 0x7F), 44100, 2, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{0.5, -0.5, -1, 0.25} // the odd trailing byte is dropped
	if a.Channels != 2 || a.SampleRate != 44100 || len(a.Samples) != len(want) {
		t.Fatalf("got %+v", a)
	}
	for i, v := range want {
		if a.Samples[i] != v {
			t.Errorf("sample %d = %v, want %v", i, a.Samples[i], v)
		}
	}
	if _, err := DecodePCM16LE(le16(1), 16000, 0, Limits{}); !errors.Is(err, ErrUnsupportedFormat) {
		t.Errorf("0 channels: err = %v", err)
	}
	if _, err := DecodePCM16LE(make([]byte, 4000), 16000, 1, Limits{MaxSamples: 100}); !errors.Is(err, ErrLimitExceeded) {
		t.Errorf("limit: err = %v", err)
	}
}

func TestSniffAndDeclaredFormat(t *testing.T) {
	wav := buildWAV(wavSpec{tag: wavTagPCM, channels: 1, rate: 16000, bits: 16, data: le16(1)})
	silentMP3 := silentMP3Frames(2)
	sniffs := []struct {
		name string
		data []byte
		want Format
	}{
		{"riff wave", wav, FormatWAV},
		{"id3 tag", append([]byte("ID3\x04\x00\x00\x00\x00\x00\x00"), silentMP3...), FormatMP3},
		{"mpeg-1 layer III frame", silentMP3, FormatMP3},
		{"ogg", []byte("OggS\x00\x02\x00\x00\x00\x00\x00\x00"), FormatUnknown},
		{"flac", []byte("fLaC\x00\x00\x00\x22"), FormatUnknown},
		{"reserved mpeg version", []byte{0xFF, 0xEB, 0x90, 0xC4}, FormatUnknown},
		{"bad bitrate index", []byte{0xFF, 0xFB, 0xF0, 0xC4}, FormatUnknown},
		{"too short", []byte{0xFF}, FormatUnknown},
	}
	for _, c := range sniffs {
		if got := Sniff(c.data); got != c.want {
			t.Errorf("Sniff(%s) = %q, want %q", c.name, got, c.want)
		}
	}
	decodes := []struct {
		name, format string
		data         []byte
		want         error
	}{
		{"wav bytes declared mp3", "mp3", wav, ErrFormatMismatch},
		{"mp3 bytes declared wav", "wav", silentMP3, ErrFormatMismatch},
		{"unsupported declared format", "flac", wav, ErrUnsupportedFormat},
		{"unknown bytes declared wav", "wav", []byte("hello, world, not audio"), ErrCorrupt},
		{"mime type accepted", "audio/x-wav", wav, nil},
		{"upper case accepted", "MP3", silentMP3, nil},
	}
	for _, c := range decodes {
		_, err := Decode(c.data, c.format, Limits{})
		if (c.want == nil && err != nil) || !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
}
