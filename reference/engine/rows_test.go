package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// Each event carries the conditioning rows computed since the one before:
// the first the prompt's, each later one one row, and together exactly the
// last event's Capture, also across chunking and preemption; a request
// that does not stream them gets none.
func TestEventsCarryNewRows(t *testing.T) {
	alone := start(t, Config{})
	busy := start(t, Config{MaxNumBatchedTokens: 7, MaxNumSeqs: 5, NumBlocks: 12})
	rng := rand.New(rand.NewPCG(5, 6))
	prompts := make([][]int, 12)
	for i := range prompts {
		prompts[i] = randomPrompt(rng, 1+rng.IntN(40))
	}
	var wg sync.WaitGroup
	for i, prompt := range prompts {
		wg.Go(func() {
			params := seeded(int64(i), 20)
			ch, err := busy.Submit(context.Background(), &Request{ID: fmt.Sprint(i), Prompt: prompt, Params: params, CaptureLayer: 2, StreamRows: true})
			if err != nil {
				t.Error(err)
				return
			}
			var embed, hidden [][]float32
			n := 0
			for ev := range ch {
				if ev.Rows == nil {
					t.Errorf("job %d: event %d carries no rows", i, n)
					return
				}
				want := 1
				if n == 0 {
					want = len(prompt)
				}
				if len(ev.Rows.Embeddings) != want || len(ev.Rows.Hidden) != want {
					t.Errorf("job %d: event %d carries %d rows; want %d", i, n, len(ev.Rows.Embeddings), want)
				}
				embed = append(embed, ev.Rows.Embeddings...)
				hidden = append(hidden, ev.Rows.Hidden...)
				n++
				if ev.Finished {
					r := run(t, alone, &Request{Prompt: prompt, Params: params, CaptureLayer: 2})
					if r.last.Rows != nil {
						t.Errorf("job %d: rows on the last event of a request that does not stream them", i)
					}
					ref := r.last.Capture
					if !rowsEqual(embed, ev.Capture.Embeddings) || !rowsEqual(hidden, ev.Capture.Hidden) ||
						!rowsEqual(embed, ref.Embeddings) || !rowsEqual(hidden, ref.Hidden) {
						t.Errorf("job %d: the streamed rows differ from the capture", i)
					}
				}
			}
		})
	}
	wg.Wait()
	if busy.Stats().Preemptions == 0 {
		t.Error("the small cache never preempted")
	}
}
