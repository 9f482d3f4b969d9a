package testbed

import (
	"context"
	"runtime"
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
		t.Errorf("%d goroutines after %v, %d at the baseline:\n%s", n, within, d.baseline, goroutineDump())
	}
}

// goroutineDump lists the goroutines that run omnipd code or the proxies,
// the likely leaks, one stack each.
func goroutineDump() string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "omnipd/omnipd") && !strings.Contains(g, "testing.tRunner") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
