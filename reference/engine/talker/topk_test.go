package talker

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// topK keeps exactly the ids, in exactly the order, that sorting every id
// by rank (logit, then id) and keeping the first k gives: sampling from it
// draws the same id as before for the same random number.
func TestTopKIsTheSortedPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var buf []int
	for trial := range 300 {
		n := 1 + rng.IntN(400)
		logits := make([]float32, n)
		for i := range logits {
			// Few distinct values, so that ties are common.
			logits[i] = float32(rng.IntN(1 + trial%20))
		}
		want := make([]int, n)
		for i := range want {
			want[i] = i
		}
		slices.SortFunc(want, func(a, b int) int {
			switch {
			case logits[a] > logits[b]:
				return -1
			case logits[a] < logits[b]:
				return 1
			}
			return a - b
		})
		for _, k := range []int{1, 2, 7, 50, n - 1, n} {
			if k < 1 || k > n {
				continue
			}
			buf = topK(buf, logits, k)
			if !slices.Equal(buf, want[:k]) {
				t.Fatalf("n %d k %d: topK %v, want %v", n, k, buf, want[:k])
			}
		}
	}
}

func BenchmarkTopK(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, 2160) // the reference codebook (Config.CodecVocab)
	for i := range logits {
		logits[i] = rng.Float32()
	}
	var buf []int
	for b.Loop() {
		buf = topK(buf, logits, 50)
	}
}

// BenchmarkTopKBySort is what topK replaced, for comparison: every id
// sorted by rank, the first k kept.
func BenchmarkTopKBySort(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, 2160) // the reference codebook (Config.CodecVocab)
	for i := range logits {
		logits[i] = rng.Float32()
	}
	idx := make([]int, 0, len(logits))
	for b.Loop() {
		idx = idx[:0]
		for i := range logits {
			idx = append(idx, i)
		}
		slices.SortFunc(idx, func(a, c int) int {
			switch {
			case logits[a] > logits[c]:
				return -1
			case logits[a] < logits[c]:
				return 1
			}
			return a - c
		})
		idx = idx[:50]
	}
}
