// Package kvnotice owns the done notices a KV producer sends the router out
// of band: LMCache's PD-mode sender pushes one ProxyNotif{req_id} per
// decode TP rank over a ZMQ PUSH socket once a request's KV has landed in
// the receiver (LMCache lmcache/v1/storage_backend/pd_backend.py). The
// router must both drain that socket — a PUSH socket with nobody reading
// queues up to its high-water mark (1000 by default; LMCache sets none) and
// then blocks the sender's save path, hanging the prefill engine — and hold
// each decode leg until its notices came.
//
// Board counts notices by id and lets a request wait for its own; Listener
// is the ZMQ PULL end (ZMTP 3.x, NULL mechanism, over TCP) that feeds a
// Board.
package kvnotice

import (
	"context"
	"sync"
)

// DefaultCapacity bounds the ids a Board remembers that nobody waits for
// yet (notices of requests that ended before their decode, or that arrive
// before the prefill's answer): the oldest are forgotten past it.
const DefaultCapacity = 1 << 16

// Board counts done notices by id. The zero value is ready to use; it is
// safe for concurrent use (one mutex guards the counts).
type Board struct {
	// Capacity bounds the ids remembered with nobody waiting; 0 means
	// DefaultCapacity.
	Capacity int

	mu     sync.Mutex
	counts map[string]int
	order  []string // ids in arrival order, for forgetting the oldest
	wake   map[string]chan struct{}
}

// Done records one notice under id.
func (b *Board) Done(id string) {
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

// forget drops the oldest ids nobody waits for beyond the capacity.
func (b *Board) forget() {
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
				return // every remembered id is awaited
			}
			continue
		}
		delete(b.counts, id)
	}
}

// Await returns once n notices under id have arrived, counting those that
// came before the call, and forgets id; or returns ctx's error.
func (b *Board) Await(ctx context.Context, id string, n int) error {
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

// drop forgets id; b.mu is held.
func (b *Board) drop(id string) {
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

// Pending is how many ids the board remembers (tests: nothing leaks).
func (b *Board) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.counts) + len(b.wake)
}
