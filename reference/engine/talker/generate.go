package talker

import (
	"errors"
	"fmt"
	"github.com/omnipd/omnipd/reference/engine/kernel"
	"math"
	"math/rand/v2"
	"slices"
)

// ErrInvalidParams is wrapped by errors about malformed Params.
var ErrInvalidParams = errors.New("talker: invalid params")

// Params are a request's sampling parameters; they apply to all 16
// codebooks. The zero value is greedy with the model's default frame limit.
type Params struct {
	// Temperature 0 is greedy: the argmax, lowest id on ties.
	Temperature float64
	// TopK > 0 samples among the K most likely ids only (ties broken by
	// lower id); 0 means all.
	TopK int
	// Seed makes sampling reproducible: frames then depend only on the
	// conditioning, the params and the seed. Without it a sampled request
	// draws a random seed, as vLLM does.
	Seed *int64
	// MaxFrames caps the frames emitted; 0 means Config.DefaultMaxFrames.
	MaxFrames int
}

func (p Params) validate() error {
	switch {
	case math.IsNaN(p.Temperature) || math.IsInf(p.Temperature, 0) || p.Temperature < 0:
		return fmt.Errorf("%w: temperature must be finite and >= 0, got %v", ErrInvalidParams, p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("%w: top_k must be >= 0, got %d", ErrInvalidParams, p.TopK)
	case p.MaxFrames < 0:
		return fmt.Errorf("%w: max_frames must be >= 0, got %d", ErrInvalidParams, p.MaxFrames)
	}
	return nil
}

// Generate runs the Talker on c and calls emit with each codec frame (16
// ids in 0..CodebookSize-1; emit must not keep the slice past the call)
// until the first codebook is StopCode, MaxFrames frames were emitted, or
// emit returns false. The stop code's frame is not emitted.
//
// Step 0 reads the Talker's hidden state after the prompt. Each later
// step's input is the sum of the previous frame's 16 codebook embeddings
// plus one text row: the next trailing reply row, then tts_eos, then
// tts_pad for as long as the Talker keeps speaking — the real Talker's
// non-streaming (async_chunk: false) decode.
func (m *Model) Generate(c *Conditioning, s Segmenter, p Params, emit func(frame []int) bool) error {
	if err := p.validate(); err != nil {
		return err
	}
	pl, err := m.check(c, s)
	if err != nil {
		return err
	}
	return m.run(wholeRows{c}, c, pl, s.Multimodal, p, emit)
}

// firstCode picks the first codebook id from the final hidden state. Only
// codes and the stop code are allowed; the other specials (pad, bos, think
// markers) are inputs, never outputs. forceStop is the reference stand-in
// for the learned end of speech (see Config.TailFrames).
func (m *Model) firstCode(smp *sampler, hid []float32, forceStop bool) int {
	if forceStop {
		return StopCode
	}
	h := m.Config.Hidden
	x := make([]float32, h)
	kernel.RMSNorm(x, hid, m.norm, m.Config.RMSNormEps)
	logits := make([]float32, CodebookSize+1) // codes, then the stop code
	kernel.MatVec(logits[:CodebookSize], m.codecHead[:CodebookSize*h], x)
	logits[CodebookSize] = kernel.Dot(m.codecHead[StopCode*h:(StopCode+1)*h], x)
	id := smp.sample(logits)
	if id == CodebookSize {
		return StopCode
	}
	return id
}

// predict fills frame[1:] with the multi-token head: a recurrence that
// starts from the step's hidden state and folds in each chosen id's
// embedding before predicting the next codebook, so every codebook is
// conditioned on the hidden state and all codebooks before it — the shape
// of the real code predictor, without its transformer.
func (m *Model) predict(smp *sampler, hid []float32, frame []int) {
	h := m.Config.Hidden
	s := slices.Clone(hid)
	logits := make([]float32, CodebookSize)
	kernel.Add(s, m.codecEmbed[frame[0]*h:(frame[0]+1)*h])
	for j := 1; j < Codebooks; j++ {
		x := make([]float32, h)
		kernel.RMSNorm(x, s, m.predNorm, m.Config.RMSNormEps)
		kernel.MatVec(logits, m.predHead[j-1], x)
		frame[j] = smp.sample(logits)
		copy(s, x)
		kernel.Add(s, m.predEmbed[j-1][frame[j]*h:(frame[j]+1)*h])
	}
}

// sampler draws ids from logits: greedy at temperature 0, else from the
// softmax at that temperature over the top K, with one PCG per request so
// a seed reproduces the frames.
type sampler struct {
	p   Params
	rng *rand.Rand
	idx []int
	w   []float64
}

// ranksAbove reports whether id a ranks above id b: a higher logit, or an
// equal one and a lower id.
func ranksAbove(logits []float32, a, b int) bool {
	return logits[a] > logits[b] || logits[a] == logits[b] && a < b
}

// topK returns the k ids of logits that rank highest, best first, in
// buf's storage — what sorting every id by rank and keeping the first k
// gives, at the cost of one pass and a heap of k: a Talker step samples
// from its codebook's top k, and sorting the whole codebook for that was
// most of a step's sampling.
func topK(buf []int, logits []float32, k int) []int {
	h := buf[:0]
	// h is a heap whose root is the lowest ranked of the ids kept.
	down := func(i int) {
		for {
			low, l, r := i, 2*i+1, 2*i+2
			if l < len(h) && ranksAbove(logits, h[low], h[l]) {
				low = l
			}
			if r < len(h) && ranksAbove(logits, h[low], h[r]) {
				low = r
			}
			if low == i {
				return
			}
			h[i], h[low] = h[low], h[i]
			i = low
		}
	}
	for id := range logits {
		switch {
		case len(h) < k:
			h = append(h, id)
			for c := len(h) - 1; c > 0; {
				p := (c - 1) / 2
				if !ranksAbove(logits, h[p], h[c]) {
					break
				}
				h[p], h[c] = h[c], h[p]
				c = p
			}
		case ranksAbove(logits, id, h[0]):
			h[0] = id
			down(0)
		}
	}
	slices.SortFunc(h, func(a, b int) int {
		if ranksAbove(logits, a, b) {
			return -1
		}
		return 1
	})
	return h
}

func (s *sampler) sample(logits []float32) int {
	if s.p.Temperature == 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return best
	}
	s.idx = s.idx[:0]
	if k := s.p.TopK; k > 0 && k < len(logits) {
		s.idx = topK(s.idx, logits, k)
	} else {
		for i := range logits {
			s.idx = append(s.idx, i)
		}
	}
	mx := logits[s.idx[0]]
	for _, i := range s.idx {
		mx = max(mx, logits[i])
	}
	s.w = slices.Grow(s.w[:0], len(s.idx))[:len(s.idx)]
	w := s.w
	var sum float64
	for n, i := range s.idx {
		w[n] = math.Exp(float64(logits[i]-mx) / s.p.Temperature)
		sum += w[n]
	}
	u := s.rng.Float64() * sum
	for n, i := range s.idx {
		u -= w[n]
		if u < 0 {
			return i
		}
	}
	return s.idx[len(s.idx)-1] // u rounded to exactly sum
}

