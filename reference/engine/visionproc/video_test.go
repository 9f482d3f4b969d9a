package visionproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"image"
	"image/png"
	"os"
	"reflect"
	"strings"
	"testing"
)

// Expected counts worked by hand from Qwen2VLVideoProcessor.sample_frames
// with fps = 2, min_frames = 4, max_frames = 768, temporal patch 2:
// max' = ⌊min(768, total)/2⌋·2, n = min(max(total/src·2, 4), max', total),
// then ⌊n/2⌋·2.
func TestSampleFrameCount(t *testing.T) {
	cfg := DefaultVideoConfig()
	tests := []struct {
		name   string
		total  int
		srcFPS float64
		want   int
		err    error
	}{
		{"1 s at 8 fps lifts to min_frames", 8, 8, 4, nil},  // 2 → 4
		{"10 s at 30 fps", 300, 30, 20, nil},                // 20
		{"fraction floors to even", 301, 30, 20, nil},       // 20.07 → 20
		{"odd source count", 45, 30, 4, nil},                // 3 → 4
		{"short video capped by max'", 3, 30, 2, nil},       // 0.2 → 4 → min(4, 2, 3) = 2
		{"low source fps capped by total", 7, 1, 6, nil},    // 14 → min(14, 6, 7) = 6
		{"long video capped at 768", 100000, 25, 768, nil},  // 8000 → 768
		{"one frame is too few", 1, 30, 0, ErrTooFewFrames}, // max' = 0
		{"zero frames", 0, 30, 0, ErrInvalidArgument},
		{"zero fps", 10, 0, 0, ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SampleFrameCount(tc.total, tc.srcFPS, cfg)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("SampleFrameCount(%d, %v) = %d, %v; want %d", tc.total, tc.srcFPS, got, err, tc.want)
			}
		})
	}
}

// Processor rule: element i is int(float32(i·total/n)), length ⌈total/step⌉.
// Linspace rule: round-half-even of i·(total−1)/(n−1).
func TestFrameIndices(t *testing.T) {
	tests := []struct {
		name     string
		total, n int
		rule     FrameIndexRule
		want     []int
	}{
		{"even step", 8, 4, IndicesProcessor, []int{0, 2, 4, 6}},
		{"fractional step truncates", 10, 4, IndicesProcessor, []int{0, 2, 5, 7}}, // 0, 2.5, 5, 7.5
		{"1.5 step", 3, 2, IndicesProcessor, []int{0, 1}},
		{"all frames", 4, 4, IndicesProcessor, []int{0, 1, 2, 3}},
		// 17/14 = 1.2142857142857142 in float64 and 17/that = 14.000000000000002,
		// so torch.arange yields 15 elements; the last, float32(14·step) = 17.0,
		// would index past the end upstream and is clamped to 16.
		{"arange length quirk", 17, 14, IndicesProcessor, []int{0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16}},
		{"linspace", 9, 4, IndicesLinspaceRound, []int{0, 3, 5, 8}},          // 0, 2.67, 5.33, 8
		{"linspace tie to even", 4, 3, IndicesLinspaceRound, []int{0, 2, 3}}, // 1.5 → 2
		{"linspace single", 5, 1, IndicesLinspaceRound, []int{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FrameIndices(tc.total, tc.n, tc.rule)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("FrameIndices(%d, %d) = %v, want %v", tc.total, tc.n, got, tc.want)
			}
		})
	}
	if _, err := FrameIndices(3, 4, IndicesProcessor); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("more samples than frames: %v", err)
	}
}

// jpegFrames makes n distinct small JPEG frames; each is made odd-sized by
// a byte after EOI (decoders ignore it) so chunk padding is exercised.
func jpegFrames(t *testing.T, n, w, h int) [][]byte {
	t.Helper()
	out := make([][]byte, n)
	for i := range out {
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		for p := 0; p < len(img.Pix); p += 4 {
			img.Pix[p], img.Pix[p+1], img.Pix[p+2], img.Pix[p+3] = uint8(i*40), uint8(p%251), 90, 255
		}
		b := encodeJPEG(t, img, 90)
		if len(b)%2 == 0 {
			b = append(b, 0)
		}
		out[i] = b
	}
	return out
}

