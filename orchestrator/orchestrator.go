// Package orchestrator owns a request's life across the Thinker's stages:
// the PD control path (a prefill leg that leaves the prompt's KV cache with
// the prefill engine, then a decode leg that imports it and generates), with
// the KV routing metadata each connector's contract asks for, replica
// choice, retries, and cancellation. It speaks to stages only through
// stageclient and never touches the engines' data paths.
package orchestrator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/stageapi"
	"github.com/omnipd/omnipd/stageclient"
)

// Paths a request can take, reported in the openai.PDPathHeader header.
const (
	PathDisaggregated = "disaggregated"
	PathDecodeOnly    = "decode-only"
	PathColocated     = "colocated"
	PathFallback      = "fallback"
)

// Error is a failure the client sees: an HTTP status, a stable code and a
// message, with the cause kept for the log.
type Error struct {
	Status int
	Code   string
	Msg    string
	Cause  error
	// Upstream is the stage's own error body, relayed for 4xx answers.
	Upstream *openai.ErrorResponse
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Msg, e.Cause)
	}
	return e.Code + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Cause }

// Response converts e into the OpenAI error body the client gets.
func (e *Error) Response() *openai.ErrorResponse {
	if e.Status == 429 && e.Upstream == nil {
		r := openai.RateLimited(e.Msg)
		r.Detail.Code = &e.Code
		return r
	}
	if e.Upstream != nil && e.Status < 500 {
		r := *e.Upstream
		r.Status = e.Status
		return &r
	}
	return openai.Upstream(e.Status, e.Code, e.Msg)
}

// Instance is one running engine of a stage.
type Instance struct {
	Client *stageclient.Client
	Peer   kvconnector.Peer
	// Supervised says omnipd itself starts and restarts this instance (a
	// reference worker under serve): when it refuses connections it is
	// taken to be restarting. Otherwise (an external engine) it is
	// reported as unreachable, at its URL.
	Supervised bool

	inflight     atomic.Int64
	ejectedUntil atomic.Int64  // unix nanoseconds its sit-out ends; untilHealthy (rotation.go)
	ejectedAt    atomic.Int64  // unix nanoseconds of its last sit-out
	rank         atomic.Uint64 // legs pinned so far, for nextRank (dp.go)
	rel          releaseCache  // its vLLM release (claim.go)
	probed       probeState    // what the health probe last saw (probe.go)
}

// Pool is a stage's instances.
type Pool struct {
	Name      string
	Instances []*Instance
	// MaxQueue bounds the legs omnipd has on each instance at once — sent
	// and not yet answered, whether the engine runs them or queues them; a
	// request that finds every instance at the bound gets 429. A PD
	// request's decode leg counts from the moment its decode instance is
	// chosen, before its prefill runs. 0: no bound.
	MaxQueue int
	// Logger receives the probe's changes of an instance's state (out of
	// rotation and why, back in); nil is slog.Default().
	Logger *slog.Logger
	next   atomic.Uint64
}

// Config wires an orchestrator. The zero Contract means the Thinker is
// colocated: Decode holds its instances and Prefill is empty.
type Config struct {
	Prefill, Decode *Pool
	// Encoder, when set, is the encoder stage of E/P/D: each media item of
	// a request is encoded there before the prefill (encoder.go).
	Encoder  *Pool
	Contract kvconnector.Contract
	// PrefillRetries is how many other prefill instances a failed prefill
	// leg is retried on (connect errors, 502, 503, 504).
	PrefillRetries int
	// PrefillTimeout bounds one prefill attempt (default 60 s).
	PrefillTimeout time.Duration
	// StageIdleTimeout bounds how long every other stage leg (the decode or
	// colocated Thinker, the Talker, Code2Wav) may send nothing: the wait
	// for a stream's next event, the first included, and the wait for a
	// whole answer — so it must exceed the longest non-streamed
	// generation. A stage that stays silent longer gets the client a 504,
	// or an error event on a stream already under way, instead of a hang.
	// Zero means DefaultStageIdleTimeout; negative disables it.
	StageIdleTimeout time.Duration
	// MinPrefillTokens sends prompts shorter than this to the decode alone
	// (conditional disaggregation; 0 disaggregates every request).
	MinPrefillTokens int
	// FallbackLocal lets the decode prefill itself when every prefill
	// attempt failed, instead of failing the request. Counted and logged.
	FallbackLocal bool
	Metrics       *metrics.Orchestrator
	// KVReady receives the done notices of a connector whose producer
	// announces each transfer out of band (kvconnector.DoneNotifier:
	// LMCache PD mode). Required with such a contract.
	KVReady KVReady
	// Omni, when set, serves audio through the Talker and Code2Wav.
	Omni   *Omni
	Logger *slog.Logger
	Now    func() time.Time
}

// Orchestrator serves requests across the configured stages.
type Orchestrator struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	// releases runs the calls that free what ended requests left behind.
	releases *releaser
	// afterPrefill, when set (tests), runs between a sequential request's legs.
	afterPrefill func()
}