// state is one request's decoder state: the keys and values of every
// position so far, per layer.
type state struct {
	m      *Model
	pos    int
	k, v   [][]float32 // [layer][pos*heads*headDim]
	x, nrm []float32
	q, att []float32
	gate   []float32
	up     []float32
	tmp    []float32
	scores []float32
}

func (m *Model) newState(capacity int) *state {
	c := m.Config
	qd := c.Heads * c.HeadDim
	st := &state{
		m: m, k: make([][]float32, c.Layers), v: make([][]float32, c.Layers),
		x: make([]float32, c.Hidden), nrm: make([]float32, c.Hidden), tmp: make([]float32, c.Hidden),
		q: make([]float32, qd), att: make([]float32, qd),
		gate: make([]float32, c.Intermediate), up: make([]float32, c.Intermediate),
	}
	for l := range st.k {
		st.k[l] = make([]float32, 0, capacity*qd)
		st.v[l] = make([]float32, 0, capacity*qd)
	}
	return st
}

// forward appends one input row at the next position and returns the last
// layer's output there (before the final norm). The returned slice is
// reused by the next call.
func (st *state) forward(in []float32) []float32 {
	m, c := st.m, st.m.Config
	qd, hd := c.Heads*c.HeadDim, c.HeadDim
	copy(st.x, in)
	for l := range m.layers {
		w := &m.layers[l]
		kernel.RMSNorm(st.nrm, st.x, w.inNorm, c.RMSNormEps)
		k := make([]float32, qd)
		v := make([]float32, qd)
		kernel.MatVec(st.q, w.q, st.nrm)
		kernel.MatVec(k, w.k, st.nrm)
		kernel.MatVec(v, w.v, st.nrm)
		for hh := range c.Heads {
			st.rope(st.q[hh*hd : (hh+1)*hd])
			st.rope(k[hh*hd : (hh+1)*hd])
		}
		st.k[l] = append(st.k[l], k...)
		st.v[l] = append(st.v[l], v...)
		n := st.pos + 1
		st.scores = slices.Grow(st.scores[:0], n)[:n]
		inv := float32(1 / math.Sqrt(float64(hd)))
		for hh := range c.Heads {
			q := st.q[hh*hd : (hh+1)*hd]
			for t := range n {
				st.scores[t] = float32(kernel.Dot(q, st.k[l][t*qd+hh*hd:t*qd+(hh+1)*hd]) * inv)
			}
			kernel.Softmax(st.scores)
			out := st.att[hh*hd : (hh+1)*hd]
			clear(out)
			for t := range n {
				kernel.Axpy(out, st.scores[t], st.v[l][t*qd+hh*hd:t*qd+(hh+1)*hd])
			}
		}
		kernel.MatVec(st.tmp, w.o, st.att)
		kernel.Add(st.x, st.tmp)
		kernel.RMSNorm(st.nrm, st.x, w.postNorm, c.RMSNormEps)
		kernel.MatVec(st.gate, w.gate, st.nrm)
		kernel.MatVec(st.up, w.up, st.nrm)
		for i, g := range st.gate {
			st.gate[i] = float32(kernel.SiLU(g) * st.up[i])
		}
		kernel.MatVec(st.tmp, w.down, st.gate)
		kernel.Add(st.x, st.tmp)
	}
	st.pos++
	return st.x
}

// rope rotates one head by the current position's angles (rotate_half
// pairing, as in Qwen).
func (st *state) rope(x []float32) {
	half := len(st.m.invFreq)
	for i, f := range st.m.invFreq {
		ang := float64(st.pos) * f
		c, s := float32(math.Cos(ang)), float32(math.Sin(ang))
		a, b := x[i], x[i+half]
		x[i] = float32(a*c) - float32(b*s)
		x[i+half] = float32(b*c) + float32(a*s)
	}
}
