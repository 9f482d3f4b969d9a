// Package server is omnipd's public HTTP API: OpenAI's chat completions and
// completions (streaming and not), /v1/models, /health and /metrics, with
// request ids, API keys, limits, and OpenAI error bodies. It hands each
// request to the orchestrator and relays the answer; SSE events are passed on
// as they arrive, never held for later ones (events that arrive together
// leave together, in one write).
//
// It also serves vLLM's /version, and vLLM's /tokenize and /detokenize,
// which it passes on to a Thinker instance. Every request gets one access
// line in the log.
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
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/omnipd/omnipd/internal/buildinfo"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/orchestrator"
)

// Orchestrator is what the server needs of the orchestrator.
type Orchestrator interface {
	Do(ctx context.Context, req *orchestrator.Request) (*orchestrator.Result, error)
}

var _ Orchestrator = (*orchestrator.Orchestrator)(nil)

// Tokenizer is what /tokenize and /detokenize need: a Thinker instance to
// pass vLLM's request to. An Orchestrator that is one (the orchestrator
// is) serves them; without it they are not routes.
type Tokenizer interface {
	Tokenize(ctx context.Context, path, requestID string, body []byte) ([]byte, error)
}

var _ Tokenizer = (*orchestrator.Orchestrator)(nil)

// Config configures the server. The zero value of every limit has a
// working default.
type Config struct {
	Orchestrator Orchestrator
	// ModelName is the model the API serves; requests naming another get 404.
	ModelName string
	// Ready reports whether every stage is healthy (for /health).
	Ready func(ctx context.Context) error
	// MaxBodyBytes bounds request bodies (default: openai.MaxBodyBytes of
	// vLLM's default media limits, room for one largest item of each
	// modality). A body over it is answered 413 — at once when its
	// Content-Length says so — and what the client still sends is read and
	// dropped (up to drainBytes, within the body timeout) so that a client
	// that writes its whole body before reading hears the 413.
	MaxBodyBytes int64
	// MaxModelLen is the Thinker's context, prompt plus output, in tokens;
	// 0 when unknown. /v1/models reports it, and a token-id prompt that
	// cannot fit it is refused with vLLM's 400 before its ids are decoded.
	MaxModelLen int
	// WriteTimeout bounds each write of an answer: a client that reads
	// nothing for this long, a stream's included, is dropped, which frees
	// its place and cancels its stage legs. It is reset before every write,
	// so it never cuts a stream the client keeps reading (default
	// DefaultWriteTimeout; negative: none).
	WriteTimeout time.Duration
	// Version is what /version reports (default buildinfo.Version()).
	Version string
	// BodyTimeout bounds the read of a request's whole body, from the end
	// of its headers (default DefaultBodyTimeout; negative: none). A body
	// not in by then is answered 408. It bounds only the body: the answer,
	// a stream of minutes included, has no deadline.
	BodyTimeout time.Duration
	// MaxConcurrent bounds requests in flight; more get 429 (default 1024).
	// A request takes its place once its body is in and valid, so clients
	// still sending their bodies hold none.
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
		cfg.MaxBodyBytes = openai.MaxBodyBytes(0, nil)
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 1024
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	switch {
	case cfg.WriteTimeout == 0:
		cfg.WriteTimeout = DefaultWriteTimeout
	case cfg.WriteTimeout < 0:
		cfg.WriteTimeout = 0
	}
	if cfg.Version == "" {
		cfg.Version = buildinfo.Version()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), log: cfg.Logger, created: time.Now().Unix()}
	s.mux.HandleFunc("POST /v1/chat/completions", s.handle(s.chat))
	s.mux.HandleFunc("POST /v1/completions", s.handle(s.completions))
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("GET /version", s.version)
	if tok, ok := cfg.Orchestrator.(Tokenizer); ok {
		s.mux.HandleFunc("POST "+orchestrator.TokenizePath, s.handle(s.tokenizer(tok, orchestrator.TokenizePath)))
		s.mux.HandleFunc("POST "+orchestrator.DetokenizePath, s.handle(s.tokenizer(tok, orchestrator.DetokenizePath)))
	}
	s.mux.HandleFunc("GET /health", s.health)
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics.Handler())
	}
	return s
}

