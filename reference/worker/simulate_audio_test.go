package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/simulate"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/stageapi"
)

// A simulated Talker waits out the profile's first frame, then one frame
// time per later frame: the waits a fake clock records are exactly those.
func TestSimulatedTalkerPacing(t *testing.T) {
	p := mustProfile(t, "h100-qwen3-omni-30b-a3b")
	thinker := newTestWorker(t, kvConfig("kv_both", "both-0", HandshakePull))
	clock := &recordingClock{now: time.Unix(1_000_000, 0)}
	ts := NewTalker(talker.Default(), talker.DefaultSegmenter(), "s3cret", slog.New(slog.DiscardHandler))
	ts.Simulate(p.Talker, clock)
	tk := httptest.NewServer(ts)
	defer tk.Close()

	prompt := testTokenizer.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "Hello!"}}, true)
	b := body(prompt, 8, 0, 1)
	b["omnipd_conditioning"] = map[string]any{"key": "sim/thinker", "layer": 2}
	if _, _, err := post(context.Background(), thinker.url, "sim", b); err != nil {
		t.Fatal(err)
	}
	frames := readFrames(t, tk.URL, stageapi.TalkerRequest{Conditioning: []stageapi.ConditioningHandle{{URL: thinker.url, Key: "sim/thinker"}}})
	if len(frames) < 2 {
		t.Fatalf("%d frames; want several", len(frames))
	}
	want := []time.Duration{p.Talker.FirstFrameTime(1)}
	for range len(frames) - 1 {
		want = append(want, p.Talker.FrameTime(1))
	}
	if got := clock.recorded(); !slices.Equal(got, want) {
		t.Errorf("waits %v\nwant %v (first frame %v, then %v a frame)", got, want, p.Talker.FirstFrameTime(1), p.Talker.FrameTime(1))
	}
}

// The batch a simulated stage is timed at is the requests in flight on it;
// a request late by more than the catch-up slack is timed from when it
// resumes, not repaid with shortened frames.
func TestAudioPacerInFlight(t *testing.T) {
	tk := simulate.Talker{FirstFrame: simulate.Linear{Base: 10 * time.Millisecond, PerUnit: 20 * time.Millisecond}, Frame: simulate.Linear{Base: 6 * time.Millisecond, PerUnit: time.Millisecond}}
	clock := &recordingClock{now: time.Unix(1_000_000, 0)}
	sim := &talkerSim{cost: tk, pacer: pacer{clock: clock}}
	ctx := context.Background()
	a := sim.start()
	b := sim.start()
	c := sim.start()
	c.frame(ctx) // three in flight
	a.done()
	c.frame(ctx) // two in flight
	clock.now = clock.now.Add(50 * time.Millisecond)
	c.frame(ctx) // late: timed from now
	b.done()
	c.done()
	want := []time.Duration{70 * time.Millisecond, 8 * time.Millisecond, 8 * time.Millisecond}
	if got := clock.recorded(); !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	if n := sim.inFlight.Load(); n != 0 {
		t.Errorf("%d in flight after every request ended", n)
	}
	// Without a profile nothing is timed and the clock is never read.
	var off *talkerSim
	r := off.start()
	r.frame(ctx)
	r.done()
}

// A simulated Code2Wav answers a chunk after the profile's chunk time for
// its new frames (left context is not charged).
func TestSimulatedCode2WavChunk(t *testing.T) {
	p := mustProfile(t, "h100-qwen3-omni-30b-a3b")
	clock := &recordingClock{now: time.Unix(1_000_000, 0)}
	cs := NewCode2Wav(code2wav.Default(), "", quietLog())
	cs.Simulate(p.Code2Wav, clock)
	hs := httptest.NewServer(cs)
	defer hs.Close()
	frames := make([][]int, 30)
	for i := range frames {
		frames[i] = make([]int, 16)
	}
	raw, _ := json.Marshal(stageapi.Code2WavRequest{Codes: stageapi.FramesToWire(frames), NumFrames: len(frames), ContextFrames: 5})
	resp, err := http.Post(hs.URL+stageapi.Code2WavPath, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d", resp.StatusCode)
	}
	if got, want := clock.recorded(), []time.Duration{p.Code2Wav.ChunkTime(25, 1)}; !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
}
