package sampler

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPenaltyValues pins the arithmetic of the penalties on the processed
// logits, values chosen to be exact in binary floating point.
func TestPenaltyValues(t *testing.T) {
	logits := []float32{4, -3, 0, 6, -1, 2}
	tests := []struct {
		name                            string
		repetition, presence, frequency float64
		prompt, output                  []int
		want                            []float64
	}{
		{"off", 1, 0, 0, []int{0, 1}, []int{3}, []float64{4, -3, 0, 6, -1, 2}},
		// Positive logits divided, negative and zero multiplied.
		{"repetition 2 on the prompt", 2, 0, 0, []int{0, 1, 2}, nil, []float64{2, -6, 0, 6, -1, 2}},
		{"repetition 2 on the output", 2, 0, 0, nil, []int{3, 4}, []float64{4, -3, 0, 3, -2, 2}},
		// Below 1 it rewards repetition.
		{"repetition 0.5", 0.5, 0, 0, []int{0, 1}, nil, []float64{8, -1.5, 0, 6, -1, 2}},
		// Once per token, however often it appears and wherever.
		{"repetition once per token", 2, 0, 0, []int{0, 0, 1}, []int{0, 1, 1}, []float64{2, -6, 0, 6, -1, 2}},
		// Output only: prompt tokens 0 and 5 untouched.
		{"presence", 1, 0.5, 0, []int{0, 5}, []int{3, 3, 4}, []float64{4, -3, 0, 5.5, -1.5, 2}},
		{"frequency", 1, 0, 0.25, []int{0, 5}, []int{3, 3, 4, 3}, []float64{4, -3, 0, 5.25, -1.25, 2}},
		{"negative frequency", 1, 0, -0.5, nil, []int{1, 1}, []float64{4, -2, 0, 6, -1, 2}},
		// Repetition first, then frequency, then presence:
		// 6/2 - 2*0.25 - 0.5 = 2; -1*2 - 0.25 - 0.5 = -2.75.
		{"all three in vLLM's order", 2, 0.5, 0.25, []int{0}, []int{3, 4, 3}, []float64{2, -3, 0, 2, -2.75, 2}},
		{"out-of-vocabulary ids", 2, 1, 1, []int{-1, 6}, []int{99, -2}, []float64{4, -3, 0, 6, -1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Params{RepetitionPenalty: tt.repetition, PresencePenalty: tt.presence, FrequencyPenalty: tt.frequency}, nil)
			sc := getScratch(len(logits))
			defer scratchPool.Put(sc)
			for i, l := range logits {
				sc.x[i] = float64(l)
			}
			s.penalize(sc, logits, tt.prompt, tt.output)
			if !slices.Equal(sc.x, tt.want) {
				t.Errorf("penalized = %v, want %v", sc.x, tt.want)
			}
			if i := slices.IndexFunc(sc.counts, func(c int32) bool { return c != 0 }); i >= 0 {
				t.Errorf("counts[%d] = %d after penalize, want all zero", i, sc.counts[i])
			}
		})
	}
}

// referenceDraw is draw written the obvious way — a full sort, filters as
// explicit prefixes, id-order normalizers by sorting the kept ids — for
// TestDrawMatchesReference to hold the lazy ranking against.
func referenceDraw(x0 []float64, temperature, topP float64, topK int, minP, u float64) int {
	x := slices.Clone(x0)
	var ids []int
	for i, v := range x {
		if math.IsNaN(v) || math.IsInf(v, -1) {
			x[i] = math.Inf(-1)
			continue
		}
		if math.IsInf(v, 1) {
			x[i] = math.MaxFloat64
		}
		ids = append(ids, i)
	}
	if len(ids) == 0 {
		return -1
	}
	slices.SortFunc(ids, func(a, b int) int {
		switch {
		case x[a] > x[b]:
			return -1
		case x[a] < x[b]:
			return 1
		}
		return a - b
	})
	xmax := x[ids[0]]
	w := make([]float64, len(x))
	for i, v := range x {
		w[i] = math.Exp((v - xmax) / temperature)
	}
	idOrderSum := func(kept []int) float64 {
		sorted := slices.Sorted(slices.Values(kept))
		var z float64
		for _, id := range sorted {
			z += w[id]
		}
		return z
	}
	kept := ids
	if topK > 0 && topK < len(kept) {
		kept = kept[:topK]
	}
	if topP < 1 {
		limit := topP * idOrderSum(kept)
		var before float64
		for i, id := range kept {
			if i > 0 && before >= limit {
				kept = kept[:i]
				break
			}
			before += w[id]
		}
	}
	if minP > 0 {
		for i, id := range kept {
			if i > 0 && w[id] < minP {
				kept = kept[:i]
				break
			}
		}
	}
	target := u * idOrderSum(kept)
	var cum float64
	for _, id := range kept {
		cum += w[id]
		if cum > target {
			return id
		}
	}
	for i := len(kept) - 1; i > 0; i-- {
		if w[kept[i]] > 0 {
			return kept[i]
		}
	}
	return kept[0]
}

func TestDrawMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 77))
	pick := func(vals ...float64) float64 { return vals[r.IntN(len(vals))] }
	for c := range 2000 {
		vocab := 1 + r.IntN(300)
		if c%20 == 0 {
			vocab = 1 + r.IntN(8000) // big enough for both ranking tiers to fill
		}
		x := make([]float64, vocab)
		for i := range x {
			switch r.IntN(20) {
			case 0:
				x[i] = math.Inf(-1)
			case 1:
				x[i] = math.NaN()
			case 2, 3, 4:
				x[i] = float64(r.IntN(3)) // ties
			default:
				x[i] = float64(float32(r.NormFloat64() * pick(0.1, 3, 30)))
			}
		}
		if r.IntN(50) == 0 {
			x[r.IntN(vocab)] = math.Inf(1)
		}
		s := &Sampler{
			temperature: pick(0.01, 0.3, 1, 2),
			topK:        int(pick(0, 1, 3, 50, 1000)),
			topP:        pick(1, 0.99, 0.5, 0.1, 1e-9),
			minP:        pick(0, 0, 0.01, 0.5, 1),
		}
		for _, u := range []float64{0, r.Float64(), r.Float64(), 0.5, 1 - 0x1p-53} {
			want := referenceDraw(x, s.temperature, s.topP, s.topK, s.minP, u)
			sc := getScratch(vocab)
			copy(sc.x, x)
			got := s.draw(sc, u)
			scratchPool.Put(sc)
			if got != want {
				t.Fatalf("case %d (vocab %d, T=%v top_k=%d top_p=%v min_p=%v, u=%v): draw = %d, reference = %d",
					c, vocab, s.temperature, s.topK, s.topP, s.minP, u, got, want)
			}
		}
	}
}

// Whatever weight threshold splits the candidates into two tiers, the
// ranker yields exactly the sorted order.
func TestRankerAnySplit(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for range 200 {
		vocab := 1 + r.IntN(500)
		x := make([]float64, vocab)
		for i := range x {
			x[i] = float64(r.IntN(20)) // many ties
		}
		want := make([]int32, vocab)
		for i := range want {
			want[i] = int32(i)
		}
		slices.SortStableFunc(want, func(a, b int32) int {
			switch {
			case x[a] > x[b]:
				return -1
			case x[a] < x[b]:
				return 1
			}
			return 0
		})
		split := float64(r.IntN(21))
		rk := ranker{x: x}
		for i, v := range x {
			if v >= split {
				rk.heap = append(rk.heap, int32(i))
			} else {
				rk.rest = append(rk.rest, int32(i))
			}
		}
		rk.init()
		for i := range vocab {
			if got := rk.at(i); got != want[i] {
				t.Fatalf("split at %v: rank %d = %d, want %d", split, i, got, want[i])
			}
		}
	}
}

func TestRankerOrder(t *testing.T) {
	x := []float64{1, 5, math.Inf(-1), 5, -2, 1, 7, 0}
	r := ranker{x: x}
	for i, v := range x {
		if !math.IsInf(v, -1) {
			r.heap = append(r.heap, int32(i))
		}
	}
	r.init()
	var got []int32
	for i := range 7 {
		got = append(got, r.at(i))
	}
	want := []int32{6, 1, 3, 0, 5, 7, 4}
	if !slices.Equal(got, want) {
		t.Errorf("rank order = %v, want %v", got, want)
	}
}
