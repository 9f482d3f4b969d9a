package orchestrator

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/stageapi"
	"github.com/omnipd/omnipd/stageclient"
)

// countingTransport counts the requests sent over it.
type countingTransport struct {
	n    atomic.Int32
	next http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// releaseTarget is a Thinker worker whose stash releases wait at a gate:
// it counts them, and how many it held at once.
type releaseTarget struct {
	gate              chan struct{}
	held, most, total atomic.Int32
}

func (rt *releaseTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodDelete || !strings.HasPrefix(r.URL.Path, stageapi.ConditioningPath) {
		http.NotFound(w, r)
		return
	}
	n := rt.held.Add(1)
	for m := rt.most.Load(); n > m && !rt.most.CompareAndSwap(m, n); m = rt.most.Load() {
	}
	select {
	case <-rt.gate:
	case <-r.Context().Done():
	}
	rt.held.Add(-1)
	rt.total.Add(1)
	w.WriteHeader(http.StatusNoContent)
}

// releaseOrch is an omni orchestrator whose one Thinker instance is rt,
// reached through tr.
func releaseOrch(t *testing.T, rt *releaseTarget, tr *countingTransport, m *metrics.Orchestrator) (*Orchestrator, string) {
	t.Helper()
	hs := httptest.NewServer(rt)
	t.Cleanup(hs.Close)
	t.Cleanup(func() { close(rt.gate) })
	c, err := stageclient.New(stageclient.Config{BaseURL: hs.URL, HTTP: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	thinker := &Pool{Name: "thinker", Instances: []*Instance{{Client: c}}}
	audio := &Pool{Name: "talker", Instances: []*Instance{liveInstance(t, &fakeStage{answer: fakeTalker}, kvconnector.Peer{})}}
	o, err := New(Config{Decode: thinker, Metrics: m, Logger: slog.New(slog.DiscardHandler),
		Omni: &Omni{Talker: audio, Code2Wav: audio}})
	if err != nil {
		t.Fatal(err)
	}
	return o, hs.URL
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A burst of releases runs on a bounded set of workers, through the stage
// client's own transport: however many requests end at once, omnipd holds
// a bounded number of release calls (and connections) open.
func TestBackgroundReleasesAreBounded(t *testing.T) {
	rt := &releaseTarget{gate: make(chan struct{})}
	tr := &countingTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(tr.next.(*http.Transport).CloseIdleConnections)
	o, url := releaseOrch(t, rt, tr, nil)
	const burst = 50
	hs := make([]stageapi.ConditioningHandle, burst)
	for i := range hs {
		hs[i] = stageapi.ConditioningHandle{URL: url, Key: "r/" + string(rune('a'+i%26)) + string(rune('a'+i/26))}
	}
	o.freeStashes(hs, slog.New(slog.DiscardHandler))
	waitUntil(t, "releases arrive", func() bool { return rt.held.Load() > 0 })
	rt.gate <- struct{}{} // let one finish, so that more could start if nothing bounded them
	waitUntil(t, "one release done", func() bool { return rt.total.Load() >= 1 })
	if n := rt.most.Load(); n > releaseWorkers {
		t.Errorf("%d releases in flight at once, want at most %d", n, releaseWorkers)
	}
	for range burst - 1 {
		rt.gate <- struct{}{}
	}
	waitUntil(t, "every release done", func() bool { return rt.total.Load() == burst })
	if n := tr.n.Load(); n != burst {
		t.Errorf("the stage client's transport carried %d of %d releases", n, burst)
	}
	waitUntil(t, "the release workers end", func() bool {
		o.releases.mu.Lock()
		defer o.releases.mu.Unlock()
		return o.releases.running == 0
	})
}

// When the release queue is full a release is dropped — counted and
// logged, its stash left to its TTL — rather than queued without bound or
// run on the caller's goroutine.
func TestFullReleaseQueueDrops(t *testing.T) {
	rt := &releaseTarget{gate: make(chan struct{})}
	tr := &countingTransport{next: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(tr.next.(*http.Transport).CloseIdleConnections)
	m := metrics.NewOrchestrator()
	o, url := releaseOrch(t, rt, tr, m)
	o.releases = newReleaser(2, 3, m)
	logs := &syncBuffer{}
	hs := make([]stageapi.ConditioningHandle, 10)
	for i := range hs {
		hs[i] = stageapi.ConditioningHandle{URL: url, Key: "r/" + string(rune('a'+i))}
	}
	// Two running at the gate, three queued, five dropped: the workers
	// cannot take from the queue before the gate opens.
	o.freeStashes(hs[:2], slog.New(slog.DiscardHandler))
	waitUntil(t, "two releases held", func() bool { return rt.held.Load() == 2 })
	o.freeStashes(hs[2:], slog.New(slog.NewTextHandler(logs, nil)))
	if n := series(t, m, `omnipd_releases_dropped_total{kind="conditioning"}`); n != 5 {
		t.Errorf("%v releases dropped, want 5", n)
	}
	if n := logs.count("queue is full"); n != 5 {
		t.Errorf("%d drops logged, want 5:\n%s", n, logs.b.String())
	}
	if n := series(t, m, "omnipd_releases_pending"); n != 5 {
		t.Errorf("%v releases pending, want 5 (2 running, 3 queued)", n)
	}
	for range 5 {
		rt.gate <- struct{}{}
	}
	waitUntil(t, "the queued releases done", func() bool { return rt.total.Load() == 5 })
	waitUntil(t, "nothing pending", func() bool { return series(t, m, "omnipd_releases_pending") == 0 })
}