// New builds an orchestrator.
func New(cfg Config) (*Orchestrator, error) {
	if cfg.Decode == nil || len(cfg.Decode.Instances) == 0 {
		return nil, errors.New("orchestrator: no decode (or colocated Thinker) instances")
	}
	if cfg.Contract != nil && (cfg.Prefill == nil || len(cfg.Prefill.Instances) == 0) {
		return nil, errors.New("orchestrator: a KV connector but no prefill instances")
	}
	if _, ok := cfg.Contract.(kvconnector.DoneNotifier); ok && cfg.KVReady == nil {
		// Without the notices the decode would be sent before its KV landed.
		return nil, fmt.Errorf("orchestrator: %s announces transfers out of band and nothing receives the notices", cfg.Contract.Name())
	}
	if cfg.PrefillTimeout <= 0 {
		cfg.PrefillTimeout = 60 * time.Second
	}
	if cfg.StageIdleTimeout == 0 {
		cfg.StageIdleTimeout = DefaultStageIdleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Orchestrator{cfg: cfg, log: cfg.Logger, now: cfg.Now, releases: newReleaser(releaseWorkers, releaseQueue, cfg.Metrics)}, nil
}

// Request is one client request, already decoded and validated.
type Request struct {
	ID string
	// PublicID, when set, is the id the client knows the request by (its
	// X-Request-Id): the answer and every chunk of it are named after it
	// ("chatcmpl-" + PublicID), while the legs carry ID. Empty: ID.
	PublicID string
	// Exactly one of Chat and Completion is set.
	Chat       *openai.ChatCompletionRequest
	Completion *openai.CompletionRequest

	// keep, on omni requests, says where the Thinker legs keep their
	// conditioning for the Talker.
	keep *conditioning
	// encoded names the request's encoder outputs for the prefill leg
	// (E/P/D with reference encoders); encoders lists the encoder
	// instances its legs were sent to, whose lease ends with the request.
	encoded  []encoderHandle
	encoders func() []string
}

func (r *Request) path() string {
	if r.Chat != nil {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// publicID is the answer's id the client sees, whatever id the legs
// carried: "chatcmpl-" or "cmpl-" and the client's id for the request
// (PublicID, else ID), as vLLM names an answer after its X-Request-Id
// (vllm/entrypoints/openai/serving_chat.py, _base_request_id), so that it
// is the id omnipd's log lines carry as client_request_id.
func (r *Request) publicID() string {
	if r.Chat != nil {
		return "chatcmpl-" + r.clientID()
	}
	return "cmpl-" + r.clientID()
}

// clientID is the id the client knows the request by.
func (r *Request) clientID() string { return cmp.Or(r.PublicID, r.ID) }

func (r *Request) streaming() bool {
	if r.Chat != nil {
		return r.Chat.Stream != nil && *r.Chat.Stream
	}
	return r.Completion.Stream != nil && *r.Completion.Stream
}

// Result is the answer: a whole body, or a stream of SSE events to relay.
type Result struct {
	Path   string
	Body   []byte
	Stream *stageclient.Stream
	// idle bounds the wait for each of Stream's events.
	idle *watchdog
	// publicID is the id every relayed chunk of Stream carries to the
	// client (see openai.Relay).
	publicID string
	// events and eventErr carry an omni stream the orchestrator assembles.
	events   <-chan json.RawMessage
	eventErr <-chan error
	// release must be called when the caller is done with the result.
	release func()
	// sitOut, when set, is told that the stage failed mid-stream — it went
	// quiet past the idle timeout, or its stream broke off — so that its
	// instance sits out.
	sitOut func()
}

// Streaming reports whether the result is a stream (read it with Next).
func (r *Result) Streaming() bool { return r.Stream != nil || r.events != nil }

// Next returns the next SSE event of a streaming result; io.EOF at the end.
func (r *Result) Next() (json.RawMessage, error) {
	if r.Stream != nil {
		if r.Stream.Buffered() {
			// Already here: there is no wait for the idle clock to bound.
			ev, err := r.Stream.Next()
			if err != nil {
				return nil, err
			}
			return r.relay(ev)
		}
		r.idle.arm()
		ev, err := r.Stream.Next()
		r.idle.disarm()
		if err != nil && r.stageFailed(err) && r.sitOut != nil {
			r.sitOut()
		}
		if err != nil && r.idle.fired() {
			return nil, r.idle.err(err)
		}
		if err != nil {
			return nil, err
		}
		return r.relay(ev)
	}
	ev, ok := <-r.events
	if ok {
		return ev, nil
	}
	select {
	case err := <-r.eventErr:
		return nil, err
	default:
		return nil, io.EOF
	}
}

// stageFailed reports a stream's error as the stage's own failure: it
// went quiet, or the stream broke off — not its end, an error event the
// stage sent, or the leg being closed by the client or the caller.
func (r *Result) stageFailed(err error) bool {
	var ue *stageclient.UpstreamError
	switch {
	case r.idle.fired():
		return true
	case errors.Is(err, io.EOF), errors.As(err, &ue):
		return false
	}
	return r.idle == nil || r.idle.ctx.Err() == nil
}

// relay turns a relayed stream's chunk into the client's (openai.Relay).
func (r *Result) relay(ev json.RawMessage) (json.RawMessage, error) {
	out, err := openai.Relay(ev, r.publicID)
	if err != nil {
		return nil, &Error{Status: 502, Code: "decode_upstream_invalid", Msg: "the Thinker streamed a chunk that is not a JSON object", Cause: err}
	}
	return out, nil
}

// Buffered reports whether a streaming result's next event is already
// here, so Next will return without waiting on a stage: for a relayed
// stream, an event that arrived in the same read as the last one (see
// stageclient.Stream.Buffered); for an omni stream the orchestrator
// assembles, an event waiting in its channel. Only Next's goroutine may ask.
// A relay sends at once when it is false, and while it is true may hold an
// event back to go out with the next.
func (r *Result) Buffered() bool {
	if r.Stream != nil {
		return r.Stream.Buffered()
	}
	return len(r.events) > 0
}

// Close releases what the result holds (the upstream stream, the
// instance's in-flight count).
func (r *Result) Close() {
	if r.Stream != nil {
		r.Stream.Close()
	}
	if r.release != nil {
		r.release()
		r.release = nil
	}
}

// Do serves req. The caller must Close the result.
func (o *Orchestrator) Do(ctx context.Context, req *Request) (*Result, error) {
	log := o.log.With("request_id", req.ID, "client_request_id", req.clientID())
	if o.cfg.Omni != nil && req.Chat != nil {
		if _, wantAudio := modalities(req.Chat); wantAudio {
			return o.omni(ctx, req, log)
		}
	}
	return o.text(ctx, req, log)
}

// text serves the Thinker's part of a request.
func (o *Orchestrator) text(ctx context.Context, req *Request, log *slog.Logger) (*Result, error) {
	if o.cfg.Contract == nil {
		return o.decode(ctx, req, PathColocated, log)
	}
	return o.disaggregated(ctx, req, log)
}

// disaggregated runs the PD control path, after the encoder legs of
// E/P/D; the encoder outputs are released when the request ends (a prefill
// retried on another instance fetches them again meanwhile).
func (o *Orchestrator) disaggregated(ctx context.Context, req *Request, log *slog.Logger) (*Result, error) {
	hs, err := o.encode(ctx, req, log)
	if err != nil {
		return nil, err
	}
	req.encoded = hs
	res, err := o.prefillThenDecode(ctx, req, log)
	if req.encoders != nil {
		if err != nil {
			o.releaseEncoded(req, log)
		} else {
			done := res.release
			res.release = func() {
				if done != nil {
					done()
				}
				o.releaseEncoded(req, log)
			}
		}
	}
	return res, err
}

// prefillThenDecode runs the prefill and decode legs.
func (o *Orchestrator) prefillThenDecode(ctx context.Context, req *Request, log *slog.Logger) (*Result, error) {
	// The decode leg is counted from here, before the prefill runs: its
	// KV is addressed to dec, so a request that could not then decode on
	// dec is refused before any KV is exported for it.
	dec, err := o.take(o.cfg.Decode, nil)
	if err != nil {
		return nil, err
	}
	pl := newPDPlan(req, dec)
	if o.cfg.MinPrefillTokens > 0 && !claimsEveryPrompt(o.cfg.Contract) && o.short(ctx, req, dec, log) {
		o.cfg.Metrics.RecordDecodeOnly()
		return o.decodeAnywhere(ctx, req, pl, PathDecodeOnly, log)
	}
	for {
		// A decode that refused the connection after its prefill had
		// addressed the KV to it ends a plan with errReplanned: the next
		// plan runs on another decode instance (redecode.go).
		res, err := o.planOnce(ctx, req, pl, log)
		if !errors.Is(err, errReplanned) {
			return res, err
		}
	}
}

// planOnce runs one plan of a PD request: the prefill, then the decode on
// pl.dec, onto which the caller has counted the decode leg.
func (o *Orchestrator) planOnce(ctx context.Context, req *Request, pl *pdPlan, log *slog.Logger) (*Result, error) {
	c := o.cfg.Contract
	if c.Dispatch() == kvconnector.Concurrent {
		res, err := o.concurrent(ctx, req, pl, log)
		if err != nil && !errors.Is(err, errReplanned) {
			return o.fallback(ctx, req, pl, err, log)
		}
		return res, err
	}
	pre, prefillParams, err := o.prefill(ctx, req, &pl.h, log)
	if err != nil {
		o.track(o.cfg.Decode, pl.dec, -1)
		return o.fallback(ctx, req, pl, err, log)
	}
	handedOver := o.now()
	if o.afterPrefill != nil {
		o.afterPrefill()
	}
	params, err := c.DecodeParams(pl.h, prefillParams)
	if err != nil {
		o.track(o.cfg.Decode, pl.dec, -1)
		return nil, &Error{Status: 502, Code: "invalid_prefill_handoff", Msg: "the prefill's kv_transfer_params cannot start the decode", Cause: err}
	}
	for _, key := range kvconnector.Absent(c, params) {
		// An engine older than the contract (NIXL before remote_request_id)
		// or a simulator: the decode finds the KV under its own request id,
		// which is the prefill's. Counted so that the version skew shows.
		o.cfg.Metrics.RecordHandoffWithout(c.Name(), key)
		log.Debug("the prefill's kv_transfer_params lack a key this engine version does without", "key", key)
	}
	if ctx.Err() != nil {
		o.track(o.cfg.Decode, pl.dec, -1)
		// The client left between the legs: the prefill's KV is exported
		// and nobody would claim it before its lease runs out. Release it,
		// or let the decode claim it and stop, as vLLM deployments must.
		if !o.releaseKV(pre, pl.h, log) {
			o.claimAndDrop(req, pl.dec, pl.h, params, claimAbandoned, log)
		}
		return nil, ctx.Err()
	}
	if err := o.awaitKV(ctx, pl.h); err != nil {
		o.track(o.cfg.Decode, pl.dec, -1)
		return nil, err
	}
	res, err := o.decodeOn(ctx, req, pl.dec, pl.h, params, PathDisaggregated, log)
	for refused(err) && ctx.Err() == nil {
		// Nothing reached the decode: the leg goes to another decode
		// instance, or the request is planned again (redecode.go).
		var next *Instance
		next, params, err = o.redecode(req, pl, pre, func(h kvconnector.Handoff) (map[string]any, error) {
			return c.DecodeParams(h, prefillParams)
		}, err, log)
		if next == nil {
			break
		}
		res, err = o.decodeOn(ctx, req, pl.dec, pl.h, params, PathDisaggregated, log)
	}
	if errors.Is(err, errReplanned) {
		return nil, err
	}
	if err != nil && o.releaseKV(pre, pl.h, log) {
		// Whatever stopped the decode leg — the client leaving before the
		// decode claimed the KV, the decode refusing or failing — the
		// KV is not going to be used: released at once.
		return nil, err
	}
	if rejected(err) {
		// The decode refused what the prefill accepted (a max_tokens past
		// its context, say) before importing: the exported KV would wait
		// out its lease, unless the decode's release frees it (claim.go).
		// Claim it with a leg shaped like the prefill's.
		o.claimAndDrop(req, pl.dec, pl.h, params, claimRejected, log)
	}
	if err == nil && res.Stream != nil {
		o.cfg.Metrics.RecordHandoff(o.now().Sub(handedOver))
	}
	return res, err
}

// KVReady waits for a producer's out-of-band done notices.
type KVReady interface {
	// Await returns once n notices under key have arrived (counting those
	// that came before the call), or with ctx's error.
	Await(ctx context.Context, key string, n int) error
}

// awaitKV holds the decode leg until the producer said its KV has landed,
// for contracts that say so out of band (LMCache PD: the receiver exposes
// chunks before they are written, so an early decode reads garbage or
// recomputes). Bounded by PrefillTimeout: a sender whose push failed never
// notifies, and the client must not hang on it.
func (o *Orchestrator) awaitKV(ctx context.Context, h kvconnector.Handoff) error {
	dn, ok := o.cfg.Contract.(kvconnector.DoneNotifier)
	if !ok {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, o.cfg.PrefillTimeout)
	defer cancel()
	err := o.cfg.KVReady.Await(wctx, dn.DoneKey(h), dn.DoneCount(h))
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return &Error{Status: 504, Code: "prefill_upstream_timeout", Msg: "the prefill did not report its KV transfer done in time", Cause: err}
}

// rejected reports a decode leg the decode refused as a bad request.
func rejected(err error) bool {
	var oe *Error
	return errors.As(err, &oe) && oe.Code == "decode_rejected"
}

// fallback decides what a failed prefill means for the client: the error,
// or — with pd.fallback: local — the decode prefilling itself. Never silent:
// counted, logged, and named in the response's path header.
func (o *Orchestrator) fallback(ctx context.Context, req *Request, pl *pdPlan, err error, log *slog.Logger) (*Result, error) {
	var oe *Error
	if !o.cfg.FallbackLocal || ctx.Err() != nil || !errors.As(err, &oe) || oe.Status < 500 || !strings.HasPrefix(oe.Code, "prefill_") {
		return nil, err
	}
	if claimsEveryPrompt(o.cfg.Contract) {
		// This decode cannot prefill for itself: it would wait for ever for
		// KV no prefill sends. Deploy configs refuse pd.fallback: local
		// with such a connector; an embedder's config gets the prefill's
		// failure, as without a fallback.
		log.Warn("prefill failed; no local fallback: the connector's decode claims every prompt's KV", "connector", o.cfg.Contract.Name(), "err", err)
		return nil, err
	}
	if err := o.admit(o.cfg.Decode, pl.dec); err != nil {
		return nil, err
	}
	o.cfg.Metrics.RecordFallback()
	log.Warn("prefill failed; the decode prefills this request itself (pd.fallback: local)", "err", err)
	if req.keep != nil {
		// The decode's rows now cover the prompt: the Talker reads them
		// alone, and whatever the failed prefill stashed is freed.
		if h, ok := req.keep.dropPrefill(); ok {
			o.freeStashes([]stageapi.ConditioningHandle{h}, log)
		}
	}
	return o.decodeAnywhere(ctx, req, pl, PathFallback, log)
}

// claimsEveryPrompt reports whether c's decode loads remote KV for every
// request (kvconnector.PromptClaimer), so it must never go without its
// prefill: pd.min_prefill_tokens and pd.fallback: local do not apply.
func claimsEveryPrompt(c kvconnector.Contract) bool {
	pc, ok := c.(kvconnector.PromptClaimer)
	return ok && pc.ClaimsEveryPrompt()
}

// short reports whether the prompt is below pd.min_prefill_tokens. A cheap
// upper bound (one token per byte, plus the chat markers) settles most
// prompts; the rest are counted by the decode's /tokenize.
func (o *Orchestrator) short(ctx context.Context, req *Request, dec *Instance, log *slog.Logger) bool {
	bound := 0
	var body map[string]any
	if req.Chat != nil {
		var msgs []map[string]string
		for _, m := range req.Chat.Messages {
			text := m.Text()
			bound += len(m.Role) + len(text) + 4
			msgs = append(msgs, map[string]string{"role": m.Role, "content": text})
		}
		bound += 11
		body = map[string]any{"model": req.Chat.Model, "messages": msgs, "add_generation_prompt": true}
	} else {
		p := req.Completion.Prompt
		if p != nil && len(p.TokenIDs) == 1 {
			return len(p.TokenIDs[0]) < o.cfg.MinPrefillTokens
		}
		if p == nil || len(p.Texts) != 1 {
			return false
		}
		bound = len(p.Texts[0])
		body = map[string]any{"model": req.Completion.Model, "prompt": p.Texts[0]}
	}
	if bound < o.cfg.MinPrefillTokens {
		return true
	}
	raw, _ := json.Marshal(body)
	dog := o.watch(ctx, "decode")
	dog.arm()
	resp, err := dec.Client.Post(dog.ctx, "/tokenize", req.ID, raw)
	dog.stop()
	if err != nil {
		log.Warn("could not count the prompt's tokens; disaggregating it", "err", err)
		return false
	}
	var counted struct {
		Count int `json:"count"`
	}
	if json.Unmarshal(resp.Body, &counted) != nil {
		return false
	}
	return counted.Count < o.cfg.MinPrefillTokens
}

// claimAndDrop sends a decode leg nobody waits for, detached from the
// client, so that the decode imports (and so frees) the exported KV. The leg
// is shaped like the prefill's — one token, one choice, nothing that ends it
// early — so a decode that would take the prefill's request takes it.
// Unless the decode's engine frees the KV itself for this cause (claimWanted).
func (o *Orchestrator) claimAndDrop(req *Request, dec *Instance, h kvconnector.Handoff, params map[string]any, cause claimCause, log *slog.Logger) {
	one := 1
	drop := *req
	drop.keep = nil // nobody will fetch this leg's conditioning
	if req.Chat != nil {
		c := req.Chat.Clone()
		c.MaxTokens, c.MaxCompletionTokens, c.Stream, c.StreamOptions = &one, nil, nil, nil
		prefillSampling(&c.SamplingParams)
		delete(c.Extra, "min_completion_tokens")
		drop.Chat = c
	} else {
		c := req.Completion.Clone()
		c.MaxTokens, c.Stream, c.StreamOptions = &one, nil, nil
		prefillSampling(&c.SamplingParams)
		delete(c.Extra, "min_completion_tokens")
		drop.Completion = c
	}
	// The claim counts onto the decode like any leg, but past the queue
	// bound if need be: it is one token, it only frees KV the prefill
	// holds, and refusing it would leave that KV to its lease.
	o.track(o.cfg.Decode, dec, +1)
	queued := o.background(releaseClaim, log, func(ctx context.Context) {
		if !o.claimWanted(ctx, dec, cause, log) {
			o.track(o.cfg.Decode, dec, -1)
			return
		}
		if res, err := o.decodeOn(ctx, &drop, dec, h, params, PathDisaggregated, log); err != nil {
			log.Warn("could not hand back the KV of a request that will not use it; it is freed when its lease expires", "err", err)
		} else {
			res.Close()
		}
	}, "decode", dec.Client.BaseURL())
	if !queued {
		o.track(o.cfg.Decode, dec, -1)
	}
}

// releaseKV tells the prefill instance pre to drop what it exported for h,
// when the connector has a release call (kvconnector.Releaser: omnipd's
// reference connector), in the background: the request is gone, and
// nothing waits for the answer. The release is by key, so it is safe
// whatever the prefill has done by then — exported, still computing
// (the export is then refused), or already claimed by the decode (nothing
// to free). It reports whether a release was sent; vLLM's connectors have
// none, and their unclaimed KV waits for the engine's own timeout.
func (o *Orchestrator) releaseKV(pre *Instance, h kvconnector.Handoff, log *slog.Logger) bool {
	r, ok := o.cfg.Contract.(kvconnector.Releaser)
	if !ok || pre == nil {
		return false
	}
	key := r.LeaseKey(h)
	o.background(releaseKVLease, log, func(ctx context.Context) {
		if err := pre.Client.ReleaseKV(ctx, h.RequestID, key); err != nil {
			log.Warn("could not release the KV of a request that will not use it; it is freed when its lease expires",
				"instance", pre.Client.BaseURL(), "key", key, "err", err)
		}
	}, "instance", pre.Client.BaseURL(), "key", key)
	return true
}

// concurrent sends prefill and decode at once (Mooncake, reference push):
// the decode waits for its KV on the data path. A failed prefill cancels
// the decode; a retryable failure starts both legs again with another
// prefill instance, up to PrefillRetries times, and a prefill instance that
// refused the connection is passed over without counting against them (it
// received nothing). A decode that refused the connection moves to another
// decode instance (redecode.go).
func (o *Orchestrator) concurrent(ctx context.Context, req *Request, pl *pdPlan, log *slog.Logger) (*Result, error) {
	tried := map[*Instance]bool{}
	var refusing []*Instance
	var last error
	var lastPre *Instance
	retries := 0
	decCounted := true // prefillThenDecode counted the first attempt's decode leg
	defer func() {
		if decCounted {
			o.track(o.cfg.Decode, pl.dec, -1)
		}
	}()
	for {
		pre, err := o.take(o.cfg.Prefill, tried)
		if err != nil {
			last = err
			break
		}
		if pre == nil {
			break
		}
		if len(refusing) > 0 && refusing[len(refusing)-1] == lastPre {
			o.refusedRetry(o.cfg.Prefill, lastPre, pre, last, log)
		}
		if !decCounted {
			if err := o.admit(o.cfg.Decode, pl.dec); err != nil {
				o.track(o.cfg.Prefill, pre, -1)
				last = err
				break
			}
		}
		decCounted = false // concurrentOnce releases both legs
		res, retryable, err := o.concurrentOnce(ctx, req, pl, pre, log)
		if err == nil {
			return res, nil
		}
		if errors.Is(err, errReplanned) {
			// The prefill was addressed to the decode that refused: both
			// legs run again on the plan's new decode, which redecode
			// counted, any prefill instance allowed (this one failed
			// nothing).
			return nil, err
		}
		last, lastPre = err, pre
		tried[pre] = true
		if ctx.Err() != nil {
			break
		}
		if retryable && refused(err) {
			// The prefill refused the connection (a decode that did is
			// never retryable here: redecode has dealt with it).
			refusing = append(refusing, pre)
			continue
		}
		if !retryable || retries >= o.cfg.PrefillRetries {
			break
		}
		retries++
		o.cfg.Metrics.RecordPrefillRetry()
		log.Warn("prefill failed; retrying both legs with another prefill instance", "instance", pre.Client.BaseURL(), "attempt", retries, "err", err)
	}
	if len(refusing) > 1 && refusing[len(refusing)-1] == lastPre {
		return nil, unreachableAll("prefill", refusing, last)
	}
	return nil, last
}

// concurrentOnce runs both legs once against one prefill instance.
// retryable reports a prefill failure another instance may not have.
func (o *Orchestrator) concurrentOnce(ctx context.Context, req *Request, pl *pdPlan, pre *Instance, log *slog.Logger) (*Result, bool, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	pl.h.Prefill, pl.h.PrefillRank = pre.Peer, pre.nextRank()
	h := pl.h
	params, err := o.cfg.Contract.DecodeParams(h, nil)
	if err != nil {
		cancel(err)
		o.track(o.cfg.Prefill, pre, -1)
		o.track(o.cfg.Decode, pl.dec, -1)
		return nil, false, &Error{Status: 502, Code: "invalid_prefill_handoff", Msg: "the connector cannot address the prefill", Cause: err}
	}
	var wg sync.WaitGroup
	var prefillErr error
	var prefillRetryable bool
	wg.Go(func() {
		_, prefillRetryable, prefillErr = o.prefillOn(ctx, req, pre, h, log)
		if prefillErr != nil {
			cancel(prefillErr)
		}
	})
	res, err := o.decodeOn(ctx, req, pl.dec, pl.h, params, PathDisaggregated, log)
	for refused(err) && ctx.Err() == nil {
		// The decode refused the connection while the prefill runs: the
		// decode leg goes to another decode instance, or — the prefill
		// addressed to the one that refused — both legs stop and run
		// again on another (redecode.go).
		var next *Instance
		next, params, err = o.redecode(req, pl, nil, func(h kvconnector.Handoff) (map[string]any, error) {
			return o.cfg.Contract.DecodeParams(h, nil)
		}, err, log)
		if next == nil {
			break
		}
		res, err = o.decodeOn(ctx, req, pl.dec, pl.h, params, PathDisaggregated, log)
	}
	if err != nil {
		// Stop the prefill leg too: a prefill that went on to export
		// would leave KV that no decode is coming for. If the prefill
		// failed first, its error is the cause and the decode's failure
		// only followed from it.
		cancel(err)
		wg.Wait()
		// The prefill may have exported (or be about to) for a decode that
		// is not coming: with the push handshake in flight, or the client
		// gone before the decode registered.
		released := false
		if !refused(prefillErr) { // a prefill that refused the connection holds nothing
			released = o.releaseKV(pre, h, log)
		}
		if prefillErr != nil && context.Cause(ctx) == prefillErr {
			return nil, prefillRetryable, o.prefillFailure(prefillErr, pre)
		}
		if prefillErr == nil && rejected(err) && !released {
			// The prefill exported before the decode refused: claim it.
			o.claimAndDrop(req, pl.dec, pl.h, params, claimRejected, log)
		}
		return nil, false, err
	}
	// The decode answered: its KV arrived, so the prefill is done or about
	// to be; the result keeps the context alive until the caller closes it.
	prev := res.release
	res.release = func() {
		wg.Wait()
		cancel(nil)
		if prev != nil {
			prev()
		}
	}
	return res, false, nil
}

// prefill runs the prefill leg with retries on other instances: up to
// PrefillRetries after failures the instance may have seen, and past any
// number of instances that refused the connection, which saw nothing.
func (o *Orchestrator) prefill(ctx context.Context, req *Request, h *kvconnector.Handoff, log *slog.Logger) (*Instance, any, error) {
	tried := map[*Instance]bool{}
	var refusing []*Instance
	var last error
	var lastIn *Instance
	retries := 0
	for {
		in, err := o.take(o.cfg.Prefill, tried)
		if err != nil {
			last = err
			break
		}
		if in == nil {
			break
		}
		if refused(last) && lastIn != nil {
			o.refusedRetry(o.cfg.Prefill, lastIn, in, last, log)
		}
		tried[in] = true
		h.Prefill, h.PrefillRank = in.Peer, in.nextRank()
		params, retryable, err := o.prefillOn(ctx, req, in, *h, log)
		if err == nil {
			return in, params, nil
		}
		last, lastIn = err, in
		if ctx.Err() != nil {
			break
		}
		if refused(err) {
			refusing = append(refusing, in)
			continue
		}
		if !retryable || retries >= o.cfg.PrefillRetries {
			break
		}
		retries++
		o.cfg.Metrics.RecordPrefillRetry()
		log.Warn("prefill failed; retrying on another instance", "instance", in.Client.BaseURL(), "attempt", retries, "err", err)
	}
	if refused(last) && len(refusing) > 1 {
		return nil, nil, unreachableAll("prefill", refusing, last)
	}
	return nil, nil, o.prefillFailure(last, lastIn)
}

// prefillFailure turns the last prefill error, from instance in, into what
// the client sees.
func (o *Orchestrator) prefillFailure(err error, in *Instance) error {
	var oe *Error
	if errors.As(err, &oe) {
		return oe
	}
	if errors.Is(err, stageclient.ErrCanceled) || errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(err, stageclient.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Status: 504, Code: "prefill_upstream_timeout", Msg: "the prefill stage did not answer in time", Cause: err}
	}
	if e := credentialRefused("prefill", err); e != nil {
		return e
	}
	var ue *stageclient.UpstreamError
	if errors.As(err, &ue) && ue.Status < 500 {
		return &Error{Status: ue.Status, Code: "prefill_rejected", Msg: "the prefill stage rejected the request", Cause: err, Upstream: ue.Body}
	}
	if e := unreachable("prefill", in, err); e != nil {
		return e
	}
	return &Error{Status: 502, Code: "prefill_upstream_unavailable", Msg: "no prefill instance could serve the request", Cause: err}
}

// prefillOn sends the prefill leg to one instance: the client's request
// with one output token, no streaming, no stops, and the connector's
// producer params. It returns the response's kv_transfer_params. The leg
// is already counted onto in (take); prefillOn releases it.
func (o *Orchestrator) prefillOn(ctx context.Context, req *Request, in *Instance, h kvconnector.Handoff, log *slog.Logger) (params any, retryable bool, err error) {
	body, err := prefillBody(req, o.cfg.Contract.PrefillParams(h))
	if err != nil {
		o.track(o.cfg.Prefill, in, -1)
		return nil, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.cfg.PrefillTimeout)
	defer cancel()
	pid, _ := o.cfg.Contract.RequestIDs(h)
	if req.keep != nil {
		// The leg keeps its conditioning where it is written: a refused
		// leg stashed nothing.
		ctx = onWritten(ctx, func() { req.keep.setPrefill(in.Client.BaseURL()) })
	}
	resp, err := in.Client.PostWith(ctx, req.path(), pid, rankHeader(in, h.PrefillRank), body)
	o.track(o.cfg.Prefill, in, -1)
	if refused(err) {
		// Nothing reached the instance: it exported nothing, and the leg
		// may go to another instance whatever PrefillRetries says.
		in.sitOutUntilHealthy(o.now())
		return nil, true, err
	}
	if req.keep != nil {
		// The leg reached the instance, or may have: whatever it stashed
		// is there (the trace may report the write after the answer).
		req.keep.setPrefill(in.Client.BaseURL())
	}
	if err != nil {
		var ue *stageclient.UpstreamError
		if !errors.As(err, &ue) || ue.Status >= 500 {
			// The leg may have reached the engine and exported — the
			// answer cut off or never read, the client gone — so whatever
			// it left is released (a prefill that refused the request
			// exported nothing).
			o.releaseKV(in, h, log)
		}
		retry := errors.Is(err, stageclient.ErrConnect) || (errors.As(err, &ue) && ue.Retryable()) ||
			(errors.Is(err, stageclient.ErrTimeout) && ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.Canceled))
		if retry {
			in.eject(o.now())
		}
		return nil, retry, err
	}
	in.ok()
	// Only this member matters here; the rest of the answer (its choice,
	// perhaps logprobs or prompt token ids) is not decoded.
	v, err := openai.MemberValue(resp.Body, openai.KVTransferParamsMember)
	if err != nil {
		return nil, false, &Error{Status: 502, Code: "invalid_prefill_handoff", Msg: "the prefill's response is not a JSON object with decodable kv_transfer_params", Cause: err}
	}
	return v, false, nil
}

// track moves an instance's in-flight count and its gauge.
func (o *Orchestrator) track(p *Pool, in *Instance, delta int) {
	in.inflight.Add(int64(delta))
	o.cfg.Metrics.AddInFlight(p.Name, in.Client.BaseURL(), delta)
}

// decode sends the client's request to a colocated Thinker instance.
func (o *Orchestrator) decode(ctx context.Context, req *Request, path string, log *slog.Logger) (*Result, error) {
	in, err := o.take(o.cfg.Decode, nil)
	if err != nil {
		return nil, err
	}
	return o.decodeAnywhere(ctx, req, &pdPlan{dec: in, h: kvconnector.Handoff{RequestID: req.ID}}, path, log)
}

// decodeAnywhere sends a decode leg that carries no KV (colocated,
// decode-only, pd.fallback: local) to pl.dec, and to another decode
// instance for as long as the one it went to refused the connection.
func (o *Orchestrator) decodeAnywhere(ctx context.Context, req *Request, pl *pdPlan, path string, log *slog.Logger) (*Result, error) {
	res, err := o.decodeOn(ctx, req, pl.dec, pl.h, nil, path, log)
	for refused(err) && ctx.Err() == nil {
		next, ferr := o.failover(o.cfg.Decode, "decode", pl.dec, pl.refusedDecodes(), err, log)
		if next == nil {
			return nil, ferr
		}
		pl.dec, pl.h.Decode, pl.h.DecodeRank = next, next.Peer, next.nextRank()
		res, err = o.decodeOn(ctx, req, pl.dec, pl.h, nil, path, log)
	}
	return res, err
}

// decodeOn sends a decode leg to in, onto which the caller has already
// counted it (take or admit); the count is released when the leg ends.
func (o *Orchestrator) decodeOn(ctx context.Context, req *Request, in *Instance, h kvconnector.Handoff, params map[string]any, path string, log *slog.Logger) (*Result, error) {
	body, err := decodeBody(req, params)
	if err != nil {
		o.track(o.cfg.Decode, in, -1)
		return nil, err
	}
	id := req.ID
	if o.cfg.Contract != nil && path == PathDisaggregated {
		_, id = o.cfg.Contract.RequestIDs(h)
	}
	var header http.Header
	if o.cfg.Contract != nil {
		// A PD decode leg runs on the rank its Handoff names; a colocated
		// Thinker's rank is left to vLLM's own balancer.
		header = rankHeader(in, h.DecodeRank)
	}
	dog := o.watch(ctx, "decode")
	lctx := dog.ctx
	if req.keep != nil {
		// The leg's stash can be read once the leg is with the instance —
		// not before: a leg refused at connect goes to another instance,
		// and a whole answer's early Talker (async chunk) must read there.
		lctx = onWritten(lctx, func() { req.keep.setThinker(in.Client.BaseURL()) })
	}
	release := func() {
		dog.stop()
		o.track(o.cfg.Decode, in, -1)
	}
	// A leg that reached the instance, or may have, has its stash there,
	// whatever the trace said when.
	reached := func(err error) {
		if req.keep != nil && !refused(err) {
			req.keep.setThinker(in.Client.BaseURL())
		}
	}
	dog.arm()
	if req.streaming() {
		s, err := in.Client.StreamWith(lctx, req.path(), id, header, body)
		dog.disarm()
		reached(err)
		if err != nil {
			release()
			return nil, o.decodeFailure(in, dog, err)
		}
		in.ok()
		// An instance that fails mid-stream sits out, as one that fails
		// before answering does (decodeFailure): once its broken leg ends
		// it would look idle and draw the next requests.
		sitOut := func() { in.eject(o.now()) }
		return &Result{Path: path, Stream: s, idle: dog, release: release, publicID: req.publicID(), sitOut: sitOut}, nil
	}
	resp, err := in.Client.PostWith(lctx, req.path(), id, header, body)
	release()
	reached(err)
	if err != nil {
		return nil, o.decodeFailure(in, dog, err)
	}
	in.ok()
	answer, err := openai.Relay(resp.Body, req.publicID())
	if err != nil {
		return nil, &Error{Status: 502, Code: "decode_upstream_invalid", Msg: "the Thinker's answer is not a JSON object", Cause: err}
	}
	return &Result{Path: path, Body: answer}, nil
}

// decodeFailure classifies a failed decode leg. An instance that could not
// be reached sits out, so that the requests after this one go to another
// instance: one that refused the connection until it is seen healthy
// again, one whose connection ended before any answer for a while
// (rotation.go).
func (o *Orchestrator) decodeFailure(in *Instance, dog *watchdog, err error) error {
	if dog.fired() {
		// Quiet past the idle timeout: it sits out too, so that the next
		// requests do not wait on it in turn.
		in.eject(o.now())
		return dog.err(err)
	}
	if refused(err) {
		in.sitOutUntilHealthy(o.now())
		return unreachable("decode", in, err)
	}
	if errors.Is(err, stageclient.ErrConnect) {
		in.eject(o.now())
		return unreachable("decode", in, err)
	}
	return decodeFailure(err)
}

func decodeFailure(err error) error {
	if errors.Is(err, stageclient.ErrCanceled) || errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(err, stageclient.ErrTimeout) {
		return &Error{Status: 504, Code: "decode_upstream_timeout", Msg: "the decode stage did not answer in time", Cause: err}
	}
	if e := credentialRefused("decode", err); e != nil {
		return e
	}
	var ue *stageclient.UpstreamError
	if errors.As(err, &ue) && ue.Status < 500 {
		return &Error{Status: ue.Status, Code: "decode_rejected", Msg: "the decode stage rejected the request", Cause: err, Upstream: ue.Body}
	}
	if errors.Is(err, stageclient.ErrConnect) {
		// The instance is down (a supervised worker restarts): fail fast
		// with a status that tells clients to retry.
		return &Error{Status: 503, Code: "decode_unavailable", Msg: "the decode stage is restarting; retry shortly", Cause: err}
	}
	return &Error{Status: 502, Code: "decode_upstream_unavailable", Msg: "the decode stage failed", Cause: err}
}
