package stagetest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"

	"github.com/omnipd/omnipd/audio"
	"github.com/omnipd/omnipd/stageapi"
)

// Wire facts of the audio stages (docs/stage-api.md).
const (
	codebookSize    = 2048 // ids 0..2047
	samplesPerFrame = audio.SamplesPerFrame
)

// talkerSamplings are the Talker's own greedy and seeded sampling.
var talkerSamplings = []struct {
	name string
	req  stageapi.TalkerRequest
}{
	{"greedy", stageapi.TalkerRequest{}},
	{"seeded", stageapi.TalkerRequest{Temperature: 0.9, TopK: 50, Seed: new(int64(42))}},
}

// talk runs one Talker request and checks its stream: one event per frame
// of 16 ids in 0..2047, then {"done": true, "frames": N} with N the frames
// sent, then [DONE].
func (c *checker) talk(base, what string, req stageapi.TalkerRequest) [][]int {
	c.Helper()
	events := c.stream(base+stageapi.TalkerPath, what, req)
	var frames [][]int
	done := false
	for i, ev := range events {
		var e struct {
			Frame  []int  `json:"frame"`
			Done   bool   `json:"done"`
			Frames *int   `json:"frames"`
			Error  string `json:"error"`
		}
		if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
			c.Fatalf("%s: event %d is not a Talker event: %v: %s", what, i, err, ev.data)
		}
		switch {
		case e.Error != "":
			c.Fatalf("%s: the stream failed after %d frames: %s", what, len(frames), e.Error)
		case done:
			c.Errorf("%s: event %d after the done event: %s", what, i, ev.data)
		case e.Done:
			done = true
			switch {
			case e.Frames == nil:
				c.Errorf("%s: the done event has no frames count (0 included): %s", what, ev.data)
			case *e.Frames != len(frames):
				c.Errorf("%s: the done event says %d frames; %d were sent", what, *e.Frames, len(frames))
			}
		default:
			if len(e.Frame) != stageapi.Codebooks {
				c.Errorf("%s: frame %d has %d ids; want %d", what, len(frames), len(e.Frame), stageapi.Codebooks)
			}
			for _, id := range e.Frame {
				if id < 0 || id >= codebookSize {
					c.Errorf("%s: frame %d holds id %d outside 0..%d", what, len(frames), id, codebookSize-1)
					break
				}
			}
			frames = append(frames, e.Frame)
		}
	}
	if !done {
		c.Fatalf("%s: the stream ended without its done event", what)
	}
	if req.MaxFrames > 0 && len(frames) > req.MaxFrames {
		c.Errorf("%s: %d frames past max_frames %d", what, len(frames), req.MaxFrames)
	}
	return frames
}

func framesEqual(a, b [][]int) bool { return slices.EqualFunc(a, b, slices.Equal) }

// talkerMaxFrames bounds the Talker's answers: enough frames to compare,
// few enough for a busy machine.
const talkerMaxFrames = 24

// checkTalker: the Talker's stream, its stop at max_frames, and that it
// takes the stashes it read.
func checkTalker(c *checker) {
	thinker, talker := c.thinker(), c.talker()
	body := c.chatBody(shortPrompt, 8)
	for _, s := range talkerSamplings {
		key := "talker/" + s.name
		c.generate(thinker, "the Thinker", c.keep(body, key+"/a", false))
		c.generate(thinker, "the Thinker", c.keep(body, key+"/b", false))
		req := s.req
		req.MaxFrames = talkerMaxFrames
		req.Conditioning = []stageapi.ConditioningHandle{{URL: thinker, Key: key + "/a"}}
		all := c.talk(talker, s.name, req)
		if len(all) == 0 {
			c.Errorf("%s: no frames: nothing to compare", s.name)
		}
		c.wantGone(thinker, key+"/a", "after the Talker read it")
		// The same conditioning, stopped early: the first frames of the
		// longer answer, and no more than max_frames.
		short := min(3, max(1, len(all)))
		req.MaxFrames = short
		req.Conditioning = []stageapi.ConditioningHandle{{URL: thinker, Key: key + "/b"}}
		got := c.talk(talker, s.name+", max_frames "+fmt.Sprint(short), req)
		if want := all[:min(short, len(all))]; !framesEqual(got, want) {
			c.Errorf("%s, max_frames %d: %d frames %v; want the first %d of the longer answer %v", s.name, short, len(got), got, len(want), want)
		}
		c.wantGone(thinker, key+"/b", "after the Talker read it")
	}
	c.wantStashes(thinker, 0, "after the Talker read every stash")
}

