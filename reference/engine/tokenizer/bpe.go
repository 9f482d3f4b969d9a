package tokenizer

import (
	"strings"
	"sync"
)

// encodeWord appends the ids of one pre-token (raw bytes) to dst.
func (t *Tokenizer) encodeWord(dst []int, word string) []int {
	if len(t.ranks) == 0 && !t.ignoreMerges {
		return t.bpe(dst, word) // bytes map straight to ids: nothing to memoise
	}
	if ids, ok := t.cache.get(word); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = t.bpe(dst, word)
	t.cache.put(word, dst[start:])
	return dst
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// bpe applies the merges to one word the way Hugging Face's Word::merge_all
// does: repeatedly merge the adjacent pair with the lowest rank, the leftmost
// one on ties. A heap of candidate pairs over a linked list of symbols keeps
// this O(n log n) in the word length; stale candidates (a neighbour changed
// since they were pushed) are recognised on pop and skipped.
func (t *Tokenizer) bpe(dst []int, word string) []int {
	if t.ignoreMerges {
		// Llama-3-style files: a word that is itself a token skips merging.
		if id, ok := t.vocab[byteLevel(word)]; ok {
			return append(dst, id)
		}
	}

	// Not len(word): a long word of bytes the vocab lacks yields nothing.
	ids := make([]int32, 0, min(len(word), 1024))
	pendingUnk := false
	for i := 0; i < len(word); i++ {
		id := t.byteIDs[word[i]]
		if id >= 0 {
			if pendingUnk {
				ids = append(ids, t.unk)
				pendingUnk = false
			}
			ids = append(ids, id)
			continue
		}
		// A byte the vocab lacks: without an unk token HF drops it; with one it
		// becomes unk, consecutive ones fused into one when fuse_unk is set.
		if t.unk < 0 {
			continue
		}
		if pendingUnk && !t.fuseUnk {
			ids = append(ids, t.unk)
		}
		pendingUnk = true
	}
	if pendingUnk {
		ids = append(ids, t.unk)
	}

	if len(ids) > 1 && len(t.ranks) > 0 {
		ids = t.mergeAll(ids)
	}
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

// candidate is a mergeable adjacent pair: the symbol at pos and its successor,
// which held ids left and right when the candidate was pushed.
type candidate struct {
	rank, id    int32 // merge rank, merged id
	pos         int32
	left, right int32
}

func (a candidate) less(b candidate) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

func (t *Tokenizer) mergeAll(ids []int32) []int32 {
	n := len(ids)
	next := make([]int32, n) // -1 at the end
	prev := make([]int32, n) // -1 at the start
	alive := make([]bool, n)
	for i := range n {
		next[i], prev[i], alive[i] = int32(i+1), int32(i-1), true
	}
	next[n-1] = -1

	var h candHeap
	push := func(pos int32) {
		r := next[pos]
		if r < 0 {
			return
		}
		if m, ok := t.ranks[pairKey(ids[pos], ids[r])]; ok {
			h.push(candidate{rank: m.rank, id: m.id, pos: pos, left: ids[pos], right: ids[r]})
		}
	}
	for i := range n - 1 {
		push(int32(i))
	}
	for len(h) > 0 {
		c := h.pop()
		r := next[c.pos]
		if !alive[c.pos] || r < 0 || ids[c.pos] != c.left || ids[r] != c.right {
			continue // stale
		}
		ids[c.pos] = c.id
		alive[r] = false
		next[c.pos] = next[r]
		if nr := next[r]; nr >= 0 {
			prev[nr] = c.pos
		}
		if p := prev[c.pos]; p >= 0 {
			push(p)
		}
		push(c.pos)
	}

	out := ids[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, ids[i]) // i only advances, so this never overwrites unread ids
	}
	return out
}

// candHeap is a binary min-heap; container/heap would box every candidate.
type candHeap []candidate

func (h *candHeap) push(c candidate) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *candHeap) pop() candidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].less(s[m]) {
			m = l
		}
		if r < len(s) && s[r].less(s[m]) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// wordCache memoises the ids of short pre-tokens: natural text repeats a small
// set of words, and merging is the expensive step. It is bounded, and emptied
// when full so that a change of topic is not stuck with the old words.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int
}

const (
	cacheMaxWords   = 1 << 14
	cacheMaxWordLen = 256 // longer words are rare and would pin memory
)

func (c *wordCache) get(word string) ([]int, bool) {
	if len(word) > cacheMaxWordLen {
		return nil, false
	}
	c.mu.RLock()
	ids, ok := c.m[word]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int) {
	if len(word) > cacheMaxWordLen {
		return
	}
	stored := append([]int(nil), ids...)
	c.mu.Lock()
	if c.m == nil || len(c.m) >= cacheMaxWords {
		c.m = make(map[string][]int)
	}
	// Clone: word is a slice of the caller's text and must not pin it.
	c.m[strings.Clone(word)] = stored
	c.mu.Unlock()
}
