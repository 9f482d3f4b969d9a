package server

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/stageapi"
	"github.com/omnipd/omnipd/stageclient"
)

func asyncChunk(c *orchestrator.Config) { c.Omni.AsyncChunk = true }

// With async chunk, colocated and under PD, whole and streamed, greedy and
// seeded, a one-token answer (shorter than the Talker's prompt needs) and
// longer ones: the text and the audio equal the batch path's, sample for
// sample, and no stash is left on any Thinker worker.
func TestAsyncChunkEqualsBatch(t *testing.T) {
	keep := func(*httptest.Server) {}
	batch := newOmniDeploymentFull(t, false, keep, 0.9)
	asyncColocated := newOmniDeploymentFull(t, false, keep, 0.9, asyncChunk)
	asyncPD := newOmniDeploymentFull(t, true, keep, 0.9, asyncChunk)
	greedyBatch := newOmniDeploymentFull(t, false, keep, 0)
	greedyPD := newOmniDeploymentFull(t, true, keep, 0, asyncChunk)
	for i, tokens := range []int{1, 3, 40} {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":"Tell me about chunk %d"}],"max_tokens":%d,"temperature":0.8,"seed":%d}`, i, tokens, i)
		greedy := fmt.Sprintf(`{"messages":[{"role":"user","content":"Tell me about chunk %d"}],"max_tokens":%d,"temperature":0}`, i, tokens)
		for _, c := range []struct {
			name       string
			want, from *omniDeployment
			body       string
		}{
			{"colocated", batch, asyncColocated, body},
			{"PD", batch, asyncPD, body},
			{"greedy PD", greedyBatch, greedyPD, greedy},
		} {
			want := omniWhole(t, c.want.url, c.body)
			for _, stream := range []bool{false, true} {
				var got omniAnswer
				if stream {
					got = omniStreamOf(t, c.from.url, strings.Replace(c.body, `"messages"`, `"stream":true,"messages"`, 1), true)
				} else {
					got = omniWhole(t, c.from.url, c.body)
				}
				if got.text != want.text || !slices.Equal(got.samples, want.samples) {
					t.Errorf("%s, %d tokens, stream %v: %q and %d samples; batch %q and %d samples", c.name, tokens, stream, got.text, len(got.samples), want.text, len(want.samples))
				}
			}
		}
	}
	for _, d := range []*omniDeployment{asyncColocated, asyncPD, greedyPD} {
		deadline := time.Now().Add(5 * time.Second)
		for _, w := range d.thinkers {
			for w.srv.Stashes() != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := w.srv.Stashes(); n != 0 {
				t.Errorf("a Thinker worker still holds %d conditioning stashes", n)
			}
		}
	}
}

// heldAnswer is a proxy in front of a Thinker worker that holds the
// worker's answer to a chat request until the Talker has read a generated
// row (row 1 on) from that worker's stash, or until a bound passes: it
// tells whether the Talker ran while the Thinker was still answering.
type heldAnswer struct {
	readEarly chan struct{}
	once      sync.Once
	early     bool
	// holdRequest: hold the chat request itself, not the answer, so that
	// the Talker asks for the first generated row before the Thinker has
	// even begun the decode.
	holdRequest bool
}

// holdAnswers puts a heldAnswer in front of the config's decode (or
// colocated Thinker) instance; the stash handles the orchestrator hands the
// Talker then name the proxy, so the Talker's reads pass through it too.
func holdAnswers(t *testing.T, c *orchestrator.Config) *heldAnswer {
	return holdThinker(t, c, false)
}