// DefaultBodyTimeout is Config.BodyTimeout's default: Traefik's read
// timeout for a whole request since v2.11.2. At that bound a 25 MiB audio
// clip's base64 needs about 4.7 Mbit/s, and a body at the default cap
// (122 MiB) about 17 Mbit/s.
const DefaultBodyTimeout = 60 * time.Second

// DefaultWriteTimeout is Config.WriteTimeout's default: nginx's
// send_timeout, which bounds the same thing — the wait between two
// successive writes to a client, not the whole answer. A write waits only
// once the client's receive window and the socket's buffer are full, so a
// client that reads at any pace never meets it; one that has read nothing
// for a minute has stopped.
const DefaultWriteTimeout = 60 * time.Second

// ServeHTTP gives the request its ids, bounds every write of its answer,
// checks the API key and routes it; its access line is logged when it
// ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ex := newExchange(r.Header.Get(openai.RequestIDHeader))
	w.Header().Set(openai.RequestIDHeader, ex.clientID)
	sw := newStatusWriter(w, ex, s.cfg.WriteTimeout)
	defer s.logAccess(r, sw, ex)
	r = r.WithContext(context.WithValue(r.Context(), exchangeKey{}, ex))
	if s.cfg.APIKey != "" && s.protected(r.URL.Path) && !openai.HasBearer(r, s.cfg.APIKey) {
		s.unauthorized(sw, r)
		return
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		s.noRoute(sw, r, h)
		return
	}
	h.ServeHTTP(sw, r)
}

