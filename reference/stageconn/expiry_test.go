package stageconn

import (
	"testing"
	"time"
)

// A stash nobody fetches or drops is freed when its TTL ends even if no
// other call comes to the store, and so are the tombstones of released and ended keys.
func TestTTLWithoutTraffic(t *testing.T) {
	s := NewStore(Config{TTL: 30 * time.Millisecond})
	if err := s.Put("forgotten", sample(2, 2)); err != nil {
		t.Fatal(err)
	}
	s.Drop("never-stashed")
	held := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.entries) + len(s.released) + len(s.ended)
	}
	deadline := time.Now().Add(5 * time.Second)
	for held() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d entries outlived their TTL", held())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	pending := s.sweeper != nil
	s.mu.Unlock()
	if pending {
		t.Error("a sweep is still scheduled for an empty store")
	}
}
