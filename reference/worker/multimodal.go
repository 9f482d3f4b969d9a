package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/eccache"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/audioproc"
	"github.com/omnipd/omnipd/reference/engine/encoder"
	"github.com/omnipd/omnipd/reference/engine/mmproc"
	"github.com/omnipd/omnipd/reference/engine/simulate"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/engine/visionproc"
	"github.com/omnipd/omnipd/reference/mediafetch"
)

// MediaConfig is what media a reference Thinker accepts and from where:
// vLLM's --allowed-media-domains, --allowed-local-media-path and
// --limit-mm-per-prompt, and a byte limit per item (docs/multimodal/api.md).
// The zero value takes inline media only (data: URLs and input_audio), at
// most vLLM's default count per modality, each at most
// mediafetch.DefaultMaxBytes.
type MediaConfig struct {
	Policy mediafetch.Policy
	Limits openai.MediaLimits
}

// The encoders' weights come from fixed seeds, so every worker of a
// deployment — prefill, decode, colocated — has the same encoders, as they
// would load the same checkpoint.
const (
	audioEncoderSeed  = 0x4155_4449_4f00 // "AUDIO"
	visionEncoderSeed = 0x5649_5349_4f4e // "VISION"
)

// media is a Thinker worker's multimodal input path: the fetch policy and
// the encoders. The processors (audioproc, visionproc, mmproc) are pure.
type media struct {
	cfg MediaConfig
	// device is the encoder worker's one modeled device in simulate mode
	// (a semaphore of one).
	device  chan struct{}
	fetch   *mediafetch.Fetcher
	audio   *encoder.AudioEncoder
	vision  *encoder.VisionEncoder
	tokens  mmproc.Tokens
	metrics *metrics.Worker
	// audioLimits bound every audio the worker decodes, a clip or a video's
	// own audio, to what its audio encoder takes; imageCfg and videoCfg
	// bound every image and video to what its vision encoder takes.
	audioLimits audioproc.Limits
	imageCfg    visionproc.Config
	videoCfg    visionproc.VideoConfig
	// layout expands a prompt's placeholders and computes its positions
	// (mmproc.Prepare); tests stand in a layout that fails.
	layout func(prompt []int, items []mmproc.Item, opts mmproc.Options) (mmproc.Prepared, error)
}

