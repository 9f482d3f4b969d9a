package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/internal/testbed"
)

// Soak bounds. The duration comes from OMNIPD_SOAK (a Go duration, e.g.
// "60s"); the default is short enough for CI.
const (
	defaultSoak     = 8 * time.Second
	soakConcurrency = 6
	// heapGrowthBound is how much the in-use heap may grow after warm-up:
	// generous, so only a real leak (tens of MiB in seconds) trips it.
	heapGrowthBound = 48 << 20
)

// soakKind is one sort of request the soak sends.
type soakKind struct {
	name   string
	weight int
	path   string
	body   func(i int) string
	stream bool
	// leave, when set, is the client hanging up: after the first content
	// event of a stream, or after a short delay on a whole answer.
	leave bool
}

var soakKinds = []soakKind{
	{name: "chat", weight: 4, path: chatPath, body: func(i int) string { return textChat(fmt.Sprint("soak chat ", i), 8, false) }},
	{name: "chat-stream", weight: 4, path: chatPath, stream: true, body: func(i int) string { return textChat(fmt.Sprint("soak stream ", i), 8, true) }},
	{name: "completion", weight: 2, path: completionPath, body: func(i int) string { return completionBody(fmt.Sprint("soak completion ", i), 8, false) }},
	{name: "completion-stream", weight: 2, path: completionPath, stream: true, body: func(i int) string { return completionBody(fmt.Sprint("soak completion ", i), 8, true) }},
	{name: "audio", weight: 1, path: chatPath, body: func(i int) string { return chatBody(fmt.Sprint("soak audio ", i), 4, false, "") }},
	{name: "audio-stream", weight: 1, path: chatPath, stream: true, body: func(i int) string { return chatBody(fmt.Sprint("soak audio ", i), 4, true, "") }},
	{name: "cancel-stream", weight: 2, path: chatPath, stream: true, leave: true, body: func(i int) string { return longChat(fmt.Sprint("soak leaving ", i), true) }},
	{name: "cancel-audio", weight: 1, path: chatPath, stream: true, leave: true, body: func(i int) string { return chatBody(fmt.Sprint("soak leaving ", i), 6, true, "") }},
	{name: "cancel-whole", weight: 1, path: chatPath, leave: true, body: func(i int) string { return longChat(fmt.Sprint("soak leaving ", i), false) }},
	// Media go through the encoder stage (E/P/D) and the prefill.
	{name: "media", weight: 2, path: chatPath, body: func(i int) string { return mediaChat(i, false, "") }},
	{name: "media-stream", weight: 1, path: chatPath, stream: true, body: func(i int) string { return mediaChat(i, true, "") }},
	{name: "media-spoken", weight: 1, path: chatPath, body: func(i int) string {
		return strings.Replace(mediaChat(i, false, ""), `"modalities":["text"]`, `"modalities":["text","audio"],"max_tokens":4`, 1)
	}},
}

// soakOutcome is what one request came to.
type soakOutcome struct {
	kind      string
	echoed    string // the X-Request-Id the answer carried
	cancelled bool
	err       error
}