// baseSpec is a 6-frame 32×16 MJPEG AVI at 3 fps with 8 kHz mono 16-bit PCM.
func baseSpec(t *testing.T) aviSpec {
	audio := make([][]byte, 6)
	for i := range audio {
		audio[i] = bytes.Repeat([]byte{byte(i), 0x10}, 1333) // 1333 samples per chunk
	}
	return aviSpec{
		width: 32, height: 16, rate: 3, scale: 1, compression: "MJPG",
		frames: jpegFrames(t, 6, 32, 16), audio: audio,
		audioTag: wavePCM, channels: 1, sampleRate: 8000, bits: 16,
		junk: true,
	}
}

func TestParseAVIWritten(t *testing.T) {
	for _, layout := range []struct {
		name   string
		useRec bool
		noIdx1 bool
	}{{"plain", false, false}, {"rec lists", true, false}, {"no idx1", false, true}} {
		t.Run(layout.name, func(t *testing.T) {
			spec := baseSpec(t)
			spec.useRec, spec.noIdx1 = layout.useRec, layout.noIdx1
			a, err := ParseAVI(testAVI(spec), DefaultContainerLimits())
			if err != nil {
				t.Fatal(err)
			}
			if a.FPS != 3 || a.FrameCount != 6 || a.Width != 32 || a.Height != 16 || a.Duration() != 2 {
				t.Fatalf("fps %v frames %d size %d×%d duration %v", a.FPS, a.FrameCount, a.Width, a.Height, a.Duration())
			}
			for i, want := range spec.frames {
				got, err := a.FrameJPEG(i)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("frame %d: %v, bytes equal %v", i, err, bytes.Equal(got, want))
				}
			}
			if a.Audio == nil || a.Audio.SampleRate != 8000 || a.Audio.Channels != 1 || a.Audio.BitsPerSample != 16 || a.Audio.Float {
				t.Fatalf("audio %+v", a.Audio)
			}
			if want := bytes.Join(spec.audio, nil); !bytes.Equal(a.Audio.Data, want) {
				t.Fatalf("audio is %d bytes, want %d in order", len(a.Audio.Data), len(want))
			}
			if got := a.Audio.Duration(); got != 6*1333/8000.0 {
				t.Fatalf("audio duration %v", got)
			}
		})
	}
}

func TestParseAVIEmptyChunkRepeatsFrame(t *testing.T) {
	spec := baseSpec(t)
	spec.frames[3] = nil
	a, err := ParseAVI(testAVI(spec), DefaultContainerLimits())
	if err != nil {
		t.Fatal(err)
	}
	f2, _ := a.FrameJPEG(2)
	f3, _ := a.FrameJPEG(3)
	if a.FrameCount != 6 || !bytes.Equal(f2, f3) {
		t.Fatalf("frames %d; empty chunk does not repeat the previous frame", a.FrameCount)
	}
	spec.frames[0] = nil
	if _, err := ParseAVI(testAVI(spec), DefaultContainerLimits()); !errors.Is(err, ErrCorruptContainer) {
		t.Fatalf("empty first frame: %v", err)
	}
}

// setLE32 overwrites the 32-bit little-endian field that follows marker.
func setLE32(t *testing.T, data []byte, marker string, offset int, v uint32) []byte {
	t.Helper()
	out := append([]byte(nil), data...)
	i := bytes.Index(out, []byte(marker))
	if i < 0 {
		t.Fatalf("no %q", marker)
	}
	binary.LittleEndian.PutUint32(out[i+offset:], v)
	return out
}

