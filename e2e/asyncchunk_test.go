package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/internal/testbed"
)

// audioOf is an answer's audio: the whole answer's audio data, or a
// stream's audio chunks in order, joined.
func audioOf(t *testing.T, a answer, streaming bool) string {
	t.Helper()
	if err := wellFormed(a, streaming); err != nil {
		t.Fatal(err)
	}
	if !streaming {
		var c struct {
			Choices []struct {
				Message struct {
					Audio *struct {
						Data string `json:"data"`
					} `json:"audio"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(a.body, &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			if ch.Message.Audio != nil {
				return ch.Message.Audio.Data
			}
		}
		t.Fatalf("no audio choice: %.300s", a.body)
	}
	var b strings.Builder
	for _, ev := range a.events {
		if isAudio(ev) {
			for _, ch := range parseChunk(ev).Choices {
				b.WriteString(ch.Delta.Content + "|")
			}
		}
	}
	if b.Len() == 0 {
		t.Fatalf("no audio chunks in %d events", len(a.events))
	}
	return b.String()
}

// Async chunk changes when the Talker starts, never what it says: the
// audio equals the batch path's sample for sample, greedy and seeded,
// whole and streamed, for an answer shorter than the Talker's prompt needs
// and for longer ones, with several requests at once; and nothing is left
// behind.
func TestAsyncChunkAudioEqualsBatch(t *testing.T) {
	batch := testbed.Start(t, testbed.Options{Omni: true})
	async := testbed.Start(t, testbed.Options{Omni: true, AsyncChunk: true})
	warm(t, async)
	type job struct {
		body   string
		stream bool
	}
	var jobs []job
	for _, tokens := range []int{1, 2, 9, 60} {
		for _, sampling := range []string{`"temperature":0,"seed":3`, `"temperature":0.8,"seed":11`} {
			for _, stream := range []bool{false, true} {
				jobs = append(jobs, job{chatBody(fmt.Sprintf("Tell me about the sea, %d", tokens), tokens, stream, sampling), stream})
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*reqTimeout)
	defer cancel()
	want := make([]string, len(jobs))
	for i, j := range jobs {
		want[i] = audioOf(t, send(ctx, batch, chatPath, j.body), j.stream)
	}
	got := make([]answer, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { got[i] = send(ctx, async, chatPath, j.body) })
	}
	wg.Wait()
	for i, j := range jobs {
		if a := audioOf(t, got[i], j.stream); a != want[i] {
			t.Errorf("job %d (%s): async chunk audio differs from the batch path's", i, j.body)
		}
	}
	batch.Settled(t, settleWithin) // its idle connections count too
	async.Settled(t, settleWithin)
}

// On a long answer the first audio chunk reaches the client before the
// text ends: the Talker starts while the decode still streams. The client
// then hangs up, and the growing conditioning is freed with the rest.
func TestAsyncChunkAudioBeforeTextEnds(t *testing.T) {
	d := testbed.Start(t, testbed.Options{Omni: true, AsyncChunk: true})
	warm(t, d)
	s := openStream(t, d, chatPath, chatBody("Tell me a long story", 20000, true, `"ignore_eos":true,"seed":5`))
	textEnded := false
	if !s.until(func(ev json.RawMessage) bool {
		c := parseChunk(ev)
		if c.Modality == "text" {
			for _, ch := range c.Choices {
				if ch.FinishReason != nil {
					textEnded = true
				}
			}
		}
		return isAudio(ev) || textEnded
	}) {
		t.Fatal("the stream ended with no audio")
	}
	if textEnded {
		t.Fatal("the text ended before the first audio chunk")
	}
	s.close()
	d.Settled(t, settleWithin)
}