// checkTalkerPD: the Talker fed a prefill/decode pair's two stashes emits
// the frames it emits for one colocated Thinker's stash of the same
// request, greedy and seeded (Thinker and Talker alike), and takes all
// three.
func checkTalkerPD(c *checker) {
	thinker, pair, talker := c.thinker(), c.pair(), c.talker()
	for i, s := range talkerSamplings {
		for _, prompt := range []string{shortPrompt, longPrompt} {
			id := fmt.Sprintf("talker-pd-%d-%d", i, len(prompt))
			body := samplings[i].apply(c.chatBody(prompt, 8))
			what := fmt.Sprintf("%s, %s, prompt %.12q", pair.KV.Name(), s.name, prompt)
			c.generate(thinker, what+": colocated", c.keep(body, id+"/thinker", false))
			c.prefillDecode(pair, id, body,
				map[string]any{"omnipd_conditioning": map[string]any{"key": id + "/prefill", "layer": c.d.Layer}},
				map[string]any{"omnipd_conditioning": map[string]any{"key": id + "/decode", "layer": c.d.Layer}})
			req := s.req
			req.MaxFrames = talkerMaxFrames
			req.Conditioning = []stageapi.ConditioningHandle{{URL: thinker, Key: id + "/thinker"}}
			want := c.talk(talker, what+": colocated", req)
			req.Conditioning = []stageapi.ConditioningHandle{{URL: pair.Prefill, Key: id + "/prefill"}, {URL: pair.Decode, Key: id + "/decode"}}
			got := c.talk(talker, what+": PD", req)
			if len(want) == 0 {
				c.Errorf("%s: no frames: nothing to compare", what)
			}
			if !framesEqual(got, want) {
				c.Errorf("%s: PD frames (%d) differ from colocated frames (%d): %v against %v", what, len(got), len(want), got, want)
			}
		}
	}
	for name, base := range map[string]string{"colocated": thinker, "prefill": pair.Prefill, "decode": pair.Decode} {
		c.wantStashes(base, 0, name+", after the Talker read every stash")
	}
}

// checkTalkerAsyncChunk: with "stream": true on every Thinker leg and
// async_chunk on the Talker, started as soon as the legs are sent, the
// Talker emits the frames of the batch path — colocated and under PD.
func checkTalkerAsyncChunk(c *checker) {
	thinker, pair, talker := c.thinker(), c.pair(), c.talker()
	body := c.chatBody(longPrompt, 10)
	req := talkerSamplings[1].req
	req.MaxFrames = talkerMaxFrames
	c.generate(thinker, "batch", c.keep(body, "async/batch", false))
	req.Conditioning = []stageapi.ConditioningHandle{{URL: thinker, Key: "async/batch"}}
	want := c.talk(talker, "batch", req)
	if len(want) == 0 {
		c.Errorf("batch: no frames: nothing to compare")
	}
	async := req
	async.AsyncChunk = true

	// Colocated: the Talker reads the one stash while the Thinker decodes.
	tc, stop := c.child()
	defer stop()
	var wg sync.WaitGroup
	var thinkerReply reply
	wg.Go(func() {
		thinkerReply = c.postAside(stop, "the Thinker, stream: true", thinker+pathOf(body), c.keep(body, "async/colocated", true))
	})
	async.Conditioning = []stageapi.ConditioningHandle{{URL: thinker, Key: "async/colocated"}}
	got := tc.talk(talker, "async chunk, colocated", async)
	wg.Wait()
	c.decodeCompletion("the Thinker, stream: true", thinkerReply)
	if !framesEqual(got, want) {
		c.Errorf("async chunk, colocated: frames (%d) differ from the batch path's (%d): %v against %v", len(got), len(want), got, want)
	}

	// PD: the prefill's stash to its end, then the decode's from row 1.
	keepStreamed := func(key string) map[string]any {
		return map[string]any{"omnipd_conditioning": map[string]any{"key": key, "layer": c.d.Layer, "stream": true}}
	}
	tc, stop = c.child()
	defer stop()
	wg.Go(func() {
		// The Talker's reads of keys not stashed yet wait for them.
		if !c.prefillDecodeAside(pair, "async-pd", body, keepStreamed("async/prefill"), keepStreamed("async/decode")) {
			stop()
		}
	})
	async.Conditioning = []stageapi.ConditioningHandle{{URL: pair.Prefill, Key: "async/prefill"}, {URL: pair.Decode, Key: "async/decode"}}
	got = tc.talk(talker, "async chunk, PD", async)
	wg.Wait()
	if !framesEqual(got, want) {
		c.Errorf("async chunk, PD: frames (%d) differ from the batch path's (%d): %v against %v", len(got), len(want), got, want)
	}
	for name, base := range map[string]string{"colocated": thinker, "prefill": pair.Prefill, "decode": pair.Decode} {
		c.wantStashes(base, 0, name+", after the Talker read every stash to its end")
	}
}

// prefillDecodeAside is prefillDecode on a goroutine of its own: a
// failure is reported with Errorf, never Fatalf, and ok says there was
// none.
func (c *checker) prefillDecodeAside(p Pair, id string, body map[string]any, prefillExtra, decodeExtra map[string]any) (ok bool) {
	q := *c
	q.reporter = asideReporter{c.reporter}
	defer func() {
		if v := recover(); v != nil {
			if _, aside := v.(asideFatal); !aside {
				panic(v)
			}
			ok = false
		}
	}()
	q.prefillDecode(p, id, body, prefillExtra, decodeExtra)
	return true
}

