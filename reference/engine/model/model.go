// Package model owns the reference engine's language model: a float32
// decoder with the Qwen3 architecture (RMSNorm, QK-normed grouped-query
// attention with rotary embeddings, SwiGLU MLP), its Hugging Face
// config.json and safetensors checkpoints, and a built-in tiny model.
//
// Forward computes each token position with exactly the same arithmetic,
// whether the position is computed alone or in a chunk with others, and
// keeps all cross-position state in the paged KV cache. That makes results
// bitwise independent of chunking and batching, which is what lets a
// prefill on one worker and a decode on another reproduce a colocated run
// bit for bit. Floating-point products are rounded explicitly (float32(a*b))
// so that no compiler fuses them into FMAs that would differ between
// architectures.
package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/engine/mmproc"
)

// Model is a loaded decoder. It is immutable after construction, so one
// Model serves any number of concurrent Forward calls.
type Model struct {
	Config Config

	embed  []float32 // [vocab][hidden]
	layers []layer
	norm   []float32 // [hidden]
	lmHead []float32 // [vocab][hidden]; the same slice as embed when tied

	invFreq []float64 // [headDim/2] rotary frequencies
	freqRow []int     // [headDim/2] the position row (0 t, 1 h, 2 w) each frequency rotates by
}

// layer holds one decoder layer's weights; linear weights are [out][in]
// row-major, as in the checkpoint.
type layer struct {
	inputNorm, postNorm []float32 // [hidden]
	qNorm, kNorm        []float32 // [headDim]
	q                   []float32 // [heads*headDim][hidden]
	k, v                []float32 // [kvHeads*headDim][hidden]
	o                   []float32 // [hidden][heads*headDim]
	gate, up            []float32 // [intermediate][hidden]
	down                []float32 // [hidden][intermediate]
}

// paramKind says how Default initialises a parameter.
type paramKind int

const (
	kindNorm paramKind = iota
	kindEmbed
	kindLinear
)

// param is one checkpoint tensor and where it lives in the Model. The list
// from params is the single source of names, shapes and order for loading,
// saving and initialising.
type param struct {
	name  string
	shape []int
	w     *[]float32
	kind  paramKind
}

