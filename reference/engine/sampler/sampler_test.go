package sampler_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/sampler"
)

var (
	inf = float32(math.Inf(1))
	nan = float32(math.NaN())
)

func seed(v int64) *int64 { return &v }

// params returns Defaults with the changes applied.
func params(change func(*sampler.Params)) sampler.Params {
	p := sampler.Defaults()
	if change != nil {
		change(&p)
	}
	return p
}

// randomLogits returns n rows of vocab logits with a spread like a real
// model's, some of them tied, from a fixed generator.
func randomLogits(seed uint64, n, vocab int) [][]float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	rows := make([][]float32, n)
	for i := range rows {
		row := make([]float32, vocab)
		for j := range row {
			row[j] = float32(r.NormFloat64() * 3)
			if r.IntN(8) == 0 {
				row[j] = float32(r.IntN(4)) // ties, sometimes at the max
			}
		}
		rows[i] = row
	}
	return rows
}

func TestGreedy(t *testing.T) {
	tests := []struct {
		name   string
		logits []float32
		want   int
	}{
		{"argmax", []float32{0.1, 2.5, -1, 2.4}, 1},
		{"tie goes to the lower id", []float32{1, 3, 0, 3, 3}, 1},
		{"all equal", []float32{7, 7, 7}, 0},
		{"NaN is never chosen", []float32{nan, -5, -6}, 1},
		{"-Inf is never chosen", []float32{-inf, -1e30, -inf}, 1},
		{"+Inf wins", []float32{1e30, inf, inf}, 1},
		{"single token", []float32{-3}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sampler.New(params(func(p *sampler.Params) { p.Temperature = 0 }), nil)
			if got := s.Sample(tt.logits, nil, nil); got != tt.want {
				t.Errorf("Sample = %d, want %d", got, tt.want)
			}
		})
	}
}

// A top_k of 1 and a vanishing top_p leave one token whatever the draw:
// both must be the greedy token, ties included, at any temperature.
func TestSingleTokenFiltersEqualGreedy(t *testing.T) {
	rows := randomLogits(7, 300, 64)
	for i, row := range rows[:100] {
		// Tie the max with a later and an earlier token.
		m, n := slices.Index(row, slices.Max(row)), len(row)
		k := 1 + i%(n-1)
		row[(m+k)%n], row[(m+n-k)%n] = row[m], row[m]
	}
	greedy := sampler.New(params(func(p *sampler.Params) { p.Temperature = 0 }), nil)
	for _, tt := range []struct {
		name   string
		change func(*sampler.Params)
	}{
		{"top_k=1", func(p *sampler.Params) { p.TopK = 1 }},
		{"top_k=1 T=2", func(p *sampler.Params) { p.TopK = 1; p.Temperature = 2 }},
		{"top_p=1e-9", func(p *sampler.Params) { p.TopP = 1e-9 }},
		{"top_p=1e-9 T=2 top_k=10", func(p *sampler.Params) { p.TopP = 1e-9; p.Temperature = 2; p.TopK = 10 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := sampler.New(params(tt.change), nil) // unseeded: the draw must not matter
			for i, row := range rows {
				want := greedy.Sample(row, nil, nil)
				if got := s.Sample(row, nil, nil); got != want {
					t.Fatalf("row %d: Sample = %d, greedy = %d", i, got, want)
				}
			}
		})
	}
}

func TestMinTokens(t *testing.T) {
	const eos, stop, other = 2, 3, 1
	// EOS and the stop id dominate; without masking they would be chosen.
	logits := []float32{0, 1, 9, 8}
	p := params(func(p *sampler.Params) {
		p.Temperature = 0
		p.MinTokens = 3
		p.MaxTokens = 10
		p.StopTokenIDs = []int{stop}
	})
	tests := []struct {
		name      string
		ignoreEOS bool
		generated int // tokens before this step
		want      int
	}{
		{"both masked at step 0", false, 0, other},
		{"both masked at step 2", false, 2, other},
		{"EOS back at step 3", false, 3, eos},
		// vLLM masks the model's EOS under min_tokens even with ignore_eos.
		{"ignore_eos still masks EOS", true, 2, other},
		{"ignore_eos lets EOS be sampled", true, 3, eos},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := p
			p.IgnoreEOS = tt.ignoreEOS
			s := sampler.New(p, []int{eos})
			output := make([]int, tt.generated)
			if got := s.Sample(logits, []int{0}, output); got != tt.want {
				t.Errorf("Sample = %d, want %d", got, tt.want)
			}
		})
	}

	// The stop id is masked too: with EOS out of the way it is the max.
	s := sampler.New(p, []int{eos})
	noEOS := []float32{0, 1, -inf, 8}
	if got := s.Sample(noEOS, nil, make([]int, 2)); got != other {
		t.Errorf("before min_tokens: Sample = %d, want %d", got, other)
	}
	if got := s.Sample(noEOS, nil, make([]int, 3)); got != stop {
		t.Errorf("at min_tokens: Sample = %d, want %d", got, stop)
	}
}