func holdThinker(t *testing.T, c *orchestrator.Config, holdRequest bool) *heldAnswer {
	t.Helper()
	in := c.Decode.Instances[0]
	target, err := url.Parse(in.Client.BaseURL())
	if err != nil {
		t.Fatal(err)
	}
	h := &heldAnswer{readEarly: make(chan struct{}), holdRequest: holdRequest}
	hold := func() {
		// Only a Talker that never reads (a bug the test then reports)
		// reaches the bound.
		select {
		case <-h.readEarly:
			h.early = true
		case <-time.After(2 * time.Minute):
		}
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method == http.MethodPost && !h.holdRequest {
			hold()
		}
		return nil
	}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, stageapi.ConditioningPath) {
			_, err := strconv.Atoi(r.URL.Query().Get("from"))
			switch {
			case err == nil && h.holdRequest:
				// Holding the request, the decode goes on once a read of
				// its stash has been answered: the stash did not exist
				// yet, so that read found the Talker ahead.
				proxy.ServeHTTP(w, r)
				h.once.Do(func() { close(h.readEarly) })
				return
			case err == nil:
				// Holding the answer, it goes once a read of the stash has
				// been answered with rows: the Talker took the Thinker's
				// rows before the Thinker answered.
				rec := httptest.NewRecorder()
				proxy.ServeHTTP(rec, r)
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				_, _ = w.Write(rec.Body.Bytes())
				if st, err := stageapi.DecodeConditioning(rec.Body.Bytes()); rec.Code == http.StatusOK && err == nil && len(st.Embed) > 0 {
					h.once.Do(func() { close(h.readEarly) })
				}
				return
			}
		}
		if r.Method == http.MethodPost && h.holdRequest {
			hold()
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	client, err := stageclient.New(stageclient.Config{BaseURL: front.URL, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	c.Decode = &orchestrator.Pool{Name: c.Decode.Name, Instances: []*orchestrator.Instance{{Client: client, Peer: in.Peer}}}
	return h
}

// With async chunk a whole (non-streamed) answer's audio is made while the
// Thinker decodes, not after: the Talker takes the Thinker's rows while the
// Thinker's answer is held back, colocated and under PD, and the audio
// still equals the batch path's.
func TestAsyncChunkWholeAnswerTalksDuringDecode(t *testing.T) {
	keep := func(*httptest.Server) {}
	batch := newOmniDeploymentFull(t, false, keep, 0.9)
	body := `{"messages":[{"role":"user","content":"Say something long"}],"max_tokens":30,"temperature":0.8,"seed":7}`
	want := omniWhole(t, batch.url, body)
	for _, pd := range []bool{false, true} {
		var held *heldAnswer
		d := newOmniDeploymentFull(t, pd, keep, 0.9, asyncChunk, func(c *orchestrator.Config) { held = holdAnswers(t, c) })
		got := omniWhole(t, d.url, body)
		if !held.early {
			t.Errorf("PD %v: the Talker took no row before the Thinker answered", pd)
		}
		if got.text != want.text || !slices.Equal(got.samples, want.samples) {
			t.Errorf("PD %v: %q and %d samples; batch %q and %d samples", pd, got.text, len(got.samples), want.text, len(want.samples))
		}
		waitNoStashes(t, d.thinkers)
	}
}

// A prefill that fails, with pd.fallback: local, leaves the decode to
// prefill the request itself: its rows then cover the prompt, and the
// Talker reads them alone — the audio equals the colocated pipeline's,
// with async chunk and without.
func TestOmniFallbackLocalAudio(t *testing.T) {
	keep := func(*httptest.Server) {}
	colocated := newOmniDeploymentFull(t, false, keep, 0.9)
	body := `{"messages":[{"role":"user","content":"Fall back"}],"max_tokens":12,"temperature":0.8,"seed":3}`
	want := omniWhole(t, colocated.url, body)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "prefill down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(broken.Close)
	fallback := func(c *orchestrator.Config) {
		client, err := stageclient.New(stageclient.Config{BaseURL: broken.URL, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
		c.FallbackLocal = true
		c.Prefill = &orchestrator.Pool{Name: "prefill", Instances: []*orchestrator.Instance{{Client: client, Peer: c.Prefill.Instances[0].Peer}}}
	}
	for _, async := range []bool{false, true} {
		adjust := []func(*orchestrator.Config){fallback}
		if async {
			adjust = append(adjust, asyncChunk)
		}
		d := newOmniDeploymentFull(t, true, keep, 0.9, adjust...)
		for _, stream := range []bool{false, true} {
			var got omniAnswer
			if stream {
				got = omniStreamOf(t, d.url, strings.Replace(body, `"messages"`, `"stream":true,"messages"`, 1), async)
			} else {
				got = omniWhole(t, d.url, body)
			}
			if got.text != want.text || !slices.Equal(got.samples, want.samples) {
				t.Errorf("async %v, stream %v: %q and %d samples; colocated %q and %d samples", async, stream, got.text, len(got.samples), want.text, len(want.samples))
			}
		}
		waitNoStashes(t, d.thinkers)
	}
}

// talkerCounter reads one counter from a Talker worker's /metrics.
func talkerCounter(t *testing.T, talkerURL, name string) float64 {
	t.Helper()
	resp, err := http.Get(talkerURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("%s not on the Talker's /metrics", name)
	return 0
}

// A Talker ahead of the Thinker waits for the next row and reads on when
// it comes (vllm-omni's WAITING_FOR_CHUNK). A proxy holds a whole answer's
// decode leg until the Talker's first read of its stash has been answered,
// so the Talker is ahead for certain — the stash did not exist; the wait is
// counted on the Talker's /metrics, and the audio equals the batch path's,
// colocated and under PD. (The unit tests of reference/engine/talker pin the waits
// in mid-answer, row by row.)
func TestAsyncChunkTalkerWaitsForRows(t *testing.T) {
	keep := func(*httptest.Server) {}
	batch := newOmniDeploymentFull(t, false, keep, 0.9)
	body := `{"messages":[{"role":"user","content":"Talk at length"}],"max_tokens":60,"temperature":0.8,"seed":11}`
	want := omniWhole(t, batch.url, body)
	// The Talker's first read of the decode's stash, which does not exist
	// yet, waits this long and is answered without rows; only then does the
	// held decode go on.
	quickReads := func(string) func(*worker.Config) {
		return func(c *worker.Config) { c.StashReadWait = 50 * time.Millisecond }
	}
	for _, pd := range []bool{false, true} {
		var talkerURL string
		var held *heldAnswer
		async := newOmniDeploymentOf(t, pd, keep, 0.9, quickReads, asyncChunk, func(c *orchestrator.Config) {
			talkerURL = c.Omni.Talker.Instances[0].Client.BaseURL()
			held = holdThinker(t, c, true)
		})
		got := omniWhole(t, async.url, body)
		if got.text != want.text || !slices.Equal(got.samples, want.samples) {
			t.Errorf("PD %v: %q and %d samples; batch %q and %d samples", pd, got.text, len(got.samples), want.text, len(want.samples))
		}
		if !held.early {
			t.Errorf("PD %v: the Talker did not read the decode's stash before the decode began", pd)
		}
		if waits := talkerCounter(t, talkerURL, "omnipd_talker_conditioning_waits_total"); waits == 0 {
			t.Errorf("PD %v: the Talker's /metrics count no wait for a row", pd)
		}
		waitNoStashes(t, async.thinkers)
	}
}