// noRoute answers a request no route takes — an unknown path (404), or a
// known one with another method (405, with the mux's Allow) — with OpenAI's
// error body, as every other error. The 404 is worded as OpenAI's API words
// it ("Invalid URL (GET /v1/nope)"). vLLM answers both through its
// HTTPException handler as {"error": {"message": "Not Found", "type": "Not
// Found", "code": 404}} (vllm/entrypoints/serve/utils/server_utils.py,
// http_exception_handler); omnipd keeps OpenAI's type and a string code,
// which OpenAI's SDKs read.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request, mux http.Handler) {
	probe := &headerProbe{header: http.Header{}}
	mux.ServeHTTP(probe, r) // the mux's own answer, for its status and Allow
	e := openai.InvalidURL(r.Method, r.URL.Path)
	if probe.status == http.StatusMethodNotAllowed {
		allow := probe.header.Get("Allow")
		w.Header().Set("Allow", allow)
		e = openai.MethodNotAllowed(fmt.Sprintf("Method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
	}
	s.requestLog(r.Context()).Info("request rejected", "status", e.Status, "method", r.Method, "path", r.URL.Path)
	s.cfg.Metrics.RecordRequest("none", e.Status, 0)
	_ = openai.WriteError(w, e)
}

// headerProbe is a ResponseWriter that keeps only the status and headers.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) WriteHeader(code int)        { p.status = code }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }

// requestIDs returns the id the client knows the request by and the id it
// is known by inside omnipd. A client's own X-Request-Id is echoed, names
// the answer ("chatcmpl-" + client, as vLLM names it) and is logged, but
// stage legs never carry it bare: the engines key KV leases, transfer ids
// and conditioning by the request id, so two requests that share one — by
// accident, or a client naming another's id — could read each other's KV.
// The legs carry it with a suffix of omnipd's, which keeps the client's id
// greppable in every log line, the stages' included. Without a usable
// X-Request-Id both are one fresh id.
func requestIDs(fromClient string) (client, id string) {
	if !validRequestID(fromClient) {
		id = openai.NewID("")
		return id, id
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fromClient, fromClient + "-" + hex.EncodeToString(b[:])
}

// protected reports whether path needs the API key: the whole OpenAI API;
// /tokenize and /detokenize, which vLLM leaves open (its key guards only
// /v1) but which run the model's tokenizer for anyone and tell what it is;
// and /health and /metrics when so configured. /version stays open, as in
// vLLM.
func (s *Server) protected(path string) bool {
	switch path {
	case "/health":
		return s.cfg.AuthHealth
	case "/metrics":
		return s.cfg.AuthMetrics
	case orchestrator.TokenizePath, orchestrator.DetokenizePath:
		return true
	}
	return path == "/v1" || strings.HasPrefix(path, "/v1/")
}

// unauthorized refuses a request without the right API key. Neither the
// key nor what the client sent is logged.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request) {
	msg := "incorrect API key provided"
	if _, ok := openai.BearerToken(r); !ok {
		msg = "missing API key: send it as \"Authorization: Bearer <key>\""
	}
	s.requestLog(r.Context()).Info("request rejected", "status", http.StatusUnauthorized, "path", r.URL.Path, "reason", msg)
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
// OpenAI error bodies, logs the cause with the request id, and counts the
// request — a client that went away as StatusClientClosedRequest, under the
// path it had reached.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		log := s.requestLog(r.Context())
		ex := exchangeOf(r.Context())
		start := time.Now()
		sw, ok := w.(*statusWriter)
		if !ok {
			sw = newStatusWriter(w, ex, s.cfg.WriteTimeout)
		}
		defer func() {
			path := sw.Header().Get(openai.PDPathHeader)
			if path == "" {
				path = "none"
			}
			status := sw.status
			if ex.cancelled {
				status = metrics.StatusClientClosedRequest
			}
			s.cfg.Metrics.RecordRequest(path, status, time.Since(start))
		}()
		defer func() {
			if p := recover(); p != nil {
				log.Error("handler panicked", "panic", p)
				if !sw.wrote {
					_ = openai.WriteError(sw, openai.InternalError("internal error"))
				}
			}
		}()
		err := h(sw, r)
		var resp *openai.ErrorResponse
		var reqErr *openai.RequestError
		var bodyErr *bodyError
		var orchErr *orchestrator.Error
		switch {
		case err == nil:
			// Answered — unless the client left before the end of it.
			ex.cancelled = r.Context().Err() != nil
			return
		case errors.As(err, &bodyErr):
			// Checked before the context: net/http cancels it on any failed
			// read of the connection, a body timeout or a half-close among
			// them, while the client may still be there to read the answer.
			if bodyErr.resp == nil {
				ex.cancelled = true
				log.Info("client went away while sending its body", "err", bodyErr.cause)
				return
			}
			resp = bodyErr.resp
			// What is left of the body must not be read as the next request.
			sw.Header().Set("Connection", "close")
		case errors.As(err, &resp):
		case errors.As(err, &reqErr):
			resp = reqErr.Response()
		case sw.timedOut:
			// Before the context, which net/http cancels once the
			// connection breaks: this client stopped reading.
			ex.cancelled = true
			s.cfg.Metrics.RecordClientWriteTimeout()
			log.Info("client stopped reading its answer; dropped after the write timeout", "write_timeout", s.cfg.WriteTimeout, "err", err)
			return
		case r.Context().Err() != nil:
			// Whatever a stage answered a request whose client left (an
			// aborted leg looks like a failed one), nobody reads it.
			ex.cancelled = true
			log.Info("client went away", "err", err)
			return
		case errors.As(err, &orchErr):
			// Before the cancellation errors: a stage that went quiet is
			// cancelled by omnipd, and its error wraps that cancellation.
			resp = orchErr.Response()
		case errors.Is(err, errClientGone), errors.Is(err, context.Canceled), errors.Is(err, orchestrator.ErrCanceled):
			ex.cancelled = true
			log.Info("client went away", "err", err)
			return
		default:
			resp = openai.InternalError("internal error")
		}
		if sw.wrote {
			// The status is long sent (a stream): nothing to answer with.
			log.Error("request failed after its answer began", "err", err)
			return
		}
		if resp.Status == http.StatusServiceUnavailable || resp.Status == http.StatusTooManyRequests {
			sw.Header().Set("Retry-After", "1")
		}
		unread := resp.Status == http.StatusRequestEntityTooLarge && !ex.bodyRead
		if unread {
			// The rest of the body is dropped after the answer, and the
			// connection closed: it must not be read as the next request.
			sw.Header().Set("Connection", "close")
			_ = http.NewResponseController(sw).EnableFullDuplex()
		}
		if resp.Status >= 500 {
			log.Error("request failed", "status", resp.Status, "err", err)
		} else {
			log.Info("request rejected", "status", resp.Status, "err", err)
		}
		_ = openai.WriteError(sw, resp)
		if unread {
			s.drain(sw, r)
		}
	}
}

