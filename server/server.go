// Package server is omnipd's public HTTP API: OpenAI's chat completions and
// completions (streaming and not), /v1/models, /health and /metrics, with
// request ids, API keys, limits, and OpenAI error bodies. It hands each
// request to the orchestrator and relays the answer; SSE events are passed on
// as they arrive, never held for later ones (events that arrive together
// leave together, in one write).
//
// What a client may steer stops here: fields that only omnipd may set on a
// stage leg (kv_transfer_params, omnipd_conditioning) are refused, and the
// request id the stages see is unique even when a client chooses its own.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/stageclient"
)

// Orchestrator is what the server needs of the orchestrator.
type Orchestrator interface {
	Do(ctx context.Context, req *orchestrator.Request) (*orchestrator.Result, error)
}

var _ Orchestrator = (*orchestrator.Orchestrator)(nil)

// Config configures the server. The zero value of every limit has a
// working default.
type Config struct {
	Orchestrator Orchestrator
	// ModelName is the model the API serves; requests naming another get 404.
	ModelName string
	// Ready reports whether every stage is healthy (for /health).
	Ready func(ctx context.Context) error
	// MaxBodyBytes bounds request bodies (default 16 MiB).
	MaxBodyBytes int64
	// MaxConcurrent bounds requests in flight; more get 429 (default 1024).
	MaxConcurrent int
	// MaxTokensLimit rejects a max_tokens or max_completion_tokens above it
	// with 400; 0 means no limit of omnipd's own (the Thinker still refuses
	// what does not fit its context).
	MaxTokensLimit int
	// APIKey, when set, must come as "Authorization: Bearer <APIKey>" on
	// every /v1/ request; anything else gets 401.
	APIKey string
	// AuthHealth and AuthMetrics require the API key on /health and
	// /metrics as well; without them those stay open for probes and
	// scrapers.
	AuthHealth, AuthMetrics bool
	Metrics                 *metrics.Orchestrator
	Logger                  *slog.Logger
}

// Server is the public API handler.
type Server struct {
	cfg      Config
	mux      *http.ServeMux
	log      *slog.Logger
	inflight atomic.Int64
	created  int64
}

var _ http.Handler = (*Server)(nil)

// New builds the handler.
func New(cfg Config) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 16 << 20
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), log: cfg.Logger, created: time.Now().Unix()}
	s.mux.HandleFunc("POST /v1/chat/completions", s.handle(s.chat))
	s.mux.HandleFunc("POST /v1/completions", s.handle(s.completions))
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.Handle("GET /metrics", cfg.Metrics.Handler())
	return s
}

type requestIDKey struct{}

// RequestID returns the request id the server assigned to ctx's request:
// the id its stage legs carry and its log lines name.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	echo, id := requestIDs(r.Header.Get("X-Request-Id"))
	w.Header().Set("X-Request-Id", echo)
	ctx := context.WithValue(r.Context(), requestIDKey{}, id)
	if s.cfg.APIKey != "" && s.protected(r.URL.Path) && !openai.HasBearer(r, s.cfg.APIKey) {
		s.unauthorized(w, r, id)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(ctx))
}

