package sampler

import "math"

// draw maps the uniform u in [0, 1) to a token. Every filter keeps a prefix
// of the rank order (logit descending, lower id first), so the kept set is
// just its length n, and the draw is the first token of that prefix whose
// running probability sum exceeds u. Returns -1 if no token has a usable
// logit.
//
// Two summation orders are fixed, and both matter for bit-identity:
// normalizers are summed in id order, which needs no sorting; running sums
// are taken in rank order, which the inverse CDF needs. The rank order is
// computed lazily (see ranker), because the walk usually ends within a few
// dozen tokens and sorting a 150k vocabulary every step would cost more
// than all the rest of sampling.
func (s *Sampler) draw(sc *scratch, u float64) int {
	x, w := sc.x, sc.w
	xmax := math.Inf(-1)
	all := 0
	for i, v := range x {
		switch {
		case math.IsNaN(v) || math.IsInf(v, -1):
			x[i] = math.Inf(-1) // never sampled; a total order for ranking
			continue
		case math.IsInf(v, 1):
			// Keeps x - xmax finite (Inf - Inf is NaN); +Inf tokens then
			// share all the probability, which is the limit.
			v = math.MaxFloat64
			x[i] = v
		}
		all++
		xmax = max(xmax, v)
	}
	if all == 0 {
		return -1
	}
	// Temperature scaling and softmax as one step: subtracting the max
	// before dividing cannot overflow however small the temperature, and the
	// top token's weight is exactly 1.
	var (
		total float64
		hist  histogram
	)
	for i, v := range x {
		if math.IsInf(v, -1) {
			w[i] = 0
			continue
		}
		e := (v - xmax) / s.temperature
		wi := math.Exp(e)
		w[i] = wi
		total += wi
		hist.add(-e, wi)
	}

	tau := hist.split(all, total, s.topP, s.topK)
	r := ranker{x: x, heap: sc.heap, rest: sc.rest, ranked: sc.ranked}
	for i, v := range x {
		switch {
		case math.IsInf(v, -1):
		case w[i] >= tau:
			r.heap = append(r.heap, int32(i))
		default:
			r.rest = append(r.rest, int32(i))
		}
	}
	r.init()
	n := all
	if s.topK > 0 && s.topK < n {
		n = s.topK
	}
	if s.topP < 1 {
		// Keep token i while the probability of the tokens ranked before it
		// is below top_p: vLLM's "drop while the tail sum <= 1 - top_p",
		// read from the top. The first token is always kept.
		limit := s.topP * r.mass(w, n, all, total)
		cum := w[r.at(0)]
		i := 1
		for i < n && cum < limit {
			cum += w[r.at(i)]
			i++
		}
		n = i
	}
	if s.minP > 0 {
		// p_i >= min_p * p_max is w_i >= min_p, since the top weight is 1.
		i := 1
		for i < n && w[r.at(i)] >= s.minP {
			i++
		}
		n = i
	}

	target := u * r.mass(w, n, all, total)
	var cum float64
	for i := range n {
		t := r.at(i)
		cum += w[t]
		if cum > target {
			return int(t)
		}
	}
	// Only rounding gets here: the rank-order sum can fall a few ulps short
	// of the id-order normalizer. Take the last kept token that has any
	// probability.
	for i := n - 1; i > 0; i-- {
		if t := r.at(i); w[t] > 0 {
			return int(t)
		}
	}
	return int(r.at(0))
}

// histogram counts tokens and their weight by -log(weight), in one-nat
// buckets, to place the split between the two ranking tiers.
type histogram [64]struct {
	n    int
	mass float64
}

// add records a token of weight w = exp(-nats).
func (h *histogram) add(nats, w float64) {
	b := len(h) - 1
	if nats < float64(len(h)-1) {
		b = int(nats)
	}
	h[b].n++
	h[b].mass += w
}

// split returns the weight at or above which a token goes in the first
// ranking tier; the rest is heapified only if a walk gets past the first
// tier. Any weight threshold splits the rank order into a prefix and a
// suffix, so the threshold changes the cost, never the token. It is chosen
// to minimize the expected heap size: the first tier, plus the rest times
// the chance that the walk leaves the first tier — about the probability
// mass beyond it, relative to top_p, and none if the first tier holds
// top_k's tokens.
func (h *histogram) split(all int, total, topP float64, topK int) float64 {
	head, bestCost := len(h)-1, math.Inf(1)
	var n int
	var mass float64
	for b := range h {
		n += h[b].n
		mass += h[b].mass
		leave := max(0, 1-mass/(topP*total))
		if topK > 0 && n >= topK {
			leave = 0
		}
		if cost := float64(n) + leave*float64(all-n); cost < bestCost {
			head, bestCost = b, cost
		}
		if leave == 0 {
			break
		}
	}
	if head == len(h)-1 {
		return 0 // everything
	}
	return math.Exp(-float64(head + 1))
}

// ranker yields candidate ids in rank order — x descending, lower id first
// on ties — by popping a binary heap, so that ranking the first k of n
// costs O(n + k log n) instead of a full sort. Candidates come in two tiers,
// every id in rest ranking after every id in heap; rest becomes the heap
// when the heap runs out.
type ranker struct {
	x      []float64
	heap   []int32 // the current tier, not ranked yet, a heap under before
	rest   []int32 // the next tier, unordered
	ranked []int32 // candidates ranked so far, in order
}

func (r *ranker) before(a, b int32) bool {
	xa, xb := r.x[a], r.x[b]
	return xa > xb || (xa == xb && a < b)
}

func (r *ranker) init() {
	for i := len(r.heap)/2 - 1; i >= 0; i-- {
		r.down(i)
	}
}

func (r *ranker) down(i int) {
	h := r.heap
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c2 := c + 1; c2 < len(h) && r.before(h[c2], h[c]) {
			c = c2
		}
		if !r.before(h[c], h[i]) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// at returns the i-th candidate in rank order; i must be below the number
// of candidates.
func (r *ranker) at(i int) int32 {
	for len(r.ranked) <= i {
		if len(r.heap) == 0 {
			r.heap, r.rest = r.rest, nil
			r.init()
		}
		h := r.heap
		top, last := h[0], len(h)-1
		h[0] = h[last]
		r.heap = h[:last]
		r.down(0)
		r.ranked = append(r.ranked, top)
	}
	return r.ranked[i]
}

// mass is the sum of w over the first n of all candidates in rank order,
// added in id order. total is that sum for n == all.
func (r *ranker) mass(w []float64, n, all int, total float64) float64 {
	if n == all {
		return total
	}
	b := r.at(n - 1)
	xb := r.x[b]
	var z float64
	for j, v := range r.x {
		if v > xb || (v == xb && j <= int(b)) {
			z += w[j]
		}
	}
	return z
}