// drainBytes bounds what drain reads of a refused body: this, or the body
// cap when it is larger. Dropping bytes costs no memory, and the body
// timeout bounds the time, so the bound is generous: many times what
// loopback and LAN sockets buffer, which is what a client's write needs
// read before it completes. A client that sends more than that past the
// cap has its connection closed on it instead.
const drainBytes = 256 << 20

// drain reads and drops what the client of a refused body still sends,
// once the answer is out, until the body ends, drainBytes (or the cap, if
// more) have come, or the body timeout passes. A client that writes its
// whole body before it reads (Python's urllib; SDKs that then retry)
// would otherwise meet a connection closed on its unread bytes: the
// kernel answers those with a reset, which makes the client's write fail
// and can destroy the answer before the client reads it. refuse in
// http.go lingers the same way for refused connections.
func (s *Server) drain(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	timeout := s.cfg.BodyTimeout
	if timeout <= 0 {
		timeout = DefaultBodyTimeout
	}
	if err := rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return
	}
	n, err := io.CopyN(io.Discard, r.Body, max(s.cfg.MaxBodyBytes, drainBytes))
	s.requestLog(r.Context()).Debug("dropped the rest of a refused body", "bytes", n, "err", err)
}

// errClientGone says the client went away mid-answer.
var errClientGone = errors.New("client went away")

// bodyError is a request body that could not be read: resp is what the
// client is told, nil when the client is gone.
type bodyError struct {
	resp  *openai.ErrorResponse
	cause error
}

func (e *bodyError) Error() string { return "reading request body: " + e.cause.Error() }
func (e *bodyError) Unwrap() error { return e.cause }

// decodeBody decodes r's body with decode, which reads it once, within
// BodyTimeout and MaxBodyBytes. The deadline is the connection's read
// deadline, set through http.ResponseController and lifted once the body is
// in, so it bounds a client that trickles its body and nothing after it.
func decodeBody[T any](s *Server, w http.ResponseWriter, r *http.Request, decode func(io.Reader, int64) (T, error)) (T, error) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		// Refused before a byte of it is read (the handler drains it).
		var zero T
		e := openai.RequestTooLarge(s.cfg.MaxBodyBytes)
		e.Detail.Message = fmt.Sprintf("the request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, s.cfg.MaxBodyBytes)
		return zero, e
	}
	rc := http.NewResponseController(w)
	if s.cfg.BodyTimeout > 0 {
		if err := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)); err != nil {
			var zero T
			return zero, fmt.Errorf("setting the body deadline: %w", err)
		}
	}
	req, err := decode(&bodyReader{s: s, r: r, ex: exchangeOf(r.Context())}, s.cfg.MaxBodyBytes)
	var bodyErr *bodyError
	if s.cfg.BodyTimeout > 0 && !errors.As(err, &bodyErr) {
		// On a failed read the deadline stays: what net/http reads of the
		// rest must fail at once, not wait on the client.
		_ = rc.SetReadDeadline(time.Time{})
	}
	return req, err
}

// bodyReader is r's body, its read errors turned into *bodyError.
type bodyReader struct {
	s  *Server
	r  *http.Request
	ex *exchange
	n  int // bytes read so far
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Body.Read(p)
	b.n += n
	if err == io.EOF {
		b.ex.bodyRead = true
	}
	if err != nil && err != io.EOF {
		return n, &bodyError{resp: b.s.bodyFailure(b.r, b.n, err), cause: err}
	}
	return n, err
}