func newMedia(cfg MediaConfig, tok *tokenizer.Tokenizer, hidden int, m *metrics.Worker) (*media, error) {
	if cfg.Policy.MaxBytes <= 0 {
		cfg.Policy.MaxBytes = mediafetch.DefaultMaxBytes
	}
	fetch, err := mediafetch.NewFetcher(cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("worker: media policy: %w", err)
	}
	audioCfg := encoder.DefaultAudioConfig(hidden)
	audio, err := encoder.NewAudioEncoder(audioCfg, audioEncoderSeed)
	if err != nil {
		return nil, fmt.Errorf("worker: audio encoder: %w", err)
	}
	visionCfg := encoder.DefaultVisionConfig(hidden)
	vision, err := encoder.NewVisionEncoder(visionCfg, visionEncoderSeed)
	if err != nil {
		return nil, fmt.Errorf("worker: vision encoder: %w", err)
	}
	// A clip longer than the audio encoder takes (its MaxFrames), or an
	// image or video of more patches than the vision encoder takes, is the
	// client's input: refused as the part's 400 — a clip from its header,
	// before a sample is decoded; an image or video before it is resized —
	// not as the encoder's error, a 500 that under PD fails the prefill and
	// is retried. vLLM, too, refuses before encoding a media item larger
	// than its encoder takes (one that outgrows its encoder cache:
	// VLLMValidationError, a 400, in InputProcessor._validate_model_input,
	// vllm/v1/engine/input_processor.py at 009daaee), and Qwen3-Omni's
	// processor never cuts a clip short (truncation=False,
	// docs/multimodal/audio.md). The duration refuses exactly the clips of
	// more frames (audioproc.FramesDuration).
	md := &media{cfg: cfg, fetch: fetch, audio: audio, vision: vision, metrics: m, device: make(chan struct{}, 1), layout: mmproc.Prepare,
		audioLimits: audioproc.Limits{MaxDuration: audioproc.FramesDuration(audioCfg.MaxFrames)},
		imageCfg:    visionproc.DefaultImageConfig(),
		videoCfg:    visionproc.DefaultVideoConfig(),
	}
	md.imageCfg.MaxPatches = min(md.imageCfg.MaxPatches, visionCfg.MaxPatches)
	md.videoCfg.MaxPatches = min(md.videoCfg.MaxPatches, visionCfg.MaxPatches)
	// A tokenizer without the markers (a checkpoint's own, text-only) takes
	// no media: tokens stays invalid and prepare refuses media parts. One
	// whose marker is no special token is refused: text would spell it
	// (Encode matches ordinary added tokens), forging placeholders that
	// only the worker's own layout may place.
	ids := make([]int, 7)
	for i, name := range []string{tokenizer.AudioStart, tokenizer.AudioEnd, tokenizer.AudioPad, tokenizer.VisionStart, tokenizer.VisionEnd, tokenizer.ImagePad, tokenizer.VideoPad} {
		id, ok := tok.TokenID(name)
		if !ok {
			return md, nil
		}
		if !tok.IsSpecial(id) {
			return nil, fmt.Errorf("worker: the tokenizer's %s (id %d) is no special token, so text could spell a media placeholder; mark it special in tokenizer.json", name, id)
		}
		ids[i] = id
	}
	md.tokens = mmproc.Tokens{AudioStart: ids[0], AudioEnd: ids[1], AudioPad: ids[2], VisionStart: ids[3], VisionEnd: ids[4], ImagePad: ids[5], VideoPad: ids[6]}
	return md, nil
}

func (md *media) supported() bool { return md.tokens.Validate() == nil }

func (md *media) options(useAudioInVideo bool) mmproc.Options {
	opts := mmproc.Qwen3OmniOptions()
	opts.Tokens = md.tokens
	opts.UseAudioInVideo = useAudioInVideo
	return opts
}

// mediaItem is one media part, processed: its sizes (what the placeholders
// and positions need) and what its encoder reads, kept for the encoder
// rather than encoded now — a decode whose KV import brings the prompt
// never encodes.
type mediaItem struct {
	item mmproc.Item
	path string
	key  string // content hash (contentKey)
	// encoded, when set, are the item's rows from an encoder worker (E/P/D):
	// the prefill uses them and encodes nothing.
	encoded *eccache.Entry
	mel     []float32 // audio: 16 kHz mono, padded to the hop
	patches visionproc.Patches
	// videoAudio is a video's own audio (use_audio_in_video), 16 kHz mono.
	videoAudio []float32
}

// requestMedia is a chat request's media, in the order of their parts.
type requestMedia struct {
	items           []mediaItem
	useAudioInVideo bool
}

