package server

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/orchestrator"
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