// bodyFailure is what a client is told when its body could not be read
// after n bytes: nil when it is gone (the connection reset).
func (s *Server) bodyFailure(r *http.Request, n int, err error) *openai.ErrorResponse {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		e := openai.InvalidRequest("", fmt.Sprintf("the request body did not arrive within %v (%d bytes came)", s.cfg.BodyTimeout, n))
		e.Status = http.StatusRequestTimeout
		code := openai.CodeRequestTimeout
		e.Detail.Code = &code
		return e
	case errors.Is(err, io.ErrUnexpectedEOF):
		// The client closed its side (or the connection) short of its
		// Content-Length: a malformed request, the client's to fix.
		return openai.InvalidRequest("", fmt.Sprintf("the request body ended after %d of the %d bytes its Content-Length announced", n, r.ContentLength))
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return nil
	}
	// Malformed chunked encoding and the like.
	return openai.InvalidRequest("", "the request body could not be read: "+err.Error())
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody(s, w, r, openai.DecodeChatRequest)
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
	o := stageRequest(r.Context())
	o.Chat = req
	return s.serve(w, r, o)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody(s, w, r, func(body io.Reader, limit int64) (*openai.CompletionRequest, error) {
		return openai.DecodeCompletionRequestWithin(body, limit, s.cfg.MaxModelLen)
	})
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
	o := stageRequest(r.Context())
	o.Completion = req
	return s.serve(w, r, o)
}

// stageRequest is the orchestrator's request for the request of ctx. Its
// legs carry the internal id, unique even when clients reuse theirs; its
// answer and every chunk of it is named after the client's id
// ("chatcmpl-" + X-Request-Id), as vLLM names an answer after the
// X-Request-Id it was given (vllm/entrypoints/openai/serving_chat.py at
// 99c5632f: "chatcmpl-" + _base_request_id, which is the header's value
// when there is one).
func stageRequest(ctx context.Context) *orchestrator.Request {
	ex := exchangeOf(ctx)
	return &orchestrator.Request{ID: ex.id, PublicID: ex.clientID}
}

// checkClientFields refuses the fields only omnipd may put on a stage leg.
// kv_transfer_params steer an engine's KV connector: a do_remote_prefill
// without block ids can crash vLLM, and a forged one could point a decode at
// another request's KV. They are refused wherever an engine would read them:
// at the top level, inside vllm_xargs (which vLLM copies into the same
// extra_args the connector reads), and inside a literal extra_body object (a
// client that meant the OpenAI SDK's extra_body). omnipd_conditioning would
// make a worker keep tensors under a key of the client's choosing, and
// omnipd_encoder_cache would make a prefill fetch from a URL of the
// client's choosing. Refusing rather than dropping tells the client its
// field had no effect.
// stageOnlyFields are omnipd's own fields on stage legs.
var stageOnlyFields = []string{openai.ConditioningMember, openai.EncoderCacheMember}

