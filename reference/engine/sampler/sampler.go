// Package sampler owns how the reference engine picks the next token from a
// row of logits, with vLLM's sampling parameters and vLLM's order of
// operations: min_tokens masking, penalties (repetition, frequency,
// presence), then temperature, top_k, top_p and min_p.
//
// It exists to be deterministic. Invariant 1 of the architecture — a request
// split across a prefill and a decode worker yields the same tokens as one
// worker — holds for sampled requests only if the token depends on nothing
// but the request's seed and the logits it is given. So a Sampler owns its
// random stream (PCG seeded from the request seed), takes exactly one
// uniform draw per Sample call when sampling (none when greedy), and maps the
// draw to a token by inverse CDF in a fixed order: logit descending, lower
// id first on ties, with probabilities and sums in float64. A decode worker
// builds a fresh Sampler and so starts the stream where a colocated worker
// starts it for the first output token (the prefill's one token is thrown
// away).
//
// Where vLLM leaves an order unspecified (ties, the rounding of sums) this
// package fixes one; the draws are not vLLM's (it uses an exponential race on
// the GPU), so a seed gives the same tokens across omnipd workers, not the
// same tokens as vLLM. Results are bit-identical for the same GOARCH;
// math.Exp is assembly on some architectures and may differ in the last bit
// across them.
package sampler

import (
	cryptorand "crypto/rand"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
)

const (
	// minTemperature is vLLM's floor for a positive temperature (_MAX_TEMP):
	// vLLM raises anything below it to it, and a request must sample here as
	// it would there.
	minTemperature = 0.01

	// pcgStream is the fixed second PCG word. Changing it changes every
	// seeded stream, which breaks reproducibility across versions: never.
	pcgStream = 0x6f6d6e6970642d73 // "omnipd-s"
)

// Sampler picks the tokens of one sequence. It is not safe for concurrent
// use: a sequence is sampled one step at a time.
type Sampler struct {
	temperature float64 // 0 = greedy
	topP        float64 // 1 = off
	topK        int     // 0 = off
	minP        float64 // 0 = off
	repetition  float64 // 1 = off
	presence    float64
	frequency   float64
	minTokens   int
	ignoreEOS   bool
	eos         []int
	stop        []int
	rng         *rand.Rand
}

// New builds the sampler of one sequence. eosIDs are the model's end of
// sequence tokens (several when generation_config lists more than one).
//
// New expects Params that passed Validate but does not fail on others: a
// value Validate would reject turns its feature off (a zero
// RepetitionPenalty is no penalty, a zero TopP no nucleus filter), so that
// a mistake degrades to plain sampling rather than to NaN logits.
func New(p Params, eosIDs []int) *Sampler {
	s := &Sampler{
		topP:       1,
		minP:       0,
		repetition: 1,
		minTokens:  p.MinTokens,
		ignoreEOS:  p.IgnoreEOS,
		eos:        slices.Clone(eosIDs),
		stop:       slices.Clone(p.StopTokenIDs),
	}
	if p.Temperature > 0 && !math.IsInf(p.Temperature, 1) {
		s.temperature = max(p.Temperature, minTemperature)
	}
	if p.TopP > 0 && p.TopP < 1 {
		s.topP = p.TopP
	}
	if p.TopK > 0 {
		s.topK = p.TopK
	}
	if p.MinP > 0 && p.MinP <= 1 {
		s.minP = p.MinP
	}
	if p.RepetitionPenalty > 0 && !math.IsInf(p.RepetitionPenalty, 1) {
		s.repetition = p.RepetitionPenalty
	}
	if !math.IsNaN(p.PresencePenalty) && !math.IsInf(p.PresencePenalty, 0) {
		s.presence = p.PresencePenalty
	}
	if !math.IsNaN(p.FrequencyPenalty) && !math.IsInf(p.FrequencyPenalty, 0) {
		s.frequency = p.FrequencyPenalty
	}
	var seed1, seed2 uint64
	if p.Seed != nil && *p.Seed != -1 {
		seed1, seed2 = uint64(*p.Seed), pcgStream
	} else {
		// crypto/rand.Read never returns an error (it crashes the program
		// instead), and it keeps unseeded samplers independent of each other
		// and of math/rand's global state.
		var b [16]byte
		_, _ = cryptorand.Read(b[:])
		seed1, seed2 = binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
	}
	s.rng = rand.New(rand.NewPCG(seed1, seed2))
	return s
}

