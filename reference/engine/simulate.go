package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/simulate"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
)

// This file is the engine's simulate mode (Config.Simulate): the scheduler,
// the KV cache, KV import and export and token streaming run as always, but
// a step computes nothing heavy and then waits until the profile's modeled
// step time has passed since it began, so the engine keeps the pace of the
// modeled GPU.
//
// What a step does instead of the forward pass: it writes each computed
// position's keys and values as a cheap deterministic function of (token,
// position), so KV blocks hold real data and a prefill-to-decode transfer
// moves real bytes; the decode checks the imported positions against that
// function, so a transfer that corrupts a byte fails as a KV load failure.
// The next token is a hash of (prompt, seed, position) into tokens that
// decode to printable text: never EOS, so an output is max_tokens long
// unless a stop string or a requested stop token ends it. Sampling
// parameters other than the seed do not matter. PD and colocated runs give
// the same tokens, as with the real model.

// Clock is the engine's time in simulate mode. The wall clock is the
// default; tests inject one that records what it is asked to wait for.
type Clock interface {
	Now() time.Time
	// Sleep waits for d, or until ctx ends.
	Sleep(ctx context.Context, d time.Duration)
}

// WallClock is the host's clock: the Clock every simulated stage uses unless
// a test gives it another.
type WallClock struct{}

func (WallClock) Now() time.Time { return time.Now() }

func (WallClock) Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// maxCatchUp is how late a step may begin and still be timed from the
// previous step's end: back-to-back steps then do not drift by the host's
// scheduling overhead, while a host stall longer than this is not repaid
// with a burst of shortened steps.
const maxCatchUp = 2 * time.Millisecond

// simulation is the simulate-mode state of one engine.
type simulation struct {
	profile *simulate.Profile
	clock   Clock
	zero    bool  // no cost at all: never read the clock
	vocab   []int // printable token ids to generate from

	// Owned by the Run goroutine.
	deadline time.Time // when the last step ends, in modeled time
	idle     bool      // the engine waited for work since that step
}

func newSimulation(p *simulate.Profile, clock Clock, m *model.Model, tok *tokenizer.Tokenizer) (*simulation, error) {
	vocab := printableTokens(m, tok)
	if len(vocab) == 0 {
		return nil, errors.New("simulate: the tokenizer has no token that decodes to printable text")
	}
	return &simulation{profile: p, clock: clock, zero: p.IsZero(), vocab: vocab}, nil
}

// maxSimVocab bounds the tokens generated from (and the startup scan).
const maxSimVocab = 4096

// printableTokens lists the non-special tokens whose text is 1 to 16
// printable ASCII characters.
func printableTokens(m *model.Model, tok *tokenizer.Tokenizer) []int {
	var ids []int
	n := min(tok.VocabSize(), m.Config.VocabSize)
	for id := 0; id < n && len(ids) < maxSimVocab; id++ {
		if tok.IsSpecial(id) {
			continue
		}
		text := tok.Decode([]int{id})
		if len(text) == 0 || len(text) > 16 {
			continue
		}
		ok := true
		for i := 0; i < len(text); i++ {
			if text[i] < 0x20 || text[i] > 0x7e {
				ok = false
				break
			}
		}
		if ok {
			ids = append(ids, id)
		}
	}
	return ids
}

const golden = 0x9e3779b97f4a7c15

// mix is splitmix64's finaliser: a cheap, well-spread 64-bit hash.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// key is what a request's simulated tokens depend on: its prompt and seed.
func (sim *simulation) key(req *Request) uint64 {
	h := uint64(0xcbf29ce484222325)
	for _, t := range req.Prompt {
		h = (h ^ uint64(t)) * 0x100000001b3
	}
	if req.Params.Seed != nil && *req.Params.Seed != -1 {
		h ^= mix(uint64(*req.Params.Seed) + golden)
	}
	return mix(h)
}

// token is the simulated next token of s: the position's hash into the
// printable vocabulary.
func (sim *simulation) token(s *sequence) int {
	h := mix(s.simKey + uint64(len(s.tokens))*golden)
	return sim.vocab[h%uint64(len(sim.vocab))]
}

// rowBase is the first value of one (position, layer, K or V) row: its
// signature. It is below 2^23, so it is exact in float32.
func rowBase(token, pos, layer, kv int) float32 {
	h := mix(uint64(token)<<32 ^ uint64(pos) ^ uint64(2*layer+kv)*golden)
	return float32(h >> 41)
}

// A simulated KV row is its signature followed by the same tail in every
// row: 1, 2, …, n-1. Writing one is a store and a copy, and checking one a
// compare and a memory comparison, so simulate mode's KV costs memory
// bandwidth rather than a float operation per element — while a swapped
// row still fails on its signature and a changed byte anywhere else on the
// tail.
var rowTails sync.Map // row length → []float32

func rowTail(n int) []float32 {
	if t, ok := rowTails.Load(n); ok {
		return t.([]float32)
	}
	t := make([]float32, max(n-1, 0))
	for i := range t {
		t[i] = float32(i + 1)
	}
	rowTails.Store(n, t)
	return t
}

// fillKV writes the simulated keys and values of positions [from, to).
func fillKV(c *kvcache.Cache, table, tokens []int, from, to int) {
	row := c.Shape().KVHeads * c.Shape().HeadDim
	if row == 0 {
		return
	}
	tail := rowTail(row)
	eachSegment(c, table, from, to, func(seg []float32, first, layer, kv int) bool {
		for i := 0; i < len(seg); i += row {
			seg[i] = rowBase(tokens[first+i/row], first+i/row, layer, kv)
			copy(seg[i+1:i+row], tail)
		}
		return true
	})
}