func TestParseAVIRefusals(t *testing.T) {
	good := testAVI(baseSpec(t))
	limits := DefaultContainerLimits()
	small := func(f func(*ContainerLimits)) ContainerLimits { l := limits; f(&l); return l }
	withSpec := func(f func(*aviSpec)) []byte { s := baseSpec(t); f(&s); return testAVI(s) }
	mp4, err := os.ReadFile("testdata/mjpeg_32x32_2f.mp4")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		data    []byte
		limits  ContainerLimits
		want    error
		mention string
	}{
		{"ffmpeg mp4", mp4, limits, ErrUnsupportedContainer, "mp4"},
		{"mp4 magic", []byte("\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00"), limits, ErrUnsupportedContainer, "AVI with Motion-JPEG"},
		{"quicktime", []byte("\x00\x00\x00\x08wide\x00\x00\x00\x00mdat"), limits, ErrUnsupportedContainer, "mov"},
		{"webm", []byte("\x1A\x45\xDF\xA3\x9F\x42\x86\x81\x01"), limits, ErrUnsupportedContainer, "webm"},
		{"ogg", []byte("OggS\x00\x02"), limits, ErrUnsupportedContainer, "ogg"},
		{"wav", []byte("RIFF\x04\x00\x00\x00WAVE"), limits, ErrUnsupportedContainer, "wav"},
		{"garbage", []byte("not a video at all"), limits, ErrUnsupportedContainer, "supported"},
		{"h264 in avi", withSpec(func(s *aviSpec) { s.compression = "H264" }), limits, ErrUnsupportedCodec, "H264"},
		{"mp3 audio", withSpec(func(s *aviSpec) { s.audioTag = 0x55 }), limits, ErrUnsupportedCodec, "0x0055"},
		{"12-bit audio", withSpec(func(s *aviSpec) { s.bits = 12 }), limits, ErrUnsupportedCodec, "12-bit"},
		{"movi size past the end", setLE32(t, good, "movi", -4, 0xFFFFFFF0), limits, ErrCorruptContainer, "cut short"},
		{"riff size past the end", setLE32(t, good, "RIFF", 4, 0xFFFFFFFF), limits, ErrCorruptContainer, "cut short"},
		{"zero frame rate", setLE32(t, good, "vidsMJPG", 24, 0), limits, ErrCorruptContainer, "frame rate"},
		{"absurd frame rate", setLE32(t, good, "vidsMJPG", 24, 1e9), limits, ErrCorruptContainer, "frame rate"},
		{"absurd width", setLE32(t, good, "strf", 12, 1<<30), limits, ErrTooLarge, "over the limit of 7680×4320"},
		{"zero width", setLE32(t, good, "strf", 12, 0), limits, ErrCorruptContainer, "video size"},
		// nBlockAlign 3 for mono 16-bit (which needs 2).
		{"wrong block align", setLE32(t, good, "strf\x12\x00\x00\x00", 20, 16<<16|3), limits, ErrCorruptContainer, "block align"},
		{"too many frames", good, small(func(l *ContainerLimits) { l.MaxFrames = 5 }), ErrTooLarge, "limit of 5"},
		{"frame too big", good, small(func(l *ContainerLimits) { l.MaxFrameBytes = 100 }), ErrTooLarge, "limit of 100"},
		{"audio too big", good, small(func(l *ContainerLimits) { l.MaxAudioBytes = 5000 }), ErrTooLarge, "audio"},
		{"file too big", good, small(func(l *ContainerLimits) { l.MaxBytes = 1000 }), ErrTooLarge, "bytes"},
		{"no frames", withSpec(func(s *aviSpec) { s.frames = nil; s.audio = nil }), limits, ErrCorruptContainer, "no video frames"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAVI(tc.data, tc.limits)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

func TestParseAVIIgnoreAudio(t *testing.T) {
	spec := baseSpec(t)
	spec.audioTag = 0x55 // MP3: refused unless audio is ignored
	limits := DefaultContainerLimits()
	limits.IgnoreAudio = true
	a, err := ParseAVI(testAVI(spec), limits)
	if err != nil {
		t.Fatal(err)
	}
	if a.Audio != nil || a.FrameCount != 6 {
		t.Fatalf("audio %v frames %d", a.Audio, a.FrameCount)
	}
}

// Every truncation of a valid file must be refused cleanly: the RIFF size
// then always claims more than remains.
func TestParseAVITruncated(t *testing.T) {
	good := testAVI(baseSpec(t))
	for n := 0; n < len(good); n++ {
		_, err := ParseAVI(good[:n], DefaultContainerLimits())
		if !errors.Is(err, ErrCorruptContainer) && !errors.Is(err, ErrUnsupportedContainer) {
			t.Fatalf("cut at %d of %d: error = %v", n, len(good), err)
		}
	}
}

// Deterministic byte corruption must never panic; whatever parses must
// decode or fail with a sentinel.
func TestParseAVICorruptBytes(t *testing.T) {
	good := testAVI(baseSpec(t))
	state := uint32(12345)
	next := func() uint32 { state = state*1664525 + 1013904223; return state }
	for iter := 0; iter < 300; iter++ {
		b := append([]byte(nil), good...)
		for k := 0; k < 1+int(next()%4); k++ {
			b[int(next())%len(b)] = byte(next())
		}
		checkNoPanic(t, b)
	}
}

// checkNoPanic parses and decodes every frame, requiring sentinel errors.
// Frame sizes are capped at 1024² so a mutated JPEG header cannot make the
// harness spend its time allocating the default 8K limit.
func checkNoPanic(t *testing.T, b []byte) {
	t.Helper()
	limits := DefaultContainerLimits()
	limits.MaxWidth, limits.MaxHeight = 1024, 1024
	sentinels := []error{ErrCorruptContainer, ErrUnsupportedContainer, ErrUnsupportedCodec, ErrTooLarge}
	isSentinel := func(err error) bool {
		for _, s := range sentinels {
			if errors.Is(err, s) {
				return true
			}
		}
		return false
	}
	a, err := ParseAVI(b, limits)
	if err != nil {
		if !isSentinel(err) {
			t.Fatalf("parse error without sentinel: %v", err)
		}
		return
	}
	for i := 0; i < a.FrameCount; i++ {
		if _, err := a.DecodeFrame(i); err != nil && !isSentinel(err) {
			t.Fatalf("frame %d error without sentinel: %v", i, err)
		}
	}
}

func FuzzParseAVI(f *testing.F) {
	fixture, err := os.ReadFile("testdata/mjpeg_pcm_64x48_8f.avi")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(fixture)
	f.Add([]byte("RIFF\x04\x00\x00\x00AVI "))
	f.Add([]byte("RIFF\xff\xff\xff\xffAVI LIST\xff\xff\xff\xffhdrl"))
	f.Fuzz(func(t *testing.T, b []byte) { checkNoPanic(t, b) })
}

func TestFFmpegFixture(t *testing.T) {
	data, err := os.ReadFile("testdata/mjpeg_pcm_64x48_8f.avi")
	if err != nil {
		t.Fatal(err)
	}
	a, err := ParseAVI(data, DefaultContainerLimits())
	if err != nil {
		t.Fatal(err)
	}
	// ffprobe: mjpeg MJPG 64×48 8/1 fps, 8 frames; pcm_s16le 16 kHz mono.
	if a.FPS != 8 || a.FrameCount != 8 || a.Width != 64 || a.Height != 48 || a.Duration() != 1 {
		t.Fatalf("fps %v frames %d size %d×%d", a.FPS, a.FrameCount, a.Width, a.Height)
	}
	if au := a.Audio; au == nil || au.SampleRate != 16000 || au.Channels != 1 || au.BitsPerSample != 16 || len(au.Data) != 32000 || au.Duration() != 1 {
		t.Fatalf("audio %+v", a.Audio)
	}
	// Go's JPEG decode of frame 5 against ffmpeg's own decode of it: the
	// decoders differ in chroma upsampling and rounding by a few levels,
	// while neighbouring frames differ by tens (measured: mean 0.07, max 3
	// for frame 5; mean ≥ 2.1, max ≥ 45 for frames 3, 4, 6).
	pngData, err := os.ReadFile("testdata/ffmpeg_frame5.png")
	if err != nil {
		t.Fatal(err)
	}
	refImg, err := png.Decode(bytes.NewReader(pngData))
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := ToRGB(refImg, AlphaDrop)
	img, err := a.DecodeFrame(5)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := ToRGB(img, AlphaDrop)
	var sum, worst int
	for i := range ref.Pix {
		d := absDiff(got.Pix[i], ref.Pix[i])
		sum += d
		worst = max(worst, d)
	}
	if mean := float64(sum) / float64(len(ref.Pix)); mean > 0.5 || worst > 8 {
		t.Fatalf("frame 5 differs from ffmpeg's decode: mean %.2f, max %d", mean, worst)
	}
}

func TestProcessVideoFixture(t *testing.T) {
	data, err := os.ReadFile("testdata/mjpeg_pcm_64x48_8f.avi")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultVideoConfig()
	v, err := ProcessVideo(data, DefaultContainerLimits(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 8 frames at 8 fps sample 4 (see TestSampleFrameCount), indices
	// 0, 2, 4, 6; 48×64 frames smart-resize to 320×448 (TestSmartResize),
	// grid 2×20×28 = 1120 patches, 280 tokens; 2 frames per patch at 2 fps
	// sampling is 1 s per temporal patch.
	if !reflect.DeepEqual(v.FrameIndices, []int{0, 2, 4, 6}) {
		t.Fatalf("indices %v", v.FrameIndices)
	}
	if v.Grid != (Grid{T: 2, H: 20, W: 28}) || v.Width != 448 || v.Height != 320 || v.Dim != 1536 || v.Tokens() != 280 {
		t.Fatalf("grid %+v size %d×%d dim %d", v.Grid, v.Width, v.Height, v.Dim)
	}
	if v.SecondsPerGrid != 1 || v.SourceFPS != 8 || v.SourceFrames != 8 || v.SourceDuration != 1 || v.Audio == nil {
		t.Fatalf("seconds per grid %v, source %v fps %d frames %v s, audio %v", v.SecondsPerGrid, v.SourceFPS, v.SourceFrames, v.SourceDuration, v.Audio != nil)
	}
	for _, x := range v.Values {
		if x < -1 || x > 1 {
			t.Fatalf("normalized value %v outside [−1, 1]", x)
		}
	}
	again, err := ProcessVideo(data, DefaultContainerLimits(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if hashValues(v.Values) != hashValues(again.Values) {
		t.Fatal("two runs differ")
	}
}

// A temporal patch pairs consecutive sampled frames: patch rows of temporal
// index 1 come from sampled frames 2 and 3, so changing source frame 6 (the
// fourth sample) must change only the second half of the output.
func TestProcessVideoTemporalPairs(t *testing.T) {
	spec := baseSpec(t) // 6 frames at 3 fps → 4 samples: 0, 1, 3, 4
	cfg := DefaultVideoConfig()
	cfg.MinPixels, cfg.MaxPixels = 1024, 4096 // 32×16 → 32×32 (round 0.5 → 0, grows)
	a, err := ProcessVideo(testAVI(spec), DefaultContainerLimits(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.FrameIndices, []int{0, 1, 3, 4}) || a.Grid.T != 2 {
		t.Fatalf("indices %v grid %+v", a.FrameIndices, a.Grid)
	}
	spec.frames[4] = jpegFrames(t, 6, 32, 16)[0] // replace the fourth sample
	b, err := ProcessVideo(testAVI(spec), DefaultContainerLimits(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	half := len(a.Values) / 2
	if hashValues(a.Values[:half]) != hashValues(b.Values[:half]) {
		t.Fatal("temporal patch 0 changed although frames 0 and 1 did not")
	}
	if hashValues(a.Values[half:]) == hashValues(b.Values[half:]) {
		t.Fatal("temporal patch 1 did not change although frame 4 did")
	}
}

func TestProcessVideoRefusals(t *testing.T) {
	spec := baseSpec(t)
	spec.frames, spec.audio = spec.frames[:1], spec.audio[:1]
	if _, err := ProcessVideo(testAVI(spec), DefaultContainerLimits(), DefaultVideoConfig()); !errors.Is(err, ErrTooFewFrames) {
		t.Fatalf("one-frame video: %v", err)
	}
	cfg := DefaultVideoConfig()
	cfg.MaxPatches = 100 // the fixture needs 1120
	data, err := os.ReadFile("testdata/mjpeg_pcm_64x48_8f.avi")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ProcessVideo(data, DefaultContainerLimits(), cfg); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("patch budget: %v", err)
	}
	bad := baseSpec(t)
	bad.frames[1] = []byte("\xff\xd8\xff\xe0 not really a jpeg ")
	if _, err := ProcessVideo(testAVI(bad), DefaultContainerLimits(), DefaultVideoConfig()); !errors.Is(err, ErrCorruptContainer) {
		t.Fatalf("corrupt frame: %v", err)
	}
	mixed := baseSpec(t)
	mixed.frames[3] = jpegFrames(t, 1, 16, 16)[0]
	if _, err := ProcessVideo(testAVI(mixed), DefaultContainerLimits(), DefaultVideoConfig()); !errors.Is(err, ErrCorruptContainer) {
		t.Fatalf("frame of another size: %v", err)
	}
}