// Sample returns the next token. logits is one row of vocabulary size and is
// not modified; prompt and output are the sequence's ids so far (ids outside
// the vocabulary are ignored). It panics on an empty row, which only a
// broken model produces.
//
// If no token survives (every logit NaN or -Inf after masking), Sample
// returns the greedy choice of the raw logits, or 0 if there is none: a
// garbage row must not crash the worker that serves other requests.
func (s *Sampler) Sample(logits []float32, prompt, output []int) int {
	if len(logits) == 0 {
		panic("sampler: empty logits")
	}
	// Draw first, whatever the logits: the stream's position must be the
	// number of Sample calls and nothing else, or one odd row would shift
	// every later token of a seeded request.
	var u float64
	if s.temperature > 0 {
		u = s.rng.Float64()
	}

	sc := getScratch(len(logits))
	defer scratchPool.Put(sc)
	x := sc.x
	for i, l := range logits {
		x[i] = float64(l)
	}
	s.penalize(sc, logits, prompt, output)
	if len(output) < s.minTokens {
		mask(x, s.eos)
		mask(x, s.stop)
	}

	var tok int
	if s.temperature == 0 {
		tok = argmax(x)
	} else {
		tok = s.draw(sc, u)
	}
	if tok < 0 {
		for i, l := range logits {
			x[i] = float64(l)
		}
		tok = max(argmax(x), 0)
	}
	return tok
}

// IsStop reports whether token ends the sequence, given how many tokens were
// generated counting this one. Reaching MaxTokens is a different finish
// ("length") and the caller's to check.
func (s *Sampler) IsStop(token, generated int) bool {
	if generated < s.minTokens {
		return false
	}
	if !s.ignoreEOS && slices.Contains(s.eos, token) {
		return true
	}
	return slices.Contains(s.stop, token)
}

// penalize applies the repetition, frequency and presence penalties to x in
// vLLM's order. Each repetition-penalized value is computed from the
// original logit, so a token that appears many times is penalized once.
func (s *Sampler) penalize(sc *scratch, logits []float32, prompt, output []int) {
	vocab := len(logits)
	if s.repetition != 1 {
		rep := func(ids []int) {
			for _, t := range ids {
				if t >= 0 && t < vocab {
					sc.x[t] = repeat(float64(logits[t]), s.repetition)
				}
			}
		}
		rep(prompt)
		rep(output)
	}
	if s.frequency == 0 && s.presence == 0 {
		return
	}
	counts := sc.counts
	for _, t := range output {
		if t >= 0 && t < vocab {
			counts[t]++
		}
	}
	for _, t := range output {
		if t < 0 || t >= vocab || counts[t] == 0 {
			continue
		}
		// The explicit conversion forbids fusing the multiply into the
		// subtraction (the Go spec allows FMA otherwise), which would round
		// differently on architectures that have it.
		sc.x[t] = sc.x[t] - float64(s.frequency*float64(counts[t])) - s.presence
		counts[t] = 0 // restores the all-zero invariant and marks t done
	}
}

// repeat is the vLLM/HF repetition penalty of one logit.
func repeat(logit, penalty float64) float64 {
	if logit > 0 {
		return logit / penalty
	}
	return logit * penalty
}

func mask(x []float64, ids []int) {
	for _, t := range ids {
		if t >= 0 && t < len(x) {
			x[t] = math.Inf(-1)
		}
	}
}

// argmax returns the index of the largest value, the lowest index on ties,
// ignoring NaN and -Inf; -1 if nothing is left.
func argmax(x []float64) int {
	best, bestV := -1, math.Inf(-1)
	for i, v := range x {
		if v > bestV {
			best, bestV = i, v
		}
	}
	return best
}

// scratch is the working memory of one Sample call. It is pooled rather
// than held per Sampler because several vocabulary-sized buffers for each of
// hundreds of live sequences would dominate memory. Reuse cannot leak state
// between calls: x and w are rewritten in full before being read, counts is
// all zero between calls, the id lists are truncated.
type scratch struct {
	x      []float64 // processed logits: penalties and masks applied
	w      []float64 // unnormalized probabilities, 0 for excluded tokens
	counts []int32   // per-token output counts, all zero between calls
	heap   []int32   // first ranking tier, not ranked yet
	rest   []int32   // second ranking tier
	ranked []int32   // candidates in rank order, produced lazily
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch(vocab int) *scratch {
	sc := scratchPool.Get().(*scratch)
	if cap(sc.x) < vocab {
		sc.x = make([]float64, vocab)
		sc.w = make([]float64, vocab)
		sc.counts = make([]int32, vocab)
		sc.heap = make([]int32, 0, vocab)
		sc.rest = make([]int32, 0, vocab)
		sc.ranked = make([]int32, 0, vocab)
	}
	sc.x, sc.w, sc.counts = sc.x[:vocab], sc.w[:vocab], sc.counts[:vocab]
	sc.heap, sc.rest, sc.ranked = sc.heap[:0], sc.rest[:0], sc.ranked[:0]
	return sc
}