// A sustained mix of streamed and whole, text and audio requests, prompts
// with media through an encoder stage, and clients that leave mid-request,
// at constant concurrency for OMNIPD_SOAK:
// every request gets exactly one well-formed answer carrying its own id
// (none lost, none duplicated, none crossed), the in-use heap stays flat
// after warm-up, and afterwards the deployment holds nothing.
func TestSoak(t *testing.T) {
	dur := defaultSoak
	if v := os.Getenv("OMNIPD_SOAK"); v != "" {
		var err error
		if dur, err = time.ParseDuration(v); err != nil || dur <= 0 {
			t.Fatalf("OMNIPD_SOAK=%q: want a positive duration such as 60s", v)
		}
	}
	// The omni requests run with async chunk on: the Talker reads the
	// decode's rows as they grow, beside the text.
	d := testbed.Start(t, testbed.Options{Omni: true, AsyncChunk: true, Prefills: 2, Decodes: 2, Encoders: 1, PrefillRetries: 1})
	warm(t, d)

	var deck []soakKind
	for _, k := range soakKinds {
		for range k.weight {
			deck = append(deck, k)
		}
	}
	var (
		mu       sync.Mutex
		sent     = map[string]string{} // request id → kind
		outcomes = map[string][]soakOutcome{}
	)
	record := func(id string, o soakOutcome) {
		mu.Lock()
		outcomes[id] = append(outcomes[id], o)
		mu.Unlock()
	}

	heapSamples := []uint64{}
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(max(dur/16, 250*time.Millisecond))
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			heapSamples = append(heapSamples, ms.HeapInuse)
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	var next sync.Mutex
	counter := 0
	for range soakConcurrency {
		wg.Go(func() {
			for time.Now().Before(end) {
				next.Lock()
				i := counter
				counter++
				next.Unlock()
				k := deck[i%len(deck)]
				id := fmt.Sprintf("soak-%d", i)
				mu.Lock()
				sent[id] = k.name
				mu.Unlock()
				record(id, soakOne(d, k, i, id))
			}
		})
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	d.Settled(t, settleWithin)

	// Every request exactly one answer, with its own id.
	byKind := map[string]int{}
	var cancelled, errs int
	for id, kind := range sent {
		os := outcomes[id]
		byKind[kind]++
		if len(os) != 1 {
			t.Errorf("request %s (%s): %d outcomes, want exactly one", id, kind, len(os))
			continue
		}
		o := os[0]
		switch {
		case o.cancelled:
			cancelled++
		case o.err != nil:
			errs++
			t.Errorf("request %s (%s): %v", id, kind, o.err)
		case o.echoed != id:
			t.Errorf("request %s (%s) was answered as %q", id, kind, o.echoed)
		}
	}
	if len(outcomes) != len(sent) {
		t.Errorf("%d ids answered, %d sent", len(outcomes), len(sent))
	}

	// Flat heap: after the first quarter of the samples, the in-use heap
	// grows by less than the bound.
	warmup := len(heapSamples) / 4
	var growth int64
	if len(heapSamples) > warmup+1 {
		start := heapSamples[warmup]
		for _, s := range heapSamples[warmup:] {
			growth = max(growth, int64(s)-int64(start))
		}
		if growth > heapGrowthBound {
			t.Errorf("in-use heap grew by %d MiB after warm-up (bound %d MiB): %s", growth>>20, heapGrowthBound>>20, mib(heapSamples))
		}
	}

	kinds := make([]string, 0, len(byKind))
	for k, n := range byKind {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	t.Logf("soak %v at concurrency %d: %d requests (%s); %d client cancellations, %d errors; heap in use after GC (MiB): %s; growth after warm-up %.1f MiB",
		dur, soakConcurrency, len(sent), strings.Join(kinds, ", "), cancelled, errs, mib(heapSamples), float64(growth)/(1<<20))
}

// soakOne sends one request of kind k and reports how it ended.
func soakOne(d *testbed.Deployment, k soakKind, i int, id string) soakOutcome {
	o := soakOutcome{kind: k.name}
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	if k.leave && !k.stream {
		// Leave after a delay that lands anywhere from the prefill to
		// mid-decode.
		go func() {
			select {
			case <-time.After(time.Duration(i%7) * 40 * time.Millisecond):
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	resp, err := post(ctx, d, k.path, k.body(i), "X-Request-Id", id)
	if err != nil {
		if k.leave && errors.Is(err, context.Canceled) {
			o.cancelled = true
			return o
		}
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.echoed = resp.Header.Get("X-Request-Id")
	if k.leave && k.stream {
		if resp.StatusCode != http.StatusOK {
			o.err = fmt.Errorf("status %d", resp.StatusCode)
			return o
		}
		ev := newEvents(resp.Body)
		for {
			e, err := ev.next()
			if err != nil {
				o.err = fmt.Errorf("stream ended before the client left: %v", err)
				return o
			}
			if hasContent(e) {
				break
			}
		}
		cancel()
		o.cancelled = true
		return o
	}
	a := readAnswer(resp)
	if k.leave && errors.Is(a.err, context.Canceled) {
		o.cancelled = true
		return o
	}
	o.err = wellFormed(a, k.stream)
	return o
}

func mib(samples []uint64) string {
	out := make([]string, len(samples))
	for i, s := range samples {
		out[i] = fmt.Sprintf("%.0f", float64(s)/(1<<20))
	}
	return strings.Join(out, " ")
}