func TestIsStop(t *testing.T) {
	const eos, eos2, stop, plain = 5, 6, 7, 1
	tests := []struct {
		name      string
		minTokens int
		ignoreEOS bool
		token     int
		generated int
		want      bool
	}{
		{"EOS", 0, false, eos, 1, true},
		{"second EOS id", 0, false, eos2, 1, true},
		{"stop id", 0, false, stop, 1, true},
		{"plain token", 0, false, plain, 1, false},
		{"ignore_eos", 0, true, eos, 1, false},
		{"ignore_eos keeps stop ids", 0, true, stop, 1, true},
		{"EOS before min_tokens", 3, false, eos, 2, false},
		{"stop id before min_tokens", 3, false, stop, 2, false},
		{"EOS as the min_tokens-th token", 3, false, eos, 3, true},
		{"stop id after min_tokens", 3, false, stop, 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sampler.New(params(func(p *sampler.Params) {
				p.MinTokens = tt.minTokens
				p.IgnoreEOS = tt.ignoreEOS
				p.StopTokenIDs = []int{stop}
			}), []int{eos, eos2})
			if got := s.IsStop(tt.token, tt.generated); got != tt.want {
				t.Errorf("IsStop(%d, %d) = %v, want %v", tt.token, tt.generated, got, tt.want)
			}
		})
	}
}

