package worker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/sampler"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
)

// generation is one request, decoded from either endpoint.
type generation struct {
	chat           bool
	model          string
	prompt         []int
	params         sampler.Params
	stream         bool
	includeUsage   bool
	returnTokenIDs bool
	kvParams       map[string]any
	// conditioning asks to keep the per-position conditioning under a key
	// for the Talker (the omni extension openai.ConditioningMember: {"key", "layer"}).
	conditioning *conditioningRequest
	// mm is a multimodal prompt's positions and encoders.
	mm *engine.Multimodal
}

type conditioningRequest struct {
	Key   string `json:"key"`
	Layer int    `json:"layer"`
	// Stream keeps the rows in a stash that grows as the engine computes
	// them (async chunk), open from before the engine starts the request,
	// so that the Talker may read them while this request still decodes.
	Stream bool `json:"stream"`
}

// Default max_tokens: OpenAI's 16 for completions; for chat, the rest of
// the context, as vLLM.
const defaultCompletionMaxTokens = 16

func (s *Server) completions(w http.ResponseWriter, r *http.Request) error {
	// A prompt of token ids that cannot fit the context is refused while
	// its ids are counted in the body, before one is decoded (eight bytes
	// an id), with the 400 fitsContext gives any prompt that does not fit.
	req, err := openai.DecodeCompletionRequestWithin(r.Body, s.cfg.MaxBodyBytes, s.cfg.MaxModelLen)
	if err != nil {
		return err
	}
	if err := refuseUnsupported(false, req.Extra, &req.SamplingParams, req.StreamOptions); err != nil {
		return err
	}
	g := &generation{model: req.Model, kvParams: req.KVTransferParams}
	switch {
	case req.Prompt == nil:
		return openai.InvalidRequest("prompt", "prompt is required")
	case req.Prompt.Kind == openai.PromptText:
		if g.prompt, err = s.promptTokens(false, req.Prompt.Texts[0], nil, false); err != nil {
			return err
		}
	case req.Prompt.Kind == openai.PromptTokens:
		g.prompt = req.Prompt.TokenIDs[0]
	default:
		return openai.InvalidRequest("prompt", "a batch of prompts is not supported by the reference worker; send one prompt per request")
	}
	if req.Logprobs != nil {
		return openai.InvalidRequest("logprobs", "logprobs are not supported by the reference worker")
	}
	if err := s.common(g, &req.SamplingParams, req.MaxTokens, req.Stream, req.StreamOptions, req.Extra, defaultCompletionMaxTokens); err != nil {
		return err
	}
	return s.generate(w, r, g)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) error {
	req, err := openai.DecodeChatRequest(r.Body, s.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	if err := refuseUnsupported(true, req.Extra, &req.SamplingParams, req.StreamOptions); err != nil {
		return err
	}
	g := &generation{chat: true, model: req.Model, kvParams: req.KVTransferParams}
	msgs, media, err := s.media.prepare(r.Context(), req)
	if err != nil {
		return err
	}
	if s.cfg.EC != nil && s.cfg.EC.Role == ECProducer {
		// An encoder (E/P/D) runs no Thinker: it encodes its media item.
		if media == nil {
			return errNoMedia
		}
		return s.encodeItems(w, r, media, req.Extra)
	}
	if media != nil {
		hs, err := encoderHandles(req.Extra, len(media.items))
		if err != nil {
			return err
		}
		if hs != nil {
			if err := s.fetchEncoded(r.Context(), media, hs); err != nil {
				return err
			}
		}
	}
	// vLLM's add_generation_prompt (default true) ends the prompt with the
	// assistant turn's header.
	addGen := true
	if raw, ok := req.Extra["add_generation_prompt"]; ok && string(bytes.TrimSpace(raw)) != "null" {
		if json.Unmarshal(raw, &addGen) != nil {
			return openai.InvalidRequest("add_generation_prompt", "want true or false")
		}
	}
	if g.prompt, err = s.promptTokens(true, "", msgs, addGen); err != nil {
		return err
	}
	if media != nil {
		if g.prompt, g.mm, err = s.media.multimodal(g.prompt, media); err != nil {
			return layoutFailure(err)
		}
		if len(g.prompt) > s.cfg.MaxModelLen-1 {
			return s.promptTooLong(true, strconv.Itoa(len(g.prompt)))
		}
	}
	if req.Logprobs != nil && *req.Logprobs {
		return openai.InvalidRequest("logprobs", "logprobs are not supported by the reference worker")
	}
	rest := s.cfg.MaxModelLen - len(g.prompt)
	if err := s.common(g, &req.SamplingParams, req.EffectiveMaxTokens(), req.Stream, req.StreamOptions, req.Extra, rest); err != nil {
		return err
	}
	return s.generate(w, r, g)
}

// layoutFailure is the answer to an error laying out a prompt's media
// placeholders. The layout is omnipd's own: the chat template renders each
// part the processors took, and no text can spell a placeholder token
// (tokenizer.Encode splits special tokens). So an error is the server's, a
// 500 whose cause only the log reads — unless it already carries the
// client's answer, an error that names the client's part, which is answered
// as it is.
func layoutFailure(err error) error {
	var resp *openai.ErrorResponse
	if errors.As(err, &resp) {
		return err
	}
	return &serverFault{resp: openai.InternalError("the server could not lay out this prompt's media placeholders; the fault is the server's, not the request's"), cause: err}
}

// serverFault is an error of the worker's own making. The client reads
// resp, which says no more than that; the log reads Error, the cause.
type serverFault struct {
	resp  *openai.ErrorResponse
	cause error
}

func (e *serverFault) Error() string   { return e.cause.Error() }
func (e *serverFault) Unwrap() []error { return []error{e.resp, e.cause} }

// common fills what both endpoints share: model check, sampling, streaming.
func (s *Server) common(g *generation, sp *openai.SamplingParams, maxTokens *int, stream *bool, opts *openai.StreamOptions, extra map[string]json.RawMessage, defaultMax int) error {
	if g.model != "" && g.model != s.cfg.ModelName {
		return openai.ModelNotFound(g.model)
	}
	if sp.N != nil && *sp.N != 1 {
		return openai.InvalidRequest("n", "n > 1 is not supported by the reference worker")
	}
	p := sampler.Defaults()
	setF := func(dst *float64, v *float64) {
		if v != nil {
			*dst = *v
		}
	}
	setF(&p.Temperature, sp.Temperature)
	setF(&p.TopP, sp.TopP)
	setF(&p.MinP, sp.MinP)
	setF(&p.RepetitionPenalty, sp.RepetitionPenalty)
	setF(&p.PresencePenalty, sp.PresencePenalty)
	setF(&p.FrequencyPenalty, sp.FrequencyPenalty)
	if sp.TopK != nil {
		p.TopK = *sp.TopK
	}
	p.Seed = sp.Seed
	if sp.MinTokens != nil {
		p.MinTokens = *sp.MinTokens
	}
	if sp.SkipSpecialTokens != nil {
		p.KeepSpecialTokens = !*sp.SkipSpecialTokens
	}
	if sp.IgnoreEOS != nil {
		p.IgnoreEOS = *sp.IgnoreEOS
	}
	p.StopTokenIDs = sp.StopTokenIDs
	if sp.Stop != nil {
		p.Stop = sp.Stop.Strings
	}
	p.MaxTokens = defaultMax
	if maxTokens != nil {
		if *maxTokens < 1 {
			return openai.InvalidRequest("max_tokens", "max_tokens must be at least 1")
		}
		p.MaxTokens = *maxTokens
	}
	if p.MaxTokens < 1 {
		return s.fitsContext(g.chat, len(g.prompt), 0)
	}
	if err := p.Validate(); err != nil {
		return err
	}
	g.params = p
	g.stream = stream != nil && *stream
	g.includeUsage = opts != nil && opts.IncludeUsage != nil && *opts.IncludeUsage
	if raw, ok := extra["return_token_ids"]; ok {
		_ = json.Unmarshal(raw, &g.returnTokenIDs)
	}
	if raw, ok := extra[openai.ConditioningMember]; ok {
		var c conditioningRequest
		if err := json.Unmarshal(raw, &c); err != nil || c.Key == "" || c.Layer < 1 || c.Layer > s.eng.Model().Config.NumLayers {
			return openai.InvalidRequest(openai.ConditioningMember, fmt.Sprintf("want {\"key\": a non-empty string, \"layer\": 1..%d}", s.eng.Model().Config.NumLayers))
		}
		if s.cfg.TTSTokenIDs == noTTSTokens {
			return openai.InvalidRequest(openai.ConditioningMember, fmt.Sprintf("this model has no TTS tokens (%s, %s, %s), whose embeddings a Talker needs with the rows; serve an omni Thinker, or name them in its config.json (%s, %s, %s)",
				ttsRoles[0].name, ttsRoles[1].name, ttsRoles[2].name, ttsRoles[0].key, ttsRoles[1].key, ttsRoles[2].key))
		}
		g.conditioning = &c
	}
	return nil
}

// ttsRoles are the three TTS tokens a stash carries, in Config.TTSTokenIDs'
// order: how the tokenizer spells each and the config.json key that names
// its id. Qwen3-Omni: <tts_pad> 151671, <tts_text_bos> 151672,
// <tts_text_eod> 151673 (transformers' Qwen3OmniMoeConfig; vllm-omni's
// Thinker embeds them for the Talker in qwen3_omni.py).
var ttsRoles = [3]struct{ name, key string }{
	{tokenizer.TTSPad, "tts_pad_token_id"},
	{tokenizer.TTSBos, "tts_bos_token_id"},
	{tokenizer.TTSEos, "tts_eos_token_id"},
}

// noTTSTokens is Config.TTSTokenIDs of a model that has no TTS tokens: the
// worker serves text and refuses to keep conditioning.
var noTTSTokens = [3]int{-1, -1, -1}

// ttsTokenIDs settles the tokens whose embeddings a stash carries: the
// configured ids, else the checkpoint config's (tts_pad_token_id, …), else
// the tokenizer's TTS tokens by name, else none. Each id must be its TTS
// token or, where the tokenizer has no such token, no token at all (an
// unused embedding row): a multimodal marker, a chat marker or a text token
// would hand the Talker another token's embedding as its text stream.
func ttsTokenIDs(ids [3]int, m *model.Model, tok *tokenizer.Tokenizer) ([3]int, error) {
	source := "configured"
	switch {
	case ids == noTTSTokens:
		return ids, nil
	case ids != [3]int{}:
	case len(m.Config.TTSTokenIDs) == len(ids):
		source = "the checkpoint's"
		copy(ids[:], m.Config.TTSTokenIDs)
	default:
		source = "the tokenizer's"
		for i, role := range ttsRoles {
			id, ok := tok.TokenID(role.name)
			if !ok || !tok.IsSpecial(id) {
				return noTTSTokens, nil
			}
			ids[i] = id
		}
	}
	vocab := m.Config.VocabSize
	for i, id := range ids {
		role := ttsRoles[i]
		what := fmt.Sprintf("worker: %s %s %d", source, role.key, id)
		if id < 0 || id >= vocab {
			return ids, fmt.Errorf("%s is outside the vocabulary (size %d)", what, vocab)
		}
		if j := slices.Index(ids[:i], id); j >= 0 {
			return ids, fmt.Errorf("%s is %s too", what, ttsRoles[j].key)
		}
		name, isToken := tok.TokenName(id)
		want, named := tok.TokenID(role.name)
		switch {
		case named && id == want:
		case isToken && tok.IsSpecial(id):
			return ids, fmt.Errorf("%s is %s, a special token of another meaning; want %s", what, name, role.name)
		case isToken:
			return ids, fmt.Errorf("%s is the text token %q; want %s", what, name, role.name)
		case named:
			return ids, fmt.Errorf("%s is no token, and the vocabulary's %s is %d", what, role.name, want)
		}
	}
	return ids, nil
}

// generate runs the request through the engine and writes the response.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, g *generation) error {
	ctx := r.Context()
	id := requestID(ctx)
	start := time.Now()
	if err := s.fitsContext(g.chat, len(g.prompt), g.params.MaxTokens); err != nil {
		return err
	}
	plan, err := s.kv.plan(g.kvParams, id)
	if err != nil {
		return err
	}
	req := &engine.Request{ID: id, Prompt: g.prompt, Params: g.params, Multimodal: g.mm}
	if g.conditioning != nil {
		req.CaptureLayer = g.conditioning.Layer
		req.StreamRows = g.conditioning.Stream
	}
	importStarted := false
	if plan != nil && plan.export {
		req.Export = s.kv.exporter(plan)
	}
	if plan != nil && plan.imports {
		req.Import = s.kv.importer(plan, &importStarted)
		req.RecomputeOnImportFailure = s.kv.cfg.LoadFailurePolicy == "recompute"
	}
	grow, err := s.openGrowing(g, id)
	if err != nil {
		return err
	}
	events, err := s.eng.Submit(ctx, req)
	if err != nil {
		if plan != nil && plan.imports {
			s.kv.release(plan)
		}
		grow.end(err)
		return err
	}
	out := &responder{s: s, w: w, g: g, id: id, start: start, created: start.Unix()}
	if g.stream {
		out.sse = openai.NewSSEWriter(w)
	}
	var last engine.Event
	var tokens []int
	prev := start
	for ev := range events {
		if !ev.Finished || ev.CompletionTokens > len(tokens) {
			now := time.Now()
			if len(tokens) == 0 {
				s.metrics.RecordFirstToken(now.Sub(start))
				s.metrics.RecordToken(0)
			} else {
				s.metrics.RecordToken(now.Sub(prev))
			}
			prev = now
			tokens = append(tokens, ev.Token)
			grow.add(ev, []int{ev.Token})
		} else {
			grow.add(ev, nil)
		}
		if ev.Finished {
			last = ev
			break
		}
		// Tokens already waiting go out in one write with this one.
		out.delta(ev.Text, len(events) == 0)
	}
	if plan != nil && plan.export && plan.blocks != nil && ctx.Err() != nil {
		// The prefill's caller left before it learned where the KV is:
		// nobody will claim it, so free it now rather than at lease expiry.
		s.kv.producer.Release(plan.key)
	}
	if last.FinishReason == "abort" && plan != nil && plan.imports && !importStarted {
		// Abandoned before its KV arrived: free the prefill's lease now.
		s.kv.release(plan)
	}
	s.metrics.RecordFinished(last.FinishReason, time.Since(start))
	switch {
	case last.Err != nil:
		grow.end(last.Err)
	case last.FinishReason == "abort":
		grow.end(ctx.Err())
	default:
		grow.end(nil)
	}
	if last.Err != nil && last.FinishReason != "abort" {
		if last.CachedTokens == 0 && plan != nil && plan.imports {
			s.metrics.RecordKVImportFailure()
		}
		return out.fail(last.Err)
	}
	if last.FinishReason == "abort" {
		return ctx.Err()
	}
	s.metrics.RecordPromptTokens(last.PromptTokens-last.CachedTokens, last.CachedTokens)
	usage := openai.Usage{
		PromptTokens:        last.PromptTokens,
		CompletionTokens:    last.CompletionTokens,
		TotalTokens:         last.PromptTokens + last.CompletionTokens,
		PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: last.CachedTokens},
	}
	var handle any
	if grow != nil && grow.store != nil {
		handle = map[string]any{"key": g.conditioning.Key, "rows": len(last.Capture.Embeddings)}
	} else if g.conditioning != nil && last.Capture != nil && ctx.Err() == nil {
		st := &stageapi.Conditioning{
			Embed: last.Capture.Embeddings, Hidden: last.Capture.Hidden,
			TTSPad: s.eng.Model().Embedding(s.cfg.TTSTokenIDs[0]), TTSBos: s.eng.Model().Embedding(s.cfg.TTSTokenIDs[1]), TTSEos: s.eng.Model().Embedding(s.cfg.TTSTokenIDs[2]),
			TokenIDs: append(append([]int(nil), g.prompt...), tokens...), PromptTokenIDs: g.prompt,
		}
		switch err := s.stashes.Put(g.conditioning.Key, st); {
		case errors.Is(err, stageconn.ErrReleased):
			s.log.Debug("conditioning released before it was kept", "request_id", id)
		case err != nil:
			return openai.InvalidRequest(openai.ConditioningMember, err.Error())
		default:
			handle = map[string]any{"key": g.conditioning.Key, "rows": len(st.Embed)}
		}
	}
	return out.finish(last.Text, last.FinishReason, usage, s.kv.responseParams(plan, id), tokens, handle)
}

