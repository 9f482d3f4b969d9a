package testbed

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// Baseline records the goroutine count of the idle deployment, after its
// idle connections are closed, for Settled to compare with. Call it once
// the deployment has served a request (connection pools warm, lazily
// started goroutines running).
func (d *Deployment) Baseline(t testing.TB) {
	t.Helper()
	d.baseline = d.quietGoroutines(5 * time.Second)
	d.baselineStacks = goroutineStacks()
}

// quietGoroutines closes idle connections until the goroutine count stops
// falling, and returns it.
func (d *Deployment) quietGoroutines(within time.Duration) int {
	deadline := time.Now().Add(within)
	last, steady := runtime.NumGoroutine(), 0
	for time.Now().Before(deadline) && steady < 5 {
		d.CloseIdle()
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n >= last {
			steady++
		} else {
			steady = 0
		}
		last = n
	}
	return last
}

// Settled waits, up to within, until the deployment holds nothing for any
// request (every gauge of Usage zero) and the goroutine count is back to
// the Baseline, closing idle connections as it goes. It fails t with what
// was left when it does not settle.
func (d *Deployment) Settled(t testing.TB, within time.Duration) {
	t.Helper()
	// What serve's background probe does between requests: an instance that
	// sat out (it went quiet, or was unreachable) and answers again is back
	// in rotation for what the test does next, and a killed one stays out.
	// Only a hung instance reaches the bound.
	for _, p := range d.pools {
		p.ProbeOnce(context.Background(), 5*time.Second)
	}
	deadline := time.Now().Add(within)
	var u Usage
	var n int
	for {
		d.CloseIdle()
		u = d.Usage()
		n = runtime.NumGoroutine()
		if u == (Usage{}) && (d.baseline == 0 || n <= d.baseline) {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if u != (Usage{}) {
		t.Errorf("left behind after %v: %v", within, u)
	}
	if d.baseline != 0 && n > d.baseline {
		t.Errorf("%d goroutines after %v, %d at the baseline; not there at the baseline:\n%s", n, within, d.baseline, newGoroutines(d.baselineStacks))
	}
}

// goroutineStacks counts the live goroutines, the caller's aside, by their
// stack, with what differs between two goroutines doing the same thing
// left out (ids, arguments, offsets, how long they have waited).
func goroutineStacks() map[string]int {
	buf := make([]byte, 1<<22)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := map[string]int{}
	// The first is the caller's own, which differs from call to call.
	for _, g := range strings.Split(string(buf), "\n\n")[1:] {
		stacks[stackShape(g)]++
	}
	return stacks
}

var (
	goroutineHeader = regexp.MustCompile(`^goroutine \d+ \[([^,\]]+)[^\]]*\]:`)
	callArgs        = regexp.MustCompile(`\([^()]*\)$`)
	frameOffset     = regexp.MustCompile(` \+0x[0-9a-f]+$`)
	creator         = regexp.MustCompile(` in goroutine \d+$`)
)

// stackShape is one goroutine's stack as goroutineStacks counts it.
func stackShape(g string) string {
	lines := strings.Split(strings.TrimSpace(g), "\n")
	for i, l := range lines {
		switch {
		case i == 0:
			l = goroutineHeader.ReplaceAllString(l, "goroutine [$1]:")
		case strings.HasPrefix(l, "\t"):
			l = frameOffset.ReplaceAllString(l, "")
		default:
			l = creator.ReplaceAllString(callArgs.ReplaceAllString(l, "(...)"), "")
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}

// newGoroutines lists the stacks there are more of than at the baseline
// (before), each with how many more: the goroutines a request left behind,
// whatever package they run in.
func newGoroutines(before map[string]int) string {
	var out []string
	for stack, n := range goroutineStacks() {
		if extra := n - before[stack]; extra > 0 {
			out = append(out, fmt.Sprintf("%d more of:\n%s", extra, stack))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n\n")
}
