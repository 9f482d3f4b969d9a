// Package engine is omnipd's embedded reference engine: a tiny Qwen3
// Thinker served with a paged KV cache and a continuous-batching scheduler,
// exact enough that prefill/decode disaggregation can be proved correct
// against it bit for bit. It knows nothing about HTTP; the worker package
// serves it.
//
// One goroutine (Run) owns the scheduler state. Requests enter through
// Submit and leave through their event channel; a cancelled context aborts
// a request at the next step and frees its blocks.
//
// With Config.Simulate the engine skips the model and keeps the pace of a
// modeled GPU instead (simulate.go), for benchmarks of the system around it.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/sampler"
	"github.com/omnipd/omnipd/reference/engine/simulate"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
)

// Errors a request can end with.
var (
	// ErrPromptTooLong: the prompt cannot fit the KV cache or the model's context.
	ErrPromptTooLong = errors.New("prompt too long")
	// ErrKVLoad: importing the prompt's KV cache from the prefill failed
	// (kv_load_failure_policy "fail"); retryable.
	ErrKVLoad = errors.New("KV cache load failed")
	// ErrClosed: the engine stopped.
	ErrClosed = errors.New("engine closed")
	// ErrInvalidRequest: the request names tokens or layers the model does not have.
	ErrInvalidRequest = errors.New("invalid request")
)

// Config sizes the engine. The zero value works.
type Config struct {
	// BlockSize is the number of token positions per KV block (default 16).
	BlockSize int
	// NumBlocks is the KV cache size in blocks (default 4096).
	NumBlocks int
	// MaxNumSeqs bounds the sequences in flight in one step (default 64).
	MaxNumSeqs int
	// MaxNumBatchedTokens bounds the tokens computed in one step (default 2048).
	MaxNumBatchedTokens int
	// Parallelism is how many sequences are computed at once (default GOMAXPROCS).
	Parallelism int
	Logger      *slog.Logger
	// Simulate, when set, runs the engine in simulate mode (simulate.go):
	// no forward pass, each step timed by this latency profile. The
	// profile's batching caps apply where MaxNumSeqs and
	// MaxNumBatchedTokens are not set.
	Simulate *simulate.Profile
	// Clock times simulated steps and KV transfers (default: the wall clock).
	Clock Clock
}