// prepare reads a chat request's media parts, fetches and decodes them
// (checking the limits), and returns the turns with each media part
// rendered as the chat template renders it, and the media. A request with
// no media part gets nil media. Errors are 400s naming the part.
func (md *media) prepare(ctx context.Context, req *openai.ChatCompletionRequest) ([]tokenizer.Message, *requestMedia, error) {
	items, err := openai.MediaItems(req, md.cfg.Policy.MaxBytes)
	if err != nil {
		return nil, nil, err
	}
	msgs := make([]tokenizer.Message, 0, len(req.Messages))
	if len(items) == 0 {
		for i, m := range req.Messages {
			if m.Content != nil {
				for j, part := range m.Content.Parts {
					if part.Type != openai.PartText {
						return nil, nil, openai.InvalidRequest(fmt.Sprintf("messages[%d].content[%d].type", i, j), fmt.Sprintf("content of type %q is not supported by the reference Thinker", part.Type))
					}
				}
			}
			msgs = append(msgs, tokenizer.Message{Role: m.Role, Content: m.Text()})
		}
		return msgs, nil, nil
	}
	if !md.supported() {
		return nil, nil, openai.InvalidRequest(items[0].Path, "this model's tokenizer has no multimodal placeholders; send text")
	}
	kw, err := openai.ParseMMProcessorKwargs(req)
	if err != nil {
		return nil, nil, err
	}
	if err := md.cfg.Limits.Check(items, kw.UseAudioInVideo); err != nil {
		return nil, nil, err
	}
	data, err := md.fetch.FetchAll(ctx, items)
	if err != nil {
		return nil, nil, fetchFailure(ctx, items, err)
	}
	rm := &requestMedia{useAudioInVideo: kw.UseAudioInVideo}
	byPath := make(map[string]int, len(items))
	for i, it := range items {
		mi, err := md.process(it, data[i], kw.UseAudioInVideo)
		if err != nil {
			return nil, nil, partError(it, err)
		}
		mi.key = contentKey(mi.item.Kind, kw.UseAudioInVideo, data[i])
		byPath[it.Path] = len(rm.items)
		rm.items = append(rm.items, mi)
	}
	for i, m := range req.Messages {
		if m.Content == nil || m.Content.Parts == nil {
			msgs = append(msgs, tokenizer.Message{Role: m.Role, Content: m.Text()})
			continue
		}
		parts := make([]tokenizer.Part, 0, len(m.Content.Parts))
		for j, p := range m.Content.Parts {
			if p.Type == openai.PartText {
				parts = append(parts, tokenizer.Part{Text: p.Text})
				continue
			}
			k, ok := byPath[fmt.Sprintf("messages[%d].content[%d]", i, j)]
			if !ok {
				return nil, nil, openai.InvalidRequest(fmt.Sprintf("messages[%d].content[%d].type", i, j), fmt.Sprintf("content of type %q is not supported by the reference Thinker", p.Type))
			}
			parts = append(parts, placeholderParts(rm.items[k].item.Kind)...)
		}
		msgs = append(msgs, tokenizer.Message{Role: m.Role, Parts: parts})
	}
	return msgs, rm, nil
}

// placeholderParts is a media part as Qwen3-Omni's chat template renders
// it; the processor then repeats the pad (mmproc.Expand).
func placeholderParts(k mmproc.Kind) []tokenizer.Part {
	start, pad, end := tokenizer.AudioStart, tokenizer.AudioPad, tokenizer.AudioEnd
	switch k {
	case mmproc.Image:
		start, pad, end = tokenizer.VisionStart, tokenizer.ImagePad, tokenizer.VisionEnd
	case mmproc.Video:
		start, pad, end = tokenizer.VisionStart, tokenizer.VideoPad, tokenizer.VisionEnd
	}
	return []tokenizer.Part{{Special: start}, {Special: pad}, {Special: end}}
}

// clientMessager is an error about a client's media that can say what is
// wrong in the client's terms. The input errors of audioproc, visionproc
// and mediafetch are such errors; so are the worker's own (inputProblem).
type clientMessager interface{ ClientMessage() string }

// clientMessage is what err tells the client: the message of the first
// clientMessager in its chain. Any other error is no fault of the
// client's media that it could put right; it is told nothing more than
// that, and the log has the cause.
func clientMessage(err error) string {
	var cm clientMessager
	if errors.As(err, &cm) {
		return cm.ClientMessage()
	}
	return "the media could not be processed"
}

// inputProblem is a problem the worker itself finds with a media part,
// worded for the client.
type inputProblem string

func (p inputProblem) Error() string         { return string(p) }
func (p inputProblem) ClientMessage() string { return string(p) }

// within says what part of an item an error is about ("its audio track"),
// to the client as to the log.
type within struct {
	what string
	err  error
}

func (w within) Error() string         { return w.what + ": " + w.err.Error() }
func (w within) Unwrap() error         { return w.err }
func (w within) ClientMessage() string { return w.what + ": " + clientMessage(w.err) }

