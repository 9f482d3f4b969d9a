package kvnotice

import (
	"context"
	"strconv"
	"sync"
	"testing"
)

// board is what the benchmarks drive: Board, or scanBoard beside it.
type board interface {
	Done(id string)
	Await(ctx context.Context, id string, n int) error
}

var (
	_ board = (*Board)(nil)
	_ board = (*scanBoard)(nil)
)

// BenchmarkBoard takes one request's notice while many others are
// outstanding (their decodes have not asked yet, or never will): the cost
// of a drop must not grow with them. scan is the board that kept its
// arrival order in a slice and searched it on every drop, for comparison.
func BenchmarkBoard(b *testing.B) {
	for _, outstanding := range []int{1 << 10, DefaultCapacity} {
		for _, impl := range []struct {
			name string
			new  func() board
		}{
			{"ordered", func() board { return &Board{} }},
			{"scan", func() board { return &scanBoard{} }},
		} {
			b.Run(impl.name+"/outstanding="+strconv.Itoa(outstanding), func(b *testing.B) {
				bd := impl.new()
				for i := range outstanding {
					bd.Done("old-" + strconv.Itoa(i))
				}
				ctx := context.Background()
				ids := make([]string, 1024)
				for i := range ids {
					ids[i] = "req-" + strconv.Itoa(i)
				}
				for i := 0; b.Loop(); i++ {
					id := ids[i%len(ids)]
					bd.Done(id)
					if err := bd.Await(ctx, id, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// scanBoard is the board as it was before its ids were kept in an ordered
// eviction list: a slice in arrival order, searched on every drop.
type scanBoard struct {
	Capacity int

	mu     sync.Mutex
	counts map[string]int
	order  []string
	wake   map[string]chan struct{}
}

func (b *scanBoard) Done(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.counts == nil {
		b.counts = map[string]int{}
		b.wake = map[string]chan struct{}{}
	}
	if _, ok := b.counts[id]; !ok {
		b.order = append(b.order, id)
		b.forget()
	}
	b.counts[id]++
	if ch, ok := b.wake[id]; ok {
		close(ch)
		delete(b.wake, id)
	}
}

func (b *scanBoard) forget() {
	limit := b.Capacity
	if limit <= 0 {
		limit = DefaultCapacity
	}
	for len(b.order) > limit {
		id := b.order[0]
		b.order = b.order[1:]
		if _, waited := b.wake[id]; waited {
			b.order = append(b.order, id)
			if len(b.order) <= len(b.wake) {
				return
			}
			continue
		}
		delete(b.counts, id)
	}
}

func (b *scanBoard) Await(ctx context.Context, id string, n int) error {
	for {
		b.mu.Lock()
		if b.counts == nil {
			b.counts = map[string]int{}
			b.wake = map[string]chan struct{}{}
		}
		if b.counts[id] >= n {
			b.drop(id)
			b.mu.Unlock()
			return nil
		}
		ch, ok := b.wake[id]
		if !ok {
			ch = make(chan struct{})
			b.wake[id] = ch
		}
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			b.mu.Lock()
			b.drop(id)
			b.mu.Unlock()
			return ctx.Err()
		}
	}
}

func (b *scanBoard) drop(id string) {
	if _, ok := b.counts[id]; ok {
		delete(b.counts, id)
		for i, o := range b.order {
			if o == id {
				b.order = append(b.order[:i], b.order[i+1:]...)
				break
			}
		}
	}
	if ch, ok := b.wake[id]; ok {
		close(ch)
		delete(b.wake, id)
	}
}
