package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/sampler"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
)

var (
	testModel     = model.Default()
	testTokenizer = tokenizer.Default()
)

func start(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(testModel, testTokenizer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

type result struct {
	tokens []int
	text   string
	last   Event
}

func collect(t *testing.T, ch <-chan Event) result {
	t.Helper()
	var r result
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return r
			}
			// The last event carries the last token, if it sampled one.
			if !ev.Finished || ev.CompletionTokens > len(r.tokens) {
				r.tokens = append(r.tokens, ev.Token)
			}
			r.text += ev.Text
			if ev.Finished {
				r.last = ev
			}
		case <-timeout:
			t.Fatal("request did not finish within 30s")
		}
	}
}

func run(t *testing.T, e *Engine, req *Request) result {
	t.Helper()
	ch, err := e.Submit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, ch)
}

func greedy(maxTokens int) sampler.Params {
	p := sampler.Defaults()
	p.Temperature = 0
	p.MaxTokens = maxTokens
	return p
}

func seeded(seed int64, maxTokens int) sampler.Params {
	p := sampler.Defaults()
	p.Temperature = 0.9
	p.TopP = 0.95
	p.Seed = &seed
	p.MaxTokens = maxTokens
	return p
}

func randomPrompt(rng *rand.Rand, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = rng.IntN(256)
	}
	return p
}

// reference generates with the model and sampler directly, one token at a
// time, with no scheduler: what the engine must reproduce.
func reference(t *testing.T, prompt []int, params sampler.Params) []int {
	t.Helper()
	shape := testModel.KVShape(16)
	c, err := kvcache.New(shape, shape.BlocksFor(len(prompt)+params.MaxTokens+1))
	if err != nil {
		t.Fatal(err)
	}
	table, _ := c.Allocate(c.NumBlocks())
	s := sampler.New(params, testTokenizer.EOSTokenIDs())
	logits := testModel.Forward(c, table, 0, prompt, nil)
	var out []int
	for {
		tok := s.Sample(logits, prompt, out)
		out = append(out, tok)
		if s.IsStop(tok, len(out)) || len(out) == params.MaxTokens {
			return out
		}
		logits = testModel.Forward(c, table, len(prompt)+len(out)-1, []int{tok}, nil)
	}
}

func TestGenerationMatchesReference(t *testing.T) {
	e := start(t, Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	for i, n := range []int{1, 2, 15, 16, 17, 40} {
		prompt := randomPrompt(rng, n)
		for _, params := range []sampler.Params{greedy(24), seeded(int64(i), 24)} {
			got := run(t, e, &Request{ID: fmt.Sprint(i), Prompt: prompt, Params: params})
			want := reference(t, prompt, params)
			if !slices.Equal(got.tokens, want) {
				t.Errorf("prompt of %d tokens: engine %v, reference %v", n, got.tokens, want)
			}
			if got.last.PromptTokens != n || got.last.CompletionTokens != len(want) {
				t.Errorf("usage: prompt %d completion %d, want %d and %d", got.last.PromptTokens, got.last.CompletionTokens, n, len(want))
			}
		}
	}
	if u := e.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks still used after every request finished", u)
	}
}

// Many requests at once, small step budgets (so prefills are chunked) and a
// small cache (so sequences are preempted and recomputed): every sequence
// still generates exactly what it generates alone.
func TestBatchingChunkingAndPreemptionAreInvisible(t *testing.T) {
	alone := start(t, Config{})
	busy := start(t, Config{MaxNumBatchedTokens: 7, MaxNumSeqs: 5, NumBlocks: 12})
	rng := rand.New(rand.NewPCG(3, 4))
	type job struct {
		prompt []int
		params sampler.Params
	}
	var jobs []job
	for i := range 16 {
		jobs = append(jobs, job{randomPrompt(rng, 1+rng.IntN(40)), seeded(int64(i), 20)})
	}
	results := make([]result, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			results[i] = run(t, busy, &Request{ID: fmt.Sprint(i), Prompt: j.prompt, Params: j.params})
		})
	}
	wg.Wait()
	for i, j := range jobs {
		want := run(t, alone, &Request{Prompt: j.prompt, Params: j.params})
		if !slices.Equal(results[i].tokens, want.tokens) || results[i].text != want.text {
			t.Errorf("job %d: batched %v %q, alone %v %q", i, results[i].tokens, results[i].text, want.tokens, want.text)
		}
	}
	if busy.Stats().Preemptions == 0 {
		t.Error("the small cache never preempted; the test does not exercise recomputation")
	}
	if u := busy.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks still used", u)
	}
}

// copyImport moves a prefill engine's exported blocks into the decode
// engine's cache: the in-process stand-in for the KV data path.
type copyImport struct {
	mu      sync.Mutex
	from    *Engine
	blocks  map[string][]int
	tokens  map[string]int
	capture map[string]*model.Capture
}

func (c *copyImport) export(id string) KVExport {
	return func(blocks []int, n int) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.blocks[id], c.tokens[id] = blocks, n
		return nil
	}
}