// mediaError is the 400 for one media part. The client reads resp, whose
// param is the part and whose message names the part's media field and
// what is wrong with it, in its terms ("messages[0].content[1].input_audio:
// not a WAV file: no RIFF/WAVE header"); the worker's log line reads
// Error, which keeps the whole cause (the decoder's or the dialer's own
// words).
type mediaError struct {
	resp  *openai.ErrorResponse
	field string
	cause error
}

func (e *mediaError) Error() string   { return e.field + ": " + e.cause.Error() }
func (e *mediaError) Unwrap() []error { return []error{e.resp, e.cause} }

// partError is the client's 400 for item, which err keeps from being used.
func partError(item openai.MediaItem, err error) error {
	field := item.Path
	if item.PartType != "" {
		field += "." + item.PartType
	}
	return &mediaError{resp: openai.InvalidRequest(item.Path, field+": "+clientMessage(err)), field: field, cause: err}
}

// fetchFailure turns a fetch error into the client's 400 naming the part.
// A fetch abandoned because the client went away is no 400: it is
// returned as the cancellation it is.
func fetchFailure(ctx context.Context, items []openai.MediaItem, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("fetching the media: %w", context.Cause(ctx))
	}
	var pe *mediafetch.PartError
	if errors.As(err, &pe) {
		for _, it := range items {
			if it.Path == pe.Path {
				return partError(it, pe.Err)
			}
		}
		return partError(openai.MediaItem{Path: pe.Path}, pe.Err)
	}
	var re *openai.RequestError
	if errors.As(err, &re) {
		return err
	}
	return &mediaError{resp: openai.InvalidRequest("messages", "messages: "+clientMessage(err)), field: "messages", cause: err}
}

// process decodes one item and computes its sizes: an audio's mel frames,
// an image's or a video's patch grid (and a video's own audio, with
// use_audio_in_video).
func (md *media) process(it openai.MediaItem, data []byte, useAudioInVideo bool) (mediaItem, error) {
	mi := mediaItem{path: it.Path}
	switch it.Kind {
	case openai.MediaAudio:
		samples, err := decodeAudio(data, it.Format, md.audioLimits)
		if err != nil {
			return mi, err
		}
		mi.mel = samples
		mi.item = mmproc.NewAudio(audioproc.FrameCount(len(samples)))
	case openai.MediaImage:
		p, _, err := visionproc.ProcessImageBytes(data, visionproc.DefaultImageLimits(), md.imageCfg)
		if err != nil {
			return mi, err
		}
		mi.patches = p
		mi.item = mmproc.NewImage(mmproc.Grid{T: p.Grid.T, H: p.Grid.H, W: p.Grid.W})
	case openai.MediaVideo:
		v, err := visionproc.ProcessVideo(data, visionproc.DefaultContainerLimits(), md.videoCfg)
		if err != nil {
			return mi, err
		}
		mi.patches = v.Patches
		grid := mmproc.Grid{T: v.Grid.T, H: v.Grid.H, W: v.Grid.W}
		mi.item = mmproc.NewVideo(grid, v.SecondsPerGrid)
		if useAudioInVideo {
			if v.Audio == nil {
				return mi, inputProblem("mm_processor_kwargs.use_audio_in_video is set, but the video has no audio track")
			}
			samples, err := decodeVideoAudio(v.Audio, md.audioLimits)
			if err != nil {
				return mi, within{"its audio track", err}
			}
			mi.videoAudio = samples
			mi.item = mmproc.NewVideoWithAudio(grid, v.SecondsPerGrid, audioproc.FrameCount(len(samples)))
		}
	default:
		return mi, inputProblem(fmt.Sprintf("media of kind %q is not supported", it.Kind))
	}
	return mi, nil
}

// decodeAudio decodes an audio file to what the feature extractor reads:
// 16 kHz mono, padded with zeros to a whole hop, as vLLM pads every audio
// before Qwen3-Omni's processor (docs/multimodal/audio.md), within limits.
// An audio_url declares no format: its bytes tell.
func decodeAudio(data []byte, format string, limits audioproc.Limits) ([]float32, error) {
	if format == "" {
		if format = string(audioproc.Sniff(data)); format == "" {
			return nil, inputProblem("not audio of a supported format; send WAV or MP3")
		}
	}
	a, err := audioproc.Decode(data, format, limits)
	if err != nil {
		return nil, err
	}
	return monoPadded(a)
}