func (c Config) withDefaults() Config {
	if p := c.Simulate; p != nil {
		if c.MaxNumSeqs <= 0 {
			c.MaxNumSeqs = p.MaxNumSeqs
		}
		if c.MaxNumBatchedTokens <= 0 {
			c.MaxNumBatchedTokens = p.MaxNumBatchedTokens
		}
	}
	if c.Clock == nil {
		c.Clock = WallClock{}
	}
	if c.BlockSize <= 0 {
		c.BlockSize = kvcache.DefaultBlockSize
	}
	if c.NumBlocks <= 0 {
		c.NumBlocks = 4096
	}
	if c.MaxNumSeqs <= 0 {
		c.MaxNumSeqs = 64
	}
	if c.MaxNumBatchedTokens <= 0 {
		c.MaxNumBatchedTokens = 2048
	}
	if c.Parallelism <= 0 {
		c.Parallelism = runtime.GOMAXPROCS(0)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// KVImport fetches a prompt's KV cache from a prefill worker into dst, the
// blocks the engine allocated for the first numTokens positions. It returns
// how many positions the remote blocks hold.
type KVImport func(ctx context.Context, dst []int) (numTokens int, err error)

// KVExport takes ownership of a finished prefill's blocks (holding
// numTokens positions). On error the engine frees them itself.
type KVExport func(blocks []int, numTokens int) error

// Request is one generation.
type Request struct {
	ID     string
	Prompt []int
	Params sampler.Params
	// Import, when set, makes this a decode of a disaggregated request: the
	// KV cache of all prompt positions but the last comes from the prefill,
	// and the engine computes exactly the last prompt position.
	Import KVImport
	// RecomputeOnImportFailure selects kv_load_failure_policy "recompute"
	// instead of "fail".
	RecomputeOnImportFailure bool
	// Export, when set, hands the prompt's blocks to the KV data path when
	// the request finishes instead of freeing them.
	Export KVExport
	// CaptureLayer, when > 0, asks for the per-position conditioning: the
	// layer-0 embeddings and the hidden states after that layer.
	CaptureLayer int
	// StreamRows, with CaptureLayer, hands each event the rows computed
	// since the one before (Event.Rows), for a stage that streams them
	// (async chunk); without it only the last event carries them, whole.
	StreamRows bool
	// Multimodal, when set, is what the prompt's media add to its tokens:
	// rotary positions and encoder rows at the placeholders.
	Multimodal *Multimodal
}

// Multimodal is a multimodal prompt's inputs beyond its token ids.
type Multimodal struct {
	// Positions are the prompt's TM-RoPE positions (temporal, height,
	// width), one per prompt token; a generated token at sequence index i
	// takes i + Delta on every row.
	Positions [][3]int
	Delta     int
	// Placeholder marks the prompt positions whose input is an encoder
	// row rather than their token's embedding.
	Placeholder []bool
	// Encode returns those rows, one per prompt position (nil elsewhere):
	// it runs the encoders. The engine calls it once per computation of
	// the prompt (again only after a preemption), only when it computes a
	// placeholder position, and drops the rows once the prompt is in the
	// cache — never for a decode whose KV
	// import brought the prompt (its last position is text), so a decode
	// runs no encoder unless it must recompute the prompt (a failed import
	// with kv_load_failure_policy recompute, or a preemption).
	Encode func() ([][]float32, error)
	// Encoding is the media the encoders work on, as the latency model
	// counts them: in simulate mode, which computes nothing from the rows,
	// the engine pays their modeled time in the step that first computes a
	// placeholder (again after a preemption), as a GPU running the encoders
	// in its batch does. Nil when this engine does not encode (the rows came
	// from an encoder stage).
	Encoding []simulate.EncoderItem
}

// Event is what a request produces: one per generated token, and a last
// one with Finished set.
type Event struct {
	Token int
	// Text is the new text this token completes (may be empty while a
	// multi-byte character or a possible stop string is held back).
	Text         string
	Finished     bool
	FinishReason string // "stop", "length", "abort" or "error" when Finished
	Err          error
	// PromptTokens, CachedTokens (positions whose KV was imported) and
	// CompletionTokens are set on the last event.
	PromptTokens, CachedTokens, CompletionTokens int
	// Capture holds the conditioning rows when asked for, on the last event.
	Capture *model.Capture
	// Rows holds, when Request.StreamRows asks for them, the rows computed
	// since the previous event, on every event: what a stage streaming them
	// (async chunk) appends. Their union over the events is Capture's rows.
	Rows *model.Capture
	// FirstTokenAt is when the first token was sampled (last event).
	FirstTokenAt time.Time
}

// Stats is a snapshot of the engine's load.
type Stats struct {
	Running, Waiting      int
	UsedBlocks, NumBlocks int
	PromptTokensComputed  uint64
	PromptTokensImported  uint64
	GenerationTokens      uint64
	Preemptions           uint64
	KVImportFailures      uint64
}

// Engine serves one model.
type Engine struct {
	model *model.Model
	tok   *tokenizer.Tokenizer
	cfg   Config
	cache *kvcache.Cache
	sim   *simulation // nil unless in simulate mode

	submit chan *sequence
	wake   chan struct{}
	done   chan struct{}
	once   sync.Once

	// Owned by the Run goroutine.
	waiting []*sequence
	running []*sequence

	// Read by Stats from any goroutine.
	nRunning, nWaiting                                                   atomic.Int64
	promptComputed, promptImported, generated, preempted, importFailures atomic.Uint64
}

// New builds an engine. Call Run to start it.
func New(m *model.Model, tok *tokenizer.Tokenizer, cfg Config) (*Engine, error) {
	cfg = cfg.withDefaults()
	cache, err := kvcache.New(m.KVShape(cfg.BlockSize), cfg.NumBlocks)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		model:  m,
		tok:    tok,
		cfg:    cfg,
		cache:  cache,
		submit: make(chan *sequence, 256),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	if cfg.Simulate != nil {
		if e.sim, err = newSimulation(cfg.Simulate, cfg.Clock, m, tok); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	return e, nil
}

// Model returns the served model.
func (e *Engine) Model() *model.Model { return e.model }

// Tokenizer returns the model's tokenizer.
func (e *Engine) Tokenizer() *tokenizer.Tokenizer { return e.tok }

// Cache returns the KV cache, for the KV data path.
func (e *Engine) Cache() *kvcache.Cache { return e.cache }

// Stats returns current load figures.
func (e *Engine) Stats() Stats {
	return Stats{
		Running:              int(e.nRunning.Load()),
		Waiting:              int(e.nWaiting.Load()),
		UsedBlocks:           e.cache.Used(),
		NumBlocks:            e.cache.NumBlocks(),
		PromptTokensComputed: e.promptComputed.Load(),
		PromptTokensImported: e.promptImported.Load(),
		GenerationTokens:     e.generated.Load(),
		Preemptions:          e.preempted.Load(),
		KVImportFailures:     e.importFailures.Load(),
	}
}

type seqState int

const (
	stateWaiting seqState = iota
	stateImporting
	stateRunning
)

// sequence is a request inside the engine. Only the Run goroutine touches
// it, except the fields the import goroutine hands back through imported.
type sequence struct {
	req       *Request
	ctx       context.Context
	events    chan Event
	tokens    []int // prompt then generated
	promptLen int
	computed  int // positions whose KV is in the cache
	table     []int
	sampler   *sampler.Sampler
	decoder   *tokenizer.StreamDecoder
	state     seqState
	cached    int // prompt positions imported
	capture   *model.Capture
	// captureSent is how many capture rows events carried already; it
	// survives preemption, whose recomputation yields the same rows.
	captureSent int
	firstAt     time.Time
	simKey      uint64 // what simulated tokens hash, in simulate mode

	text    strings.Builder // all text so far, for stop strings
	emitted int             // bytes of text already sent

	imported     chan importResult
	importTried  bool
	cancelImport context.CancelFunc

	// mmRows are the encoder rows of a multimodal prompt while its
	// placeholders are being computed (Multimodal.Encode), then dropped.
	mmRows [][]float32
	// simEncoded: in simulate mode, the modeled encoder time was paid.
	simEncoded bool
}

type importResult struct {
	numTokens int
	err       error
}

// maxEventBuffer is how many events a request's channel holds unread
// before the engine pauses the request (see schedule).
const maxEventBuffer = 64

// eventBuffer sizes a request's event channel: room for every event it can
// send (one per token, the last one included) when that is fewer than
// maxEventBuffer. A prefill leg's single token then costs a channel of two
// events rather than one of 64, about 8 KiB allocated and cleared.
func eventBuffer(maxTokens int) int {
	if maxTokens > 0 && maxTokens < maxEventBuffer {
		return maxTokens + 1
	}
	return maxEventBuffer
}

// Submit queues a request. Its events arrive on the returned channel, which
// is closed after the last one. Cancelling ctx aborts the request.
func (e *Engine) Submit(ctx context.Context, req *Request) (<-chan Event, error) {
	if len(req.Prompt) == 0 {
		return nil, fmt.Errorf("%w: empty prompt", ErrPromptTooLong)
	}
	if err := req.Params.Validate(); err != nil {
		return nil, err
	}
	for _, t := range req.Prompt {
		if t < 0 || t >= e.model.Config.VocabSize {
			return nil, fmt.Errorf("%w: token id %d is outside the vocabulary (size %d)", ErrInvalidRequest, t, e.model.Config.VocabSize)
		}
	}
	if max := e.model.Config.MaxPositionEmbeddings; max > 0 && len(req.Prompt)+req.Params.MaxTokens > max {
		return nil, fmt.Errorf("%w: %d prompt tokens + %d max_tokens exceed the model's context of %d", ErrPromptTooLong, len(req.Prompt), req.Params.MaxTokens, max)
	}
	if mm := req.Multimodal; mm != nil && (len(mm.Positions) != len(req.Prompt) || len(mm.Placeholder) != len(req.Prompt) || mm.Encode == nil) {
		return nil, fmt.Errorf("%w: multimodal inputs of %d positions and %d placeholder marks for %d prompt tokens", ErrInvalidRequest, len(mm.Positions), len(mm.Placeholder), len(req.Prompt))
	}
	if req.CaptureLayer < 0 || req.CaptureLayer > e.model.Config.NumLayers {
		return nil, fmt.Errorf("%w: capture layer %d is outside the model's 1..%d", ErrInvalidRequest, req.CaptureLayer, e.model.Config.NumLayers)
	}
	need := e.cache.Shape().BlocksFor(len(req.Prompt) + 1)
	if need > e.cache.NumBlocks() {
		return nil, fmt.Errorf("%w: %d tokens need %d KV blocks, the cache has %d", ErrPromptTooLong, len(req.Prompt), need, e.cache.NumBlocks())
	}
	s := &sequence{
		req:       req,
		ctx:       ctx,
		events:    make(chan Event, eventBuffer(req.Params.MaxTokens)),
		tokens:    slices.Clone(req.Prompt),
		promptLen: len(req.Prompt),
		sampler:   sampler.New(req.Params, e.tok.EOSTokenIDs()),
		decoder:   e.tok.NewStreamDecoder(),
	}
	if req.CaptureLayer > 0 {
		s.capture = &model.Capture{Layer: req.CaptureLayer}
	}
	if e.sim != nil {
		s.simKey = e.sim.key(req)
	}
	select {
	case e.submit <- s:
	case <-e.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.events, nil
}

// Simulation is the latency profile the engine keeps the pace of, nil
// unless in simulate mode.
func (e *Engine) Simulation() *simulate.Profile { return e.cfg.Simulate }

// Close stops the engine; Run returns after aborting every request.
func (e *Engine) Close() { e.once.Do(func() { close(e.done) }) }

// Run schedules and computes until ctx is done or Close is called.
func (e *Engine) Run(ctx context.Context) {
	defer e.abortAll()
	for {
		if !e.intake(ctx) {
			return
		}
		if !e.step(ctx) {
			// Nothing could run: every waiting sequence needs blocks that
			// are held elsewhere (running sequences, leased exports). Wait
			// for a change rather than spin.
			e.simIdle()
			select {
			case s := <-e.submit:
				e.waiting = append(e.waiting, s)
			case <-e.wake:
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return
			case <-e.done:
				return
			}
		}
	}
}

// intake takes new requests and import results, blocking while there is
// nothing to compute. False when the engine is stopping.
func (e *Engine) intake(ctx context.Context) bool {
	for {
		// Drain whatever is queued without blocking.
		for drained := false; !drained; {
			select {
			case s := <-e.submit:
				e.waiting = append(e.waiting, s)
			default:
				drained = true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-e.done:
			return false
		default:
		}
		e.collectImports()
		e.publish()
		if len(e.running) > 0 || e.anyReady() {
			return true
		}
		e.simIdle()
		select {
		case s := <-e.submit:
			e.waiting = append(e.waiting, s)
		case <-e.wake:
		case <-ctx.Done():
			return false
		case <-e.done:
			return false
		}
	}
}

// anyReady reports whether some waiting sequence can be scheduled now.
func (e *Engine) anyReady() bool {
	for _, s := range e.waiting {
		if s.state == stateWaiting || s.ctx.Err() != nil {
			return true
		}
	}
	return false
}

func (e *Engine) publish() {
	e.nRunning.Store(int64(len(e.running)))
	e.nWaiting.Store(int64(len(e.waiting)))
}

// collectImports moves sequences whose KV import finished to running.
func (e *Engine) collectImports() {
	kept := e.waiting[:0]
	for _, s := range e.waiting {
		if s.state != stateImporting {
			kept = append(kept, s)
			continue
		}
		select {
		case r := <-s.imported:
			if !e.finishImport(s, r) {
				continue
			}
			e.running = append(e.running, s)
		default:
			kept = append(kept, s)
		}
	}
	clear(e.waiting[len(kept):])
	e.waiting = kept
}

// finishImport applies an import result; false when the sequence ended.
func (e *Engine) finishImport(s *sequence, r importResult) bool {
	want := s.promptLen - 1
	if r.err == nil && r.numTokens < want {
		r.err = fmt.Errorf("the prefill exported %d positions, the prompt needs %d", r.numTokens, want)
	}
	if r.err != nil {
		e.importFailures.Add(1)
		if s.ctx.Err() != nil {
			e.finish(s, "abort", s.ctx.Err())
			return false
		}
		if !s.req.RecomputeOnImportFailure {
			e.finish(s, "error", fmt.Errorf("%w: %w", ErrKVLoad, r.err))
			return false
		}
		e.cfg.Logger.Warn("KV import failed; recomputing the prompt", "request_id", s.req.ID, "err", r.err)
		s.computed, s.cached = 0, 0
	} else {
		s.computed, s.cached = want, want
		e.promptImported.Add(uint64(want))
	}
	s.state = stateRunning
	return true
}

// step admits waiting sequences, computes one batch and handles its
// results. It reports whether anything was computed.
func (e *Engine) step(ctx context.Context) bool {
	e.dropCancelled()
	e.admit()
	batch := e.schedule()
	if len(batch) == 0 {
		e.publish()
		return false
	}
	start := e.simBegin()
	e.compute(batch)
	e.simEnd(ctx, start, batch)
	for _, w := range batch {
		e.advance(w)
	}
	e.publish()
	return true
}

func (e *Engine) dropCancelled() {
	keep := e.running[:0]
	for _, s := range e.running {
		if s.ctx.Err() != nil {
			e.finish(s, "abort", s.ctx.Err())
			continue
		}
		keep = append(keep, s)
	}
	clear(e.running[len(keep):])
	e.running = keep
	kw := e.waiting[:0]
	for _, s := range e.waiting {
		// An importing sequence is dropped when its import returns, so
		// that the import goroutine never writes into freed blocks.
		if s.state == stateWaiting && s.ctx.Err() != nil {
			e.finish(s, "abort", s.ctx.Err())
			continue
		}
		kw = append(kw, s)
	}
	clear(e.waiting[len(kw):])
	e.waiting = kw
}

// admit moves waiting sequences into the running set, in arrival order,
// while there are free slots and blocks.
func (e *Engine) admit() {
	shape := e.cache.Shape()
	for len(e.waiting) > 0 {
		s := e.waiting[0]
		if s.state != stateWaiting {
			// Importing sequences hold their place but do not block
			// the ones behind them.
			idx := slices.IndexFunc(e.waiting, func(x *sequence) bool { return x.state == stateWaiting })
			if idx < 0 {
				return
			}
			s = e.waiting[idx]
		}
		if len(e.running)+e.importing() >= e.cfg.MaxNumSeqs {
			return
		}
		need := shape.BlocksFor(len(s.tokens)+1) - len(s.table)
		if need > e.cache.FreeBlocks() {
			return
		}
		blocks, err := e.cache.Allocate(need)
		if err != nil {
			return
		}
		s.table = append(s.table, blocks...)
		e.removeWaiting(s)
		if s.req.Import != nil && !s.importTried {
			e.startImport(s)
			e.waiting = append(e.waiting, s)
			continue
		}
		s.state = stateRunning
		e.running = append(e.running, s)
	}
}

func (e *Engine) importing() int {
	n := 0
	for _, s := range e.waiting {
		if s.state == stateImporting {
			n++
		}
	}
	return n
}

func (e *Engine) removeWaiting(s *sequence) {
	i := slices.Index(e.waiting, s)
	e.waiting = slices.Delete(e.waiting, i, i+1)
}

// startImport fetches the prompt's KV from the prefill in the background.
// The destination is the blocks of all prompt positions, as the prefill
// exported them; the last position is recomputed over its imported copy,
// bit for bit the same.
func (e *Engine) startImport(s *sequence) {
	s.state = stateImporting
	s.importTried = true
	s.imported = make(chan importResult, 1)
	dst := slices.Clone(s.table[:e.cache.Shape().BlocksFor(s.promptLen)])
	ctx, cancel := context.WithCancel(s.ctx)
	s.cancelImport = cancel
	go func() {
		defer cancel()
		n, err := e.importKV(ctx, s, dst)
		s.imported <- importResult{numTokens: n, err: err}
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}()
}

// work is one sequence's share of a step.
type work struct {
	s      *sequence
	n      int // positions to compute
	logits []float32
	err    error // the step could not be computed (an encoder failed)
}

// schedule picks what each running sequence computes this step: decodes
// first (one token each), then prefill chunks, within the token budget.
// Growth blocks are allocated here, preempting the newest sequences when
// the cache is full.
func (e *Engine) schedule() []*work {
	budget := e.cfg.MaxNumBatchedTokens
	var batch []*work
	for _, decoding := range []bool{true, false} {
		for i := 0; i < len(e.running); i++ {
			s := e.running[i]
			remaining := len(s.tokens) - s.computed
			if (remaining == 1) != decoding || budget == 0 {
				continue
			}
			if len(s.events) == cap(s.events) {
				// Its consumer stopped reading (a client that stalls
				// without hanging up): pause this sequence until there is
				// room, rather than block the whole engine in send. A step
				// sends at most one event per sequence, so one free slot
				// is enough.
				continue
			}
			n := min(remaining, budget)
			if !e.ensureBlocks(s, s.computed+n) {
				continue
			}
			budget -= n
			batch = append(batch, &work{s: s, n: n})
		}
	}
	// Preemption may have removed sequences already in the batch.
	return slices.DeleteFunc(batch, func(w *work) bool { return !slices.Contains(e.running, w.s) })
}

// ensureBlocks makes s's block table cover n positions, preempting the
// newest other sequences if the cache is full. False when s itself had to
// give way.
func (e *Engine) ensureBlocks(s *sequence, n int) bool {
	need := e.cache.Shape().BlocksFor(n) - len(s.table)
	for need > 0 {
		if blocks, err := e.cache.Allocate(need); err == nil {
			s.table = append(s.table, blocks...)
			return true
		}
		victim := e.running[len(e.running)-1]
		e.preempt(victim)
		if victim == s {
			return false
		}
	}
	return true
}

// preempt frees a running sequence's blocks and queues it to be recomputed
// first; chunk-invariant computation makes the recomputation exact.
func (e *Engine) preempt(s *sequence) {
	e.preempted.Add(1)
	e.cfg.Logger.Debug("preempting sequence", "request_id", s.req.ID, "tokens", len(s.tokens))
	e.cache.Free(s.table)
	s.table, s.computed, s.cached = nil, 0, 0
	s.simEncoded = false // a recomputed prompt is encoded again
	if s.capture != nil {
		s.capture.Embeddings, s.capture.Hidden = nil, nil
	}
	s.state = stateWaiting
	i := slices.Index(e.running, s)
	e.running = slices.Delete(e.running, i, i+1)
	e.waiting = slices.Insert(e.waiting, 0, s)
}

// compute runs the batch's forward passes, several sequences at a time.
// Each sequence is computed alone, so its results do not depend on the
// batch.
func (e *Engine) compute(batch []*work) {
	if e.sim != nil {
		e.simCompute(batch)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, e.cfg.Parallelism)
	for _, w := range batch {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s := w.s
			in, err := s.inputs(s.computed, w.n)
			if err != nil {
				w.err = err
				return
			}
			w.logits = e.model.ForwardInputs(e.cache, s.table, s.computed, s.tokens[s.computed:s.computed+w.n], in, s.capture)
		})
	}
	wg.Wait()
}

// inputs are the multimodal inputs of positions start..start+n-1: their
// rotary positions, and the encoder rows of the placeholders among them,
// encoding the prompt's media the first time one is needed. A text-only
// request has none.
func (s *sequence) inputs(start, n int) (model.Inputs, error) {
	mm := s.req.Multimodal
	if mm == nil {
		return model.Inputs{}, nil
	}
	in := model.Inputs{Positions: make([][3]int, n)}
	needRows := false
	for t := range n {
		i := start + t
		if i < s.promptLen {
			in.Positions[t] = mm.Positions[i]
			needRows = needRows || mm.Placeholder[i]
		} else {
			v := i + mm.Delta
			in.Positions[t] = [3]int{v, v, v}
		}
	}
	if !needRows {
		return in, nil
	}
	if s.mmRows == nil {
		rows, err := mm.Encode()
		if err != nil {
			return in, fmt.Errorf("encoding the prompt's media: %w", err)
		}
		if len(rows) != s.promptLen {
			return in, fmt.Errorf("the encoders gave rows for %d positions; the prompt has %d", len(rows), s.promptLen)
		}
		s.mmRows = rows
	}
	in.Embeds = s.mmRows[start:min(start+n, s.promptLen)]
	return in, nil
}

// advance records a computed chunk and, when it reached the end of the
// known tokens, samples the next one.
func (e *Engine) advance(w *work) {
	s := w.s
	if w.err != nil {
		e.finishRunning(s, "error", w.err)
		return
	}
	if s.computed < s.promptLen {
		e.promptComputed.Add(uint64(min(w.n, s.promptLen-s.computed)))
	}
	s.computed += w.n
	if s.computed >= s.promptLen {
		// The prompt is in the cache: its encoder rows are no longer
		// needed (a preemption that recomputes it encodes again), as
		// vLLM's encoder cache frees an item once its positions are
		// computed.
		s.mmRows = nil
	}
	if s.computed < len(s.tokens) {
		return // more prompt to compute
	}
	var tok int
	if e.sim != nil {
		tok = e.sim.token(s)
	} else {
		tok = s.sampler.Sample(w.logits, s.tokens[:s.promptLen], s.tokens[s.promptLen:])
	}
	s.tokens = append(s.tokens, tok)
	e.generated.Add(1)
	generated := len(s.tokens) - s.promptLen
	if generated == 1 {
		s.firstAt = time.Now()
	}
	// A stop token ends the sequence without adding text, as in vLLM.
	if s.sampler.IsStop(tok, generated) {
		s.text.WriteString(s.decoder.Flush())
		e.finishRunning(s, "stop", nil)
		return
	}
	if s.req.Params.KeepSpecialTokens || !e.tok.IsSpecial(tok) {
		s.text.WriteString(s.decoder.Add(tok))
	}
	if e.stopString(s) {
		e.finishRunning(s, "stop", nil)
		return
	}
	if s.req.Params.MaxTokens > 0 && generated >= s.req.Params.MaxTokens {
		s.text.WriteString(s.decoder.Flush())
		e.finishRunning(s, "length", nil)
		return
	}
	e.emit(s, tok)
}

// stopString truncates the text at the first stop string; true when found.
func (e *Engine) stopString(s *sequence) bool {
	text := s.text.String()
	for _, stop := range s.req.Params.Stop {
		if stop == "" {
			continue
		}
		if i := strings.Index(text, stop); i >= 0 {
			s.text.Reset()
			s.text.WriteString(text[:i])
			if s.emitted > i {
				s.emitted = i
			}
			return true
		}
	}
	return false
}

// emit sends the token with the text that is now safe to show: a tail that
// could still grow into a stop string is held back until it cannot.
func (e *Engine) emit(s *sequence, tok int) {
	text := s.text.String()
	upto := len(text)
	for _, stop := range s.req.Params.Stop {
		for k := min(len(stop)-1, len(text)); k > 0; k-- {
			if strings.HasSuffix(text, stop[:k]) {
				upto = min(upto, len(text)-k)
				break
			}
		}
	}
	delta := ""
	if upto > s.emitted {
		delta = text[s.emitted:upto]
		s.emitted = upto
	}
	s.send(Event{Token: tok, Text: delta, Rows: s.newRows()})
}

// newRows returns the capture rows no event carried yet, nil unless the
// request streams them. The rows are never changed once computed, so the
// event may share them.
func (s *sequence) newRows() *model.Capture {
	if s.capture == nil || !s.req.StreamRows {
		return nil
	}
	from := min(s.captureSent, len(s.capture.Embeddings))
	out := &model.Capture{Layer: s.capture.Layer,
		Embeddings: slices.Clone(s.capture.Embeddings[from:]), Hidden: slices.Clone(s.capture.Hidden[from:])}
	s.captureSent = max(s.captureSent, len(s.capture.Embeddings))
	return out
}

func (s *sequence) send(ev Event) {
	select {
	case s.events <- ev:
	case <-s.ctx.Done():
	}
}

func (e *Engine) finishRunning(s *sequence, reason string, err error) {
	i := slices.Index(e.running, s)
	if i >= 0 {
		e.running = slices.Delete(e.running, i, i+1)
	}
	e.finish(s, reason, err)
}

// finish ends a sequence: its blocks go to the KV data path (a finished
// prefill) or back to the pool, and its last event is sent.
func (e *Engine) finish(s *sequence, reason string, err error) {
	if s.table != nil {
		if s.req.Export != nil && err == nil && reason != "abort" {
			positions := s.promptLen
			keep := e.cache.Shape().BlocksFor(positions)
			if extra := s.table[keep:]; len(extra) > 0 {
				e.cache.Free(extra)
			}
			if xerr := s.req.Export(s.table[:keep], positions); xerr != nil {
				e.cfg.Logger.Warn("KV export failed; freeing the blocks", "request_id", s.req.ID, "err", xerr)
				e.cache.Free(s.table[:keep])
			}
		} else {
			e.cache.Free(s.table)
		}
		s.table = nil
	}
	text := s.text.String()
	last := Event{
		Finished:         true,
		FinishReason:     reason,
		Err:              err,
		PromptTokens:     s.promptLen,
		CachedTokens:     s.cached,
		CompletionTokens: len(s.tokens) - s.promptLen,
		Capture:          s.capture,
		Rows:             s.newRows(),
		FirstTokenAt:     s.firstAt,
	}
	if n := len(s.tokens); n > s.promptLen {
		last.Token = s.tokens[n-1]
	}
	if len(text) > s.emitted {
		last.Text = text[s.emitted:]
		s.emitted = len(text)
	}
	// The last event must not be lost to a full channel, and the request
	// must not block the engine: the buffer holds it unless the consumer
	// stopped reading, in which case ctx is done.
	s.send(last)
	close(s.events)
}

func (e *Engine) abortAll() {
	for _, s := range e.running {
		e.finish(s, "abort", ErrClosed)
	}
	e.running = nil
	for _, s := range e.waiting {
		if s.state == stateImporting {
			s.cancelImport()
			<-s.imported
		}
		e.finish(s, "abort", ErrClosed)
	}
	e.waiting = nil
	for {
		select {
		case s := <-e.submit:
			e.finish(s, "abort", ErrClosed)
		default:
			e.publish()
			return
		}
	}
}