// verifyKV checks that positions [0, n) of table hold what fillKV writes
// for tokens.
func verifyKV(c *kvcache.Cache, table, tokens []int, n int) error {
	row := c.Shape().KVHeads * c.Shape().HeadDim
	if row == 0 {
		return nil
	}
	tail := floatBytes(rowTail(row))
	var err error
	eachSegment(c, table, 0, n, func(seg []float32, first, layer, kv int) bool {
		for i := 0; i < len(seg); i += row {
			pos := first + i/row
			if seg[i] != rowBase(tokens[pos], pos, layer, kv) || !bytes.Equal(floatBytes(seg[i+1:i+row]), tail) {
				err = fmt.Errorf("simulate: imported KV of position %d (layer %d) differs from what the prefill wrote", pos, layer)
				return false
			}
		}
		return true
	})
	return err
}

// eachSegment calls f, until it returns false, with each run of rows of
// positions [from, to) that lie next to each other in memory: in every
// block, for each layer, the keys and then the values of the block's
// positions from first on. Walking blocks in memory order, a few calls and
// bounds checks per block, is what makes simulate mode's KV cost memory
// bandwidth and little else.
func eachSegment(c *kvcache.Cache, table []int, from, to int, f func(seg []float32, first, layer, kv int) bool) {
	shape := c.Shape()
	bs, row := shape.BlockSize, shape.KVHeads*shape.HeadDim
	for first := from; first < to; {
		block := c.Block(table[first/bs])
		slot := first % bs
		last := min(to, first-slot+bs)
		for l := range shape.Layers {
			for kv := range 2 {
				base := (2*l + kv) * bs * row
				if !f(block[base+slot*row:base+(slot+last-first)*row], first, l, kv) {
					return
				}
			}
		}
		first = last
	}
}

// floatBytes views f's memory as bytes, for a comparison that is exact to
// the bit (NaN included) at memory speed.
func floatBytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// simCompute is a simulated step's work: the batch's KV positions (and
// conditioning rows, when asked for) written cheaply, no logits.
func (e *Engine) simCompute(batch []*work) {
	for _, w := range batch {
		s := w.s
		fillKV(e.cache, s.table, s.tokens, s.computed, s.computed+w.n)
		if s.capture != nil {
			for _, t := range s.tokens[s.computed : s.computed+w.n] {
				s.capture.Embeddings = append(s.capture.Embeddings, e.model.Embedding(t))
				s.capture.Hidden = append(s.capture.Hidden, e.model.Embedding(t))
			}
		}
	}
}

// simWork counts a batch for the latency model: a sequence computing its
// one newest generated position decodes; every other computed position
// (prompt chunks, the last prompt position after a KV import, recomputation
// after preemption) is prefill work.
func simWork(batch []*work) (prefillTokens, decodeSeqs int) {
	for _, w := range batch {
		if w.n == 1 && w.s.computed >= w.s.promptLen {
			decodeSeqs++
		} else {
			prefillTokens += w.n
		}
	}
	return prefillTokens, decodeSeqs
}

// simEncoding lists the media the batch's encoders work on: those of each
// sequence whose chunk is the first to compute one of its placeholders.
func simEncoding(batch []*work) []simulate.EncoderItem {
	var items []simulate.EncoderItem
	for _, w := range batch {
		s := w.s
		mm := s.req.Multimodal
		if mm == nil || mm.Encoding == nil || s.simEncoded {
			continue
		}
		for i := s.computed; i < min(s.computed+w.n, s.promptLen); i++ {
			if mm.Placeholder[i] {
				items = append(items, mm.Encoding...)
				s.simEncoded = true
				break
			}
		}
	}
	return items
}

// simBegin is when a step begins in modeled time: now, or the previous
// step's end when the engine ran on without waiting for work.
func (e *Engine) simBegin() time.Time {
	sim := e.sim
	if sim == nil || sim.zero {
		return time.Time{}
	}
	now := sim.clock.Now()
	start := now
	if !sim.idle && !sim.deadline.IsZero() && !now.Before(sim.deadline) && now.Sub(sim.deadline) <= maxCatchUp {
		start = sim.deadline
	}
	sim.idle = false
	return start
}

// simEnd waits until the batch's modeled step time has passed since start.
func (e *Engine) simEnd(ctx context.Context, start time.Time, batch []*work) {
	sim := e.sim
	if sim == nil || sim.zero {
		return
	}
	sim.deadline = start.Add(sim.profile.StepTime(simWork(batch)) + sim.profile.Encoder.BatchTime(simEncoding(batch)))
	if wait := sim.deadline.Sub(sim.clock.Now()); wait > 0 {
		sim.clock.Sleep(ctx, wait)
	}
}

// simIdle notes that the engine waits for work: the next step is timed
// from when it begins.
func (e *Engine) simIdle() {
	if e.sim != nil {
		e.sim.idle = true
	}
}

// importKV runs a decode's KV import. In simulate mode it then checks the
// imported positions and waits out the rest of the modeled transfer,
// measured from when the import began.
func (e *Engine) importKV(ctx context.Context, s *sequence, dst []int) (int, error) {
	sim := e.sim
	if sim == nil {
		return s.req.Import(ctx, dst)
	}
	var start time.Time
	if !sim.zero {
		start = sim.clock.Now()
	}
	n, err := s.req.Import(ctx, dst)
	if err != nil {
		return n, err
	}
	if err := verifyKV(e.cache, dst, s.req.Prompt, min(n, len(s.req.Prompt))); err != nil {
		return 0, err
	}
	if sim.zero {
		return n, nil
	}
	if wait := start.Add(sim.profile.TransferTime(n)).Sub(sim.clock.Now()); wait > 0 {
		sim.clock.Sleep(ctx, wait)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
	return n, nil
}