func decodeVideoAudio(p *visionproc.PCMAudio, limits audioproc.Limits) ([]float32, error) {
	if p.BitsPerSample != 16 || p.Float {
		kind := "integer"
		if p.Float {
			kind = "float"
		}
		return nil, inputProblem(fmt.Sprintf("%d-bit %s PCM is not supported; send 16-bit PCM (ffmpeg -c:a pcm_s16le)", p.BitsPerSample, kind))
	}
	a, err := audioproc.DecodePCM16LE(p.Data, p.SampleRate, p.Channels, limits)
	if err != nil {
		return nil, err
	}
	return monoPadded(a)
}

func monoPadded(a audioproc.Audio) ([]float32, error) {
	mono, err := audioproc.Mono16k(a)
	if err != nil {
		return nil, err
	}
	if len(mono) == 0 {
		return nil, inputProblem("the audio is empty")
	}
	return audioproc.PadToHop(mono), nil
}

// multimodal expands the prompt's placeholders and computes its rotary
// positions (the processor's work, which prefill and decode both do), and
// gives the engine the encoders to run, should it compute a placeholder.
func (md *media) multimodal(prompt []int, rm *requestMedia) ([]int, *engine.Multimodal, error) {
	items := make([]mmproc.Item, len(rm.items))
	for i, mi := range rm.items {
		items[i] = mi.item
	}
	opts := md.options(rm.useAudioInVideo)
	p, err := md.layout(prompt, items, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("laying out the media placeholders: %w", err)
	}
	n := len(p.Tokens)
	mm := &engine.Multimodal{Positions: make([][3]int, n), Placeholder: make([]bool, n), Delta: p.Positions.Delta}
	pads := []int{md.tokens.AudioPad, md.tokens.ImagePad, md.tokens.VideoPad}
	for i, tok := range p.Tokens {
		mm.Positions[i] = p.Positions.At(i)
		mm.Placeholder[i] = slices.Contains(pads, tok)
	}
	tokens := p.Tokens
	mm.Encode = func() ([][]float32, error) { return md.encode(tokens, rm) }
	if !rm.fetched() {
		// What the engine's encoders would work on, for the latency model
		// in simulate mode.
		mm.Encoding = rm.simItems()
	}
	return tokens, mm, nil
}

// fetched reports media whose encoder rows all came from an encoder stage.
func (rm *requestMedia) fetched() bool {
	for _, mi := range rm.items {
		if mi.encoded == nil {
			return false
		}
	}
	return true
}

// encode places every item's encoder rows at the placeholders — rows an
// encoder worker made (E/P/D), or this worker's encoders' — the audio pads
// taking the audio rows (standalone clips and videos' own audio) in the
// order of the items, the image and video pads likewise.
func (md *media) encode(tokens []int, rm *requestMedia) ([][]float32, error) {
	var audio, image, video [][]float32
	for _, mi := range rm.items {
		e := mi.encoded
		if e == nil {
			var err error
			if e, err = md.encodeEntry(mi); err != nil {
				return nil, fmt.Errorf("%s: %w", mi.path, err)
			}
		}
		audio = append(audio, e.Audio...)
		switch mi.item.Kind {
		case mmproc.Image:
			image = append(image, e.Vision...)
		case mmproc.Video:
			video = append(video, e.Vision...)
		}
	}
	out := make([][]float32, len(tokens))
	queues := map[int]*[][]float32{md.tokens.AudioPad: &audio, md.tokens.ImagePad: &image, md.tokens.VideoPad: &video}
	for i, tok := range tokens {
		q, ok := queues[tok]
		if !ok {
			continue
		}
		if len(*q) == 0 {
			return nil, fmt.Errorf("the encoders gave fewer rows than the prompt has placeholders (at position %d)", i)
		}
		out[i], *q = (*q)[0], (*q)[1:]
	}
	if len(audio)+len(image)+len(video) != 0 {
		return nil, fmt.Errorf("the encoders gave %d rows more than the prompt has placeholders", len(audio)+len(image)+len(video))
	}
	return out, nil
}