// responder writes one request's answer, streamed or whole.
type responder struct {
	s       *Server
	w       http.ResponseWriter
	g       *generation
	id      string
	start   time.Time
	created int64
	sse     *openai.SSEWriter
	text    strings.Builder
	started bool
}

func (o *responder) chunkID() string {
	if o.g.chat {
		return "chatcmpl-" + o.id
	}
	return "cmpl-" + o.id
}

// delta streams new text (or keeps it for the whole response); flush sends
// it now rather than with the next chunk.
func (o *responder) delta(text string, flush bool) {
	if o.sse == nil {
		o.text.WriteString(text)
		return
	}
	if text == "" && o.started {
		if flush {
			_ = o.sse.Flush()
		}
		return
	}
	o.writeChunk(text, nil, nil, flush)
}

func (o *responder) writeChunk(text string, finish *string, usage *openai.Usage, flush bool) {
	var v any
	if o.g.chat {
		d := openai.ChatDelta{Content: &text}
		if !o.started {
			d.Role = "assistant"
		}
		c := openai.ChatCompletionChunk{ID: o.chunkID(), Object: "chat.completion.chunk", Created: o.created, Model: o.s.cfg.ModelName,
			Choices: []openai.ChatChunkChoice{{Index: 0, Delta: d, FinishReason: finish}}, Usage: usage}
		if finish == nil && usage != nil {
			c.Choices = nil
		}
		v = c
	} else {
		c := openai.CompletionChunk{ID: o.chunkID(), Object: "text_completion", Created: o.created, Model: o.s.cfg.ModelName,
			Choices: []openai.CompletionChunkChoice{{Index: 0, Text: text, FinishReason: finish}}, Usage: usage}
		if finish == nil && usage != nil {
			c.Choices = nil
		}
		v = c
	}
	o.started = true
	if flush {
		_ = o.sse.WriteEvent(v)
	} else {
		_ = o.sse.Queue(v)
	}
}

