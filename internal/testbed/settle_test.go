package testbed

import (
	"strings"
	"testing"
)

func parkedForTest(stop chan struct{}) { <-stop }

// A goroutine started after the baseline is named, however many others run
// the same code since before it; goroutines of the baseline are not.
func TestNewGoroutinesNamesWhatWasLeftBehind(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	for range 3 {
		go parkedForTest(stop)
	}
	waitParked(t, stop, 3)
	before := goroutineStacks()
	if got := newGoroutines(before); got != "" {
		t.Fatalf("nothing started since the baseline, yet:\n%s", got)
	}
	go parkedForTest(stop)
	waitParked(t, stop, 4)
	got := newGoroutines(before)
	if !strings.HasPrefix(got, "1 more of:\n") || !strings.Contains(got, "testbed.parkedForTest") {
		t.Errorf("the goroutine started since the baseline is not named:\n%s", got)
	}
}

// waitParked waits until n goroutines are parked in parkedForTest.
func waitParked(t *testing.T, stop chan struct{}, n int) {
	t.Helper()
	for t.Context().Err() == nil {
		parked := 0
		for stack, k := range goroutineStacks() {
			if strings.Contains(stack, "testbed.parkedForTest") && strings.HasPrefix(stack, "goroutine [chan receive]") {
				parked += k
			}
		}
		if parked == n {
			return
		}
	}
}
