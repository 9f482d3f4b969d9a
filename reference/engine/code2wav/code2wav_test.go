package code2wav

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/omnipd/omnipd/audio"
)

// frames returns n deterministic, varied codec frames.
func frames(n int) [][]int {
	out := make([][]int, n)
	for t := range out {
		f := make([]int, Codebooks)
		for c := range f {
			f[c] = (t*7919 + c*104729 + t*c*31) % CodebookSize
		}
		out[t] = f
	}
	return out
}

func TestDecodeLengthAndRange(t *testing.T) {
	m := Default()
	for _, n := range []int{0, 1, 3, 10} {
		pcm, err := m.Decode(frames(n))
		if err != nil {
			t.Fatal(err)
		}
		if len(pcm) != n*audio.SamplesPerFrame {
			t.Fatalf("%d frames: %d samples; want %d", n, len(pcm), n*audio.SamplesPerFrame)
		}
		for i, v := range pcm {
			if !(v >= -1 && v <= 1) {
				t.Fatalf("%d frames: sample %d = %v outside [-1, 1]", n, i, v)
			}
		}
	}
}

func TestDecodeDeterministic(t *testing.T) {
	a, err := Default().Decode(frames(6))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Default().Decode(frames(6))
	if !slices.Equal(a, b) {
		t.Fatal("two decodes of the same frames differ")
	}
}

// TestChunkedEqualsWhole is the invariant the serving path relies on:
// decoding the chunks the default Chunker emits, with their left context
// trimmed, gives exactly the samples of decoding the whole stream.
func TestChunkedEqualsWhole(t *testing.T) {
	m := Default()
	for _, n := range []int{1, 3, 4, 5, 29, 30, 54, 80} {
		in := frames(n)
		whole, err := m.Decode(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []*audio.Chunker{
			{Initial: 4, Size: 25, LeftContext: 25},
			{Initial: 1, Size: 3, LeftContext: m.ReceptiveField()},
		} {
			if err := m.CheckLeftContext(c.EffectiveLeftContext()); err != nil {
				t.Fatal(err)
			}
			var chunks []audio.Chunk
			for _, f := range in {
				chunks = append(chunks, c.Push(f)...)
			}
			chunks = append(chunks, c.Flush()...)
			var streamed []float32
			for _, ch := range chunks {
				pcm, err := m.DecodeChunk(ch.Frames, ch.Context)
				if err != nil {
					t.Fatal(err)
				}
				if len(pcm) != len(ch.New())*audio.SamplesPerFrame {
					t.Fatalf("chunk at %d: %d samples; want %d", ch.Start, len(pcm), len(ch.New())*audio.SamplesPerFrame)
				}
				streamed = append(streamed, pcm...)
			}
			if len(streamed) != len(whole) {
				t.Fatalf("n=%d %+v: %d streamed samples; want %d", n, *c, len(streamed), len(whole))
			}
			for i := range whole {
				if math.Float32bits(streamed[i]) != math.Float32bits(whole[i]) {
					t.Fatalf("n=%d %+v: sample %d (frame %d) streamed %v; whole %v", n, *c, i, i/audio.SamplesPerFrame, streamed[i], whole[i])
				}
			}
		}
	}
}

// TestShortContextDiffers shows the receptive field is real: with less left
// context than R, chunk borders change the audio, so CheckLeftContext matters.
func TestShortContextDiffers(t *testing.T) {
	m := Default()
	in := frames(8)
	whole, _ := m.Decode(in)
	tail, err := m.DecodeChunk(in[6-m.ReceptiveField()+1:], m.ReceptiveField()-1)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(tail, whole[6*audio.SamplesPerFrame:]) {
		t.Fatal("decoding with too little context matched; the receptive field is smaller than ReceptiveField says")
	}
	if err := m.CheckLeftContext(m.ReceptiveField() - 1); err == nil {
		t.Fatal("CheckLeftContext accepted a context smaller than the receptive field")
	}
	if err := m.CheckLeftContext(audio.DefaultLeftContextFrames); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeInvalid(t *testing.T) {
	m := Default()
	for name, f := range map[string][]int{
		"id too large": append(make([]int, Codebooks-1), CodebookSize),
		"negative id":  append([]int{-1}, make([]int, Codebooks-1)...),
		"stop token":   append(make([]int, Codebooks-1), 2150),
		"15 codebooks": make([]int, Codebooks-1),
		"17 codebooks": make([]int, Codebooks+1),
		"empty":        nil,
	} {
		in := append(frames(2), f)
		if _, err := m.Decode(in); !errors.Is(err, ErrInvalidFrame) {
			t.Errorf("%s: err = %v; want ErrInvalidFrame", name, err)
		}
		// An invalid context frame is still an error: it would be
		// embedded into the next frame's history.
		if _, err := m.DecodeChunk([][]int{f, frames(1)[0]}, 1); !errors.Is(err, ErrInvalidFrame) {
			t.Errorf("%s as context: err = %v; want ErrInvalidFrame", name, err)
		}
	}
	for _, ctx := range []int{-1, 3} {
		if _, err := m.DecodeChunk(frames(2), ctx); err == nil {
			t.Errorf("context %d of 2 frames: no error", ctx)
		}
	}
}

func TestDifferentFramesDifferentAudio(t *testing.T) {
	m := Default()
	in := frames(2)
	a, _ := m.Decode(in[:1])
	b, _ := m.Decode(in[1:])
	if slices.Equal(a, b) {
		t.Fatal("two different frames decode to the same audio")
	}
	// One codebook changed is enough to change the audio.
	c := slices.Clone(in[0])
	c[15] = (c[15] + 1) % CodebookSize
	d, _ := m.Decode([][]int{c})
	if slices.Equal(a, d) {
		t.Fatal("changing codebook 15 did not change the audio")
	}
	// Not silence: a real fraction of the frame's energy is there.
	for _, pcm := range [][]float32{a, b, d} {
		var energy float64
		for _, v := range pcm {
			energy += float64(v) * float64(v)
		}
		if rms := math.Sqrt(energy / float64(len(pcm))); rms < 0.05 {
			t.Fatalf("rms %v; want audible audio", rms)
		}
	}
}

func BenchmarkDecode100Frames(b *testing.B) {
	m := Default()
	in := frames(100)
	b.SetBytes(100 * audio.SamplesPerFrame * 4)
	for b.Loop() {
		if _, err := m.Decode(in); err != nil {
			b.Fatal(err)
		}
	}
}