// encodeEntry runs the encoders on one item: an audio's, an image's or a
// video's rows, and a video's own audio's when it is heard.
func (md *media) encodeEntry(mi mediaItem) (*eccache.Entry, error) {
	e := &eccache.Entry{}
	var err error
	switch mi.item.Kind {
	case mmproc.Audio:
		e.Audio, err = md.encodeAudio(mi.mel)
	case mmproc.Image, mmproc.Video:
		if e.Vision, err = md.encodeVision(mi.patches); err != nil {
			return nil, err
		}
		md.metrics.RecordEncoderRun(map[mmproc.Kind]string{mmproc.Image: "image", mmproc.Video: "video"}[mi.item.Kind])
		if mi.videoAudio != nil {
			if e.Audio, err = md.encodeAudio(mi.videoAudio); err != nil {
				return nil, fmt.Errorf("its audio: %w", err)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return e, nil
}

func (md *media) encodeAudio(samples []float32) ([][]float32, error) {
	f, err := audioproc.LogMel(samples)
	if err != nil {
		return nil, err
	}
	md.metrics.RecordEncoderRun("audio")
	return md.audio.Encode(f.Mel)
}

func (md *media) encodeVision(p visionproc.Patches) ([][]float32, error) {
	rows := make([][]float32, p.NumPatches())
	for i := range rows {
		rows[i] = p.Patch(i)
	}
	return md.vision.Encode(rows, p.Grid.T, p.Grid.H, p.Grid.W)
}

// tokens are the placeholders an item fills: its audio pads (a clip's, or
// a video's own audio heard with it) and its image or video pads.
func (mi mediaItem) tokens() (audio, vision int) {
	it := mi.item
	if it.Kind == mmproc.Image || it.Kind == mmproc.Video {
		vision, _ = mmproc.VisionTokens(it.Grid, mmproc.Qwen3OmniSpatialMergeSize)
	}
	if it.Kind == mmproc.Audio || mi.videoAudio != nil {
		audio, _ = mmproc.AudioTokens(it.AudioFrames)
	}
	return audio, vision
}

// simItems are the request's media as the encoder latency model counts
// them: each item's placeholder tokens (a video's own audio as an audio
// item of its own).
func (rm *requestMedia) simItems() []simulate.EncoderItem {
	var items []simulate.EncoderItem
	for _, mi := range rm.items {
		audio, vision := mi.tokens()
		switch mi.item.Kind {
		case mmproc.Image:
			items = append(items, simulate.EncoderItem{Kind: simulate.EncoderImage, Tokens: vision, Segments: 1})
		case mmproc.Video:
			items = append(items, simulate.EncoderItem{Kind: simulate.EncoderVideo, Tokens: vision, Segments: mi.item.Grid.T})
		}
		if audio > 0 {
			items = append(items, simulate.EncoderItem{Kind: simulate.EncoderAudio, Tokens: audio, Segments: 1})
		}
	}
	return items
}

// simulateEncoders keeps an encoder worker's modeled pace in simulate
// mode: instead of running the tiny encoders (the simulated prefill
// computes nothing from their rows) it holds the worker's one modeled
// device for what the profile says the request's items take
// (docs/simulate.md), one request after another as a GPU would, and
// counts the items as encoded.
func (md *media) simulateEncoders(ctx context.Context, p *simulate.Profile, rm *requestMedia) error {
	d := p.Encoder.BatchTime(rm.simItems())
	select {
	case md.device <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-md.device }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, mi := range rm.items {
		md.metrics.RecordEncoderRun(mi.item.Kind.String())
		if mi.videoAudio != nil {
			md.metrics.RecordEncoderRun("audio")
		}
	}
	return nil
}