func (c *copyImport) importer(to *Engine, id string) KVImport {
	return func(ctx context.Context, dst []int) (int, error) {
		c.mu.Lock()
		src, n := c.blocks[id], c.tokens[id]
		delete(c.blocks, id)
		c.mu.Unlock()
		if src == nil {
			return 0, errors.New("no such transfer")
		}
		if len(src) != len(dst) {
			return 0, fmt.Errorf("exported %d blocks, asked for %d", len(src), len(dst))
		}
		for i := range src {
			copy(to.Cache().Block(dst[i]), c.from.Cache().Block(src[i]))
		}
		c.from.Cache().Free(src)
		return n, nil
	}
}

// PD equals colocated, in process: a prefill engine computes the prompt and
// exports its blocks, a decode engine imports them, computes exactly the
// last prompt token, and generates what a single engine generates.
func TestDisaggregatedEqualsColocated(t *testing.T) {
	colocated := start(t, Config{})
	prefill := start(t, Config{})
	decode := start(t, Config{})
	path := &copyImport{from: prefill, blocks: map[string][]int{}, tokens: map[string]int{}}
	rng := rand.New(rand.NewPCG(5, 6))
	lengths := []int{1, 2, 3, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 65}
	for len(lengths) < 30 {
		lengths = append(lengths, 1+rng.IntN(90))
	}
	const layer = 2
	for i, n := range lengths {
		prompt := randomPrompt(rng, n)
		for _, params := range []sampler.Params{greedy(12), seeded(int64(100+i), 12)} {
			id := fmt.Sprintf("req-%d-%v", i, params.Temperature)
			want := run(t, colocated, &Request{ID: id, Prompt: prompt, Params: params, CaptureLayer: layer})

			pre := params
			pre.MaxTokens = 1
			pre.IgnoreEOS = true
			p := run(t, prefill, &Request{ID: id, Prompt: prompt, Params: pre, Export: path.export(id), CaptureLayer: layer})
			if p.last.FinishReason != "length" {
				t.Fatalf("prefill finished with %q, want length", p.last.FinishReason)
			}
			before := decode.Stats().PromptTokensComputed
			d := run(t, decode, &Request{ID: id, Prompt: prompt, Params: params, Import: path.importer(decode, id), CaptureLayer: layer})
			if !slices.Equal(d.tokens, want.tokens) || d.text != want.text {
				t.Errorf("prompt of %d tokens, T=%v: PD %v, colocated %v", n, params.Temperature, d.tokens, want.tokens)
			}
			if computed := decode.Stats().PromptTokensComputed - before; computed != 1 {
				t.Errorf("prompt of %d tokens: decode computed %d prompt tokens, want exactly the last one", n, computed)
			}
			if d.last.CachedTokens != n-1 {
				t.Errorf("prompt of %d tokens: %d cached tokens reported, want %d", n, d.last.CachedTokens, n-1)
			}
			// Conditioning: prefill rows [0:P] then decode rows [1:] are the
			// colocated rows.
			merged := slices.Concat(p.last.Capture.Hidden[:n], d.last.Capture.Hidden[1:])
			if !rowsEqual(merged, want.last.Capture.Hidden) {
				t.Errorf("prompt of %d tokens: merged conditioning (%d rows) differs from colocated (%d rows)", n, len(merged), len(want.last.Capture.Hidden))
			}
		}
	}
	for _, e := range []*Engine{colocated, prefill, decode} {
		if u := e.Cache().Used(); u != 0 {
			t.Errorf("%d KV blocks still used", u)
		}
	}
}

func rowsEqual(a, b [][]float32) bool {
	return slices.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
}

func TestImportFailurePolicies(t *testing.T) {
	e := start(t, Config{})
	prompt := randomPrompt(rand.New(rand.NewPCG(7, 8)), 20)
	failing := func(context.Context, []int) (int, error) { return 0, errors.New("side channel closed") }

	r := run(t, e, &Request{Prompt: prompt, Params: greedy(5), Import: failing})
	if r.last.FinishReason != "error" || !errors.Is(r.last.Err, ErrKVLoad) {
		t.Errorf("policy fail: finish %q err %v, want error wrapping ErrKVLoad", r.last.FinishReason, r.last.Err)
	}
	r = run(t, e, &Request{Prompt: prompt, Params: greedy(5), Import: failing, RecomputeOnImportFailure: true})
	if want := reference(t, prompt, greedy(5)); !slices.Equal(r.tokens, want) || r.last.CachedTokens != 0 {
		t.Errorf("policy recompute: %v (cached %d), want %v computed locally", r.tokens, r.last.CachedTokens, want)
	}
	if e.Stats().KVImportFailures != 2 {
		t.Errorf("import failures counted %d, want 2", e.Stats().KVImportFailures)
	}
	if u := e.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks still used", u)
	}
}

