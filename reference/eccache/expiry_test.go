package eccache

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when told: Advance runs, in order,
// every timer that falls due, the ones those timers set included.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
	fired   bool
}

var _ Clock = (*fakeClock)(nil)

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.fired || t.stopped {
		return false
	}
	t.stopped = true
	return true
}

// Advance moves the clock on by d and runs what fell due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	for range 1000 { // a timer that keeps setting a due one is a bug
		c.mu.Lock()
		var due *fakeTimer
		for _, t := range c.timers {
			if !t.fired && !t.stopped && !t.at.After(c.now) && (due == nil || t.at.Before(due.at)) {
				due = t
			}
		}
		if due == nil {
			c.mu.Unlock()
			return
		}
		due.fired = true
		c.mu.Unlock()
		due.f()
	}
	panic("fakeClock: timers keep falling due")
}

// pending is how many timers are set and not yet run or stopped.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(slices.DeleteFunc(slices.Clone(c.timers), func(t *fakeTimer) bool { return t.fired || t.stopped }))
}

// held is what the store keeps, read without sweeping: entries, leases and
// released leases remembered.
func (s *Store) held() (entries, leases, released int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries), len(s.leases), len(s.released)
}

// Outputs nobody releases — and the memory of released leases — go when
// their TTL runs out, though no call comes to the store.
func TestExpiresWithoutCalls(t *testing.T) {
	clock := newFakeClock()
	s := NewStore(Config{TTL: time.Minute, Clock: clock})
	if err := s.Put("k", "req-1", entry()); err != nil {
		t.Fatal(err)
	}
	s.Release("req-gone") // overtook its encoder leg: remembered for the TTL
	clock.Advance(time.Minute + time.Second)
	if e, l, r := s.held(); e+l+r != 0 {
		t.Errorf("past the TTL with no call, the store holds %d entries, %d leases, %d released leases", e, l, r)
	}
	if n := clock.pending(); n != 0 {
		t.Errorf("%d sweeps still set for an empty store", n)
	}
}

// An entry put again (the same item in a later request) lives a whole TTL
// from then, while what expires before it goes on time.
func TestPutAgainRestartsTheTTL(t *testing.T) {
	clock := newFakeClock()
	s := NewStore(Config{TTL: time.Minute, Clock: clock})
	for _, key := range []string{"a", "b"} {
		if err := s.Put(key, "req-1", entry()); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(40 * time.Second)
	if err := s.Put("a", "req-2", entry()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Second) // b's TTL is over, not a's
	if _, err := s.Get("a"); err != nil {
		t.Errorf("an entry put again expired with its first put: %v", err)
	}
	if e, _, _ := s.held(); e != 1 {
		t.Errorf("%d entries held, want a alone", e)
	}
	clock.Advance(30 * time.Second)
	if e, l, _ := s.held(); e+l != 0 {
		t.Errorf("past a's second TTL, %d entries and %d leases held", e, l)
	}
}

// Close stops the sweeps and frees everything: a stopped worker leaves no
// timer behind and keeps nothing.
func TestCloseStopsTheSweeps(t *testing.T) {
	clock := newFakeClock()
	s := NewStore(Config{Clock: clock})
	if err := s.Put("k", "req", entry()); err != nil {
		t.Fatal(err)
	}
	s.Release("req-gone")
	if clock.pending() != 1 {
		t.Fatalf("%d sweeps set, want one", clock.pending())
	}
	s.Close()
	if n := clock.pending(); n != 0 {
		t.Errorf("%d sweeps still set after Close", n)
	}
	if e, l, r := s.held(); e+l+r != 0 {
		t.Errorf("a closed store holds %d entries, %d leases, %d released leases", e, l, r)
	}
	if err := s.Put("k", "req", entry()); !errors.Is(err, ErrClosed) {
		t.Errorf("Put after Close: %v", err)
	}
	if s.Release("req") || clock.pending() != 0 {
		t.Error("a release after Close was remembered")
	}
	s.Close()
}
