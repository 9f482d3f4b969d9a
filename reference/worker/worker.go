// Package worker serves one reference engine as a stage worker, speaking
// vLLM's OpenAI-compatible API — /v1/completions, /v1/chat/completions
// (streaming and not), /v1/models, /tokenize, /detokenize, /health,
// /metrics — with
// kv_transfer_params handled by omnipd's reference KV connector, so that the
// orchestrator drives a reference worker exactly as it drives vllm serve.
// It also serves the omni stage API (the Talker and Code2Wav stages).
//
// With a deployment secret configured, every endpoint but /health and
// /metrics requires "Authorization: Bearer <secret>" — the header stock
// vllm serve --api-key checks — so only the deployment can run the engine,
// read conditioning, or start KV transfers.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/eccache"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/sampler"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
)

// Config configures a worker. Engine is required.
type Config struct {
	Engine *engine.Engine
	// ModelName is the served model name (default "omnipd-reference").
	ModelName string
	// KV is the parsed --kv-transfer-config; nil for no KV transfer.
	KV *KVTransferConfig
	// KVListener, when set, is the KV side channel of a kv_producer or
	// kv_both worker, already bound (omnipd serve hands its workers the
	// ports it settled): the side channel serves on it instead of binding
	// KV's kv_ip:kv_port, whose port, if not 0, must be its port. The
	// worker owns it: Close closes it, and so does New when it fails.
	KVListener net.Listener
	// Secret is the deployment secret: the KV side channel requires it of
	// peers, and every HTTP endpoint but /health and /metrics requires it as
	// "Authorization: Bearer <Secret>". Empty means anyone who can reach the
	// worker may use it.
	Secret string
	// MaxModelLen bounds prompt plus output tokens (vLLM's --max-model-len;
	// default and ceiling: the model's max_position_embeddings).
	MaxModelLen int
	// MaxBodyBytes bounds request bodies (default: openai.MaxBodyBytes of
	// Media's item size and per-prompt limits, so that every prompt they
	// allow fits). omnipd serve gives the workers it starts
	// openai.MaxLegBodyBytes of its own cap, room for every leg it sends.
	MaxBodyBytes int64
	// TTSTokenIDs are the pad, bos and eos tokens whose embeddings a
	// conditioning stash carries (Qwen3-Omni's <tts_pad> 151671,
	// <tts_text_bos> 151672, <tts_text_eod> 151673). Default: the
	// checkpoint config's tts_pad_token_id, tts_bos_token_id and
	// tts_eos_token_id, else the tokenizer's tokens of those names, else none
	// (all -1: the worker serves text and refuses omnipd_conditioning). New
	// refuses an id that is another token, such as a multimodal marker.
	TTSTokenIDs [3]int
	// StashTTL bounds how long conditioning waits to be fetched (default 60 s).
	StashTTL time.Duration
	// StashReadWait bounds how long one read of a stash waits for rows not
	// there yet before it is answered without them and the reader asks
	// again (default stageconn's, 10 s).
	StashReadWait time.Duration
	// Media is what media parts the worker takes, and from where.
	Media MediaConfig
	// EC is the parsed --ec-transfer-config (encoder disaggregation): an
	// ec_producer worker encodes media items and keeps their rows, an
	// ec_consumer (a prefill) fetches them instead of encoding; nil for
	// neither.
	EC     *ECTransferConfig
	Logger *slog.Logger
}

// Server is a running worker: an http.Handler plus its KV side channel.
type Server struct {
	cfg     Config
	eng     *engine.Engine
	kv      *kvPath
	stashes *stageconn.Store
	metrics *metrics.Worker
	media   *media
	// encoded holds an encoder worker's outputs by content hash.
	encoded *eccache.Store
	// client fetches from other workers (encoder outputs).
	client  *http.Client
	mux     *http.ServeMux
	log     *slog.Logger
	created int64

	mu      sync.Mutex
	stopped bool
}

var _ http.Handler = (*Server)(nil)