// asideReporter turns Fatalf into Errorf and a panic that unwinds to
// prefillDecodeAside, for work on a goroutine of its own.
type asideReporter struct{ reporter }

type asideFatal struct{}

func (a asideReporter) Fatalf(format string, args ...any) {
	a.Errorf(format, args...)
	panic(asideFatal{})
}

// checkTalkerMissing: a handle to no stash is a 404 with OpenAI's error
// body before the stream starts — a key never kept, or one already taken
// (which a read from an offset, async chunk, answers at once too).
func checkTalkerMissing(c *checker) {
	thinker, talker := c.thinker(), c.talker()
	req := stageapi.TalkerRequest{MaxFrames: 2, Conditioning: []stageapi.ConditioningHandle{{URL: thinker, Key: "missing/never-kept"}}}
	c.wantError("a Talker request for a stash never kept", c.post(talker+stageapi.TalkerPath, req), http.StatusNotFound, "")
	c.generate(thinker, "the Thinker", c.keep(c.chatBody(shortPrompt, 4), "missing/taken", false))
	c.fetch(thinker, "missing/taken")
	for _, async := range []bool{false, true} {
		req := stageapi.TalkerRequest{MaxFrames: 2, AsyncChunk: async, Conditioning: []stageapi.ConditioningHandle{{URL: thinker, Key: "missing/taken"}}}
		c.wantError(fmt.Sprintf("a Talker request (async_chunk %v) for a stash already taken", async), c.post(talker+stageapi.TalkerPath, req), http.StatusNotFound, "")
	}
}

// decodeAudio decodes frames with context frames of left context.
func (c *checker) decodeAudio(base, what string, frames [][]int, context int) []float32 {
	c.Helper()
	r := c.post(base+stageapi.Code2WavPath, stageapi.Code2WavRequest{Codes: stageapi.FramesToWire(frames), NumFrames: len(frames), ContextFrames: context})
	var out stageapi.Code2WavResponse
	if r.status != http.StatusOK || json.Unmarshal(r.body, &out) != nil {
		c.Fatalf("%s: %v", what, r)
	}
	samples, err := stageapi.DecodeSamples(out.Samples)
	if err != nil {
		c.Fatalf("%s: samples_f32le: %v", what, err)
	}
	if len(samples) != out.NumSamples {
		c.Errorf("%s: num_samples %d for %d samples", what, out.NumSamples, len(samples))
	}
	if want := (len(frames) - context) * samplesPerFrame; len(samples) != want {
		c.Errorf("%s: %d samples for %d frames of which %d context; want %d (1920 per new frame)", what, len(samples), len(frames), context, want)
	}
	for i, v := range samples {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			c.Errorf("%s: sample %d is %v", what, i, v)
			break
		}
	}
	return samples
}

// checkCode2Wav: 1920 samples per frame that is not context, and decoding
// a stream chunk by chunk with left context, as the orchestrator chunks it
// (audio.Chunker: 4 frames, then 25 new with up to 25 of context, the rest
// at the end), gives the samples of decoding it whole.
func checkCode2Wav(c *checker) {
	base := c.code2wav()
	rng := rand.New(rand.NewPCG(5, 5))
	frames := make([][]int, 61)
	for i := range frames {
		frames[i] = make([]int, stageapi.Codebooks)
		for q := range frames[i] {
			frames[i][q] = rng.IntN(codebookSize)
		}
	}
	frames[7] = slices.Repeat([]int{codebookSize - 1}, stageapi.Codebooks) // the range's ends
	frames[8] = make([]int, stageapi.Codebooks)
	whole := c.decodeAudio(base, "61 frames whole", frames, 0)
	var chunker audio.Chunker
	var chunks []audio.Chunk
	for _, f := range frames {
		chunks = append(chunks, chunker.Push(f)...)
	}
	chunks = append(chunks, chunker.Flush()...)
	var streamed []float32
	for _, ch := range chunks {
		streamed = append(streamed, c.decodeAudio(base, fmt.Sprintf("the chunk of frames %d.. with %d of context", ch.Start, ch.Context), ch.Frames, ch.Context)...)
	}
	if len(streamed) != len(whole) {
		c.Fatalf("chunked decoding gave %d samples; whole %d", len(streamed), len(whole))
	}
	for i := range whole {
		if math.Float32bits(streamed[i]) != math.Float32bits(whole[i]) {
			c.Fatalf("chunked decoding differs from whole decoding at sample %d (frame %d): %v against %v", i, i/samplesPerFrame, streamed[i], whole[i])
		}
	}
	// Context alone shifts what is returned, not what it is: frames
	// [k:] of a whole decode with k frames of context.
	tail := c.decodeAudio(base, "61 frames, 30 of context", frames, 30)
	if !slices.Equal(tail, whole[30*samplesPerFrame:]) {
		c.Errorf("decoding with 30 frames of context does not give the whole decode's samples from frame 30")
	}
}