func TestStopConditions(t *testing.T) {
	e := start(t, Config{})
	prompt := []int{'a', 'b', 'c'}
	free := reference(t, prompt, greedy(30))
	full := run(t, e, &Request{Prompt: prompt, Params: greedy(30)})

	// A stop token id ends generation at its first occurrence.
	p := greedy(30)
	p.StopTokenIDs = []int{free[3]}
	r := run(t, e, &Request{Prompt: prompt, Params: p})
	if r.last.FinishReason != "stop" || !slices.Equal(r.tokens, free[:slices.Index(free, free[3])+1]) {
		t.Errorf("stop_token_ids: %v (%s), want up to the first %d of %v", r.tokens, r.last.FinishReason, free[3], free)
	}

	// A stop string cuts the text before it, and is never streamed.
	if len(full.text) >= 6 {
		stop := full.text[3:5]
		p = greedy(30)
		p.Stop = []string{stop}
		r = run(t, e, &Request{Prompt: prompt, Params: p})
		want := full.text[:len(full.text)]
		if i := indexOf(want, stop); i >= 0 {
			want = want[:i]
		}
		if r.text != want || r.last.FinishReason != "stop" {
			t.Errorf("stop %q: text %q (%s), want %q", stop, r.text, r.last.FinishReason, want)
		}
	}

	// max_tokens ends with "length".
	r = run(t, e, &Request{Prompt: prompt, Params: greedy(4)})
	if len(r.tokens) != 4 || r.last.FinishReason != "length" {
		t.Errorf("max_tokens 4: %d tokens, finish %q", len(r.tokens), r.last.FinishReason)
	}
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// Clients that go away at every point of a request leave nothing behind:
// no KV block, no queued sequence, no goroutine.
func TestCancellationFreesEverything(t *testing.T) {
	e := start(t, Config{MaxNumBatchedTokens: 16})
	base := runtime.NumGoroutine()
	rng := rand.New(rand.NewPCG(9, 10))
	var wg sync.WaitGroup
	long := greedy(200)
	long.IgnoreEOS = true // only the client ends these
	for i := range 40 {
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := e.Submit(ctx, &Request{Prompt: randomPrompt(rng, 1+rng.IntN(60)), Params: long})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer cancel()
			n := 0
			if i%5 == 0 {
				cancel() // before the first token
			}
			for ev := range ch {
				n++
				if n == i%5 {
					cancel()
				}
				if ev.Finished && ev.FinishReason != "abort" {
					t.Errorf("request %d finished %q although its client left after %d events", i, ev.FinishReason, i%5)
				}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	settled := func() bool {
		s := e.Stats()
		return s.UsedBlocks == 0 && s.Running == 0 && s.Waiting == 0 && runtime.NumGoroutine() <= base
	}
	for !settled() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if u := e.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks still used after every client went away", u)
	}
	if s := e.Stats(); s.Running != 0 || s.Waiting != 0 {
		t.Errorf("stats after all requests ended: %+v", s)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Errorf("%d goroutines, %d before the requests", n, base)
	}
}

func TestSubmitRejectsBadRequests(t *testing.T) {
	e := start(t, Config{NumBlocks: 4})
	for name, req := range map[string]*Request{
		"empty prompt":     {Params: greedy(1)},
		"token outside":    {Prompt: []int{testModel.Config.VocabSize}, Params: greedy(1)},
		"too long":         {Prompt: make([]int, 100), Params: greedy(1)},
		"invalid sampling": {Prompt: []int{1}, Params: sampler.Params{}},
	} {
		if _, err := e.Submit(context.Background(), req); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Generated special tokens (a multimodal marker, <|im_start|>) are left out
// of the text by default, as vLLM's skip_special_tokens, and kept with
// KeepSpecialTokens; the tokens are the same either way.
func TestSpecialTokensInText(t *testing.T) {
	e := start(t, Config{})
	rng := rand.New(rand.NewPCG(3, 4))
	for seed := range int64(40) {
		prompt := randomPrompt(rng, 12)
		p := seeded(seed, 48)
		p.IgnoreEOS = true
		skipped := run(t, e, &Request{Prompt: prompt, Params: p})
		var special []int
		for _, tok := range skipped.tokens {
			if testTokenizer.IsSpecial(tok) {
				special = append(special, tok)
			}
		}
		if len(special) == 0 {
			continue
		}
		p.KeepSpecialTokens = true
		kept := run(t, e, &Request{Prompt: prompt, Params: p})
		if !slices.Equal(kept.tokens, skipped.tokens) {
			t.Fatalf("seed %d: the tokens differ with KeepSpecialTokens", seed)
		}
		marker := testTokenizer.Decode(special[:1])
		if strings.Contains(skipped.text, marker) || !strings.Contains(kept.text, marker) {
			t.Errorf("seed %d: %q in the default text %q, or missing from the kept %q", seed, marker, skipped.text, kept.text)
		}
		return
	}
	t.Fatal("no seeded answer generated a special token to test with")
}
