package worker

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"

	"github.com/omnipd/omnipd/engine/code2wav"
	"github.com/omnipd/omnipd/openai"
)

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

// Code2WavServer serves a Code2Wav stage.
type Code2WavServer struct {
	model *code2wav.Model
	mux   *http.ServeMux
	log   *slog.Logger
}

// NewCode2Wav builds a Code2Wav stage worker.
func NewCode2Wav(m *code2wav.Model, log *slog.Logger) *Code2WavServer {
	if log == nil {
		log = slog.Default()
	}
	s := &Code2WavServer{model: m, mux: http.NewServeMux(), log: log}
	s.mux.HandleFunc("POST /v1/omnipd/code2wav", s.decode)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return s
}

func (s *Code2WavServer) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Code2WavServer) decode(w http.ResponseWriter, r *http.Request) {
	var req Code2WavRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil {
		_ = openai.WriteError(w, openai.InvalidRequest("", "invalid JSON: "+err.Error()))
		return
	}
	frames, err := FramesFromWire(req.Codes, req.NumFrames)
	if err != nil {
		_ = openai.WriteError(w, openai.InvalidRequest("codes", err.Error()))
		return
	}
	samples, err := s.model.DecodeChunk(frames, req.ContextFrames)
	if err != nil {
		param := "codes"
		if !errors.Is(err, code2wav.ErrInvalidFrame) {
			param = "context_frames"
		}
		_ = openai.WriteError(w, openai.InvalidRequest(param, err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, Code2WavResponse{Samples: EncodeSamples(samples), NumSamples: len(samples)})
}

// FramesFromWire unflattens codebook-major codes into T frames of 16 ids.
func FramesFromWire(codes []int, numFrames int) ([][]int, error) {
	if numFrames < 0 || len(codes) != numFrames*code2wav.Codebooks {
		return nil, fmt.Errorf("%d codes for %d frames; want %d (16 per frame, codebook-major)", len(codes), numFrames, numFrames*code2wav.Codebooks)
	}
	frames := make([][]int, numFrames)
	for t := range frames {
		frames[t] = make([]int, code2wav.Codebooks)
		for q := range code2wav.Codebooks {
			frames[t][q] = codes[q*numFrames+t]
		}
	}
	return frames, nil
}

// FramesToWire flattens frames codebook-major.
func FramesToWire(frames [][]int) []int {
	codes := make([]int, len(frames)*code2wav.Codebooks)
	for t, f := range frames {
		for q := range code2wav.Codebooks {
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
