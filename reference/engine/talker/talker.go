// Package talker owns the reference engine's Talker: the stage that turns the
// Thinker's conditioning (layer-0 embedding rows and accept-layer hidden rows
// of a whole conversation) into Qwen3-Omni codec frames, one frame of 16
// codebook ids per step, for Code2Wav to render.
//
// It reproduces the real Talker's contracts at tiny size so the serving path
// around it can be tested on a CPU: the prompt is built from the chat
// structure exactly as vllm-omni builds it (system turns skipped, user turns
// projected row by row, a fixed 9-row assistant block), so its length is
// Σ(user segment lengths) + 9; the Thinker's remaining reply text is fed in
// one row per step, then tts_eos, then tts_pad; the first codebook comes from
// a head over 2048 codes plus the stop code 2150, the other 15 from a small
// multi-token head. The weights are random, so the audio is noise, but it is
// deterministic noise that depends on every conditioning row.
//
// Like reference/engine/model, all products are rounded explicitly (float32(a*b)) so
// that no compiler fuses them into FMAs: frames are the same on every
// architecture, which lets tests pin PD output against colocated output.
package talker

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// Codec geometry and special codec ids. The ids below 2048 are codes; the
// specials follow the real Talker's config (codec_pad_id 2148, codec_bos_id
// 2149, codec_eos_token_id 2150, codec_nothink_id 2155, codec_think_bos_id
// 2156, codec_think_eos_id 2157); the reference has one voice, speaker 2158.
const (
	Codebooks    = 16   // ids per frame
	CodebookSize = 2048 // ids per codebook are 0..CodebookSize-1
	StopCode     = 2150 // first-codebook id that ends generation

	codecPad      = 2148
	codecBos      = 2149
	codecNothink  = 2155
	codecThinkBos = 2156
	codecThinkEos = 2157
	codecSpeaker  = 2158

	// AssistantRows is the fixed length of the assistant block of the
	// Talker prompt: 3 header rows, 4 tts_pad, tts_bos, first text token.
	AssistantRows = 9
)

// Config is the Talker's geometry.
type Config struct {
	ThinkerHidden    int // width of the conditioning rows and TTS vectors
	Hidden           int // the Talker's own width (text projection output)
	Layers           int
	Heads            int
	HeadDim          int
	Intermediate     int
	CodecVocab       int // first-codebook embedding and head rows; > every special id
	RopeTheta        float64
	RMSNormEps       float64
	DefaultMaxFrames int // used when Params.MaxFrames is 0

	// TailFrames is how many frames the reference Talker speaks on tts_pad
	// input after the text stream (reply rows, then tts_eos) is used up
	// before it emits the stop code. The real Talker learned to stop once
	// the text ends; random weights cannot, so the reference forces it, which
	// makes audio length follow reply length as it does in production. A
	// negative value disables the rule: then only a sampled stop code or
	// MaxFrames ends generation.
	TailFrames int
}

// DefaultConfig is the built-in Talker: it reads the 64-wide rows of
// model.Default() and, like the real model (2048 → 1024), projects them to
// a narrower width of its own.
func DefaultConfig() Config {
	return Config{
		ThinkerHidden:    64,
		Hidden:           32,
		Layers:           2,
		Heads:            2,
		HeadDim:          16,
		Intermediate:     64,
		CodecVocab:       2160,
		RopeTheta:        1e4,
		RMSNormEps:       1e-6,
		DefaultMaxFrames: 2048,
		TailFrames:       2,
	}
}

// Validate reports the first inconsistency in c.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"thinker_hidden", c.ThinkerHidden}, {"hidden", c.Hidden}, {"layers", c.Layers},
		{"heads", c.Heads}, {"head_dim", c.HeadDim}, {"intermediate", c.Intermediate},
		{"default_max_frames", c.DefaultMaxFrames},
	} {
		if f.v <= 0 || f.v > 1<<16 {
			return fmt.Errorf("talker: config %s: want 1..65536, got %d", f.name, f.v)
		}
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("talker: config head_dim: must be even for rotary embeddings, got %d", c.HeadDim)
	}
	if c.CodecVocab <= codecSpeaker || c.CodecVocab > 1<<16 {
		return fmt.Errorf("talker: config codec_vocab: want %d..65536, got %d", codecSpeaker+1, c.CodecVocab)
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) || !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		return fmt.Errorf("talker: config rope_theta and rms_norm_eps must be positive and finite")
	}
	return nil
}

