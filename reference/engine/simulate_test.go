package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/engine/sampler"
	"github.com/omnipd/omnipd/reference/engine/simulate"
)

// fakeClock is a Clock whose time moves only when the engine sleeps; it
// records every wait it is asked for.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(_ context.Context, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
}

func (c *fakeClock) recorded() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sleeps)
}

// noClock fails the test if the engine ever consults it.
type noClock struct{ t *testing.T }

func (c noClock) Now() time.Time {
	c.t.Error("the zero profile read the clock")
	return time.Time{}
}

func (c noClock) Sleep(context.Context, time.Duration) { c.t.Error("the zero profile slept") }

const us, ms = time.Microsecond, time.Millisecond

var testProfile = &simulate.Profile{
	Name:    "test",
	Prefill: simulate.Linear{Base: 5 * ms, PerUnit: 10 * us},
	Decode:  simulate.Linear{Base: 3 * ms, PerUnit: 200 * us},
	KV:      simulate.KVTransfer{Setup: 2 * ms, BytesPerSecond: 1e9},
	Model:   simulate.KVModel{Layers: 48, KVHeads: 4, HeadDim: 128, DTypeBytes: 2},
}

// newSim builds a simulate-mode engine; call run to start it.
func newSim(t *testing.T, cfg Config, p *simulate.Profile, clock Clock) *Engine {
	t.Helper()
	cfg.Simulate, cfg.Clock = p, clock
	e, err := New(testModel, testTokenizer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func runEngine(t *testing.T, e *Engine) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func submit(t *testing.T, e *Engine, req *Request) <-chan Event {
	t.Helper()
	ch, err := e.Submit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// Each step waits exactly the modeled time of what it computed: prefill
// chunks a + b·P, decodes c + d·B, a mixed step the sum of both.
func TestSimulatedStepTimes(t *testing.T) {
	p := testProfile
	pre := func(n int) time.Duration { return p.Prefill.Base + time.Duration(n)*p.Prefill.PerUnit }
	dec := func(n int) time.Duration { return p.Decode.Base + time.Duration(n)*p.Decode.PerUnit }

	t.Run("batched prefill then decodes", func(t *testing.T) {
		clock := newFakeClock()
		e := newSim(t, Config{}, p, clock)
		// Queued before the engine runs, so one step takes both.
		a := submit(t, e, &Request{Prompt: randomPrompt(rand.New(rand.NewPCG(1, 1)), 10), Params: greedy(3)})
		b := submit(t, e, &Request{Prompt: randomPrompt(rand.New(rand.NewPCG(2, 2)), 20), Params: greedy(3)})
		runEngine(t, e)
		collect(t, a)
		collect(t, b)
		want := []time.Duration{pre(30), dec(2), dec(2)}
		if got := clock.recorded(); !slices.Equal(got, want) {
			t.Errorf("waits %v, want %v", got, want)
		}
	})

	t.Run("chunked prefill mixed with decodes", func(t *testing.T) {
		clock := newFakeClock()
		e := newSim(t, Config{MaxNumBatchedTokens: 8}, p, clock)
		a := submit(t, e, &Request{Prompt: randomPrompt(rand.New(rand.NewPCG(3, 3)), 4), Params: greedy(4)})
		b := submit(t, e, &Request{Prompt: randomPrompt(rand.New(rand.NewPCG(4, 4)), 12), Params: greedy(2)})
		runEngine(t, e)
		ra, rb := collect(t, a), collect(t, b)
		if len(ra.tokens) != 4 || len(rb.tokens) != 2 {
			t.Fatalf("generated %d and %d tokens, want 4 and 2", len(ra.tokens), len(rb.tokens))
		}
		want := []time.Duration{
			pre(8),          // A's 4 prompt tokens + B's first 4
			pre(7) + dec(1), // A decodes; B's next 7 fill the budget
			pre(1) + dec(1), // A decodes; B's last prompt token
			dec(2),          // both decode; both finish
		}
		if got := clock.recorded(); !slices.Equal(got, want) {
			t.Errorf("waits %v, want %v", got, want)
		}
	})
}

// driftClock also moves time forward on every reading, as the host's own
// work between steps does.
type driftClock struct {
	fakeClock
	overhead time.Duration
	first    time.Time
}

func (c *driftClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first.IsZero() {
		c.first = c.now
	}
	t := c.now
	c.now = c.now.Add(c.overhead)
	return t
}

// Back-to-back steps are timed from each other's deadlines, so the host's
// overhead between them (two clock readings a step here) does not add up
// while it is shorter than a step; a host slower than the model falls
// behind rather than paying the time back with shortened steps.
func TestSimulatedStepsDoNotDrift(t *testing.T) {
	p := &simulate.Profile{Prefill: simulate.Linear{Base: ms}, Decode: simulate.Linear{Base: ms}}
	const tokens = 10
	for _, c := range []struct {
		overhead time.Duration
		drift    bool
	}{{100 * us, false}, {400 * us, false}, {ms, true}} {
		clock := &driftClock{fakeClock: *newFakeClock(), overhead: c.overhead}
		e := newSim(t, Config{}, p, clock)
		ch := submit(t, e, &Request{Prompt: []int{1, 2, 3}, Params: greedy(tokens)})
		runEngine(t, e)
		collect(t, ch)
		modeled := tokens * ms
		if got := e.sim.deadline.Sub(clock.first); (got != modeled) != c.drift {
			t.Errorf("overhead %v: the last step ended %v after the first began; modeled %v (drift expected: %v)", c.overhead, got, modeled, c.drift)
		}
	}
}

// The zero profile never touches the clock: no timers on the hot path.
func TestZeroProfileNeverWaits(t *testing.T) {
	zero, err := simulate.Load("zero")
	if err != nil {
		t.Fatal(err)
	}
	e := newSim(t, Config{}, zero, noClock{t})
	runEngine(t, e)
	r := collect(t, submit(t, e, &Request{Prompt: []int{'h', 'i'}, Params: greedy(20)}))
	if len(r.tokens) != 20 {
		t.Errorf("%d tokens, want 20", len(r.tokens))
	}
}

// Simulated output: max_tokens long (EOS is never chosen), one event per
// token, printable text, a function of prompt and seed only; stop strings
// and stop token ids still end it.
func TestSimulatedOutput(t *testing.T) {
	zero, _ := simulate.Load("zero")
	e := newSim(t, Config{}, zero, WallClock{})
	runEngine(t, e)
	prompt := []int{'a', 'b', 'c', 'd'}
	const n = 64

	ch := submit(t, e, &Request{Prompt: prompt, Params: greedy(n)})
	var events []Event
	for ev := range ch {
		events = append(events, ev)
	}
	last := events[len(events)-1]
	if !last.Finished || last.FinishReason != "length" || last.CompletionTokens != n {
		t.Fatalf("last event %+v, want a length finish after %d tokens", last, n)
	}
	// One event per token: n-1 streamed, the last on the final event.
	if len(events) != n {
		t.Errorf("%d events for %d tokens", len(events), n)
	}
	var text strings.Builder
	var tokens []int
	for _, ev := range events {
		text.WriteString(ev.Text)
		tokens = append(tokens, ev.Token)
	}
	for _, r := range text.String() {
		if r < 0x20 || r > 0x7e {
			t.Fatalf("unprintable %q in %q", r, text.String())
		}
	}
	if len(text.String()) != n {
		t.Errorf("text %q is not one byte per token", text.String())
	}

	again := collect(t, submit(t, e, &Request{Prompt: prompt, Params: seeded(7, n)}))
	same := collect(t, submit(t, e, &Request{Prompt: prompt, Params: seeded(7, n)}))
	other := collect(t, submit(t, e, &Request{Prompt: prompt, Params: seeded(8, n)}))
	if !slices.Equal(again.tokens, same.tokens) || slices.Equal(again.tokens, other.tokens) || slices.Equal(again.tokens, tokens) {
		t.Errorf("tokens must depend on prompt and seed only:\nunseeded %v\nseed 7   %v\nseed 7   %v\nseed 8   %v", tokens, again.tokens, same.tokens, other.tokens)
	}

	stop := text.String()[10:12]
	p := greedy(n)
	p.Stop = []string{stop}
	r := collect(t, submit(t, e, &Request{Prompt: prompt, Params: p}))
	if want := text.String()[:strings.Index(text.String(), stop)]; r.text != want || r.last.FinishReason != "stop" {
		t.Errorf("stop %q: %q (%s), want %q", stop, r.text, r.last.FinishReason, want)
	}
	p = greedy(n)
	p.StopTokenIDs = []int{tokens[5]}
	r = collect(t, submit(t, e, &Request{Prompt: prompt, Params: p}))
	if want := tokens[:slices.Index(tokens, tokens[5])+1]; !slices.Equal(r.tokens, want) || r.last.FinishReason != "stop" {
		t.Errorf("stop token %d: %v (%s), want %v", tokens[5], r.tokens, r.last.FinishReason, want)
	}
	if u := e.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks still used", u)
	}
}

// PD in simulate mode: the decode imports the prefill's real (simulated)
// KV bytes, checks them, computes only the last prompt position, waits the
// modeled transfer, and generates what one colocated engine generates.
func TestSimulatedDisaggregation(t *testing.T) {
	p := testProfile
	colocated := newSim(t, Config{}, p, newFakeClock())
	prefillClock, decodeClock := newFakeClock(), newFakeClock()
	prefill := newSim(t, Config{}, p, prefillClock)
	decode := newSim(t, Config{}, p, decodeClock)
	for _, e := range []*Engine{colocated, prefill, decode} {
		runEngine(t, e)
	}
	path := &copyImport{from: prefill, blocks: map[string][]int{}, tokens: map[string]int{}}
	rng := rand.New(rand.NewPCG(5, 6))
	for i, n := range []int{1, 2, 16, 17, 40} {
		prompt := randomPrompt(rng, n)
		params := seeded(int64(i), 6)
		id := fmt.Sprint("sim-", i)
		want := run(t, colocated, &Request{ID: id, Prompt: prompt, Params: params, CaptureLayer: 2})

		pre := params
		pre.MaxTokens, pre.IgnoreEOS = 1, true
		before := len(prefillClock.recorded())
		run(t, prefill, &Request{ID: id, Prompt: prompt, Params: pre, Export: path.export(id), CaptureLayer: 2})
		if got := prefillClock.recorded()[before:]; !slices.Equal(got, []time.Duration{p.StepTime(n, 0)}) {
			t.Errorf("prompt of %d: prefill waited %v, want one prefill step of %v", n, got, p.StepTime(n, 0))
		}

		before = len(decodeClock.recorded())
		computed := decode.Stats().PromptTokensComputed
		d := run(t, decode, &Request{ID: id, Prompt: prompt, Params: params, Import: path.importer(decode, id), CaptureLayer: 2})
		if !slices.Equal(d.tokens, want.tokens) || d.text != want.text {
			t.Errorf("prompt of %d: PD %v, colocated %v", n, d.tokens, want.tokens)
		}
		if d.last.CachedTokens != n-1 || decode.Stats().PromptTokensComputed-computed != 1 {
			t.Errorf("prompt of %d: %d cached, %d computed; want %d and 1", n, d.last.CachedTokens, decode.Stats().PromptTokensComputed-computed, n-1)
		}
		wantWaits := []time.Duration{p.TransferTime(n), p.StepTime(1, 0)}
		for range 5 {
			wantWaits = append(wantWaits, p.StepTime(0, 1))
		}
		if got := decodeClock.recorded()[before:]; !slices.Equal(got, wantWaits) {
			t.Errorf("prompt of %d: decode waited %v, want %v (transfer, last prompt position, decodes)", n, got, wantWaits)
		}
		merged := slices.Concat(run(t, colocated, &Request{Prompt: prompt, Params: pre, CaptureLayer: 2}).last.Capture.Hidden[:n], d.last.Capture.Hidden[1:])
		if !rowsEqual(merged, want.last.Capture.Hidden) {
			t.Errorf("prompt of %d: merged conditioning differs from colocated", n)
		}
	}
	for _, e := range []*Engine{colocated, prefill, decode} {
		if u := e.Cache().Used(); u != 0 {
			t.Errorf("%d KV blocks still used", u)
		}
	}
}

// A transfer that changes one byte of the prefill's KV is a KV load
// failure, not silently wrong output.
func TestSimulatedImportChecksKV(t *testing.T) {
	zero, _ := simulate.Load("zero")
	prefill := newSim(t, Config{}, zero, WallClock{})
	decode := newSim(t, Config{}, zero, WallClock{})
	runEngine(t, prefill)
	runEngine(t, decode)
	path := &copyImport{from: prefill, blocks: map[string][]int{}, tokens: map[string]int{}}
	prompt := randomPrompt(rand.New(rand.NewPCG(9, 9)), 33)
	pre := greedy(1)
	pre.IgnoreEOS = true
	// Element 0 of position 16's layer-0 keys is the row's signature, 7 is
	// in its tail; -1 leaves the import intact.
	for i, element := range []int{-1, 0, 7} {
		corrupt := element >= 0
		id := fmt.Sprint("check-", i)
		run(t, prefill, &Request{ID: id, Prompt: prompt, Params: pre, Export: path.export(id)})
		imp := path.importer(decode, id)
		if corrupt {
			imp = func(ctx context.Context, dst []int) (int, error) {
				n, err := path.importer(decode, id)(ctx, dst)
				decode.Cache().Block(dst[1])[element] += 1
				return n, err
			}
		}
		r := run(t, decode, &Request{Prompt: prompt, Params: greedy(3), Import: imp})
		if !corrupt && (r.last.Err != nil || r.last.CachedTokens != 32) {
			t.Errorf("intact import: %v, %d cached", r.last.Err, r.last.CachedTokens)
		}
		if corrupt && (!errors.Is(r.last.Err, ErrKVLoad) || !strings.Contains(r.last.Err.Error(), "position 16")) {
			t.Errorf("corrupted import: finish %q, err %v; want a KV load failure naming position 16", r.last.FinishReason, r.last.Err)
		}
	}
	if u := decode.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks still used", u)
	}
}

// A modeled step of an hour does not hold the engine when it stops.
func TestSimulatedStepStopsWithEngine(t *testing.T) {
	slow := &simulate.Profile{Prefill: simulate.Linear{Base: time.Hour}}
	e := newSim(t, Config{}, slow, WallClock{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	ch := submit(t, e, &Request{Prompt: []int{1, 2, 3}, Params: greedy(2)})
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not stop within 30s of its context ending")
	}
	for ev := range ch {
		if ev.Finished && ev.FinishReason != "abort" {
			t.Errorf("finished %q, want abort", ev.FinishReason)
		}
	}
}

// The profile's batching caps apply unless the config sets its own.
func TestSimulateProfileCaps(t *testing.T) {
	p := &simulate.Profile{MaxNumSeqs: 3, MaxNumBatchedTokens: 100}
	e := newSim(t, Config{}, p, WallClock{})
	if e.cfg.MaxNumSeqs != 3 || e.cfg.MaxNumBatchedTokens != 100 {
		t.Errorf("caps %d/%d, want the profile's 3/100", e.cfg.MaxNumSeqs, e.cfg.MaxNumBatchedTokens)
	}
	e = newSim(t, Config{MaxNumSeqs: 9, MaxNumBatchedTokens: 50}, p, WallClock{})
	if e.cfg.MaxNumSeqs != 9 || e.cfg.MaxNumBatchedTokens != 50 {
		t.Errorf("caps %d/%d, want the config's 9/50", e.cfg.MaxNumSeqs, e.cfg.MaxNumBatchedTokens)
	}
}

// BenchmarkZeroProfileRequest is one short request through a zero-profile
// engine: the engine's own per-request and per-token cost.
func BenchmarkZeroProfileRequest(b *testing.B) {
	zero, _ := simulate.Load("zero")
	e, err := New(testModel, testTokenizer, Config{Simulate: zero})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	prompt := []int{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}
	const tokens = 32
	p := sampler.Defaults()
	p.MaxTokens = tokens
	b.ReportAllocs()
	for b.Loop() {
		ch, err := e.Submit(ctx, &Request{Prompt: prompt, Params: p})
		if err != nil {
			b.Fatal(err)
		}
		for range ch {
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*tokens), "ns/token")
}

// BenchmarkModeledStep shows the modeled time honoured as a lower bound on
// the wall clock: requests whose modeled duration is known, with the
// wall-clock overshoot per step as a metric.
func BenchmarkModeledStep(b *testing.B) {
	p := &simulate.Profile{Prefill: simulate.Linear{Base: ms}, Decode: simulate.Linear{Base: ms}}
	e, err := New(testModel, testTokenizer, Config{Simulate: p})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	const tokens = 20
	modeled := p.StepTime(3, 0) + (tokens-1)*p.StepTime(0, 1)
	var over time.Duration
	for b.Loop() {
		start := time.Now()
		ch, _ := e.Submit(ctx, &Request{Prompt: []int{1, 2, 3}, Params: greedy(tokens)})
		for range ch {
		}
		took := time.Since(start)
		if took < modeled {
			b.Fatalf("a request modeled at %v took %v", modeled, took)
		}
		over += took - modeled
	}
	b.ReportMetric(float64(over.Nanoseconds())/float64(b.N*tokens)/1e3, "overshoot-us/step")
}

// BenchmarkSimulatedKV is simulate mode's per-position KV work for a
// 170-token prompt: the prefill writing its rows, the decode checking the
// imported ones.
func BenchmarkSimulatedKV(b *testing.B) {
	const n = 170
	shape := testModel.KVShape(16)
	c, err := kvcache.New(shape, shape.BlocksFor(n))
	if err != nil {
		b.Fatal(err)
	}
	table, _ := c.Allocate(c.NumBlocks())
	tokens := make([]int, n)
	for i := range tokens {
		tokens[i] = 'a' + i%26
	}
	b.SetBytes(int64(n * shape.Layers * 2 * shape.KVHeads * shape.HeadDim * 4))
	for b.Loop() {
		fillKV(c, table, tokens, 0, n)
		if err := verifyKV(c, table, tokens, n); err != nil {
			b.Fatal(err)
		}
	}
}

// A multimodal prompt pays its modeled encoder time in the step that first
// computes one of its placeholders — with a chunked prefill, only that
// chunk's step — and a prompt whose rows came from an encoder stage
// (Encoding nil) pays none.
func TestSimulatedEncoderTime(t *testing.T) {
	p := *testProfile
	p.Encoder = simulate.Encoder{Audio: simulate.EncoderCost{PerItem: 7 * ms, PerToken: 100 * us}}
	pre := func(n int) time.Duration { return p.Prefill.Base + time.Duration(n)*p.Prefill.PerUnit }
	enc := p.Encoder.Time(simulate.EncoderAudio, 6)
	item := []simulate.EncoderItem{{Kind: simulate.EncoderAudio, Tokens: 6, Segments: 1}}
	mmRequest := func(encoding []simulate.EncoderItem) *Request {
		req, _ := mmPrompt(rand.New(rand.NewPCG(8, 8)), 16, 6, 12, 6)
		req.Params = greedy(1)
		req.Multimodal.Encoding = encoding
		return req
	}
	for _, c := range []struct {
		name     string
		budget   int
		encoding []simulate.EncoderItem
		want     []time.Duration
	}{
		{"whole prompt", 0, item, []time.Duration{pre(16) + enc}},
		{"chunked: placeholders in the second chunk", 5, item, []time.Duration{pre(5), pre(5) + enc, pre(5), pre(1)}},
		{"rows from an encoder stage", 0, nil, []time.Duration{pre(16)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			e := newSim(t, Config{MaxNumBatchedTokens: c.budget}, &p, clock)
			runEngine(t, e)
			collect(t, submit(t, e, mmRequest(c.encoding)))
			if got := clock.recorded(); !slices.Equal(got, c.want) {
				t.Errorf("waits %v, want %v", got, c.want)
			}
		})
	}
}
