package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/sampler"
)

// mmPrompt is a prompt with one media item: placeholders at [from, to)
// that take encoder rows and a 2-D grid of positions (an image's), text
// after it continuing from the grid's largest position + 1.
func mmPrompt(rng *rand.Rand, n, from, to, gridW int) (*Request, *atomic.Int64) {
	prompt := randomPrompt(rng, n)
	mm := &Multimodal{Positions: make([][3]int, n), Placeholder: make([]bool, n)}
	rows := make([][]float32, n)
	next := 0
	for i := range n {
		switch {
		case i < from:
			mm.Positions[i] = [3]int{i, i, i}
			next = i + 1
		case i < to:
			k := i - from
			mm.Positions[i] = [3]int{from, from + k/gridW, from + k%gridW}
			mm.Placeholder[i] = true
			rows[i] = make([]float32, testModel.Config.HiddenSize)
			for j := range rows[i] {
				rows[i][j] = rng.Float32() - 0.5
			}
			next = max(next, from+k/gridW+1, from+k%gridW+1)
		default:
			mm.Positions[i] = [3]int{next, next, next}
			next++
		}
	}
	mm.Delta = next - n
	calls := &atomic.Int64{}
	mm.Encode = func() ([][]float32, error) {
		calls.Add(1)
		return rows, nil
	}
	return &Request{Prompt: prompt, Multimodal: mm}, calls
}

// A multimodal prompt: chunked prefill changes nothing; under PD the decode, whose import brings the prompt, never
// calls the encoders and still generates what a colocated engine does,
// rows included; a decode that must recompute the prompt (its import
// failed, policy recompute) encodes and gets it right too; a failing
// encoder fails only its request.
func TestMultimodalPrompts(t *testing.T) {
	colocated := start(t, Config{})
	chunked := start(t, Config{MaxNumBatchedTokens: 5, NumBlocks: 12, BlockSize: 4})
	prefill := start(t, Config{})
	decode := start(t, Config{})
	path := &copyImport{from: prefill, blocks: map[string][]int{}, tokens: map[string]int{}}
	rng := rand.New(rand.NewPCG(9, 10))
	const layer = 2
	for i, shape := range []struct{ n, from, to, gridW int }{{12, 3, 9, 3}, {20, 0, 8, 4}, {9, 2, 6, 2}, {30, 10, 22, 4}} {
		for _, params := range []sampler.Params{greedy(10), seeded(int64(40+i), 10)} {
			id := fmt.Sprintf("mm-%d-%v", i, params.Temperature)
			base, _ := mmPrompt(rand.New(rand.NewPCG(uint64(i), 1)), shape.n, shape.from, shape.to, shape.gridW)
			req := func() (*Request, *atomic.Int64) {
				r, calls := mmPrompt(rand.New(rand.NewPCG(uint64(i), 1)), shape.n, shape.from, shape.to, shape.gridW)
				r.ID, r.Params, r.CaptureLayer = id, params, layer
				return r, calls
			}
			want, calls := req()
			w := run(t, colocated, want)
			if calls.Load() != 1 {
				t.Errorf("%s: colocated engine encoded %d times, want once", id, calls.Load())
			}
			text := run(t, colocated, &Request{ID: id, Prompt: base.Prompt, Params: params, CaptureLayer: layer})
			if rowsEqual(text.last.Capture.Hidden, w.last.Capture.Hidden) {
				t.Errorf("%s: the media change none of the rows", id)
			}

			c, _ := req()
			if got := run(t, chunked, c); !slices.Equal(got.tokens, w.tokens) || !rowsEqual(got.last.Capture.Hidden, w.last.Capture.Hidden) {
				t.Errorf("%s: chunked prefill in a small cache gives %v; want %v", id, got.tokens, w.tokens)
			}

			pre, _ := req()
			pre.Params.MaxTokens, pre.Params.IgnoreEOS, pre.Export = 1, true, path.export(id)
			p := run(t, prefill, pre)
			dec, decCalls := req()
			dec.Import = path.importer(decode, id)
			d := run(t, decode, dec)
			if decCalls.Load() != 0 {
				t.Errorf("%s: the decode ran the encoders %d times", id, decCalls.Load())
			}
			merged := slices.Concat(p.last.Capture.Hidden[:shape.n], d.last.Capture.Hidden[1:])
			if !slices.Equal(d.tokens, w.tokens) || !rowsEqual(merged, w.last.Capture.Hidden) {
				t.Errorf("%s: PD %v; colocated %v (rows equal: %v)", id, d.tokens, w.tokens, rowsEqual(merged, w.last.Capture.Hidden))
			}

			re, reCalls := req()
			re.Import = func(context.Context, []int) (int, error) { return 0, errors.New("side channel closed") }
			re.RecomputeOnImportFailure = true
			if got := run(t, decode, re); !slices.Equal(got.tokens, w.tokens) || reCalls.Load() != 1 {
				t.Errorf("%s: recomputed after a failed import: %v with %d encoder runs; want %v with 1", id, got.tokens, reCalls.Load(), w.tokens)
			}
		}
	}
	bad, _ := mmPrompt(rng, 10, 2, 6, 2)
	bad.Params = greedy(4)
	bad.Multimodal.Encode = func() ([][]float32, error) { return nil, errors.New("corrupt audio") }
	if r := run(t, colocated, bad); r.last.FinishReason != "error" || r.last.Err == nil {
		t.Errorf("a failing encoder: finish %q, err %v", r.last.FinishReason, r.last.Err)
	}
	for _, e := range []*Engine{colocated, chunked, prefill, decode} {
		if u := e.Cache().Used(); u != 0 {
			t.Errorf("%d KV blocks still used", u)
		}
	}
}
