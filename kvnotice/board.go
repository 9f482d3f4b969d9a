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
	"container/list"
	"context"
	"sync"
)

// DefaultCapacity bounds the ids a Board remembers that nobody waits for
// yet (notices of requests that ended before their decode, or that arrive
// before the prefill's answer): the oldest are forgotten past it.
const DefaultCapacity = 1 << 16

// Board counts done notices by id. The zero value is ready to use; it is
// safe for concurrent use (one mutex guards its ids). Every call costs O(1)
// however many notices are outstanding: the ids nobody waits for are kept
// in arrival order in a list each id knows its place in, so forgetting the
// oldest and dropping any one are both a splice.
type Board struct {
	// Capacity bounds the ids remembered with nobody waiting; 0 means
	// DefaultCapacity.
	Capacity int

	mu  sync.Mutex
	ids map[string]*notices
	// idle holds the ids with notices that nobody awaits, oldest first:
	// the ones forgotten past Capacity. An awaited id is never in it.
	idle list.List
}

// notices is what the board knows of one id.
type notices struct {
	id    string
	count int
	// waiters is how many Awaits of the id are in progress; while any is,
	// the id is not idle and cannot be forgotten.
	waiters int
	// wake is closed, and cleared, at the id's next notice or when it is
	// dropped; nil while nobody waits.
	wake chan struct{}
	// idle is the id's element in Board.idle, nil when it is not there.
	idle *list.Element
}

// get returns id's notices, remembering id if it is new; b.mu is held.
func (b *Board) get(id string) *notices {
	if b.ids == nil {
		b.ids = map[string]*notices{}
	}
	n, ok := b.ids[id]
	if !ok {
		n = &notices{id: id}
		b.ids[id] = n
	}
	return n
}

// Done records one notice under id.
func (b *Board) Done(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.get(id)
	n.count++
	if n.waiters == 0 && n.idle == nil {
		n.idle = b.idle.PushBack(n)
		b.forget()
	}
	if n.wake != nil {
		close(n.wake)
		n.wake = nil
	}
}

// forget drops the oldest ids nobody waits for beyond the capacity.
func (b *Board) forget() {
	limit := b.Capacity
	if limit <= 0 {
		limit = DefaultCapacity
	}
	for b.idle.Len() > limit {
		b.drop(b.idle.Front().Value.(*notices))
	}
}

// Await returns once n notices under id have arrived, counting those that
// came before the call, and forgets id; or returns ctx's error.
func (b *Board) Await(ctx context.Context, id string, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		// Another Await of the same id may have taken and dropped it while
		// this one slept; it then waits under a fresh entry, as for an id
		// never seen.
		got := b.get(id)
		if got.count >= n {
			b.drop(got)
			return nil
		}
		if err := ctx.Err(); err != nil {
			b.drop(got)
			return err
		}
		if got.idle != nil {
			b.idle.Remove(got.idle)
			got.idle = nil
		}
		if got.wake == nil {
			got.wake = make(chan struct{})
		}
		wake := got.wake
		got.waiters++
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
		}
		b.mu.Lock()
		got.waiters--
	}
}

// drop forgets n's id and wakes whoever waits for it; b.mu is held.
func (b *Board) drop(n *notices) {
	delete(b.ids, n.id)
	if n.idle != nil {
		b.idle.Remove(n.idle)
		n.idle = nil
	}
	if n.wake != nil {
		close(n.wake)
		n.wake = nil
	}
}

// Pending is how many ids the board remembers, awaited or not (tests:
// nothing leaks).
func (b *Board) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ids)
}
