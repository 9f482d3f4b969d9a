package worker

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/stageapi"
)

// Code2WavServer serves a Code2Wav stage.
type Code2WavServer struct {
	model   *code2wav.Model
	secret  string
	mux     *http.ServeMux
	log     *slog.Logger
	metrics *metrics.Stage
	sim     *code2wavSim // nil unless simulated (simulate_audio.go)
}

// NewCode2Wav builds a Code2Wav stage worker. secret, when set, is the
// deployment's, required of callers (all but /health and /metrics).
func NewCode2Wav(m *code2wav.Model, secret string, log *slog.Logger) *Code2WavServer {
	if log == nil {
		log = slog.Default()
	}
	s := &Code2WavServer{model: m, secret: secret, mux: http.NewServeMux(), log: log, metrics: metrics.NewStage("code2wav", "omnipd-reference-code2wav")}
	s.mux.HandleFunc("POST "+stageapi.Code2WavPath, s.decode)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.Handle("GET /metrics", s.metrics.Handler())
	return s
}

func (s *Code2WavServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if allowed(w, r, s.secret, s.log) {
		s.mux.ServeHTTP(w, r)
	}
}

func (s *Code2WavServer) decode(w http.ResponseWriter, r *http.Request) {
	m := s.metrics.Start()
	outcome := metrics.OutcomeInvalid
	defer func() { m.End(outcome) }()
	var req stageapi.Code2WavRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil {
		_ = openai.WriteError(w, openai.InvalidRequest("", "invalid JSON: "+err.Error()))
		return
	}
	frames, err := stageapi.FramesFromWire(req.Codes, req.NumFrames)
	if err != nil {
		_ = openai.WriteError(w, openai.InvalidRequest("codes", err.Error()))
		return
	}
	decoded := s.sim.chunk()
	samples, err := s.model.DecodeChunk(frames, req.ContextFrames)
	decoded(r.Context(), len(samples))
	if err == nil {
		outcome = metrics.OutcomeOK
		m.Produced(len(samples))
	}
	if err != nil {
		param := "codes"
		if !errors.Is(err, code2wav.ErrInvalidFrame) {
			param = "context_frames"
		}
		_ = openai.WriteError(w, openai.InvalidRequest(param, err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, stageapi.Code2WavResponse{Samples: stageapi.EncodeSamples(samples), NumSamples: len(samples)})
}