// requestIDs returns the id to echo to the client and the id the request
// is known by inside omnipd. A client's own X-Request-Id is echoed and
// logged, but stage legs never carry it bare: the engines key KV leases,
// transfer ids and conditioning by the request id, so two requests that
// share one — by accident, or a client naming another's id — could read
// each other's KV. The suffix keeps the client's id greppable in every log.
func requestIDs(client string) (echo, id string) {
	if !validRequestID(client) {
		id = openai.NewID("")
		return id, id
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return client, client + "-" + hex.EncodeToString(b[:])
}

// protected reports whether path needs the API key: the whole OpenAI API,
// and /health and /metrics when so configured.
func (s *Server) protected(path string) bool {
	switch path {
	case "/health":
		return s.cfg.AuthHealth
	case "/metrics":
		return s.cfg.AuthMetrics
	}
	return path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// unauthorized refuses a request without the right API key. Neither the
// key nor what the client sent is logged.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, id string) {
	msg := "incorrect API key provided"
	if _, ok := openai.BearerToken(r); !ok {
		msg = "missing API key: send it as \"Authorization: Bearer <key>\""
	}
	s.log.Info("request rejected", "request_id", id, "status", http.StatusUnauthorized, "path", r.URL.Path, "reason", msg)
	s.cfg.Metrics.RecordRequest("none", http.StatusUnauthorized, 0)
	_ = openai.WriteUnauthorized(w, msg)
}

// validRequestID accepts ids that are safe to pass on in headers and logs.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// handle adapts handlers that return errors: one place maps them to
// OpenAI error bodies, logs the cause with the request id, and limits
// concurrency.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		log := s.log.With("request_id", RequestID(r.Context()))
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		w = sw
		defer func() {
			path := sw.Header().Get("X-Omnipd-Pd-Path")
			if path == "" {
				path = "none"
			}
			s.cfg.Metrics.RecordRequest(path, sw.status, time.Since(start))
		}()
		if n := s.inflight.Add(1); n > int64(s.cfg.MaxConcurrent) {
			s.inflight.Add(-1)
			w.Header().Set("Retry-After", "1")
			_ = openai.WriteError(w, openai.RateLimited("omnipd is at its limit of concurrent requests; retry shortly"))
			return
		}
		defer s.inflight.Add(-1)
		defer func() {
			if p := recover(); p != nil {
				log.Error("handler panicked", "panic", p)
				_ = openai.WriteError(w, openai.InternalError("internal error"))
			}
		}()
		err := h(w, r)
		if err == nil {
			return
		}
		var resp *openai.ErrorResponse
		var reqErr *openai.RequestError
		var orchErr *orchestrator.Error
		switch {
		case errors.As(err, &resp):
		case errors.As(err, &reqErr):
			resp = reqErr.Response()
		case errors.As(err, &orchErr):
			resp = orchErr.Response()
		case errors.Is(err, context.Canceled), errors.Is(err, stageclient.ErrCanceled):
			log.Info("client went away")
			return
		default:
			resp = openai.InternalError("internal error")
		}
		if resp.Status == http.StatusServiceUnavailable || resp.Status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		if resp.Status >= 500 {
			log.Error("request failed", "status", resp.Status, "err", err)
		} else {
			log.Info("request rejected", "status", resp.Status, "err", err)
		}
		_ = openai.WriteError(w, resp)
	}
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) error {
	req, err := openai.DecodeChatRequest(r.Body, s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	if err := s.checkClientFields(req.KVTransferParams, req.Extra); err != nil {
		return err
	}
	if err := s.checkMaxTokens("max_tokens", req.MaxTokens); err != nil {
		return err
	}
	if err := s.checkMaxTokens("max_completion_tokens", req.MaxCompletionTokens); err != nil {
		return err
	}
	return s.serve(w, r, &orchestrator.Request{ID: RequestID(r.Context()), Chat: req})
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) error {
	req, err := openai.DecodeCompletionRequest(r.Body, s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	if err := s.checkClientFields(req.KVTransferParams, req.Extra); err != nil {
		return err
	}
	if err := s.checkMaxTokens("max_tokens", req.MaxTokens); err != nil {
		return err
	}
	return s.serve(w, r, &orchestrator.Request{ID: RequestID(r.Context()), Completion: req})
}

// checkClientFields refuses the fields only omnipd may put on a stage leg.
// kv_transfer_params steer an engine's KV connector: a do_remote_prefill
// without block ids can crash vLLM, and a forged one could point a decode at
// another request's KV. They are refused wherever an engine would read them:
// at the top level, inside vllm_xargs (which vLLM copies into the same
// extra_args the connector reads), and inside a literal extra_body object (a
// client that meant the OpenAI SDK's extra_body). omnipd_conditioning would
// make a worker keep tensors under a key of the client's choosing. Refusing
// rather than dropping tells the client its field had no effect.
func (s *Server) checkClientFields(kv map[string]any, extra map[string]json.RawMessage) error {
	const why = "is set by omnipd for its stages and may not come from a client"
	if kv != nil {
		return openai.InvalidRequest("kv_transfer_params", "kv_transfer_params "+why)
	}
	if _, ok := extra["omnipd_conditioning"]; ok {
		return openai.InvalidRequest("omnipd_conditioning", "omnipd_conditioning "+why)
	}
	for _, outer := range []string{"vllm_xargs", "extra_body"} {
		raw, ok := extra[outer]
		if !ok {
			continue
		}
		var inner map[string]json.RawMessage
		if json.Unmarshal(raw, &inner) != nil {
			continue // not an object: nothing an engine reads as KV params
		}
		for _, key := range []string{"kv_transfer_params", "omnipd_conditioning"} {
			if _, ok := inner[key]; ok {
				param := outer + "." + key
				return openai.InvalidRequest(param, param+" "+why)
			}
		}
	}
	return nil
}

// checkMaxTokens enforces MaxTokensLimit on one of the output-length fields.
func (s *Server) checkMaxTokens(param string, v *int) error {
	if s.cfg.MaxTokensLimit > 0 && v != nil && *v > s.cfg.MaxTokensLimit {
		return openai.InvalidRequest(param, fmt.Sprintf("%s is %d; this server allows at most %d", param, *v, s.cfg.MaxTokensLimit))
	}
	return nil
}

func (s *Server) checkModel(model string) error {
	if model != "" && model != s.cfg.ModelName {
		return openai.ModelNotFound(model)
	}
	return nil
}

// serve runs the request and relays its answer.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, req *orchestrator.Request) error {
	start := time.Now()
	res, err := s.cfg.Orchestrator.Do(r.Context(), req)
	if err != nil {
		return err
	}
	defer res.Close()
	w.Header().Set("X-Omnipd-Pd-Path", res.Path)
	if !res.Streaming() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, err := w.Write(res.Body)
		return err
	}
	sse := openai.NewSSEWriter(w)
	events := 0
	var first time.Duration
	defer func() {
		if events > 0 {
			s.cfg.Metrics.RecordStreamTiming(first, events, time.Since(start))
		}
	}()
	for {
		ev, err := res.Next()
		if err == nil {
			if events == 0 {
				first = time.Since(start)
			}
			events++
		}
		if err != nil {
			var ue *stageclient.UpstreamError
			var oe *orchestrator.Error
			switch {
			case isEOF(err):
				// The end of the upstream leg normally came in the read that
				// brought its [DONE], and a concurrent prefill leg has
				// answered long before its decode ends, so closing the
				// result costs nothing here; then the [DONE] leaves with the
				// end of this body, in the write net/http makes when the
				// handler returns. A client that stops reading at [DONE]
				// then finds the body ended and can reuse the connection.
				// (Should the close wait, for a prefill that hangs after
				// exporting its KV, the end of the body would have waited
				// for it anyway.)
				res.Close()
				return sse.QueueDone()
			case errors.As(err, &ue) && ue.Body != nil:
				_ = sse.WriteEvent(ue.Body)
			case errors.As(err, &oe):
				// A failure the orchestrator classified mid-stream (a stage
				// that went quiet): its status and code, as an event.
				s.log.Error("stream failed", "request_id", req.ID, "err", err)
				_ = sse.WriteEvent(oe.Response())
			case r.Context().Err() != nil:
				return r.Context().Err()
			default:
				s.log.Error("decode stream failed", "request_id", req.ID, "err", err)
				_ = sse.WriteEvent(openai.Upstream(http.StatusBadGateway, "decode_stream_failed", "the decode stage's stream broke off"))
			}
			return sse.WriteDone()
		}
		// Events that reached omnipd together leave together: while the
		// next one is already here, this one waits in the response's buffer
		// for it, and the last of them flushes them all in one write. No
		// event waits for one that has not arrived.
		write := sse.WriteEvent
		if res.Buffered() {
			write = sse.Queue
		}
		if err := write(ev); err != nil {
			// The client went away mid-stream: the status is long sent, so
			// there is nothing to answer; closing the result cancels the
			// upstream legs.
			s.log.Info("client went away mid-stream", "request_id", req.ID)
			return nil
		}
	}
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"object": "list",
		"data":   []map[string]any{{"id": s.cfg.ModelName, "object": "model", "created": s.created, "owned_by": "omnipd"}},
	})
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := s.cfg.Ready(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// statusWriter remembers the status written, for the request metric, and
// passes flushes on (SSE needs them).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the underlying writer's Flush.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