// New builds a worker around a running engine and starts its KV side
// channel, if it has one.
func New(cfg Config) (_ *Server, err error) {
	if cfg.KVListener != nil {
		defer func() {
			if err != nil {
				cfg.KVListener.Close()
			}
		}()
	}
	if cfg.Engine == nil {
		return nil, errors.New("worker: no engine")
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "omnipd-reference"
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = openai.MaxBodyBytes(cfg.Media.Policy.MaxBytes, cfg.Media.Limits)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if positions := cfg.Engine.Model().Config.MaxPositionEmbeddings; cfg.MaxModelLen <= 0 {
		cfg.MaxModelLen = positions
	} else if cfg.MaxModelLen > positions {
		return nil, fmt.Errorf("worker: max model length %d exceeds the model's %d positions", cfg.MaxModelLen, positions)
	}
	// Settled before the KV side channel opens: a refusal leaves nothing running.
	ttsIDs, err := ttsTokenIDs(cfg.TTSTokenIDs, cfg.Engine.Model(), cfg.Engine.Tokenizer())
	if err != nil {
		return nil, err
	}
	cfg.TTSTokenIDs = ttsIDs
	kv, err := newKVPath(cfg.KV, cfg.KVListener, cfg.Engine, cfg.Secret, cfg.Logger)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, eng: cfg.Engine, kv: kv, log: cfg.Logger, created: time.Now().Unix(), mux: http.NewServeMux(),
		// The store's routes sit behind the worker's own secret check, like
		// every other route, so the store itself checks nothing twice.
		stashes: stageconn.NewStore(stageconn.Config{TTL: cfg.StashTTL, ReadWait: cfg.StashReadWait})}
	var leases metrics.KVLeaseStats
	if kv != nil {
		leases = kv
	}
	s.metrics = metrics.NewWorker(cfg.ModelName, engineLoad{cfg.Engine}, leases)
	if s.media, err = newMedia(cfg.Media, cfg.Engine.Tokenizer(), cfg.Engine.Model().Config.HiddenSize, s.metrics); err != nil {
		// The side channel is listening by now: a refusal leaves nothing running.
		kv.close(cfg.Logger)
		return nil, err
	}
	s.client = &http.Client{Timeout: 60 * time.Second} // the default transport, as the Talker's
	if cfg.EC != nil && cfg.EC.Role == ECProducer {
		s.encoded = eccache.NewStore(eccache.Config{TTL: cfg.StashTTL})
		s.metrics.WatchEncoderCache(s.encoded.Len)
		s.mux.Handle(stageapi.EncoderCachePath+"{key}", s.encoded.Handler())
		s.mux.Handle(stageapi.EncoderLeasePath+"{lease}", s.encoded.Handler())
	}
	s.metrics.WatchStashes(s.stashes.Len)
	s.mux.Handle(stageapi.ConditioningPath+"{key}", s.stashes.Handler())
	s.mux.HandleFunc("POST /v1/completions", s.handle(s.completions))
	s.mux.HandleFunc("POST /v1/chat/completions", s.handle(s.chatCompletions))
	s.mux.HandleFunc("POST /tokenize", s.handle(s.tokenize))
	s.mux.HandleFunc("POST /detokenize", s.handle(s.detokenize))
	s.mux.HandleFunc(kvReleaseRoute, s.handle(s.releaseKV))
	s.mux.HandleFunc("GET /v1/models", s.models)
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.Handle("GET /metrics", s.metrics.Handler())
	return s, nil
}

// KVAddr is the KV side channel's address ("host:port"), empty when the
// worker exports no KV.
func (s *Server) KVAddr() string {
	if s.kv == nil || s.kv.producer == nil {
		return ""
	}
	return s.kv.producer.Addr().String()
}

// KVStats reports the side channel's leases, for tests and diagnostics.
func (s *Server) KVStats() (leasedBlocks int, expired uint64) {
	if s.kv == nil {
		return 0, 0
	}
	return s.kv.LeasedBlocks(), s.kv.ExpiredLeases()
}

// Close stops the side channel, freeing every leased block, and an encoder
// worker's cache, freeing its outputs and stopping their expiry timer. The
// engine is the caller's to stop.
func (s *Server) Close() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.kv.close(s.log)
	if s.encoded != nil {
		s.encoded.Close()
	}
}

type engineLoad struct{ e *engine.Engine }