// Penalties decide the greedy token; their exact arithmetic is pinned by
// TestPenaltyValues in the package's own tests.
func TestPenaltiesChangeTheChoice(t *testing.T) {
	tests := []struct {
		name   string
		change func(*sampler.Params)
		logits []float32
		prompt []int
		output []int
		want   int
	}{
		// 4/2 = 2 < 3.
		{"repetition on a prompt token", func(p *sampler.Params) { p.RepetitionPenalty = 2 },
			[]float32{0, 4, 3}, []int{1}, nil, 2},
		// -1*2 = -2 < -1.5.
		{"repetition on a negative output token", func(p *sampler.Params) { p.RepetitionPenalty = 2 },
			[]float32{-3, -1, -1.5}, nil, []int{1}, 2},
		// Presence and frequency skip prompt tokens.
		{"presence ignores the prompt", func(p *sampler.Params) { p.PresencePenalty = 2 },
			[]float32{0, 4, 3}, []int{1, 1, 1}, nil, 1},
		// 4 - 2 = 2 < 3.
		{"presence on an output token", func(p *sampler.Params) { p.PresencePenalty = 2 },
			[]float32{0, 4, 3}, nil, []int{1}, 2},
		// 4 - 0.4*2 = 3.2 > 3, but 4 - 0.4*3 = 2.8 < 3.
		{"frequency below the count", func(p *sampler.Params) { p.FrequencyPenalty = 0.4 },
			[]float32{0, 4, 3}, nil, []int{1, 1}, 1},
		{"frequency at the count", func(p *sampler.Params) { p.FrequencyPenalty = 0.4 },
			[]float32{0, 4, 3}, nil, []int{1, 0, 1, 1}, 2},
		// A negative penalty rewards repetition.
		{"negative presence", func(p *sampler.Params) { p.PresencePenalty = -2 },
			[]float32{0, 2, 3}, nil, []int{1}, 1},
		{"ids outside the vocabulary are ignored", func(p *sampler.Params) {
			p.RepetitionPenalty = 2
			p.PresencePenalty = 2
			p.FrequencyPenalty = 2
		}, []float32{0, 4, 3}, []int{-1, 3, 99}, []int{-7, 3, 1 << 40}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := params(tt.change)
			p.Temperature = 0
			if got := sampler.New(p, nil).Sample(tt.logits, tt.prompt, tt.output); got != tt.want {
				t.Errorf("Sample = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestSeededReproducible(t *testing.T) {
	rows := randomLogits(11, 1000, 200)
	prompt := []int{3, 4, 5, 3}
	configs := map[string]func(*sampler.Params){
		"temperature": func(p *sampler.Params) { p.Temperature = 1.3 },
		"all filters": func(p *sampler.Params) {
			p.Temperature = 0.8
			p.TopK = 40
			p.TopP = 0.9
			p.MinP = 0.02
		},
		"penalties": func(p *sampler.Params) {
			p.Temperature = 1
			p.RepetitionPenalty = 1.3
			p.PresencePenalty = 0.5
			p.FrequencyPenalty = 0.3
		},
	}
	for name, change := range configs {
		t.Run(name, func(t *testing.T) {
			run := func(v int64) []int {
				s := sampler.New(params(func(p *sampler.Params) { change(p); p.Seed = seed(v) }), nil)
				var out []int
				for _, row := range rows {
					out = append(out, s.Sample(row, prompt, out))
				}
				return out
			}
			a, b := run(42), run(42)
			if !slices.Equal(a, b) {
				t.Fatalf("same seed, different tokens:\n%v\n%v", a[:20], b[:20])
			}
			c := run(43)
			differ := 0
			for i := range a {
				if a[i] != c[i] {
					differ++
				}
			}
			// The rows are spread enough that a draw matters on most steps.
			if differ < 100 {
				t.Errorf("seeds 42 and 43 differ on %d of %d tokens", differ, len(a))
			}
		})
	}
}

// The random stream advances once per Sample call whatever the logits, so
// one bad row (here all NaN, which takes the fallback) cannot shift later
// tokens.
func TestStreamPositionIsCallCount(t *testing.T) {
	rows := randomLogits(3, 50, 100)
	p := params(func(p *sampler.Params) { p.Seed = seed(9); p.TopP = 0.95 })
	a, b := sampler.New(p, nil), sampler.New(p, nil)
	broken := slices.Repeat([]float32{nan}, 100)
	for i, row := range rows {
		ra, rb := row, row
		if i == 10 {
			ra = broken
		}
		ta, tb := a.Sample(ra, nil, nil), b.Sample(rb, nil, nil)
		if i > 10 && ta != tb {
			t.Fatalf("step %d: %d != %d after a broken row at step 10", i, ta, tb)
		}
	}
}

// The PD contract: the prefill's sampler takes one draw and its token is
// discarded; the decode worker's fresh sampler then yields the tokens a
// colocated worker yields.
func TestDisaggregatedEqualsColocated(t *testing.T) {
	rows := randomLogits(5, 64, 300)
	p := params(func(p *sampler.Params) { p.Seed = seed(2026); p.Temperature = 0.9; p.TopK = 50 })
	colocated := sampler.New(p, nil)
	var want []int
	for _, row := range rows {
		want = append(want, colocated.Sample(row, nil, want))
	}

	prefillParams := p
	prefillParams.MaxTokens = 1
	sampler.New(prefillParams, nil).Sample(rows[0], nil, nil) // discarded
	decode := sampler.New(p, nil)
	var got []int
	for _, row := range rows {
		got = append(got, decode.Sample(row, nil, got))
	}
	if !slices.Equal(got, want) {
		t.Errorf("decode tokens differ from colocated:\n%v\n%v", got, want)
	}
}

func TestUnseededSamplersDiffer(t *testing.T) {
	row := make([]float32, 1000) // uniform
	a, b := sampler.New(sampler.Defaults(), nil), sampler.New(sampler.Defaults(), nil)
	same := 0
	for range 100 {
		if a.Sample(row, nil, nil) == b.Sample(row, nil, nil) {
			same++
		}
	}
	if same == 100 {
		t.Error("two unseeded samplers drew the same 100 tokens")
	}
	// Seed -1 means unseeded, as in vLLM.
	p := params(func(p *sampler.Params) { p.Seed = seed(-1) })
	a, b = sampler.New(p, nil), sampler.New(p, nil)
	same = 0
	for range 100 {
		if a.Sample(row, nil, nil) == b.Sample(row, nil, nil) {
			same++
		}
	}
	if same == 100 {
		t.Error("two samplers with seed -1 drew the same 100 tokens")
	}
}

// Frequencies over 20000 seeded draws from a fixed 4-token distribution
// match the filtered, renormalized probabilities. With a fixed seed this is
// deterministic; the bounds are loose enough to survive any change of seed.
func TestDistribution(t *testing.T) {
	// Rank order 1, 3, 0, 2 differs from id order on purpose.
	probs := []float64{0.2, 0.4, 0.1, 0.3}
	logits := make([]float32, len(probs))
	for i, p := range probs {
		logits[i] = float32(math.Log(p))
	}
	tests := []struct {
		name   string
		change func(*sampler.Params)
		want   []float64
	}{
		{"T=1", nil, []float64{0.2, 0.4, 0.1, 0.3}},
		{"T=0.5 squares", func(p *sampler.Params) { p.Temperature = 0.5 }, []float64{4. / 30, 16. / 30, 1. / 30, 9. / 30}},
		{"top_k=3", func(p *sampler.Params) { p.TopK = 3 }, []float64{2. / 9, 4. / 9, 0, 3. / 9}},
		{"top_k=2", func(p *sampler.Params) { p.TopK = 2 }, []float64{0, 4. / 7, 0, 3. / 7}},
		// Kept while the mass ranked before is < 0.5: 0, then 0.4; not 0.7.
		{"top_p=0.5", func(p *sampler.Params) { p.TopP = 0.5 }, []float64{0, 4. / 7, 0, 3. / 7}},
		{"top_p=0.75", func(p *sampler.Params) { p.TopP = 0.75 }, []float64{2. / 9, 4. / 9, 0, 3. / 9}},
		// p/p_max: 1, 0.75, 0.5, 0.25.
		{"min_p=0.6", func(p *sampler.Params) { p.MinP = 0.6 }, []float64{0, 4. / 7, 0, 3. / 7}},
		{"min_p=0.3", func(p *sampler.Params) { p.MinP = 0.3 }, []float64{2. / 9, 4. / 9, 0, 3. / 9}},
		// Temperature first: 16/30, 9/30, 4/30 ranked before token 2 sum to
		// 29/30 >= 0.9, so token 2 goes.
		{"T=0.5 top_p=0.9", func(p *sampler.Params) { p.Temperature = 0.5; p.TopP = 0.9 }, []float64{4. / 29, 16. / 29, 0, 9. / 29}},
		// top_k renormalizes before top_p: 4/9 < 0.5 keeps token 3.
		{"top_k=3 top_p=0.45", func(p *sampler.Params) { p.TopK = 3; p.TopP = 0.45 }, []float64{0, 4. / 7, 0, 3. / 7}},
		{"top_k=1", func(p *sampler.Params) { p.TopK = 1 }, []float64{0, 1, 0, 0}},
	}
	const draws = 20000
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sampler.New(params(func(p *sampler.Params) {
				if tt.change != nil {
					tt.change(p)
				}
				p.Seed = seed(1234)
			}), nil)
			counts := make([]int, len(probs))
			for range draws {
				counts[s.Sample(logits, nil, nil)]++
			}
			chi2 := 0.0
			for i, want := range tt.want {
				got := float64(counts[i]) / draws
				if want == 0 {
					if counts[i] != 0 {
						t.Errorf("token %d: drawn %d times, want never", i, counts[i])
					}
					continue
				}
				if math.Abs(got-want) > 0.02 {
					t.Errorf("token %d: frequency %.4f, want %.4f ± 0.02", i, got, want)
				}
				e := want * draws
				chi2 += (float64(counts[i]) - e) * (float64(counts[i]) - e) / e
			}
			// At most 3 degrees of freedom: P(chi2 > 25) is about 1e-5.
			if chi2 > 25 {
				t.Errorf("chi-square %.1f > 25 (counts %v)", chi2, counts)
			}
		})
	}
}

// Every row a model can produce yields a token inside the vocabulary.
func TestNoUsableLogit(t *testing.T) {
	const eos = 1
	tests := []struct {
		name   string
		change func(*sampler.Params)
		logits []float32
		output []int
		want   int
	}{
		{"all -Inf falls back to 0", nil, []float32{-inf, -inf, -inf}, nil, 0},
		{"all NaN falls back to 0", nil, []float32{nan, nan}, nil, 0},
		{"greedy all NaN falls back to 0", func(p *sampler.Params) { p.Temperature = 0 }, []float32{nan, nan}, nil, 0},
		// Only EOS is usable and min_tokens masks it: the raw argmax wins
		// over returning a token the model gave no probability.
		{"min_tokens masks the only usable token", func(p *sampler.Params) { p.MinTokens = 5 }, []float32{-inf, 0, -inf}, nil, eos},
		{"+Inf takes all the probability", nil, []float32{0, 100, inf, 3}, nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sampler.New(params(tt.change), []int{eos})
			for range 20 {
				if got := s.Sample(tt.logits, nil, tt.output); got != tt.want {
					t.Fatalf("Sample = %d, want %d", got, tt.want)
				}
			}
		})
	}
}

func TestEmptyLogitsPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Sample(nil) did not panic")
		}
	}()
	sampler.New(sampler.Defaults(), nil).Sample(nil, nil, nil)
}

func TestSampleDoesNotModifyInputs(t *testing.T) {
	logits := []float32{3, -2, nan, inf, -inf, 0, 5, 5, -0.5}
	prompt := []int{0, 1, 6, 1, 20}
	output := []int{6, 6, 1, -3}
	keep := func(x []float32) []uint32 {
		bits := make([]uint32, len(x))
		for i, v := range x {
			bits[i] = math.Float32bits(v)
		}
		return bits
	}
	wantLogits, wantPrompt, wantOutput := keep(logits), slices.Clone(prompt), slices.Clone(output)
	for _, temp := range []float64{0, 1} {
		s := sampler.New(params(func(p *sampler.Params) {
			p.Temperature = temp
			p.RepetitionPenalty = 1.5
			p.PresencePenalty = 1
			p.FrequencyPenalty = 0.5
			p.MinTokens = 10
			p.StopTokenIDs = []int{7}
			p.TopP = 0.9
		}), []int{6})
		s.Sample(logits, prompt, output)
	}
	if !slices.Equal(keep(logits), wantLogits) || !slices.Equal(prompt, wantPrompt) || !slices.Equal(output, wantOutput) {
		t.Errorf("Sample modified its inputs: logits %v, prompt %v, output %v", logits, prompt, output)
	}
}

