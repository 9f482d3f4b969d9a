package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/omnipd/omnipd/engine/talker"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/stageapi"
	"github.com/omnipd/omnipd/stageconn"
)

// TalkerServer serves a Talker stage: it fetches the Thinker's conditioning
// straight from the Thinker workers and streams codec frames.
type TalkerServer struct {
	model   *talker.Model
	seg     talker.Segmenter
	secret  string
	client  *http.Client
	mux     *http.ServeMux
	log     *slog.Logger
	metrics *metrics.Stage
	sim     *talkerSim // nil unless simulated (simulate_audio.go)
}

// NewTalker builds a Talker stage worker. secret is the deployment's: it
// fetches conditioning with it, and requires it of callers (all but
// /health and /metrics) when set.
func NewTalker(m *talker.Model, seg talker.Segmenter, secret string, log *slog.Logger) *TalkerServer {
	if log == nil {
		log = slog.Default()
	}
	s := &TalkerServer{model: m, seg: seg, secret: secret, client: &http.Client{Timeout: 60 * time.Second}, mux: http.NewServeMux(), log: log,
		metrics: metrics.NewStage("talker", "omnipd-reference-talker")}
	s.mux.HandleFunc("POST "+stageapi.TalkerPath, s.generate)
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.Handle("GET /metrics", s.metrics.Handler())
	return s
}

func (s *TalkerServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if allowed(w, r, s.secret, s.log) {
		s.mux.ServeHTTP(w, r)
	}
}

func (s *TalkerServer) generate(w http.ResponseWriter, r *http.Request) {
	m := s.metrics.Start()
	outcome := metrics.OutcomeFailed
	defer func() { m.End(outcome) }()
	var req stageapi.TalkerRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		outcome = metrics.OutcomeInvalid
		_ = openai.WriteError(w, openai.InvalidRequest("", "invalid JSON: "+err.Error()))
		return
	}
	if n := len(req.Conditioning); n != 1 && n != 2 {
		outcome = metrics.OutcomeInvalid
		_ = openai.WriteError(w, openai.InvalidRequest("conditioning", "give one handle (colocated Thinker) or two (prefill, then decode)"))
		return
	}
	var (
		c    *talker.Conditioning
		feed *stashFeed
		err  error
	)
	if req.AsyncChunk {
		feed = &stashFeed{s: s, m: m, ctx: r.Context(), handles: req.Conditioning}
		defer feed.release()
		c, err = feed.head()
	} else {
		c, err = s.fetch(r.Context(), req.Conditioning)
	}
	if err != nil {
		status := http.StatusBadGateway
		if errors.Is(err, stageconn.ErrNotFound) {
			status = http.StatusNotFound
		}
		outcome = metrics.OutcomeNoConditioning
		_ = openai.WriteError(w, openai.Upstream(status, "conditioning_unavailable", err.Error()))
		return
	}
	params := talker.Params{Temperature: req.Temperature, TopK: req.TopK, Seed: req.Seed, MaxFrames: req.MaxFrames}
	sse := openai.NewSSEWriter(w)
	frames := 0
	pace := s.sim.start()
	defer pace.done()
	emit := func(frame []int) bool {
		pace.frame(r.Context())
		frames++
		m.Produced(1)
		return sse.WriteEvent(stageapi.TalkerEvent{Frame: frame}) == nil && r.Context().Err() == nil
	}
	if feed != nil {
		err = s.model.GenerateFeed(c, feed, s.seg, params, emit)
	} else {
		err = s.model.Generate(c, s.seg, params, emit)
	}
	switch {
	case r.Context().Err() != nil:
		outcome = metrics.OutcomeCancelled
	case err != nil:
		s.log.Error("talker generation failed", "request_id", r.Header.Get("X-Request-Id"), "err", err)
	default:
		outcome = metrics.OutcomeOK
	}
	if err != nil {
		_ = sse.WriteEvent(stageapi.TalkerEvent{Error: err.Error()})
	} else {
		_ = sse.WriteEvent(stageapi.TalkerEvent{Done: true, Frames: frames})
	}
	_ = sse.WriteDone()
}

// fetch takes the stashes from the Thinker workers (freeing them there)
// and merges a prefill/decode pair.
func (s *TalkerServer) fetch(ctx context.Context, handles []stageapi.ConditioningHandle) (*talker.Conditioning, error) {
	stashes := make([]*stageconn.Stash, len(handles))
	var firstErr error
	for i, h := range handles {
		st, err := stageconn.Fetch(ctx, s.client, h.URL, h.Key, s.secret)
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("conditioning %q from %s: %w", h.Key, h.URL, err)
		}
		stashes[i] = st
	}
	if firstErr != nil {
		return nil, firstErr
	}
	st := stashes[0]
	if len(stashes) == 2 {
		merged, err := stageconn.Merge(stashes[0], stashes[1])
		if err != nil {
			return nil, err
		}
		st = merged
	}
	return &talker.Conditioning{
		Embed: st.Embed, Hidden: st.Hidden, TokenIDs: st.TokenIDs, PromptTokenIDs: st.PromptTokenIDs,
		TTSPad: st.TTSPad, TTSBos: st.TTSBos, TTSEos: st.TTSEos,
	}, nil
}
