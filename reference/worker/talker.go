package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
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
		_ = openai.WriteError(w, talkerBodyError(err))
		return
	}
	if n := len(req.Conditioning); n != 1 && n != 2 {
		outcome = metrics.OutcomeInvalid
		_ = openai.WriteError(w, openai.InvalidRequest("conditioning", "give one handle (colocated Thinker) or two (prefill, then decode)"))
		return
	}
	// Checked before anything is fetched: a fetch frees the stash on the
	// Thinker, so a request refused after it would lose the conditioning
	// the corrected request needs.
	params, bad := talkerParams(req)
	if bad != nil {
		outcome = metrics.OutcomeInvalid
		_ = openai.WriteError(w, bad)
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
		s.log.Error("talker generation failed", "request_id", r.Header.Get(openai.RequestIDHeader), "err", err)
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

// maxTalkerFrames bounds max_frames, as a Talker config bounds its
// default_max_frames: the Talker reserves its cache for the whole answer
// up front, so an unbounded count is an unbounded allocation, which ends
// the process rather than the request.
const maxTalkerFrames = 1 << 16

// talkerParams checks a request's sampling parameters (docs/stage-api.md)
// and says which one is out of range.
func talkerParams(req stageapi.TalkerRequest) (talker.Params, *openai.ErrorResponse) {
	p := talker.Params{Temperature: req.Temperature, TopK: req.TopK, Seed: req.Seed, MaxFrames: req.MaxFrames}
	switch {
	case !(p.Temperature >= 0) || math.IsInf(p.Temperature, 0):
		return p, openai.InvalidRequest("temperature", fmt.Sprintf("temperature must be a finite number >= 0 (0 is greedy), got %v", p.Temperature))
	case p.TopK < 0:
		return p, openai.InvalidRequest("top_k", fmt.Sprintf("top_k must be >= 0 (0 samples among all codes), got %d", p.TopK))
	case p.MaxFrames < 0 || p.MaxFrames > maxTalkerFrames:
		return p, openai.InvalidRequest("max_frames", fmt.Sprintf("max_frames must be 0 (the Talker's default) to %d, got %d", maxTalkerFrames, p.MaxFrames))
	}
	return p, nil
}

// talkerBodyError is the 400 for a body that does not decode, naming the
// member whose value has the wrong type ("seed": 1.5).
func talkerBodyError(err error) *openai.ErrorResponse {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return openai.InvalidRequest(te.Field, fmt.Sprintf("%s must be %s, got %s", te.Field, jsonKind(te.Type), te.Value))
	}
	return openai.InvalidRequest("", "invalid JSON: "+err.Error())
}

// jsonKind names, for a client, the JSON values a Go type decodes from.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("a %d-bit integer", t.Bits())
	case reflect.Float32, reflect.Float64:
		return "a finite number"
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return "an object"
	}
}

// fetch takes the stashes from the Thinker workers (freeing them there)
// and merges a prefill/decode pair.
func (s *TalkerServer) fetch(ctx context.Context, handles []stageapi.ConditioningHandle) (*talker.Conditioning, error) {
	stashes := make([]*stageapi.Conditioning, len(handles))
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
		merged, err := stageapi.MergeConditioning(stashes[0], stashes[1])
		if err != nil {
			// Named as the data path the stashes came by, as a refused
			// fetch is, and as the streamed merge's refusal (stashFeed.head).
			return nil, fmt.Errorf("stageconn: %w", err)
		}
		st = merged
	}
	return &talker.Conditioning{
		Embed: st.Embed, Hidden: st.Hidden, TokenIDs: st.TokenIDs, PromptTokenIDs: st.PromptTokenIDs,
		TTSPad: st.TTSPad, TTSBos: st.TTSBos, TTSEos: st.TTSEos,
	}, nil
}
