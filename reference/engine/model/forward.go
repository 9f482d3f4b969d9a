package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/omnipd/omnipd/reference/engine/kernel"
	"github.com/omnipd/omnipd/reference/engine/kvcache"
)

// Capture collects per-position conditioning for a downstream stage (the
// Thinker's "embed" and accept_hidden_layer rows). Forward appends one row
// per computed position, so one Capture can follow a sequence across
// chunks.
type Capture struct {
	// Layer is how many decoder layers have been applied to the captured
	// hidden state: 0 is the embeddings, NumLayers the last layer's output
	// before the final norm.
	Layer      int
	Embeddings [][]float32
	Hidden     [][]float32
}

// scratch is one Forward call's working memory, sized once per call so the
// loops below never allocate.
type scratch struct {
	normed   []float32 // [hidden]
	q        []float32 // [heads*headDim]
	attn     []float32 // [heads*headDim]
	out      []float32 // [hidden]
	gate, up []float32 // [intermediate]
	scores   []float32 // [heads][span]
	span     int       // positions an attention row can cover in this call
	cos, sin []float32 // [tokens][headDim/2]
}

// Forward computes the tokens at positions start..start+len(tokens)-1 of
// one sequence. table lists the sequence's cache blocks, already allocated
// to cover start+len(tokens) positions; the keys and values of positions
// before start must already be in the cache. Forward writes the new
// positions' keys and values into the cache and returns the logits
// (VocabSize of them) of the last position, or nil for no tokens. When
// capture is not nil it appends, per computed position, the token's
// embedding row and the hidden state after capture.Layer layers.
//
// A position's results depend only on the tokens and cache contents before
// it, never on how positions are split across calls or which other
// sequences are computed. Concurrent calls are safe when they write
// disjoint blocks. Forward panics on caller bugs: a token outside the
// vocabulary, a short block table, a cache of another geometry, or a
// capture layer out of range.
func (m *Model) Forward(cache *kvcache.Cache, table []int, start int, tokens []int, capture *Capture) []float32 {
	return m.ForwardInputs(cache, table, start, tokens, Inputs{}, capture)
}

// Inputs is what a multimodal prompt adds to its token ids, for the
// positions one Forward computes.
type Inputs struct {
	// Embeds[t], when not nil, is the input row of position start+t in
	// place of its token's embedding: an encoder output at a placeholder.
	// Nil, or shorter than the tokens: token embeddings.
	Embeds [][]float32
	// Positions[t] is position start+t's rotary position on each row
	// (temporal, height, width: Qwen3-Omni's TM-RoPE, which Config.MRope
	// maps onto the frequencies). Nil: start+t on every row, plain RoPE.
	Positions [][3]int
}

// ForwardInputs is Forward with a multimodal prompt's inputs.
func (m *Model) ForwardInputs(cache *kvcache.Cache, table []int, start int, tokens []int, in Inputs, capture *Capture) []float32 {
	n := len(tokens)
	if n == 0 {
		return nil
	}
	m.checkForward(cache, table, start, tokens, capture)
	c := &m.Config
	hid := c.HiddenSize
	if in.Positions != nil && len(in.Positions) != n {
		panic(fmt.Sprintf("model: %d positions for %d tokens", len(in.Positions), n))
	}
	s := m.newScratch(start, n, in.Positions)

	x := make([]float32, n*hid) // the residual stream of every computed position
	for t, tok := range tokens {
		row := m.embed[tok*hid : (tok+1)*hid]
		if t < len(in.Embeds) && in.Embeds[t] != nil {
			if len(in.Embeds[t]) != hid {
				panic(fmt.Sprintf("model: an input row of width %d; hidden size is %d", len(in.Embeds[t]), hid))
			}
			row = in.Embeds[t]
		}
		copy(x[t*hid:(t+1)*hid], row)
	}
	if capture != nil {
		for t := range n {
			capture.Embeddings = append(capture.Embeddings, slices.Clone(x[t*hid:(t+1)*hid]))
		}
		if capture.Layer == 0 {
			capture.appendHidden(x, n, hid)
		}
	}

	// Layer by layer, so a layer's weights stay in cache across the chunk;
	// within a layer, position by position, so position t's attention sees
	// the keys of earlier positions of this chunk already in the cache.
	for l := range m.layers {
		for t := range n {
			m.layerStep(l, cache, table, start+t, t, x[t*hid:(t+1)*hid], s)
		}
		if capture != nil && capture.Layer == l+1 {
			capture.appendHidden(x, n, hid)
		}
	}

	last := x[(n-1)*hid:]
	kernel.RMSNorm(s.normed, last, m.norm, c.RMSNormEps)
	logits := make([]float32, c.VocabSize)
	kernel.MatVec(logits, m.lmHead, s.normed)
	return logits
}

func (cp *Capture) appendHidden(x []float32, n, hid int) {
	for t := range n {
		cp.Hidden = append(cp.Hidden, slices.Clone(x[t*hid:(t+1)*hid]))
	}
}