// Samplers on many goroutines share the scratch pool; their tokens must be
// the ones they yield alone.
func TestConcurrentSamplers(t *testing.T) {
	rows := randomLogits(21, 100, 500)
	run := func(i int) []int {
		s := sampler.New(params(func(p *sampler.Params) {
			p.Seed = seed(int64(i))
			p.FrequencyPenalty = 0.5
			p.RepetitionPenalty = 1.2
			p.TopP = 0.9
		}), nil)
		var out []int
		for _, row := range rows {
			out = append(out, s.Sample(row, []int{1, 2, 3}, out))
		}
		return out
	}
	const n = 8
	want := make([][]int, n)
	for i := range n {
		want[i] = run(i)
	}
	got := make([][]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i] = run(i) })
	}
	wg.Wait()
	for i := range n {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("sampler %d: concurrent tokens differ from sequential", i)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*sampler.Params)
		param  string // "" = valid
		msg    string
	}{
		{"defaults", nil, "", ""},
		{"greedy", func(p *sampler.Params) { p.Temperature = 0 }, "", ""},
		{"everything at its bound", func(p *sampler.Params) {
			p.Temperature = 2
			p.TopP = 1e-9
			p.TopK = -1
			p.MinP = 1
			p.PresencePenalty = -2
			p.FrequencyPenalty = 2
			p.RepetitionPenalty = 1e-3
			p.MaxTokens = 5
			p.MinTokens = 5
			p.StopTokenIDs = []int{0}
			p.Stop = []string{"\n"}
		}, "", ""},
		{"min_tokens without a max", func(p *sampler.Params) { p.MinTokens = 100 }, "", ""},
		{"negative temperature", func(p *sampler.Params) { p.Temperature = -0.1 }, "temperature", "temperature must be >= 0, got -0.1"},
		{"NaN temperature", func(p *sampler.Params) { p.Temperature = math.NaN() }, "temperature", "temperature must be finite, got NaN"},
		{"hot temperature", func(p *sampler.Params) { p.Temperature = 2.5 }, "temperature", "temperature must be <= 2, got 2.5"},
		{"top_p 0", func(p *sampler.Params) { p.TopP = 0 }, "top_p", "top_p must be in (0, 1], got 0"},
		{"top_p above 1", func(p *sampler.Params) { p.TopP = 1.01 }, "top_p", "top_p must be in (0, 1], got 1.01"},
		{"top_p NaN", func(p *sampler.Params) { p.TopP = math.NaN() }, "top_p", "top_p must be in (0, 1], got NaN"},
		{"top_k -2", func(p *sampler.Params) { p.TopK = -2 }, "top_k", "top_k must be 0 or -1 (off), or >= 1, got -2"},
		{"min_p above 1", func(p *sampler.Params) { p.MinP = 1.5 }, "min_p", "min_p must be in [0, 1], got 1.5"},
		{"min_p negative", func(p *sampler.Params) { p.MinP = -0.1 }, "min_p", "min_p must be in [0, 1], got -0.1"},
		{"repetition_penalty 0", func(p *sampler.Params) { p.RepetitionPenalty = 0 }, "repetition_penalty", "repetition_penalty must be > 0, got 0"},
		{"repetition_penalty +Inf", func(p *sampler.Params) { p.RepetitionPenalty = math.Inf(1) }, "repetition_penalty", "repetition_penalty must be finite, got +Inf"},
		{"presence_penalty", func(p *sampler.Params) { p.PresencePenalty = 2.5 }, "presence_penalty", "presence_penalty must be in [-2, 2], got 2.5"},
		{"frequency_penalty", func(p *sampler.Params) { p.FrequencyPenalty = -3 }, "frequency_penalty", "frequency_penalty must be in [-2, 2], got -3"},
		{"frequency_penalty NaN", func(p *sampler.Params) { p.FrequencyPenalty = math.NaN() }, "frequency_penalty", "frequency_penalty must be in [-2, 2], got NaN"},
		{"max_tokens negative", func(p *sampler.Params) { p.MaxTokens = -1 }, "max_tokens", "max_tokens must be >= 1 (or 0 for no limit), got -1"},
		{"min_tokens negative", func(p *sampler.Params) { p.MinTokens = -1 }, "min_tokens", "min_tokens must be >= 0, got -1"},
		{"min_tokens above max_tokens", func(p *sampler.Params) { p.MinTokens = 9; p.MaxTokens = 8 }, "min_tokens", "min_tokens must not exceed max_tokens (min_tokens=9, max_tokens=8)"},
		{"negative stop id", func(p *sampler.Params) { p.StopTokenIDs = []int{4, -1} }, "stop_token_ids", "stop_token_ids must not be negative, got -1"},
		{"empty stop string", func(p *sampler.Params) { p.Stop = []string{"end", ""} }, "stop", "stop must not contain an empty string"},
		{"zero Params", func(p *sampler.Params) { *p = sampler.Params{} }, "repetition_penalty", "repetition_penalty must be > 0, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := params(tt.change).Validate()
			if tt.param == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var pe *sampler.ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("Validate = %v, want a *ParamError", err)
			}
			if pe.Param != tt.param || err.Error() != tt.msg {
				t.Errorf("Validate = (%s) %q, want (%s) %q", pe.Param, err, tt.param, tt.msg)
			}
			if !errors.Is(err, sampler.ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
		})
	}
}