func (l engineLoad) Running() int { return l.e.Stats().Running }
func (l engineLoad) Waiting() int { return l.e.Stats().Waiting }
func (l engineLoad) KVCacheUsage() float64 {
	st := l.e.Stats()
	return float64(st.UsedBlocks) / float64(st.NumBlocks)
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(openai.RequestIDHeader)
	if id == "" || len(id) > 256 {
		id = openai.NewID("")
	}
	w.Header().Set(openai.RequestIDHeader, id)
	if !allowed(w, r, s.cfg.Secret, s.log) {
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
	s.mux.ServeHTTP(w, r)
}

// allowed is every stage worker's front door: with a secret, a request to
// anything but /health and /metrics must carry "Authorization: Bearer
// <secret>", or it is answered 401 before any handler runs — no engine
// work, no stash read or drop, no KV transfer. Neither the secret nor what
// the caller sent is logged.
func allowed(w http.ResponseWriter, r *http.Request, secret string, log *slog.Logger) bool {
	if secret == "" || r.URL.Path == "/health" || r.URL.Path == "/metrics" || openai.HasBearer(r, secret) {
		return true
	}
	log.Warn("refused a request without the deployment secret", "path", r.URL.Path, "remote", r.RemoteAddr,
		"request_id", r.Header.Get(openai.RequestIDHeader))
	_ = openai.WriteUnauthorized(w, "this stage worker requires the deployment secret as \"Authorization: Bearer <secret>\"")
	return false
}

// MaxModelLen is the longest prompt plus output, in tokens, the worker serves.
func (s *Server) MaxModelLen() int { return s.cfg.MaxModelLen }

// fitsContext refuses a request whose prompt and output cannot fit the
// context, with vLLM's words and numbers, before the engine sees it.
func (s *Server) fitsContext(chat bool, prompt, maxTokens int) error {
	limit := s.cfg.MaxModelLen
	switch {
	case prompt >= limit:
		return s.promptTooLong(chat, strconv.Itoa(prompt))
	case prompt+maxTokens > limit:
		// vLLM's wording (vllm/entrypoints/openai/serving_engine.py,
		// OpenAIServing._validate_input).
		return contextError(promptParam(chat), fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			maxTokens, limit, prompt, maxTokens, limit, prompt))
	}
	return nil
}

// promptTooLong is vLLM's refusal of a prompt that alone reaches the
// context (vllm/entrypoints/openai/serving_engine.py,
// OpenAIServing._validate_input). tokens is the count, or "at least N" when
// tokenizing stopped past the limit, as vLLM's renderer words its own
// truncated count (vllm/renderers/params.py).
func (s *Server) promptTooLong(chat bool, tokens string) error {
	return s.tooLong(promptParam(chat), tokens)
}

// tooLong is promptTooLong about param.
func (s *Server) tooLong(param, tokens string) error {
	return contextError(param, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %s input tokens. Please reduce the length of the input messages.",
		s.cfg.MaxModelLen, tokens))
}

// promptTokens tokenizes a completions prompt, or renders and tokenizes chat
// messages, stopping as soon as the prompt is known not to fit the context:
// the work and memory spent on a prompt are bounded by --max-model-len,
// however long its text.
func (s *Server) promptTokens(chat bool, text string, msgs []tokenizer.Message, addGenerationPrompt bool) ([]int, error) {
	limit := s.cfg.MaxModelLen - 1 // a prompt must leave room for one token
	var ids []int
	var n int
	if chat {
		ids, n = s.eng.Tokenizer().ApplyChatTemplateUpTo(msgs, addGenerationPrompt, limit)
	} else {
		ids, n = s.eng.Tokenizer().EncodeUpTo(text, limit)
	}
	if n > limit {
		return nil, s.promptTooLong(chat, "at least "+strconv.Itoa(n))
	}
	return ids, nil
}

// promptParam is the parameter that holds the prompt of a chat or a
// completions request.
func promptParam(chat bool) string {
	if chat {
		return "messages"
	}
	return "prompt"
}

func contextError(param, msg string) error {
	e := openai.InvalidRequest(param, msg)
	code := CodeContextLengthExceeded
	e.Detail.Code = &code
	return e
}

// CodeContextLengthExceeded is the error code of a request that does not fit
// the model's context, as OpenAI names it: the one openai.PromptTooLong sets.
const CodeContextLengthExceeded = openai.CodeContextLengthExceeded

type requestIDKey struct{}

// startedWriter remembers whether the answer has begun (its status went
// out), so that an error met later is not written over it.
type startedWriter struct {
	http.ResponseWriter
	started bool
}