func (o *responder) finish(text, reason string, usage openai.Usage, kvParams any, tokens []int, conditioning any) error {
	if o.sse != nil {
		// The last chunk, the usage and [DONE] leave in one write, with
		// the end of the body: the handler returns right after.
		o.writeChunk(text, &reason, nil, false)
		if o.g.includeUsage {
			o.writeChunk("", nil, &usage, false)
		}
		return o.sse.QueueDone()
	}
	o.text.WriteString(text)
	full := o.text.String()
	var body any
	if o.g.chat {
		body = openai.ChatCompletion{ID: o.chunkID(), Object: "chat.completion", Created: o.created, Model: o.s.cfg.ModelName,
			Choices: []openai.ChatChoice{{Index: 0, Message: openai.ResponseMessage{Role: "assistant", Content: &full}, FinishReason: reason}},
			Usage:   usage, KVTransferParams: kvParams}
	} else {
		body = openai.Completion{ID: o.chunkID(), Object: "text_completion", Created: o.created, Model: o.s.cfg.ModelName,
			Choices: []openai.CompletionChoice{{Index: 0, Text: full, FinishReason: reason}},
			Usage:   usage, KVTransferParams: kvParams}
	}
	if o.g.returnTokenIDs || conditioning != nil {
		// vLLM's return_token_ids: the choice carries the generated ids;
		// omnipd's conditioning handle rides at the top level.
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		if o.g.returnTokenIDs {
			m["choices"].([]any)[0].(map[string]any)["token_ids"] = tokens
		}
		if conditioning != nil {
			m[openai.ConditioningMember] = conditioning
		}
		body = m
	}
	writeJSON(o.w, http.StatusOK, body)
	return nil
}