// The zero Params is invalid for a client, but a sampler built from it is
// greedy without penalties rather than broken.
func TestNewToleratesZeroParams(t *testing.T) {
	s := sampler.New(sampler.Params{}, nil)
	if got := s.Sample([]float32{1, 3, 2}, []int{1}, []int{1}); got != 1 {
		t.Errorf("Sample = %d, want 1", got)
	}
}

func BenchmarkSample(b *testing.B) {
	modes := []struct {
		name   string
		change func(*sampler.Params)
	}{
		{"greedy", func(p *sampler.Params) { p.Temperature = 0 }},
		{"temperature", func(p *sampler.Params) { p.Temperature = 0.7 }},
		{"topk20_topp0.8", func(p *sampler.Params) { p.Temperature = 0.7; p.TopK = 20; p.TopP = 0.8 }},
		{"topp0.95", func(p *sampler.Params) { p.Temperature = 1; p.TopP = 0.95 }},
		{"penalties", func(p *sampler.Params) {
			p.RepetitionPenalty = 1.05
			p.PresencePenalty = 1.5
			p.FrequencyPenalty = 0.5
		}},
	}
	for _, vocab := range []int{151936, 259} {
		rows := randomLogits(1, 16, vocab)
		r := rand.New(rand.NewPCG(2, 2))
		prompt, output := make([]int, 512), make([]int, 256)
		for i := range prompt {
			prompt[i] = r.IntN(vocab)
		}
		for i := range output {
			output[i] = r.IntN(vocab)
		}
		for _, m := range modes {
			b.Run(fmt.Sprintf("vocab=%d/%s", vocab, m.name), func(b *testing.B) {
				s := sampler.New(params(func(p *sampler.Params) { m.change(p); p.Seed = seed(1) }), []int{vocab - 1})
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					s.Sample(rows[i%len(rows)], prompt, output)
					i++
				}
			})
		}
	}
}