// Model is a Talker. It is immutable after construction, so one Model serves
// any number of concurrent Generate calls.
type Model struct {
	Config Config

	textProj   []float32 // [hidden][thinkerHidden]: text positions and TTS vectors
	hiddenProj []float32 // [hidden][thinkerHidden]: multimodal positions' hidden rows
	codecEmbed []float32 // [codecVocab][hidden]: first codebook and codec specials
	layers     []layer
	norm       []float32 // [hidden]
	codecHead  []float32 // [codecVocab][hidden]

	// The multi-token head ("code predictor"): predEmbed[j] embeds codebook
	// j+1's id, predHead[j] predicts codebook j+1.
	predNorm  []float32   // [hidden]
	predEmbed [][]float32 // [Codebooks-1][CodebookSize][hidden]
	predHead  [][]float32 // [Codebooks-1][CodebookSize][hidden]

	invFreq []float64 // [headDim/2]
}

// layer is one pre-norm decoder layer; linear weights are [out][in].
type layer struct {
	inNorm, postNorm []float32
	q, k, v, o       []float32
	gate, up, down   []float32
}

// defaultSeed fixes the built-in Talker's weights; changing it changes every
// frame any golden test pins.
const defaultSeed = 0x74616c6b6572 // "talker"

var defaultModel = sync.OnceValue(func() *Model {
	m, err := New(DefaultConfig(), defaultSeed)
	if err != nil {
		panic(err) // DefaultConfig is valid; pinned by a test
	}
	return m
})

// Default returns the built-in Talker. It is built once (its tables are
// about 8 MiB) and shared, which is safe because a Model is immutable.
func Default() *Model { return defaultModel() }

// New makes a Talker of geometry c with uniform random weights drawn from a
// PCG seeded with seed. The draws go through 24-bit integers, so the weights
// are the same on every machine.
func New(c Config, seed uint64) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h, th, qd := c.Hidden, c.ThinkerHidden, c.Heads*c.HeadDim
	// linear draws weights whose outputs keep their inputs' scale
	// (variance 1/in per weight).
	linear := func(out, in int) []float32 {
		return draw(r, out*in, float32(math.Sqrt(3/float64(in))))
	}
	ones := func(n int) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = 1
		}
		return w
	}
	m := &Model{Config: c}
	m.textProj = linear(h, th)
	m.hiddenProj = linear(h, th)
	m.codecEmbed = draw(r, c.CodecVocab*h, 0.5)
	m.layers = make([]layer, c.Layers)
	for i := range m.layers {
		m.layers[i] = layer{
			inNorm: ones(h), postNorm: ones(h),
			q: linear(qd, h), k: linear(qd, h), v: linear(qd, h), o: linear(h, qd),
			gate: linear(c.Intermediate, h), up: linear(c.Intermediate, h), down: linear(h, c.Intermediate),
		}
	}
	m.norm = ones(h)
	// Heads read unit-RMS states; scaling by 2 gives logits a standard
	// deviation near 2, enough spread for sampling to matter.
	m.codecHead = draw(r, c.CodecVocab*h, 2*float32(math.Sqrt(3/float64(h))))
	m.predNorm = ones(h)
	m.predEmbed = make([][]float32, Codebooks-1)
	m.predHead = make([][]float32, Codebooks-1)
	for j := range Codebooks - 1 {
		m.predEmbed[j] = draw(r, CodebookSize*h, 0.5)
		m.predHead[j] = draw(r, CodebookSize*h, 2*float32(math.Sqrt(3/float64(h))))
	}
	m.invFreq = make([]float64, c.HeadDim/2)
	for i := range m.invFreq {
		m.invFreq[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
	}
	return m, nil
}

// draw returns n uniform values on [-bound, bound). Only the final scaling
// rounds, so no platform's float library can change a weight.
func draw(r *rand.Rand, n int, bound float32) []float32 {
	w := make([]float32, n)
	for i := range w {
		u := float32(r.Uint32()>>8) * (1.0 / (1 << 24))
		w[i] = (2*u - 1) * bound
	}
	return w
}
