package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/omnipd/omnipd/stageapi"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/omnipd/omnipd/audio"
	"github.com/omnipd/omnipd/reference/engine/code2wav"
)

// Streaming through the Code2Wav stage chunk by chunk — the orchestrator's
// chunking with left context — gives the samples of decoding the whole
// sequence at once.
func TestCode2WavStageChunksEqualWhole(t *testing.T) {
	hs := httptest.NewServer(NewCode2Wav(code2wav.Default(), "", quietLog()))
	defer hs.Close()
	rng := rand.New(rand.NewPCG(5, 5))
	frames := make([][]int, 61)
	for i := range frames {
		frames[i] = make([]int, 16)
		for q := range frames[i] {
			frames[i][q] = rng.IntN(2048)
		}
	}
	call := func(fs [][]int, ctx int) []float32 {
		b, _ := json.Marshal(stageapi.Code2WavRequest{Codes: stageapi.FramesToWire(fs), NumFrames: len(fs), ContextFrames: ctx})
		resp, err := http.Post(hs.URL+"/v1/omnipd/code2wav", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out stageapi.Code2WavResponse
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&out) != nil {
			t.Fatalf("HTTP %d", resp.StatusCode)
		}
		s, err := stageapi.DecodeSamples(out.Samples)
		if err != nil || len(s) != out.NumSamples {
			t.Fatalf("samples: %v", err)
		}
		return s
	}
	whole := call(frames, 0)
	if len(whole) != len(frames)*audio.SamplesPerFrame {
		t.Fatalf("%d samples for %d frames", len(whole), len(frames))
	}
	var streamed []float32
	c := audio.Chunker{}
	var chunks []audio.Chunk
	for _, f := range frames {
		chunks = append(chunks, c.Push(f)...)
	}
	chunks = append(chunks, c.Flush()...)
	for _, ch := range chunks {
		streamed = append(streamed, call(ch.Frames, ch.Context)...)
	}
	if !slices.Equal(streamed, whole) {
		t.Errorf("chunked decoding differs from whole decoding")
	}
}

func TestCode2WavStageRejectsBadInput(t *testing.T) {
	hs := httptest.NewServer(NewCode2Wav(code2wav.Default(), "", quietLog()))
	defer hs.Close()
	for _, body := range []string{`{`, `{"codes":[1,2,3],"num_frames":1}`, fmt.Sprintf(`{"codes":%s,"num_frames":1}`, jsonInts(16, 5000)), fmt.Sprintf(`{"codes":%s,"num_frames":1,"context_frames":2}`, jsonInts(16, 1))} {
		resp, err := http.Post(hs.URL+"/v1/omnipd/code2wav", "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%.60s: HTTP %d, want 400", body, resp.StatusCode)
		}
	}
}

func jsonInts(n, v int) string {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = v
	}
	b, _ := json.Marshal(ids)
	return string(b)
}

func TestWireLayoutIsCodebookMajor(t *testing.T) {
	frames := [][]int{make([]int, 16), make([]int, 16)}
	for q := range 16 {
		frames[0][q], frames[1][q] = q, 100+q
	}
	codes := stageapi.FramesToWire(frames)
	if codes[0] != 0 || codes[1] != 100 || codes[2] != 1 || codes[3] != 101 {
		t.Errorf("layout %v: want all frames' codebook 0, then codebook 1, ...", codes[:4])
	}
	back, err := stageapi.FramesFromWire(codes, 2)
	if err != nil || !slices.EqualFunc(back, frames, slices.Equal) {
		t.Errorf("round trip %v %v", back, err)
	}
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }
