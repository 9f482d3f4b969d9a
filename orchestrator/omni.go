package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/omnipd/omnipd/audio"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/stageapi"
	"github.com/omnipd/omnipd/stageclient"
)

// Omni configures the stages after the Thinker: the Talker, fed the
// Thinker's conditioning, and Code2Wav, fed codec frames in chunks.
type Omni struct {
	Talker, Code2Wav *Pool
	// ConditioningLayer is the Thinker layer whose hidden states the Talker
	// reads (Qwen3-Omni's accept_hidden_layer).
	ConditioningLayer int
	// Chunking is the codec chunking of streamed audio (the stage
	// connector's initial_codec_chunk_frames, codec_chunk_frames,
	// codec_left_context_frames).
	Chunking audio.Chunker
	// AsyncChunk streams the conditioning (the deploy config's async_chunk):
	// the Thinker legs keep their rows in stashes that grow, and the Talker
	// of a streamed answer starts once the legs are under way, reading the
	// rows as the decode computes them, while the text streams on.
	AsyncChunk bool
	// Talker sampling defaults (the Talker stage's default_sampling_params).
	Temperature float64
	TopK        int
	MaxFrames   int
}

// conditioning is where a request's Thinker rows are kept.
type conditioning struct {
	layer                int
	prefillKey, thinkKey string
	// stream: the legs keep their rows in stashes that grow (async chunk).
	stream bool

	mu                   sync.Mutex
	prefillURL, thinkURL string
	fetched              bool
	// sent is closed once the leg that keeps the generated rows (the
	// decode, or the colocated Thinker) is sent: from then on its stash can
	// be read, and a whole answer's Talker starts (async chunk).
	sent     chan struct{}
	sentOnce sync.Once
}

func newConditioning(layer int, prefillKey, thinkKey string, stream bool) *conditioning {
	return &conditioning{layer: layer, prefillKey: prefillKey, thinkKey: thinkKey, stream: stream, sent: make(chan struct{})}
}

func (c *conditioning) setPrefill(url string) {
	c.mu.Lock()
	c.prefillURL = url
	c.mu.Unlock()
}

// dropPrefill forgets the prefill's stash: the decode prefills the request
// itself (pd.fallback: local), so its own rows cover the prompt, as a
// colocated Thinker's do. It returns the handle of the stash a failed
// prefill may have left, for the caller to free.
func (c *conditioning) dropPrefill() (stageapi.ConditioningHandle, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := stageapi.ConditioningHandle{URL: c.prefillURL, Key: c.prefillKey}
	c.prefillURL = ""
	return h, h.URL != ""
}

// rekeyPrefill gives the prefill's stash a new key, for a request planned
// again (redecode.go): a worker refuses a key it holds or was told to
// release. It returns the handle of the plan before's stash, for the
// caller to free.
func (c *conditioning) rekeyPrefill(key string) (stageapi.ConditioningHandle, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := stageapi.ConditioningHandle{URL: c.prefillURL, Key: c.prefillKey}
	c.prefillKey, c.prefillURL = key, ""
	return old, old.URL != ""
}

func (c *conditioning) setThinker(url string) {
	c.mu.Lock()
	c.thinkURL = url
	c.mu.Unlock()
	c.sentOnce.Do(func() { close(c.sent) })
}

// handles lists the stashes for the Talker: the prefill's then the
// decode's, or the colocated Thinker's.
func (c *conditioning) handles() []stageapi.ConditioningHandle {
	c.mu.Lock()
	defer c.mu.Unlock()
	var hs []stageapi.ConditioningHandle
	if c.prefillURL != "" {
		hs = append(hs, stageapi.ConditioningHandle{URL: c.prefillURL, Key: c.prefillKey})
	}
	return append(hs, stageapi.ConditioningHandle{URL: c.thinkURL, Key: c.thinkKey})
}

// prefill and thinker name where a leg keeps its conditioning: no key (and
// layer 0) when the request keeps none.
func (c *conditioning) prefill() (string, int) {
	if c == nil {
		return "", 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.prefillKey, c.layer
}

func (c *conditioning) thinker() (string, int) {
	if c == nil {
		return "", 0
	}
	return c.thinkKey, c.layer
}

func (c *conditioning) streams() bool { return c != nil && c.stream }

// thinkerExtras prepares every chat Thinker leg: the omni fields a text
// engine has no use for are removed, and with a key the leg is asked to
// keep its conditioning.
func thinkerExtras(c *openai.ChatCompletionRequest, key string, layer int, stream bool) {
	c.Modalities, c.Audio, c.Speaker = nil, nil, nil
	if key == "" {
		return
	}
	keep := map[string]any{"key": key, "layer": layer}
	if stream {
		keep["stream"] = true
	}
	raw, _ := json.Marshal(keep)
	if c.Extra == nil {
		c.Extra = map[string]json.RawMessage{}
	}
	c.Extra[openai.ConditioningMember] = raw
}

// Modalities the client asked for; both by default on an omni pipeline.
func modalities(req *openai.ChatCompletionRequest) (text, audioOut bool) {
	if len(req.Modalities) == 0 {
		return true, true
	}
	return slices.Contains(req.Modalities, openai.ModalityText), slices.Contains(req.Modalities, openai.ModalityAudio)
}

// SupportedAudioFormats are the formats the pipeline encodes.
func SupportedAudioFormats() []string { return audio.Formats() }

// omni serves a chat request whose answer includes audio.
func (o *Orchestrator) omni(ctx context.Context, req *Request, log *slog.Logger) (*Result, error) {
	om := o.cfg.Omni
	format := "wav"
	if req.Chat.Audio != nil && req.Chat.Audio.Format != "" {
		format = req.Chat.Audio.Format
	}
	if !slices.Contains(audio.Formats(), format) {
		return nil, openai.InvalidRequest("audio.format", fmt.Sprintf("audio.format %q is not supported; this pipeline encodes %s", format, strings.Join(audio.Formats(), ", ")))
	}
	if err := o.preflight(om.Talker, om.Code2Wav); err != nil {
		return nil, err
	}
	cond := newConditioning(om.ConditioningLayer, "", req.ID+"/thinker", om.AsyncChunk)
	if o.cfg.Contract != nil {
		cond.prefillKey, cond.thinkKey = req.ID+"/prefill", req.ID+"/decode"
	}
	req.keep = cond
	wantText, _ := modalities(req.Chat)
	streaming := req.streaming()

	// A whole answer's audio, with async chunk, is made while the Thinker
	// decodes: the Talker starts as soon as the leg with the generated rows
	// is sent, though the client sees nothing before the whole answer.
	var early *earlyTalk
	if !streaming && cond.stream {
		early = o.talkEarly(ctx, req, cond)
	}
	res, err := o.text(ctx, req, log)
	if err != nil {
		if early != nil {
			early.stop()
		}
		o.releaseConditioning(cond, log)
		return nil, err
	}
	if !streaming {
		defer res.Close()
		return o.omniWhole(ctx, req, res, cond, format, wantText, early, log)
	}
	return o.omniStream(ctx, req, res, cond, format, wantText, log), nil
}

// releaseConditioning drops stashes the Talker will not fetch.
func (o *Orchestrator) releaseConditioning(c *conditioning, log *slog.Logger) {
	c.mu.Lock()
	fetched := c.fetched
	c.mu.Unlock()
	if fetched {
		return
	}
	o.freeConditioning(c, log)
}

// freeConditioning tells each Thinker worker to drop c's stash, in the
// background (release.go): one the worker already dropped answers not
// found, which is fine.
func (o *Orchestrator) freeConditioning(c *conditioning, log *slog.Logger) {
	o.freeStashes(c.handles(), log)
}

func (o *Orchestrator) freeStashes(hs []stageapi.ConditioningHandle, log *slog.Logger) {
	for _, h := range hs {
		if h.URL == "" {
			continue
		}
		c := clientFor(h.URL, o.cfg.Prefill, o.cfg.Decode)
		if c == nil {
			log.Warn("no Thinker instance at the conditioning's URL; it is freed at its TTL", "key", h.Key, "instance", h.URL)
			continue
		}
		o.background(releaseStash, log, func(ctx context.Context) {
			if err := c.ReleaseConditioning(ctx, h.Key); err != nil {
				log.Warn("could not release conditioning; it is freed at its TTL", "key", h.Key, "err", err)
			}
		}, "key", h.Key, "instance", h.URL)
	}
}

// talk runs the Talker on the request's conditioning and calls frame for
// each codec frame. A Talker instance that refused the connection never
// saw the request: it goes to another (rotation.go).
func (o *Orchestrator) talk(ctx context.Context, req *Request, c *conditioning, frame func([]int) error) error {
	om := o.cfg.Omni
	log := o.log.With("request_id", req.ID, "client_request_id", req.clientID())
	body := stageapi.TalkerRequest{Conditioning: c.handles(), Temperature: om.Temperature, TopK: om.TopK, Seed: req.Chat.Seed, MaxFrames: om.MaxFrames, AsyncChunk: c.stream}
	raw, _ := json.Marshal(body)
	in, err := o.take(om.Talker, nil)
	if err != nil {
		o.releaseConditioning(c, log)
		return err
	}
	tried := map[*Instance]bool{}
	for {
		err := o.talkOn(ctx, req, in, raw, c, frame, log)
		if !refused(err) || ctx.Err() != nil {
			return err
		}
		refusal := err
		if in, err = o.failover(om.Talker, "talker", in, tried, err, log); in == nil {
			o.releaseConditioning(c, log)
			return audioUnreachable("talker", err, refusal)
		}
	}
}

// talkOn runs the Talker leg on in, onto which take counted it; the count
// is released when the leg ends. A refused connection is returned as it
// is, for talk to move the leg.
func (o *Orchestrator) talkOn(ctx context.Context, req *Request, in *Instance, raw []byte, c *conditioning, frame func([]int) error, log *slog.Logger) error {
	om := o.cfg.Omni
	defer o.track(om.Talker, in, -1)
	dog := o.watch(ctx, "talker")
	defer dog.stop()
	dog.arm()
	s, err := in.Client.Stream(dog.ctx, stageapi.TalkerPath, req.ID, raw)
	dog.disarm()
	if refused(err) {
		return err
	}
	if err != nil {
		// The Talker never fetched (or fetched only part): free what is left.
		o.releaseConditioning(c, log)
		if dog.fired() || errors.Is(err, stageclient.ErrConnect) {
			// Quiet past the idle timeout, or gone before answering: it
			// sits out, as a Thinker instance does, so that the next
			// requests do not find it in turn.
			in.eject(o.now())
		}
		if dog.fired() {
			return dog.err(err)
		}
		return fmt.Errorf("talker: %w", err)
	}
	in.ok()
	c.mu.Lock()
	c.fetched = true // the Talker took them
	c.mu.Unlock()
	defer s.Close()
	broke, err := o.relayFrames(ctx, s, dog, frame)
	if broke {
		// It went quiet, or its stream broke off (it died mid-answer):
		// once this leg ends it would look idle and draw the next requests.
		in.eject(o.now())
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		// A Talker that failed after it took the conditioning may never
		// free it (a crashed process frees nothing): free it here rather
		// than leave it to its TTL. A client that left cancels the Talker's
		// own request, and the Talker frees what it took.
		o.freeConditioning(c, log)
	}
	return err
}

// relayFrames passes each codec frame of the Talker's stream s to frame,
// until the stream ends (nil) or fails. broke reports a failure of the
// Talker itself: it went quiet past the idle timeout, or its stream broke
// off — not an error event it sent, nor frame's failure, nor the client
// leaving.
func (o *Orchestrator) relayFrames(ctx context.Context, s *stageclient.Stream, dog *watchdog, frame func([]int) error) (broke bool, err error) {
	for {
		dog.arm()
		ev, err := s.Next()
		dog.disarm()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			if dog.fired() {
				return true, dog.err(err)
			}
			var ue *stageclient.UpstreamError
			return !errors.As(err, &ue) && ctx.Err() == nil, fmt.Errorf("talker: %w", err)
		}
		var te stageapi.TalkerEvent
		if err := json.Unmarshal(ev, &te); err != nil {
			return false, fmt.Errorf("talker: %w", err)
		}
		switch {
		case te.Error != "":
			return false, fmt.Errorf("talker: %s", te.Error)
		case te.Frame != nil:
			if err := frame(te.Frame); err != nil {
				return false, err
			}
		}
	}
}

// vocode turns frames (the first context of them left context) into
// samples, on a Code2Wav instance — another one for as long as the one it
// went to refused the connection.
func (o *Orchestrator) vocode(ctx context.Context, req *Request, frames [][]int, context int) ([]float32, error) {
	om := o.cfg.Omni
	raw, _ := json.Marshal(stageapi.Code2WavRequest{Codes: stageapi.FramesToWire(frames), NumFrames: len(frames), ContextFrames: context})
	in, err := o.take(om.Code2Wav, nil)
	if err != nil {
		return nil, err
	}
	var tried map[*Instance]bool
	for {
		samples, err := o.vocodeOn(ctx, req, in, raw)
		if !refused(err) || ctx.Err() != nil {
			return samples, err
		}
		if tried == nil {
			tried = map[*Instance]bool{}
		}
		refusal := err
		if in, err = o.failover(om.Code2Wav, "code2wav", in, tried, err, o.log.With("request_id", req.ID)); in == nil {
			return nil, audioUnreachable("code2wav", err, refusal)
		}
	}
}

// vocodeOn sends one Code2Wav leg to in, onto which take counted it. A
// refused connection is returned as it is, for vocode to move the leg.
func (o *Orchestrator) vocodeOn(ctx context.Context, req *Request, in *Instance, raw []byte) ([]float32, error) {
	om := o.cfg.Omni
	dog := o.watch(ctx, "code2wav")
	dog.arm()
	resp, err := in.Client.Post(dog.ctx, stageapi.Code2WavPath, req.ID, raw)
	dog.stop()
	o.track(om.Code2Wav, in, -1)
	if refused(err) {
		return nil, err
	}
	if err != nil {
		if dog.fired() || errors.Is(err, stageclient.ErrConnect) {
			// Quiet past the idle timeout, or gone before answering: it
			// sits out, as a Thinker instance does.
			in.eject(o.now())
		}
		if dog.fired() {
			return nil, dog.err(err)
		}
		return nil, fmt.Errorf("code2wav: %w", err)
	}
	in.ok()
	var out stageapi.Code2WavResponse
	if err := json.Unmarshal(resp.Body, &out); err != nil {
		return nil, fmt.Errorf("code2wav: %w", err)
	}
	return stageapi.DecodeSamples(out.Samples)
}

func newAudioID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "audio-" + hex.EncodeToString(b[:])
}

// talkAll runs the Talker on the request's conditioning and returns every
// codec frame.
func (o *Orchestrator) talkAll(ctx context.Context, req *Request, c *conditioning) ([][]int, error) {
	var frames [][]int
	err := o.talk(ctx, req, c, func(f []int) error { frames = append(frames, f); return nil })
	return frames, err
}

// earlyTalk is a whole answer's Talker run beside its Thinker legs (async
// chunk): it starts once the leg with the generated rows is sent and reads
// the rows as they are computed.
type earlyTalk struct {
	cancel context.CancelFunc
	done   chan struct{}
	frames [][]int
	err    error
}

func (o *Orchestrator) talkEarly(ctx context.Context, req *Request, c *conditioning) *earlyTalk {
	tctx, cancel := context.WithCancel(ctx)
	t := &earlyTalk{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		select {
		case <-c.sent:
		case <-tctx.Done():
			t.err = tctx.Err()
			return
		}
		t.frames, t.err = o.talkAll(tctx, req, c)
	}()
	return t
}

// wait returns the Talker's frames once it has finished.
func (t *earlyTalk) wait() ([][]int, error) {
	<-t.done
	t.cancel()
	return t.frames, t.err
}

// stop ends the Talker (its Thinker legs failed) and waits for it.
func (t *earlyTalk) stop() {
	t.cancel()
	<-t.done
}

// omniWhole answers a non-streaming request: the text choice and the audio
// choice, both index 0, as vllm-omni returns them. The Talker is the one
// already under way (early, with async chunk) or is run now.
func (o *Orchestrator) omniWhole(ctx context.Context, req *Request, res *Result, c *conditioning, format string, wantText bool, early *earlyTalk, log *slog.Logger) (*Result, error) {
	var resp map[string]json.RawMessage
	if err := json.Unmarshal(res.Body, &resp); err != nil {
		if early != nil {
			early.stop()
		}
		o.releaseConditioning(c, log)
		return nil, &Error{Status: 502, Code: "decode_upstream_invalid", Msg: "the Thinker's response is not JSON", Cause: err}
	}
	var frames [][]int
	var err error
	if early != nil {
		frames, err = early.wait()
	} else {
		frames, err = o.talkAll(ctx, req, c)
	}
	if err != nil {
		return nil, audioFailure(ctx, "talker_failed", "the Talker stage failed", err)
	}
	samples, err := o.vocode(ctx, req, frames, 0)
	if err != nil {
		return nil, audioFailure(ctx, "code2wav_failed", "the Code2Wav stage failed", err)
	}
	data, _ := audio.Encode(format, samples)
	audioChoice := openai.ChatChoice{Index: 0, FinishReason: finishAudio, Message: openai.ResponseMessage{Role: "assistant", Audio: &openai.MessageAudio{
		ID: newAudioID(), Data: base64.StdEncoding.EncodeToString(data), ExpiresAt: time.Now().Add(24 * time.Hour).Unix(),
	}}}
	var choices []json.RawMessage
	if wantText {
		var text []json.RawMessage
		_ = json.Unmarshal(resp["choices"], &text)
		choices = append(choices, text...)
	}
	ac, _ := json.Marshal(audioChoice)
	choices = append(choices, ac)
	resp["choices"], _ = json.Marshal(choices)
	delete(resp, openai.ConditioningMember)
	body, _ := json.Marshal(resp)
	return &Result{Path: res.Path, Body: body}, nil
}

// finishAudio is the audio choice's finish_reason, whole or streamed. Each
// modality ends with a reason of its own, as vllm-omni's serving layer
// gives them (vllm_omni/entrypoints/openai/serving_chat.py at
// vllm-project/vllm-omni 2561d0d6): the text choice the Thinker's ("stop",
// "length", "tool_calls", …, or "stop" when it gave none), on the whole
// answer's text choice and on the text's last streamed chunk; the audio
// choice always "stop" (_create_audio_choice), on the whole answer's audio
// choice and, streamed, on the audio's last chunk — the Code2Wav output is
// finished only there, so the chunks before it carry none.
const finishAudio = openai.FinishStop

// omniStream relays the Thinker's text chunks (marked modality "text") as
// they arrive, then streams audio in codec chunks, each a complete small
// audio file; each modality's last chunk carries its finish_reason (see
// finishAudio). A Talker or
// Code2Wav failure after the text ends the stream with an error event for
// audio; the text already sent stands.
func (o *Orchestrator) omniStream(ctx context.Context, req *Request, res *Result, c *conditioning, format string, wantText bool, log *slog.Logger) *Result {
	out := &Result{Path: res.Path, release: res.release}
	res.release = nil
	events := make(chan json.RawMessage, 16)
	errc := make(chan error, 1)
	go func() {
		defer close(events)
		defer res.Close()
		send := func(v any) bool {
			b, err := json.Marshal(v)
			if err != nil {
				return false
			}
			select {
			case events <- b:
				return true
			case <-ctx.Done():
				return false
			}
		}
		var base map[string]any
		// With async chunk the audio runs beside the text from the start:
		// the text never waits for it, and it waits only for the first
		// text chunk, whose id and model the audio chunks repeat.
		baseReady := make(chan struct{})
		markBase := sync.OnceFunc(func() { close(baseReady) })
		var audioDone chan struct{}
		actx, stopAudio := context.WithCancel(ctx)
		defer stopAudio()
		if c.stream {
			audioDone = make(chan struct{})
			go func() {
				defer close(audioDone)
				select {
				case <-baseReady:
				case <-actx.Done():
					return
				}
				o.speak(actx, req, c, format, base, send, log)
			}()
		}
		endAudio := func() {
			stopAudio()
			if audioDone != nil {
				<-audioDone
			}
		}
		for {
			ev, err := res.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				o.releaseConditioning(c, log)
				endAudio()
				errc <- err
				return
			}
			var chunk map[string]any
			if json.Unmarshal(ev, &chunk) != nil {
				continue
			}
			if base == nil {
				base = map[string]any{"id": chunk["id"], "object": chunk["object"], "created": chunk["created"], "model": chunk["model"]}
				markBase()
			}
			// The text keeps the Thinker's finish_reason on its last chunk,
			// as the whole answer's text choice does (see finishAudio).
			chunk["modality"] = openai.ModalityText
			if wantText && !send(chunk) {
				o.releaseConditioning(c, log)
				endAudio()
				return
			}
		}
		markBase()
		if audioDone != nil {
			<-audioDone
			return
		}
		o.speak(ctx, req, c, format, base, send, log)
	}()
	out.events = events
	out.eventErr = errc
	return out
}

// audioUnreachable is the failure of an audio leg no instance of its stage
// could take: every one refused the connection (failover's err), or the
// rest were at their queue bound (a 429, kept). It stays the stage's
// failure (talker_failed, code2wav_failed, or the stream's audio_failed
// event), as for an audio stage that fails any other way.
func audioUnreachable(stage string, err, refusal error) error {
	if errors.Is(err, ErrStageBusy) {
		return err
	}
	var oe *Error
	if errors.As(err, &oe) {
		return fmt.Errorf("%s: %s: %w", stage, oe.Msg, refusal)
	}
	return fmt.Errorf("%s: %w", stage, refusal)
}

// audioFailure is what a failed Talker or Code2Wav leg of a whole answer
// means for the client: nothing when it left (the leg failed because it
// did), a stage's own classified error (a timeout), or a 502.
func audioFailure(ctx context.Context, code, msg string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var oe *Error
	if errors.As(err, &oe) {
		return oe
	}
	return &Error{Status: http.StatusBadGateway, Code: code, Msg: msg, Cause: err}
}

func withBase(base, fields map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range fields {
		out[k] = v
	}
	return out
}

// speak streams a request's audio: the Talker's frames in codec chunks,
// each rendered by Code2Wav and sent as a complete small audio file, then
// the audio's last chunk (or its error event).
func (o *Orchestrator) speak(ctx context.Context, req *Request, c *conditioning, format string, base map[string]any, send func(any) bool, log *slog.Logger) {
	chunker := o.cfg.Omni.Chunking
	first := true
	emit := func(ch audio.Chunk) error {
		samples, err := o.vocode(ctx, req, ch.Frames, ch.Context)
		if err != nil {
			return err
		}
		data, _ := audio.Encode(format, samples)
		content := base64.StdEncoding.EncodeToString(data)
		delta := map[string]any{"content": content}
		if first {
			delta["role"] = "assistant"
			first = false
		}
		if !send(withBase(base, map[string]any{"modality": openai.ModalityAudio,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": nil}}})) {
			return ctx.Err()
		}
		return nil
	}
	err := o.talk(ctx, req, c, func(f []int) error {
		for _, ch := range chunker.Push(f) {
			if err := emit(ch); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		for _, ch := range chunker.Flush() {
			if err = emit(ch); err != nil {
				break
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			log.Info("client went away during the audio")
			return
		}
		log.Error("audio failed after the text was sent", "err", err)
		ev := openai.Upstream(http.StatusBadGateway, "audio_failed", "the audio stages failed: "+err.Error())
		var oe *Error
		if errors.As(err, &oe) {
			ev = openai.Upstream(oe.Status, oe.Code, "the audio stages failed: "+oe.Msg)
		}
		send(withBase(base, map[string]any{"modality": openai.ModalityAudio, "error": ev.Detail}))
		return
	}
	send(withBase(base, map[string]any{"modality": openai.ModalityAudio,
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": finishAudio}}}))
}