// fail reports an engine error: an HTTP error before anything was
// streamed, an error event after.
func (o *responder) fail(err error) error {
	if o.sse == nil {
		return err
	}
	o.s.log.Error("request failed mid-stream", "request_id", o.id, "err", err)
	// The handler returns right after: the error event, [DONE] and the end
	// of the body leave in one write.
	_ = o.sse.Queue(openai.InternalError(err.Error()))
	_ = o.sse.QueueDone()
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	switch v.(type) {
	case openai.ChatCompletion, openai.Completion:
		// Their MarshalJSON writes compact JSON already, U+2028 and U+2029
		// escaped: json.Encoder would only scan it again to escape HTML,
		// which the bytes rarely need. The body stays what json.Encoder
		// wrote, escapes and final newline included.
		b, err := v.(json.Marshaler).MarshalJSON()
		if err != nil {
			return
		}
		if bytes.ContainsAny(b, "<>&") {
			var esc bytes.Buffer
			json.HTMLEscape(&esc, b)
			b = esc.Bytes()
		}
		_, _ = w.Write(append(b, '\n'))
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// growing is a request's stash that grows (async chunk); nil when the
// request keeps its rows the batch way or keeps none.
type growing struct {
	store *stageconn.Store
	key   string
	id    string
	s     *Server
	// gone: the stash was released or expired; nobody reads more.
	gone bool
}

// openGrowing opens the stash before the engine starts, so that it exists
// by the time the response (or the KV a decode waits for) leaves.
func (s *Server) openGrowing(g *generation, id string) (*growing, error) {
	if g.conditioning == nil || !g.conditioning.Stream {
		return nil, nil
	}
	m := s.eng.Model()
	head := &stageapi.Conditioning{
		TTSPad: m.Embedding(s.cfg.TTSTokenIDs[0]), TTSBos: m.Embedding(s.cfg.TTSTokenIDs[1]), TTSEos: m.Embedding(s.cfg.TTSTokenIDs[2]),
		TokenIDs: slices.Clone(g.prompt), PromptTokenIDs: g.prompt,
	}
	switch err := s.stashes.Open(g.conditioning.Key, head); {
	case errors.Is(err, stageconn.ErrReleased):
		s.log.Debug("conditioning released before it was kept", "request_id", id)
		return &growing{gone: true}, nil
	case err != nil:
		return nil, openai.InvalidRequest(openai.ConditioningMember, err.Error())
	}
	return &growing{store: s.stashes, key: g.conditioning.Key, id: id, s: s}, nil
}

// add appends the rows an event carries, with the token they bring.
func (gr *growing) add(ev engine.Event, tokens []int) {
	if gr == nil || gr.gone || ev.Rows == nil {
		return
	}
	if err := gr.store.Append(gr.key, ev.Rows.Embeddings, ev.Rows.Hidden, tokens); err != nil {
		gr.gone = true
		gr.s.log.Debug("conditioning no longer wanted", "request_id", gr.id, "err", err)
	}
}

// end closes the stash, or fails it with cause.
func (gr *growing) end(cause error) {
	if gr == nil || gr.gone {
		return
	}
	gr.gone = true
	if cause != nil {
		_ = gr.store.Fail(gr.key, cause)
		return
	}
	_ = gr.store.Close(gr.key)
}
