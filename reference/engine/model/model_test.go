package model

import (
	"fmt"
	"github.com/omnipd/omnipd/reference/engine/kernel"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
)

// tinyConfig is small enough for a naive float64 reference, with a
// head_dim that is not hidden/heads and grouped KV heads.
func tinyConfig(tied bool) Config {
	return Config{
		VocabSize: 23, HiddenSize: 24, IntermediateSize: 40, NumLayers: 2,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 8, MaxPositionEmbeddings: 512,
		RopeTheta: 1e4, RMSNormEps: 1e-6, TieWordEmbeddings: tied,
		BOSTokenID: -1, EOSTokenIDs: []int{22},
	}
}

// randomTestModel is randomModel with norm weights away from 1, so that a
// test notices a norm weight applied wrongly or to the wrong place.
func randomTestModel(t testing.TB, c Config, seed uint64) *Model {
	t.Helper()
	m, err := randomModel(c, seed, c.VocabSize)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	for _, p := range m.params() {
		if p.kind == kindNorm {
			for i := range *p.w {
				(*p.w)[i] = float32(0.5 + r.Float64())
			}
		}
	}
	return m
}

func newCache(t testing.TB, m *Model, blockSize, blocks int) *kvcache.Cache {
	t.Helper()
	c, err := kvcache.New(m.KVShape(blockSize), blocks)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func alloc(t testing.TB, c *kvcache.Cache, positions int) []int {
	t.Helper()
	table, err := c.Allocate(c.Shape().BlocksFor(positions))
	if err != nil {
		t.Fatal(err)
	}
	return table
}

func prompt(n int, vocab int, seed uint64) []int {
	r := rand.New(rand.NewPCG(seed, 2))
	toks := make([]int, n)
	for i := range toks {
		toks[i] = r.IntN(vocab)
	}
	return toks
}

// kvRows returns every K and V row of a sequence, position-major, so that
// caches with different block tables compare.
func kvRows(c *kvcache.Cache, table []int, n int) [][]float32 {
	var rows [][]float32
	for pos := range n {
		b, s := c.Position(table, pos)
		for l := range c.Shape().Layers {
			rows = append(rows, c.K(b, l, s), c.V(b, l, s))
		}
	}
	return rows
}

func bitsEqual(a, b []float32) bool {
	return len(a) == len(b) && slices.EqualFunc(a, b, func(x, y float32) bool {
		return math.Float32bits(x) == math.Float32bits(y)
	})
}

func rowsEqual(a, b [][]float32) bool {
	return len(a) == len(b) && slices.EqualFunc(a, b, bitsEqual)
}

// runChunks computes tokens in chunks ending at the given split points and
// returns the last logits, the sequence's cache rows and the capture.
func runChunks(t testing.TB, m *Model, tokens []int, splits []int, blockSize int, layer int) ([]float32, [][]float32, *Capture) {
	t.Helper()
	c := newCache(t, m, blockSize, 64)
	c.Allocate(3) // so the sequence's blocks are not 0, 1, 2, …
	table := alloc(t, c, len(tokens))
	slices.Reverse(table)
	capture := &Capture{Layer: layer}
	var logits []float32
	start := 0
	for _, end := range append(slices.Clone(splits), len(tokens)) {
		if end == start {
			continue
		}
		logits = m.Forward(c, table, start, tokens[start:end], capture)
		start = end
	}
	return logits, kvRows(c, table, len(tokens)), capture
}

func TestDefaultIsPinned(t *testing.T) {
	a, b := Default(), Default()
	h := fnv.New64a()
	for i, p := range a.params() {
		q := b.params()[i]
		if !bitsEqual(*p.w, *q.w) {
			t.Fatalf("%s differs between two Default() calls", p.name)
		}
		for _, v := range *p.w {
			fmt.Fprintf(h, "%08x", math.Float32bits(v))
		}
	}
	// Pinning the weights pins every output built on Default across
	// machines; change it only on purpose, with the goldens that depend on it.
	const want = 0x353ae06344746dc8
	if got := h.Sum64(); got != want {
		t.Errorf("Default() weights hash to %#x, want %#x", got, want)
	}
	if &a.lmHead[0] != &a.embed[0] {
		t.Error("Default() does not tie lm_head to embed_tokens")
	}
	c := a.Config
	if c.VocabSize != 269 || c.HiddenSize != 64 || c.NumLayers != 4 || c.NumHeads != 4 || c.NumKVHeads != 2 ||
		c.HeadDim != 16 || c.IntermediateSize != 128 || !slices.Equal(c.EOSTokenIDs, []int{258, 256}) ||
		!slices.Equal(c.TTSTokenIDs, []int{266, 267, 268}) {
		t.Errorf("Default().Config = %+v", c)
	}
}

// Tokens added to the built-in vocabulary after its seed was chosen leave
// every weight drawn before as it was: the model of the seeded vocabulary
// is Default without the added embedding rows.
func TestDefaultKeepsTheSeededWeights(t *testing.T) {
	c := DefaultConfig()
	c.VocabSize, c.TTSTokenIDs = seededVocab, nil
	seeded, err := randomModel(c, defaultSeed, seededVocab)
	if err != nil {
		t.Fatal(err)
	}
	m := Default()
	for i, p := range seeded.params() {
		got := *m.params()[i].w
		if p.kind == kindEmbed {
			got = got[:len(*p.w)]
		}
		if !bitsEqual(got, *p.w) {
			t.Errorf("%s differs from the seeded vocabulary's", p.name)
		}
	}
}

func TestDefaultGreedyIsPinned(t *testing.T) {
	m := Default()
	c := newCache(t, m, 16, 8)
	tokens := []int{257, 'u', 's', 'e', 'r', '\n', 'H', 'i', 258, '\n', 257, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', '\n'}
	table := alloc(t, c, len(tokens)+16)
	logits := m.Forward(c, table, 0, tokens, nil)
	var out []int
	for range 16 {
		next := argmax(logits)
		out = append(out, next)
		logits = m.Forward(c, table, len(tokens), []int{next}, nil)
		tokens = append(tokens, next)
	}
	want := []int{159, 196, 148, 37, 231, 172, 37, 231, 3, 3, 215, 121, 81, 121, 268, 37}
	if !slices.Equal(out, want) {
		t.Errorf("greedy continuation = %v, want %v", out, want)
	}
	if len(slices.Compact(slices.Clone(out))) < 3 {
		t.Errorf("greedy continuation %v is degenerate; the default model should produce varied tokens", out)
	}
}

func argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

func TestDeterminism(t *testing.T) {
	m := Default()
	tokens := prompt(50, m.Config.VocabSize, 1)
	l1, kv1, c1 := runChunks(t, m, tokens, nil, 16, 2)
	l2, kv2, c2 := runChunks(t, Default(), tokens, nil, 16, 2)
	if !bitsEqual(l1, l2) || !rowsEqual(kv1, kv2) || !rowsEqual(c1.Hidden, c2.Hidden) {
		t.Error("two runs of the same input differ")
	}
}

func TestChunkInvariance(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *Model
	}{
		{"default", Default()},
		{"tiny untied", randomTestModel(t, tinyConfig(false), 3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 37
			tokens := prompt(n, tc.m.Config.VocabSize, 4)
			layer := tc.m.Config.NumLayers / 2
			wantLogits, wantKV, wantCap := runChunks(t, tc.m, tokens, nil, 4, layer)
			one := make([]int, n-1)
			for i := range one {
				one[i] = i + 1
			}
			r := rand.New(rand.NewPCG(5, 5))
			random := []int{}
			for p := r.IntN(5) + 1; p < n; p += r.IntN(9) + 1 {
				random = append(random, p)
			}
			for _, splits := range [][]int{{1}, {3}, {4}, {5}, {16}, {36}, {8, 9, 30}, one, random} {
				for _, bs := range []int{4, 16, 5} {
					logits, kv, cp := runChunks(t, tc.m, tokens, splits, bs, layer)
					if !bitsEqual(logits, wantLogits) {
						t.Errorf("splits %v, block size %d: last logits differ from one call", splits, bs)
					}
					if !rowsEqual(kv, wantKV) {
						t.Errorf("splits %v, block size %d: cache contents differ from one call", splits, bs)
					}
					if !rowsEqual(cp.Hidden, wantCap.Hidden) || !rowsEqual(cp.Embeddings, wantCap.Embeddings) {
						t.Errorf("splits %v, block size %d: captured rows differ from one call", splits, bs)
					}
				}
			}
		})
	}
}

// TestPrefixLogits checks that the logits a chunk returns are those of its
// last position in a whole-prompt run: what a prefill worker samples from.
func TestPrefixLogits(t *testing.T) {
	m := Default()
	tokens := prompt(20, m.Config.VocabSize, 6)
	for k := 1; k <= len(tokens); k += 6 {
		want, _, _ := runChunks(t, m, tokens[:k], nil, 16, 0)
		c := newCache(t, m, 16, 4)
		table := alloc(t, c, len(tokens))
		got := m.Forward(c, table, 0, tokens[:k], nil)
		m.Forward(c, table, k, tokens[k:], nil)
		if !bitsEqual(got, want) {
			t.Errorf("logits after %d tokens differ", k)
		}
	}
}

func TestBatchInterleaving(t *testing.T) {
	m := Default()
	a, b := prompt(29, m.Config.VocabSize, 7), prompt(18, m.Config.VocabSize, 8)
	wantA, kvA, _ := runChunks(t, m, a, nil, 4, 0)
	wantB, kvB, _ := runChunks(t, m, b, nil, 4, 0)

	t.Run("interleaved", func(t *testing.T) {
		c := newCache(t, m, 4, 32)
		ta, tb := alloc(t, c, len(a)), alloc(t, c, len(b))
		var la, lb []float32
		sa, sb := 0, 0
		for step := 0; sa < len(a) || sb < len(b); step++ {
			if sa < len(a) {
				e := min(len(a), sa+1+step%5)
				la = m.Forward(c, ta, sa, a[sa:e], nil)
				sa = e
			}
			if sb < len(b) {
				e := min(len(b), sb+1+step%3)
				lb = m.Forward(c, tb, sb, b[sb:e], nil)
				sb = e
			}
		}
		if !bitsEqual(la, wantA) || !rowsEqual(kvRows(c, ta, len(a)), kvA) {
			t.Error("sequence a differs when interleaved with b")
		}
		if !bitsEqual(lb, wantB) || !rowsEqual(kvRows(c, tb, len(b)), kvB) {
			t.Error("sequence b differs when interleaved with a")
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		c := newCache(t, m, 4, 32)
		ta, tb := alloc(t, c, len(a)), alloc(t, c, len(b))
		var la, lb []float32
		var wg sync.WaitGroup
		wg.Go(func() { la = m.Forward(c, ta, 0, a, nil) })
		wg.Go(func() {
			lb = m.Forward(c, tb, 0, b[:7], nil)
			lb = m.Forward(c, tb, 7, b[7:], nil)
		})
		wg.Wait()
		if !bitsEqual(la, wantA) || !bitsEqual(lb, wantB) {
			t.Error("concurrent Forward calls differ from each sequence alone")
		}
	})
}

// naiveLogits is the Qwen3 forward pass written out directly in float64,
// with no cache: every position recomputed from the tokens.
func naiveLogits(m *Model, tokens []int) []float64 {
	c := m.Config
	H, hd, nh, nkv := c.HiddenSize, c.HeadDim, c.NumHeads, c.NumKVHeads
	n := len(tokens)
	f64 := func(w []float32) []float64 {
		out := make([]float64, len(w))
		for i, v := range w {
			out[i] = float64(v)
		}
		return out
	}
	linear := func(w []float32, x []float64, out int) []float64 {
		y := make([]float64, out)
		for r := range out {
			for i, v := range x {
				y[r] += float64(w[r*len(x)+i]) * v
			}
		}
		return y
	}
	norm := func(x []float64, w []float32) []float64 {
		var ms float64
		for _, v := range x {
			ms += v * v
		}
		ms /= float64(len(x))
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v / math.Sqrt(ms+c.RMSNormEps) * float64(w[i])
		}
		return y
	}
	rotate := func(x []float64, pos int) {
		half := hd / 2
		for i := range half {
			theta := float64(pos) * math.Pow(c.RopeTheta, -float64(2*i)/float64(hd))
			a, b := x[i], x[i+half]
			x[i] = a*math.Cos(theta) - b*math.Sin(theta)
			x[i+half] = b*math.Cos(theta) + a*math.Sin(theta)
		}
	}
	hs := make([][]float64, n)
	for t, tok := range tokens {
		hs[t] = f64(m.embed[tok*H : (tok+1)*H])
	}
	for _, w := range m.layers {
		qs, ks, vs := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for t := range n {
			x := norm(hs[t], w.inputNorm)
			qs[t], ks[t], vs[t] = linear(w.q, x, nh*hd), linear(w.k, x, nkv*hd), linear(w.v, x, nkv*hd)
			for h := range nh {
				copy(qs[t][h*hd:], norm(qs[t][h*hd:(h+1)*hd], w.qNorm))
				rotate(qs[t][h*hd:(h+1)*hd], t)
			}
			for h := range nkv {
				copy(ks[t][h*hd:], norm(ks[t][h*hd:(h+1)*hd], w.kNorm))
				rotate(ks[t][h*hd:(h+1)*hd], t)
			}
		}
		for t := range n {
			attn := make([]float64, nh*hd)
			for h := range nh {
				kvh := h / (nh / nkv)
				scores := make([]float64, t+1)
				mx := math.Inf(-1)
				for j := range t + 1 {
					for d := range hd {
						scores[j] += qs[t][h*hd+d] * ks[j][kvh*hd+d]
					}
					scores[j] /= math.Sqrt(float64(hd))
					mx = max(mx, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range scores {
					for d := range hd {
						attn[h*hd+d] += scores[j] / sum * vs[j][kvh*hd+d]
					}
				}
			}
			o := linear(w.o, attn, H)
			for i := range hs[t] {
				hs[t][i] += o[i]
			}
			x := norm(hs[t], w.postNorm)
			g, u := linear(w.gate, x, c.IntermediateSize), linear(w.up, x, c.IntermediateSize)
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := linear(w.down, g, H)
			for i := range hs[t] {
				hs[t][i] += d[i]
			}
		}
	}
	return linear(m.lmHead, norm(hs[n-1], m.norm), c.VocabSize)
}

func TestMatchesNaiveReference(t *testing.T) {
	mha := tinyConfig(true)
	mha.NumKVHeads = mha.NumHeads
	mqa := tinyConfig(false)
	mqa.NumKVHeads = 1
	for _, tc := range []struct {
		name string
		m    *Model
	}{
		{"gqa untied", randomTestModel(t, tinyConfig(false), 10)},
		{"mha tied", randomTestModel(t, mha, 11)},
		{"mqa", randomTestModel(t, mqa, 12)},
		{"default", Default()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens := prompt(40, tc.m.Config.VocabSize, 13)
			for _, n := range []int{1, 2, 7, 40} {
				got, _, _ := runChunks(t, tc.m, tokens[:n], nil, 16, 0)
				want := naiveLogits(tc.m, tokens[:n])
				var scale, diff float64
				for i, w := range want {
					scale = max(scale, math.Abs(w))
					diff = max(diff, math.Abs(float64(got[i])-w))
				}
				if rel := diff / scale; rel > 1e-5 || math.IsNaN(rel) {
					t.Errorf("%d tokens: max |Δlogit| / max |logit| = %.3g, want ≤ 1e-5", n, rel)
				}
			}
		})
	}
}

func TestCapture(t *testing.T) {
	m := Default()
	tokens := prompt(11, m.Config.VocabSize, 14)
	for _, layer := range []int{0, 1, m.Config.NumLayers} {
		c := newCache(t, m, 4, 8)
		table := alloc(t, c, len(tokens))
		cp := &Capture{Layer: layer}
		m.Forward(c, table, 0, tokens[:5], cp)
		logits := m.Forward(c, table, 5, tokens[5:], cp)
		if len(cp.Embeddings) != len(tokens) || len(cp.Hidden) != len(tokens) {
			t.Fatalf("layer %d: captured %d embeddings and %d hidden rows, want %d each", layer, len(cp.Embeddings), len(cp.Hidden), len(tokens))
		}
		for i, tok := range tokens {
			if len(cp.Embeddings[i]) != m.Config.HiddenSize || len(cp.Hidden[i]) != m.Config.HiddenSize {
				t.Fatalf("layer %d, row %d: widths %d and %d, want %d", layer, i, len(cp.Embeddings[i]), len(cp.Hidden[i]), m.Config.HiddenSize)
			}
			if !bitsEqual(cp.Embeddings[i], m.Embedding(tok)) {
				t.Errorf("layer %d: Embeddings[%d] is not Embedding(%d)", layer, i, tok)
			}
		}
		switch layer {
		case 0:
			if !rowsEqual(cp.Hidden, cp.Embeddings) {
				t.Error("layer 0: hidden rows are not the embeddings")
			}
		case m.Config.NumLayers:
			// The last layer's output, before the final norm: the logits follow from it.
			x := make([]float32, m.Config.HiddenSize)
			kernel.RMSNorm(x, cp.Hidden[len(tokens)-1], m.norm, m.Config.RMSNormEps)
			want := make([]float32, m.Config.VocabSize)
			kernel.MatVec(want, m.lmHead, x)
			if !bitsEqual(logits, want) {
				t.Error("last-layer capture does not produce the logits through the final norm and lm_head")
			}
		default:
			if rowsEqual(cp.Hidden, cp.Embeddings) {
				t.Errorf("layer %d: hidden rows equal the embeddings", layer)
			}
		}
	}
	e := m.Embedding(3)
	e[0]++
	if m.Embedding(3)[0] == e[0] {
		t.Error("Embedding returns the model's own memory, not a copy")
	}
}

func TestForwardPanics(t *testing.T) {
	m := Default()
	good := newCache(t, m, 4, 8)
	table := alloc(t, good, 8)
	other, _ := kvcache.New(kvcache.Shape{Layers: 3, KVHeads: 2, HeadDim: 16, BlockSize: 4}, 4)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"token too large", func() { m.Forward(good, table, 0, []int{269}, nil) }},
		{"negative token", func() { m.Forward(good, table, 0, []int{-1}, nil) }},
		{"short table", func() { m.Forward(good, table, 6, []int{1, 2, 3}, nil) }},
		{"negative start", func() { m.Forward(good, table, -1, []int{1}, nil) }},
		{"cache shape", func() { m.Forward(other, []int{0}, 0, []int{1}, nil) }},
		{"capture layer", func() { m.Forward(good, table, 0, []int{1}, &Capture{Layer: 5}) }},
		{"embedding", func() { m.Embedding(269) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("did not panic")
				}
			}()
			tc.f()
		})
	}
	if got := m.Forward(good, table, 0, nil, nil); got != nil {
		t.Errorf("Forward of no tokens = %v, want nil", got)
	}
}

func TestKVShape(t *testing.T) {
	m := Default()
	want := kvcache.Shape{Layers: 4, KVHeads: 2, HeadDim: 16, BlockSize: 8}
	if got := m.KVShape(8); got != want {
		t.Errorf("KVShape(8) = %+v, want %+v", got, want)
	}
	if got := m.KVShape(0).BlockSize; got != kvcache.DefaultBlockSize {
		t.Errorf("KVShape(0).BlockSize = %d, want the default %d", got, kvcache.DefaultBlockSize)
	}
}

func BenchmarkForwardPrefill128(b *testing.B) {
	m := Default()
	c := newCache(b, m, 16, 16)
	table := alloc(b, c, 128)
	tokens := prompt(128, m.Config.VocabSize, 15)
	for b.Loop() {
		m.Forward(c, table, 0, tokens, nil)
	}
	b.ReportMetric(float64(b.N*128)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkForwardDecodeStep(b *testing.B) {
	m := Default()
	c := newCache(b, m, 16, 16)
	table := alloc(b, c, 129)
	tokens := prompt(129, m.Config.VocabSize, 15)
	m.Forward(c, table, 0, tokens[:128], nil)
	for b.Loop() {
		m.Forward(c, table, 128, tokens[128:], nil)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
