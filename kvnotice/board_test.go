package kvnotice

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// take takes id's notice if the board has one, without waiting.
func take(b *Board, id string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return b.Await(ctx, id, 1) == nil
}

// Past its capacity the board forgets the ids nobody waits for, oldest
// first, and never one a request is waiting on — not even one whose
// notices have partly come (one of two decode TP ranks), while its waiter
// is between a wake-up and its next look.
func TestBoardForgetsOnlyIdleIDsOldestFirst(t *testing.T) {
	ctx := t.Context()
	for round := range 50 {
		b := &Board{Capacity: 3}
		b.Done("early") // before its decode asks: idle, the oldest
		done := make(chan error, 1)
		go func() { done <- b.Await(ctx, "ranks", 2) }()
		for b.Pending() != 2 { // the waiter is in
			select {
			case err := <-done:
				t.Fatalf("Await returned %v before any notice", err)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			default:
			}
		}
		b.Done("ranks") // the first rank: the waiter wakes and waits again
		for i := range 5 {
			b.Done(fmt.Sprintf("flood-%d", i))
		}
		b.Done("ranks")
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: Await: %v", round, err)
			}
		case <-time.After(time.Minute): // a safety bound only a hang reaches
			t.Fatalf("round %d: the second notice came and Await did not return: the board forgot an awaited id", round)
		}
		// "early" and the two oldest of the flood are forgotten: the three
		// newest idle ids remain.
		var kept []string
		for _, id := range []string{"early", "flood-0", "flood-1", "flood-2", "flood-3", "flood-4"} {
			if take(b, id) {
				kept = append(kept, id)
			}
		}
		if want := []string{"flood-2", "flood-3", "flood-4"}; !slices.Equal(kept, want) {
			t.Fatalf("round %d: the board kept %v, want the %d newest idle ids %v", round, kept, len(want), want)
		}
	}
}

// An Await that gives up forgets its id: nothing it registered stays.
func TestBoardAwaitCancelledForgets(t *testing.T) {
	b := &Board{}
	b.Done("half")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Await(ctx, "half", 2) }()
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Await: %v", err)
	}
	if p := b.Pending(); p != 0 {
		t.Errorf("%d ids remembered after the only waiter gave up", p)
	}
}
