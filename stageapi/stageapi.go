// Package stageapi holds the wire names and types of omnipd's stage API (see
// docs/stage-api.md): the paths and headers of omnipd's own endpoints on a
// stage worker (/v1/omnipd/...), what the orchestrator sends the Talker and
// Code2Wav stages and what they answer, and the OCND body of a conditioning
// stash (Conditioning), encoded, decoded and merged from a prefill/decode
// pair, so that every worker and the conformance suite that judges them read
// one format. Every side imports it — the orchestrator and its stage
// client, the workers, the stores behind those endpoints — and it imports
// nothing of ours, so the orchestrator stays free of the engines. The omnipd members of an OpenAI-API body
// (omnipd_conditioning, omnipd_encoder_cache) are openai's: they ride on the
// Thinker's chat and completions bodies, which openai models.
package stageapi

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
)

// Codebooks is the number of codebook ids in one codec frame.
const Codebooks = 16

// Paths of omnipd's own endpoints on stage workers, all under /v1/omnipd/.
// A path that ends in "/" is followed by one path-escaped key.
const (
	// TalkerPath takes a TalkerRequest and answers a stream of TalkerEvent.
	TalkerPath = "/v1/omnipd/talker"
	// Code2WavPath takes a Code2WavRequest and answers a Code2WavResponse.
	Code2WavPath = "/v1/omnipd/code2wav"
	// ConditioningPath{key} is a Thinker worker's conditioning stash: GET
	// fetches it whole and frees it, GET with ?from=N reads its rows from
	// row N on (see ConditioningDoneHeader), DELETE frees it unread.
	ConditioningPath = "/v1/omnipd/conditioning/"
	// EncoderCachePath{key} is one media item's encoder outputs on an
	// encoder worker: GET reads them and leaves them there.
	EncoderCachePath = "/v1/omnipd/encoder-cache/"
	// EncoderLeasePath{lease} is one request's hold on the encoder outputs
	// it asked for: DELETE ends it.
	EncoderLeasePath = "/v1/omnipd/encoder-leases/"
	// KVReleasePath is where a reference Thinker worker that exports KV
	// takes the release of one request's lease: POST {"key": "<lease
	// key>"}, answered 204 whether or not the key was leased. A key not
	// exported yet is remembered for one lease, so that its export, when
	// the prefill finishes, is dropped instead of leased. vLLM has no such
	// endpoint; see docs/reliability.md.
	KVReleasePath = "/v1/omnipd/kv/release"
)

// ConditioningFromParam is the query parameter of a conditioning read from
// an offset: GET ConditioningPath{key}?from=N reads the rows from row N on.
const ConditioningFromParam = "from"

// Headers of the answer to a conditioning read from an offset (GET
// ConditioningPath{key}?from=N), each "true" or "false".
const (
	// ConditioningDoneHeader is "true" when the rows returned are the
	// stash's last; the worker freed it once they were sent.
	ConditioningDoneHeader = "Omnipd-Conditioning-Done"
	// ConditioningWaitedHeader is "true" when the reader was ahead of the
	// Thinker: nothing was at the offset when the read came, and the
	// worker waited for it (vllm-omni's WAITING_FOR_CHUNK).
	ConditioningWaitedHeader = "Omnipd-Conditioning-Waited"
)

// ConditioningHandle names a stash on a Thinker worker.
type ConditioningHandle struct {
	URL string `json:"url"` // the Thinker worker's base URL
	Key string `json:"key"`
}

// TalkerRequest is the body of POST /v1/omnipd/talker. Conditioning holds
// one handle (a colocated Thinker) or two (the prefill's, then the
// decode's, merged without the duplicate row).
type TalkerRequest struct {
	Conditioning []ConditioningHandle `json:"conditioning"`
	Temperature  float64              `json:"temperature"`
	TopK         int                  `json:"top_k"`
	Seed         *int64               `json:"seed"`
	MaxFrames    int                  `json:"max_frames"`
	// AsyncChunk reads the conditioning while the Thinker still computes
	// it: each handle names a stash that grows (see stageconn.Store.Open),
	// and the Talker starts once its prompt's rows are in.
	AsyncChunk bool `json:"async_chunk,omitempty"`
}

// TalkerEvent is one SSE event of the Talker stream: a frame (16 codebook
// ids), the end with the number of frames, or the error that ended it.
type TalkerEvent struct {
	Frame  []int  `json:"frame,omitempty"`
	Done   bool   `json:"done,omitempty"`
	Frames int    `json:"frames,omitempty"`
	Error  string `json:"error,omitempty"`
}

// MarshalJSON writes each event with its own members only — {"frame":
// [...]}, {"done":true,"frames":N}, {"error":"..."} — the done event with
// its count even when that is 0, so that a reader can tell a stream of no
// frames from a count left out.
func (e TalkerEvent) MarshalJSON() ([]byte, error) {
	type members TalkerEvent // without this method
	var v any = members(e)
	if e.Done {
		v = struct {
			members
			Frames int `json:"frames"`
		}{members(e), e.Frames}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // an error's text as it was written
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// Code2WavRequest is the body of POST /v1/omnipd/code2wav: codec frames in
// Qwen3-Omni's wire layout, frames [T,16] flattened codebook-major (all
// frames' codebook 0, then all frames' codebook 1, ...), of which the first
// ContextFrames are left context whose samples are not returned.
type Code2WavRequest struct {
	Codes         []int `json:"codes"`
	NumFrames     int   `json:"num_frames"`
	ContextFrames int   `json:"context_frames"`
}

// Code2WavResponse carries the audio: float32 little-endian samples,
// base64, 24 kHz mono, exactly 1920 per new frame.
type Code2WavResponse struct {
	Samples    string `json:"samples_f32le"`
	NumSamples int    `json:"num_samples"`
}

// FramesFromWire unflattens codebook-major codes into T frames of 16 ids.
func FramesFromWire(codes []int, numFrames int) ([][]int, error) {
	if numFrames < 0 || len(codes) != numFrames*Codebooks {
		return nil, fmt.Errorf("%d codes for %d frames; want %d (16 per frame, codebook-major)", len(codes), numFrames, numFrames*Codebooks)
	}
	frames := make([][]int, numFrames)
	for t := range frames {
		frames[t] = make([]int, Codebooks)
		for q := range Codebooks {
			frames[t][q] = codes[q*numFrames+t]
		}
	}
	return frames, nil
}

// FramesToWire flattens frames codebook-major.
func FramesToWire(frames [][]int) []int {
	codes := make([]int, len(frames)*Codebooks)
	for t, f := range frames {
		for q := range Codebooks {
			codes[q*len(frames)+t] = f[q]
		}
	}
	return codes
}

// EncodeSamples is the base64 of float32 little-endian samples.
func EncodeSamples(samples []float32) string {
	b := make([]byte, 4*len(samples))
	for i, v := range samples {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// DecodeSamples reverses EncodeSamples.
func DecodeSamples(s string) ([]float32, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		return nil, fmt.Errorf("samples are not base64 float32 little-endian")
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}
