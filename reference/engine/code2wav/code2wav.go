// Package code2wav is the reference Code2Wav: a tiny, deterministic stand-in
// for Qwen3-Omni's codec decoder that turns Talker codec frames (16 codebook
// ids in 0..2047 each) into 24 kHz mono audio, exactly audio.SamplesPerFrame
// samples per frame.
//
// It is not a vocoder; it is built so that the serving path around it can be
// proved correct. It is causal with a receptive field of ReceptiveField
// frames: the samples of frame t depend only on frames t-R..t. Decoding a
// stream chunk by chunk with at least R frames of left context, and trimming
// the context's samples, therefore reproduces whole-stream decoding bit for
// bit, which is what lets tests pin streamed audio against offline audio.
package code2wav

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/omnipd/omnipd/audio"
)

// Shape of the codec Qwen3-Omni's Talker emits.
const (
	Codebooks    = 16   // ids per frame
	CodebookSize = 2048 // ids are 0..CodebookSize-1
)

const (
	// receptiveField is R: frame t's samples depend on frames t-R..t. It
	// must stay well under the deploy default left context (25) and under
	// the initial chunk (4), so every chunk the default Chunker emits after
	// the first carries the full history its frames need.
	receptiveField = 2
	dim            = 8                // embedding and mixed-vector width
	partials       = 4                // sinusoids per frame
	seed           = 0x6f6d6e69706420 // "omnipd ", fixed so weights never change
)

// ErrInvalidFrame is wrapped by errors about malformed codec frames.
var ErrInvalidFrame = errors.New("code2wav: invalid codec frame")

// Model is an immutable reference Code2Wav; it is safe for concurrent use.
type Model struct {
	embed [Codebooks][CodebookSize][dim]float32
	// mix[r] weighs the embedding of frame t-r in frame t's mixed vector.
	mix  [receptiveField + 1][dim][dim]float32
	bias [dim]float32
}

// defaultModel is built once: the tables are 1 MiB and never change.
var defaultModel = sync.OnceValue(func() *Model {
	m := new(Model)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	// Scale so the sum of 16 embeddings has roughly unit variance.
	for c := range m.embed {
		for id := range m.embed[c] {
			for k := range m.embed[c][id] {
				m.embed[c][id][k] = float32(r.NormFloat64() / 4)
			}
		}
	}
	// The current frame dominates; older frames contribute less, as a
	// causal convolution over the codec sequence would.
	for lag := range m.mix {
		scale := 0.6 / float64(lag+1) / math.Sqrt(dim)
		for i := range m.mix[lag] {
			for j := range m.mix[lag][i] {
				m.mix[lag][i][j] = float32(r.NormFloat64() * scale)
			}
		}
	}
	for k := range m.bias {
		m.bias[k] = float32(r.NormFloat64() / 4)
	}
	return m
})

// Default returns the reference Code2Wav. Every call returns the same model.
func Default() *Model { return defaultModel() }

// ReceptiveField returns R, the number of preceding frames a frame's samples
// depend on. Chunked decoding is exact when every chunk that does not start
// the stream carries at least R frames of left context.
func (m *Model) ReceptiveField() int { return receptiveField }

// CheckLeftContext reports an error when left frames of context (a
// Chunker's EffectiveLeftContext) cannot cover the receptive field, in which
// case chunked audio would differ from whole-stream audio at chunk borders.
func (m *Model) CheckLeftContext(left int) error {
	if left < receptiveField {
		return fmt.Errorf("code2wav: left context of %d frames is smaller than the receptive field of %d frames", left, receptiveField)
	}
	return nil
}

// Decode turns codec frames into audio: audio.SamplesPerFrame samples per
// frame, each in [-1, 1]. frames[0] starts the stream: the history before
// it counts as zero embeddings.
func (m *Model) Decode(frames [][]int) ([]float32, error) {
	return m.DecodeChunk(frames, 0)
}

// DecodeChunk decodes frames whose first context frames are left context and
// returns the samples of the other frames only: the first
// context*audio.SamplesPerFrame samples are dropped. The context frames are
// embedded but not synthesised, since their samples would be discarded. For
// the result to match whole-stream decoding, context must be at least
// ReceptiveField unless frames[0] is the start of the stream.
func (m *Model) DecodeChunk(frames [][]int, context int) ([]float32, error) {
	if context < 0 || context > len(frames) {
		return nil, fmt.Errorf("code2wav: context of %d frames for a chunk of %d frames", context, len(frames))
	}
	emb := make([][dim]float32, len(frames))
	for t, f := range frames {
		if len(f) != Codebooks {
			return nil, fmt.Errorf("%w: frame %d has %d codebooks; want %d", ErrInvalidFrame, t, len(f), Codebooks)
		}
		for c, id := range f {
			if id < 0 || id >= CodebookSize {
				return nil, fmt.Errorf("%w: frame %d codebook %d: id %d outside 0..%d", ErrInvalidFrame, t, c, id, CodebookSize-1)
			}
			for k := range dim {
				emb[t][k] += m.embed[c][id][k]
			}
		}
	}
	out := make([]float32, (len(frames)-context)*audio.SamplesPerFrame)
	for t := context; t < len(frames); t++ {
		v := m.mixed(emb, t)
		m.synthesize(out[(t-context)*audio.SamplesPerFrame:][:audio.SamplesPerFrame], &v)
	}
	return out, nil
}

// mixed returns frame t's mixed vector, a causal combination of the
// embeddings of frames t-R..t; frames before the slice count as zeros. It
// reads nothing else, which is the whole of the chunking guarantee.
func (m *Model) mixed(emb [][dim]float32, t int) [dim]float32 {
	acc := m.bias
	// Oldest lag first, so the summation order is fixed regardless of how
	// many predecessors exist (an absent one adds exact zeros).
	for lag := receptiveField; lag >= 0; lag-- {
		if t-lag < 0 {
			continue
		}
		e := &emb[t-lag]
		for i := range dim {
			var s float32
			for j := range dim {
				s += m.mix[lag][i][j] * e[j]
			}
			acc[i] += s
		}
	}
	for i := range acc {
		acc[i] = float32(math.Tanh(float64(acc[i])))
	}
	return acc
}

// synthesize writes one frame of audio from its mixed vector v: a sum of
// partials whose frequencies and amplitudes come from v, with time measured
// from the frame's own first sample so a sample never depends on where the
// frame sits in the stream.
func (m *Model) synthesize(out []float32, v *[dim]float32) {
	var freq, amp, phase [partials]float64
	for k := range partials {
		// v is in (-1, 1): partial k sweeps an octave-ish band above
		// 110·(k+1) Hz, with an amplitude that never reaches zero so no
		// frame decodes to silence.
		freq[k] = 2 * math.Pi * 110 * float64(k+1) * (1.5 + float64(v[k])) / audio.SampleRate
		amp[k] = 0.15 + 0.1*float64(v[partials+k])
		phase[k] = math.Pi * float64(v[(k+1)%dim])
	}
	for n := range out {
		var s float64
		for k := range partials {
			s += amp[k] * math.Sin(freq[k]*float64(n)+phase[k])
		}
		// tanh keeps the output inside [-1, 1] whatever the mix.
		out[n] = float32(math.Tanh(s))
	}
}
