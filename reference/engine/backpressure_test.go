package engine

import (
	"context"
	"testing"
	"time"
)

// A request whose consumer stops reading its events (a client that stalls
// without hanging up) pauses only itself: the engine goes on serving the
// others, and the stalled one resumes, tokens intact, once read again.
func TestStalledConsumerPausesOnlyItsRequest(t *testing.T) {
	e := start(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := greedy(100)
	p.IgnoreEOS = true
	stalled, err := e.Submit(ctx, &Request{ID: "stalled", Prompt: []int{1, 2, 3}, Params: p})
	if err != nil {
		t.Fatal(err)
	}
	// Let it fill its event buffer, unread.
	deadline := time.Now().Add(30 * time.Second)
	for len(stalled) < cap(stalled) {
		if time.Now().After(deadline) {
			t.Fatalf("the stalled request produced only %d events", len(stalled))
		}
		time.Sleep(time.Millisecond)
	}
	for i := range 3 {
		other, err := e.Submit(ctx, &Request{ID: "other", Prompt: []int{4, 5, i}, Params: greedy(4)})
		if err != nil {
			t.Fatal(err)
		}
		if r := collect(t, other); r.last.FinishReason != "length" || len(r.tokens) != 4 {
			t.Fatalf("a request behind a stalled one: %+v", r.last)
		}
	}
	r := collect(t, stalled)
	if r.last.FinishReason != "length" || len(r.tokens) != 100 {
		t.Errorf("the stalled request, read again: %s after %d tokens", r.last.FinishReason, len(r.tokens))
	}
}

// A request shorter than the event buffer runs to its end while nobody
// reads it: its channel, sized to its max_tokens, holds every event, the
// last one included, so a prefill leg's answer never waits on its reader.
func TestShortRequestBufferHoldsEveryEvent(t *testing.T) {
	e := start(t, Config{})
	for _, n := range []int{1, 2, 7, maxEventBuffer - 1} {
		p := greedy(n)
		p.IgnoreEOS = true
		ch, err := e.Submit(t.Context(), &Request{ID: "short", Prompt: []int{1, 2, 3}, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		// Finished unread: every event is in the buffer, then the close.
		deadline := time.Now().Add(30 * time.Second)
		for len(ch) < n {
			if time.Now().After(deadline) {
				t.Fatalf("max_tokens %d: only %d events buffered", n, len(ch))
			}
			time.Sleep(time.Millisecond)
		}
		if r := collect(t, ch); r.last.FinishReason != "length" || len(r.tokens) != n {
			t.Fatalf("max_tokens %d: %s after %d tokens", n, r.last.FinishReason, len(r.tokens))
		}
	}
}
