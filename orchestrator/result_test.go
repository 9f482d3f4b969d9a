package orchestrator

import (
	"encoding/json"
	"io"
	"testing"
)

// An omni result's events come through a channel: the next one is
// Buffered when it waits there, and not once the channel is drained.
func TestResultBufferedOmni(t *testing.T) {
	events := make(chan json.RawMessage, 2)
	r := &Result{events: events, eventErr: make(chan error, 1)}
	if r.Buffered() {
		t.Fatal("Buffered with nothing sent")
	}
	events <- json.RawMessage(`1`)
	events <- json.RawMessage(`2`)
	close(events)
	for _, want := range []string{"1", "2"} {
		if !r.Buffered() {
			t.Fatalf("event %s waits in the channel, but not Buffered", want)
		}
		if ev, err := r.Next(); err != nil || string(ev) != want {
			t.Fatalf("Next = %s, %v; want %s", ev, err, want)
		}
	}
	if r.Buffered() {
		t.Error("Buffered with the channel drained")
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("end: %v", err)
	}
}