func (s *Server) checkClientFields(kv map[string]any, extra map[string]json.RawMessage) error {
	const why = "is set by omnipd for its stages and may not come from a client"
	if kv != nil {
		return openai.InvalidRequest(openai.KVTransferParamsMember, openai.KVTransferParamsMember+" "+why)
	}
	for _, key := range stageOnlyFields {
		if _, ok := extra[key]; ok {
			return openai.InvalidRequest(key, key+" "+why)
		}
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
		for _, key := range append([]string{openai.KVTransferParamsMember}, stageOnlyFields...) {
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

// serve runs the request and relays its answer, in one of the
// MaxConcurrent places: taken here, once the request is read and checked,
// so that clients still sending their bodies hold none.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, req *orchestrator.Request) error {
	if err := s.takePlace(); err != nil {
		return err
	}
	defer s.inflight.Add(-1)
	ex := exchangeOf(r.Context())
	start := time.Now()
	res, err := s.cfg.Orchestrator.Do(r.Context(), req)
	if err != nil {
		return err
	}
	defer res.Close()
	w.Header().Set(openai.PDPathHeader, res.Path)
	if !res.Streaming() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if _, err := w.Write(res.Body); err != nil {
			return fmt.Errorf("%w: %v", errClientGone, err)
		}
		return nil
	}
	sse := openai.NewSSEWriter(w)
	ex.streamed = true
	defer func() {
		if ex.events > 0 {
			s.cfg.Metrics.RecordStreamTiming(ex.firstEvent, ex.events, time.Since(start))
		}
	}()
	for {
		ev, err := res.Next()
		if err == nil {
			if ex.events == 0 {
				ex.firstEvent = time.Since(start)
			}
			ex.events++
		}
		if err != nil {
			stageErr := orchestrator.StageErrorBody(err)
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
			case stageErr != nil:
				_ = sse.WriteEvent(stageErr)
			case errors.As(err, &oe):
				// A failure the orchestrator classified mid-stream (a stage
				// that went quiet): its status and code, as an event.
				s.requestLog(r.Context()).Error("stream failed", "err", err)
				_ = sse.WriteEvent(oe.Response())
			case r.Context().Err() != nil:
				return r.Context().Err()
			default:
				s.requestLog(r.Context()).Error("decode stream failed", "err", err)
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
			return fmt.Errorf("%w mid-stream: %v", errClientGone, err)
		}
	}
}

// takePlace takes one of the MaxConcurrent places, or refuses with 429.
// The caller gives it back with s.inflight.Add(-1).
func (s *Server) takePlace() error {
	if n := s.inflight.Add(1); n > int64(s.cfg.MaxConcurrent) {
		s.inflight.Add(-1)
		return openai.RateLimited("omnipd is at its limit of concurrent requests; retry shortly")
	}
	return nil
}

// models is vLLM's model list: the served model, with its root (what it
// serves, here the served name itself), no parent (it is no adapter), the
// Thinker's max_model_len (null when unknown) and vLLM's one permission.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	name := s.cfg.ModelName
	card := openai.ModelCard{
		ID: name, Object: "model", Created: s.created, OwnedBy: "omnipd", Root: &name,
		Permission: []openai.ModelPermission{openai.NewModelPermission(time.Now().Unix())},
	}
	if n := s.cfg.MaxModelLen; n > 0 {
		card.MaxModelLen = &n
	}
	writeJSON(w, openai.ModelList{Object: "list", Data: []openai.ModelCard{card}})
}

// version is vLLM's GET /version, with omnipd's version.
func (s *Server) version(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, openai.VersionResponse{Version: s.cfg.Version})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// tokenizer serves vLLM's /tokenize or /detokenize (path) by passing the
// request, checked to be a JSON object naming the served model (or none),
// to a Thinker instance: the shapes are the Thinker's own, vLLM's
// TokenizeRequest and DetokenizeRequest. It takes a place like any
// request.
func (s *Server) tokenizer(tok Tokenizer, path string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		body, err := decodeBody(s, w, r, openai.ReadObject)
		if err != nil {
			return err
		}
		if model, _ := openai.MemberValue(body, "model"); model != nil {
			name, ok := model.(string)
			if !ok {
				return openai.InvalidRequest("model", "expected a string")
			}
			if err := s.checkModel(name); err != nil {
				return err
			}
		}
		if err := s.takePlace(); err != nil {
			return err
		}
		defer s.inflight.Add(-1)
		out, err := tok.Tokenize(r.Context(), path, RequestID(r.Context()), body)
		if err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		if _, err := w.Write(out); err != nil {
			return fmt.Errorf("%w: %v", errClientGone, err)
		}
		return nil
	}
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := s.cfg.Ready(ctx); err != nil {
			s.requestLog(r.Context()).Info("not ready", "err", err)
			_ = openai.WriteError(w, openai.Unavailable("not ready: "+err.Error()))
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