func (m *Model) checkForward(cache *kvcache.Cache, table []int, start int, tokens []int, capture *Capture) {
	c := &m.Config
	sh := cache.Shape()
	if sh.Layers != c.NumLayers || sh.KVHeads != c.NumKVHeads || sh.HeadDim != c.HeadDim {
		panic(fmt.Sprintf("model: cache of %d layers × %d KV heads × %d head_dim; model needs %d × %d × %d",
			sh.Layers, sh.KVHeads, sh.HeadDim, c.NumLayers, c.NumKVHeads, c.HeadDim))
	}
	if start < 0 {
		panic(fmt.Sprintf("model: negative start position %d", start))
	}
	if end := start + len(tokens); len(table) < sh.BlocksFor(end) {
		panic(fmt.Sprintf("model: block table of %d blocks cannot hold %d positions (block size %d)", len(table), end, sh.BlockSize))
	}
	for _, tok := range tokens {
		m.checkToken(tok)
	}
	if capture != nil && (capture.Layer < 0 || capture.Layer > c.NumLayers) {
		panic(fmt.Sprintf("model: capture layer %d outside 0..%d", capture.Layer, c.NumLayers))
	}
}

func (m *Model) newScratch(start, n int, positions [][3]int) *scratch {
	c := &m.Config
	qDim, half := c.NumHeads*c.HeadDim, c.HeadDim/2
	span := start + n
	s := &scratch{
		normed: make([]float32, c.HiddenSize),
		q:      make([]float32, qDim),
		attn:   make([]float32, qDim),
		out:    make([]float32, c.HiddenSize),
		gate:   make([]float32, c.IntermediateSize),
		up:     make([]float32, c.IntermediateSize),
		scores: make([]float32, c.NumHeads*span),
		span:   span,
		cos:    make([]float32, n*half),
		sin:    make([]float32, n*half),
	}
	// The angles depend on the position only, so every layer shares them;
	// they are computed in float64 and rounded once. Frequency i rotates by
	// the position on its row (m.freqRow); with no positions given every
	// row is the sequence index.
	for t := range n {
		for i, f := range m.invFreq {
			pos := float64(start + t)
			if positions != nil {
				pos = float64(positions[t][m.freqRow[i]])
			}
			sin, cos := math.Sincos(pos * f)
			s.cos[t*half+i], s.sin[t*half+i] = float32(cos), float32(sin)
		}
	}
	return s
}

// layerStep applies decoder layer l to one position, updating its residual
// stream x in place and writing its keys and values into the cache.
func (m *Model) layerStep(l int, cache *kvcache.Cache, table []int, pos, t int, x []float32, s *scratch) {
	c := &m.Config
	w := &m.layers[l]
	hd, half := c.HeadDim, c.HeadDim/2
	cos, sin := s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half]

	kernel.RMSNorm(s.normed, x, w.inputNorm, c.RMSNormEps)
	block, slot := cache.Position(table, pos)
	k, v := cache.K(block, l, slot), cache.V(block, l, slot)
	kernel.MatVec(s.q, w.q, s.normed)
	kernel.MatVec(k, w.k, s.normed)
	kernel.MatVec(v, w.v, s.normed)
	for h := range c.NumHeads {
		qh := s.q[h*hd : (h+1)*hd]
		kernel.RMSNorm(qh, qh, w.qNorm, c.RMSNormEps)
		kernel.RotateHalf(qh, cos, sin)
	}
	for h := range c.NumKVHeads {
		kh := k[h*hd : (h+1)*hd]
		kernel.RMSNorm(kh, kh, w.kNorm, c.RMSNormEps)
		kernel.RotateHalf(kh, cos, sin)
	}

	m.attend(l, cache, table, pos, s)
	kernel.MatVec(s.out, w.o, s.attn)
	kernel.Add(x, s.out)

	kernel.RMSNorm(s.normed, x, w.postNorm, c.RMSNormEps)
	kernel.MatVec(s.gate, w.gate, s.normed)
	kernel.MatVec(s.up, w.up, s.normed)
	for i, g := range s.gate {
		s.gate[i] = float32(kernel.SiLU(g) * s.up[i])
	}
	kernel.MatVec(s.out, w.down, s.gate)
	kernel.Add(x, s.out)
}

// attend computes causal grouped-query attention of the position's
// queries (s.q) over the cached keys and values of positions 0..pos of
// layer l, into s.attn.
func (m *Model) attend(l int, cache *kvcache.Cache, table []int, pos int, s *scratch) {
	c := &m.Config
	hd, group := c.HeadDim, c.NumHeads/c.NumKVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	n := pos + 1
	for j := range n {
		block, slot := cache.Position(table, j)
		k := cache.K(block, l, slot)
		for h := range c.NumHeads {
			kv := h / group
			s.scores[h*s.span+j] = float32(kernel.Dot(s.q[h*hd:(h+1)*hd], k[kv*hd:(kv+1)*hd]) * scale)
		}
	}
	for h := range c.NumHeads {
		kernel.Softmax(s.scores[h*s.span : h*s.span+n])
	}
	clear(s.attn)
	for j := range n {
		block, slot := cache.Position(table, j)
		v := cache.V(block, l, slot)
		for h := range c.NumHeads {
			kv := h / group
			kernel.Axpy(s.attn[h*hd:(h+1)*hd], s.scores[h*s.span+j], v[kv*hd:(kv+1)*hd])
		}
	}
}