func newModel(c Config) *Model {
	m := &Model{Config: c, layers: make([]layer, c.NumLayers)}
	m.invFreq = make([]float64, c.HeadDim/2)
	for i := range m.invFreq {
		m.invFreq[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
	}
	m.freqRow = make([]int, c.HeadDim/2) // plain RoPE: all temporal
	if c.MRope != (mmproc.RotarySections{}) {
		rows, err := c.MRope.FrequencyRows(c.HeadDim / 2)
		if err != nil {
			panic(err) // Validate checked it
		}
		for i, r := range rows {
			m.freqRow[i] = int(r)
		}
	}
	return m
}

// params lists the model's tensors in Hugging Face order. lm_head.weight
// is absent when the embeddings are tied.
func (m *Model) params() []param {
	c := m.Config
	h, q, kv := c.HiddenSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	ps := []param{{"model.embed_tokens.weight", []int{c.VocabSize, h}, &m.embed, kindEmbed}}
	for i := range m.layers {
		l := &m.layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		ps = append(ps,
			param{p + "input_layernorm.weight", []int{h}, &l.inputNorm, kindNorm},
			param{p + "self_attn.q_proj.weight", []int{q, h}, &l.q, kindLinear},
			param{p + "self_attn.k_proj.weight", []int{kv, h}, &l.k, kindLinear},
			param{p + "self_attn.v_proj.weight", []int{kv, h}, &l.v, kindLinear},
			param{p + "self_attn.o_proj.weight", []int{h, q}, &l.o, kindLinear},
			param{p + "self_attn.q_norm.weight", []int{c.HeadDim}, &l.qNorm, kindNorm},
			param{p + "self_attn.k_norm.weight", []int{c.HeadDim}, &l.kNorm, kindNorm},
			param{p + "post_attention_layernorm.weight", []int{h}, &l.postNorm, kindNorm},
			param{p + "mlp.gate_proj.weight", []int{c.IntermediateSize, h}, &l.gate, kindLinear},
			param{p + "mlp.up_proj.weight", []int{c.IntermediateSize, h}, &l.up, kindLinear},
			param{p + "mlp.down_proj.weight", []int{h, c.IntermediateSize}, &l.down, kindLinear},
		)
	}
	ps = append(ps, param{"model.norm.weight", []int{h}, &m.norm, kindNorm})
	if !c.TieWordEmbeddings {
		ps = append(ps, param{"lm_head.weight", []int{c.VocabSize, h}, &m.lmHead, kindLinear})
	}
	return ps
}

// tie points lm_head at the embeddings when the config says so; called
// once every parameter is filled.
func (m *Model) tie() {
	if m.Config.TieWordEmbeddings {
		m.lmHead = m.embed
	}
}

// DefaultConfig is the geometry of the built-in model: byte-level
// vocabulary (256 bytes, then <|endoftext|>, <|im_start|>, <|im_end|>, the
// seven multimodal markers and the three TTS tokens of tokenizer.Default,
// which TTSTokenIDs names as a Qwen3-Omni config does), with Qwen3-Omni's
// interleaved multimodal rotary layout scaled to its 8 frequencies
// (mmproc.RotarySections.FrequencyRows).
func DefaultConfig() Config {
	return Config{
		VocabSize:             269,
		MRope:                 mmproc.RotarySections{Temporal: 4, Height: 2, Width: 2, Interleaved: true},
		HiddenSize:            64,
		IntermediateSize:      128,
		NumLayers:             4,
		NumHeads:              4,
		NumKVHeads:            2,
		HeadDim:               16,
		MaxPositionEmbeddings: 32768,
		RopeTheta:             1e6,
		RMSNormEps:            1e-6,
		TieWordEmbeddings:     true,
		BOSTokenID:            256,
		EOSTokenIDs:           []int{258, 256},
		TTSTokenIDs:           []int{266, 267, 268},
	}
}

// defaultSeed fixes the built-in model's weights. Of the first dozen
// seeds it gives the most varied greedy output (random decoders tend to
// repeat one token), which makes engine tests compare something. Changing
// it changes every golden output built on Default.
const defaultSeed = 2

// seededVocab is the built-in vocabulary's size when defaultSeed was
// chosen. The embedding rows of tokens added since (the TTS tokens) are
// drawn after every other weight, so each weight drawn before keeps its
// value: an output built on Default changes only where it picks a new
// token.
const seededVocab = 266

// Default returns the built-in tiny model. Its weights come from a
// fixed-seed PCG through integer-exact arithmetic, so they are the same on
// every run, machine and architecture.
func Default() *Model {
	m, err := randomModel(DefaultConfig(), defaultSeed, seededVocab)
	if err != nil {
		panic(err) // DefaultConfig is valid; pinned by a test
	}
	return m
}

// randomModel makes a model with uniform random weights: linear layers
// with unit-variance outputs, unit norm weights, and small embeddings. With
// tied embeddings a large embedding row stays in the residual stream and
// votes for its own token, so greedy decoding would repeat the input; the
// final norm's weight instead sets the logit scale (standard deviation
// about 2). The embedding rows past firstRows are drawn last.
func randomModel(c Config, seed uint64, firstRows int) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	m := newModel(c)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var lastRows []float32
	for _, p := range m.params() {
		n := p.shape[0]
		if len(p.shape) == 2 {
			n *= p.shape[1]
		}
		w := make([]float32, n)
		switch p.kind {
		case kindNorm:
			for i := range w {
				w[i] = 1
			}
		case kindEmbed:
			split := min(firstRows, c.VocabSize) * c.HiddenSize
			fill(r, w[:split], 0.1)
			lastRows = w[split:]
		case kindLinear:
			// Uniform on ±sqrt(3/in) has variance 1/in: outputs keep the
			// scale of their normalised inputs.
			fill(r, w, float32(math.Sqrt(3/float64(p.shape[1]))))
		}
		*p.w = w
	}
	fill(r, lastRows, 0.1)
	for i := range m.norm {
		m.norm[i] = 4
	}
	m.tie()
	return m, nil
}

// fill draws uniform values on [-bound, bound). Going through 24-bit
// integers keeps every step exact but the final scaling, a single IEEE
// rounding, so no platform's float library can change a weight.
func fill(r *rand.Rand, w []float32, bound float32) {
	for i := range w {
		u := float32(r.Uint32()>>8) * (1.0 / (1 << 24))
		w[i] = (2*u - 1) * bound
	}
}

// KVShape is the cache geometry this model writes; blockSize <= 0 means
// kvcache.DefaultBlockSize.
func (m *Model) KVShape(blockSize int) kvcache.Shape {
	if blockSize <= 0 {
		blockSize = kvcache.DefaultBlockSize
	}
	return kvcache.Shape{
		Layers:    m.Config.NumLayers,
		KVHeads:   m.Config.NumKVHeads,
		HeadDim:   m.Config.HeadDim,
		BlockSize: blockSize,
	}
}

// Embedding returns a copy of token's row of embed_tokens (the Thinker
// exports such rows, e.g. of the TTS special tokens). It panics on a token
// outside the vocabulary.
func (m *Model) Embedding(token int) []float32 {
	m.checkToken(token)
	h := m.Config.HiddenSize
	return slices.Clone(m.embed[token*h : (token+1)*h])
}

func (m *Model) checkToken(token int) {
	if token < 0 || token >= m.Config.VocabSize {
		panic(fmt.Sprintf("model: token %d outside the vocabulary (size %d)", token, m.Config.VocabSize))
	}
}