func (w *startedWriter) WriteHeader(code int) {
	if code >= 200 {
		w.started = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *startedWriter) Write(b []byte) (int, error) {
	w.started = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer's Flush and
// deadlines.
func (w *startedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// handle adapts a handler that returns an error: one place writes the
// OpenAI error body, logs the cause with the request id, and never lets a
// panic take the process down.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		log := s.log.With("request_id", requestID(r.Context()), "path", r.URL.Path)
		w := &startedWriter{ResponseWriter: rw}
		defer func() {
			if p := recover(); p != nil {
				log.Error("handler panicked", "panic", p)
				if !w.started {
					_ = openai.WriteError(w, openai.InternalError("internal error"))
				}
			}
		}()
		err := h(w, r)
		if err == nil {
			return
		}
		if w.started {
			// The status is long sent (a stream under way): an error body
			// now would land in the middle of it. The stream's own error
			// event (responder.fail) is the client's word.
			log.Error("request failed after its answer began", "err", err)
			return
		}
		var resp *openai.ErrorResponse
		var reqErr *openai.RequestError
		var pErr *paramError
		var spErr *sampler.ParamError
		switch {
		case errors.As(err, &resp):
		case errors.As(err, &reqErr):
			resp = reqErr.Response()
		case errors.As(err, &pErr):
			resp = openai.InvalidRequest(openai.KVTransferParamsMember, pErr.Error())
		case errors.As(err, &spErr):
			resp = openai.InvalidRequest(spErr.Param, spErr.Msg)
		case errors.Is(err, engine.ErrPromptTooLong), errors.Is(err, engine.ErrInvalidRequest):
			resp = openai.InvalidRequest("prompt", err.Error())
		case errors.Is(err, engine.ErrKVLoad):
			resp = openai.InternalError(err.Error())
		case errors.Is(err, engine.ErrClosed):
			resp = openai.Unavailable("the engine is shutting down")
		case errors.Is(err, context.Canceled):
			log.Debug("client went away")
			return
		default:
			resp = openai.InternalError(err.Error())
		}
		s.metrics.RecordError(resp.Status)
		if resp.Status >= 500 {
			log.Error("request failed", "err", err)
		} else {
			log.Info("request rejected", "err", err)
		}
		_ = openai.WriteError(w, resp)
	}
}

// models is vLLM's model list (openai.ModelCard): the served model, its
// root (the served name itself, as omnipd serve lists it), no parent (it
// is no adapter), the worker's max_model_len — which omnipd serve reads
// when it is not told one — and vLLM's one permission.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	name, n := s.cfg.ModelName, s.cfg.MaxModelLen
	writeJSON(w, http.StatusOK, openai.ModelList{Object: "list", Data: []openai.ModelCard{{
		ID: name, Object: "model", Created: s.created, OwnedBy: "omnipd", Root: &name, MaxModelLen: &n,
		Permission: []openai.ModelPermission{openai.NewModelPermission(time.Now().Unix())},
	}}})
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// tokenize is vLLM's POST /tokenize: the prompt's token ids and count, for a
// completions prompt or chat messages (with the generation prompt).
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Model               string `json:"model"`
		Prompt              *string
		Messages            []struct{ Role, Content string }
		AddGenerationPrompt *bool `json:"add_generation_prompt"`
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if err := json.NewDecoder(body).Decode(&req); err != nil {
		return openai.InvalidRequest("", "invalid JSON: "+err.Error())
	}
	if req.Model != "" && req.Model != s.cfg.ModelName {
		return openai.ModelNotFound(req.Model)
	}
	// Tokenizing stops past max_model_len: a text that long is refused
	// like a prompt, so that counting costs no more than serving.
	var ids []int
	var n int
	limit := s.cfg.MaxModelLen
	switch {
	case req.Prompt != nil:
		ids, n = s.eng.Tokenizer().EncodeUpTo(*req.Prompt, limit)
	case len(req.Messages) > 0:
		msgs := make([]tokenizer.Message, len(req.Messages))
		for i, m := range req.Messages {
			msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		ids, n = s.eng.Tokenizer().ApplyChatTemplateUpTo(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt, limit)
	default:
		return openai.InvalidRequest("prompt", "give a prompt or messages")
	}
	if n > limit {
		return s.promptTooLong(req.Prompt == nil, "at least "+strconv.Itoa(n))
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids})
	return nil
}

// Stashes is the number of conditioning stashes the worker holds.
func (s *Server) Stashes() int { return s.stashes.Len() }

// EncoderOutputs is how many media items' encoder outputs an encoder
// worker holds for prefills to fetch (0 for other workers).
func (s *Server) EncoderOutputs() int {
	if s.encoded == nil {
		return 0
	}
	return s.encoded.Len()
}
