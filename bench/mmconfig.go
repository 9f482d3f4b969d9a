package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Modalities of the synthetic media items of the random-mm dataset.
const (
	ModalityAudio = "audio"
	ModalityImage = "image"
	ModalityVideo = "video"
)

// Defaults of the random-mm flags. The text, count and bucket defaults are
// vLLM's (RandomMultiModalDataset in vllm/benchmarks/datasets.py); the audio
// limit and the audio settings are omnipd's, since vLLM synthesizes no audio.
const (
	DefaultMMBaseItemsPerRequest = 1
	DefaultMMLimitPerPrompt      = `{"image": 255, "video": 1, "audio": 1}`
	DefaultMMBucketConfig        = `{(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}`
	DefaultMMAudioSampleRate     = 16000
	AudioPartInputAudio          = "input_audio"
	AudioPartAudioURL            = "audio_url"
)

// Bounds on one synthetic item, so that a slip in a bucket key (a missing
// comma, seconds for milliseconds) fails at once rather than filling memory.
const (
	maxImageSide     = 16384
	maxImagePixels   = 64 << 20
	maxAudioSeconds  = 3600
	maxAudioChannels = 8
	maxSampleRate    = 192000
	maxItemBytes     = 512 << 20
)

// Bucket is one shape of synthetic media item, keyed as vLLM's
// --random-mm-bucket-config keys it: (height, width, frames), an image when
// frames is 1 and a video when it is more; and, as vllm-omni extends it,
// (0, seconds, channels) for an audio clip.
type Bucket struct {
	Key [3]int
}

// Modality is audio, image or video.
func (b Bucket) Modality() string {
	switch {
	case b.Key[0] == 0:
		return ModalityAudio
	case b.Key[2] == 1:
		return ModalityImage
	default:
		return ModalityVideo
	}
}

// Height and Width of an image or video; Seconds and Channels of audio.
func (b Bucket) Height() int   { return b.Key[0] }
func (b Bucket) Width() int    { return b.Key[1] }
func (b Bucket) Frames() int   { return b.Key[2] }
func (b Bucket) Seconds() int  { return b.Key[1] }
func (b Bucket) Channels() int { return b.Key[2] }

// String writes the key as the flag takes it: "(256, 256, 1)".
func (b Bucket) String() string {
	return fmt.Sprintf("(%d, %d, %d)", b.Key[0], b.Key[1], b.Key[2])
}

// Describe names the item in words: "256x256 image", "30 s mono audio".
func (b Bucket) Describe() string {
	switch b.Modality() {
	case ModalityAudio:
		ch := fmt.Sprintf("%d-channel", b.Channels())
		switch b.Channels() {
		case 1:
			ch = "mono"
		case 2:
			ch = "stereo"
		}
		return fmt.Sprintf("%d s %s audio", b.Seconds(), ch)
	case ModalityImage:
		return fmt.Sprintf("%dx%d image", b.Width(), b.Height())
	}
	return fmt.Sprintf("%dx%d video of %d frames", b.Width(), b.Height(), b.Frames())
}

func (b Bucket) validate() error {
	k := b.Key
	switch b.Modality() {
	case ModalityAudio:
		switch {
		case k[1] < 1 || k[1] > maxAudioSeconds:
			return fmt.Errorf("audio bucket %s: %d seconds; want 1 to %d", b, k[1], maxAudioSeconds)
		case k[2] < 1 || k[2] > maxAudioChannels:
			return fmt.Errorf("audio bucket %s: %d channels; want 1 to %d", b, k[2], maxAudioChannels)
		}
		return nil
	case ModalityVideo:
		if k[2] < 1 {
			return fmt.Errorf("bucket %s: %d frames; want 1 (an image) or more (a video)", b, k[2])
		}
		return fmt.Errorf("bucket %s: video buckets (frames > 1) are not synthesized yet; use images (frames 1) or audio (0, seconds, channels)", b)
	}
	switch {
	case k[0] < 1 || k[1] < 1 || k[0] > maxImageSide || k[1] > maxImageSide:
		return fmt.Errorf("image bucket %s: height and width must be 1 to %d", b, maxImageSide)
	case k[0]*k[1] > maxImagePixels:
		return fmt.Errorf("image bucket %s: %d pixels; at most %d", b, k[0]*k[1], maxImagePixels)
	}
	return nil
}

// BucketWeight is a bucket and its sampling weight as given.
type BucketWeight struct {
	Bucket Bucket
	Weight float64
}

// ParseBucketConfig reads --random-mm-bucket-config: a Python dict literal
// of (height, width, frames) tuples to probabilities, as vLLM takes it
// ({(256, 256, 1): 0.5, (720, 1280, 1): 0.5}), or the same with the tuples
// quoted, as JSON must write them ({"(0, 60, 1)": 1.0}). Entries keep the
// order given. Weights need not sum to 1; they are normalized when sampled.
func ParseBucketConfig(s string) ([]BucketWeight, error) {
	p := &litParser{s: s}
	var out []BucketWeight
	if err := p.expect('{'); err != nil {
		return nil, err
	}
	for {
		p.space()
		if p.peek() == '}' {
			p.i++
			break
		}
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		if err := p.expect(':'); err != nil {
			return nil, err
		}
		w, err := p.number()
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", key, err)
		}
		if w < 0 || math.IsInf(w, 0) || math.IsNaN(w) {
			return nil, fmt.Errorf("bucket %s: probability %v; want a finite number >= 0", key, w)
		}
		if slices.ContainsFunc(out, func(b BucketWeight) bool { return b.Bucket == key }) {
			return nil, fmt.Errorf("bucket %s given twice", key)
		}
		out = append(out, BucketWeight{key, w})
		p.space()
		switch p.peek() {
		case ',':
			p.i++
			continue
		case '}':
			p.i++
		default:
			return nil, p.errorf("want ',' or '}'")
		}
		break
	}
	p.space()
	if p.i != len(p.s) {
		return nil, p.errorf("unexpected text after the closing '}'")
	}
	if len(out) == 0 {
		return nil, errors.New("no buckets; want e.g. {(256, 256, 1): 1.0}")
	}
	return out, nil
}

// litParser reads the small subset of Python literals a bucket config is.
type litParser struct {
	s string
	i int
}

func (p *litParser) errorf(format string, args ...any) error {
	at := p.s[p.i:]
	if len(at) > 16 {
		at = at[:16] + "…"
	}
	if at == "" {
		at = "the end"
	} else {
		at = strconv.Quote(at)
	}
	return fmt.Errorf("at %s (offset %d): %s", at, p.i, fmt.Sprintf(format, args...))
}

func (p *litParser) space() {
	for p.i < len(p.s) && strings.ContainsRune(" \t\r\n", rune(p.s[p.i])) {
		p.i++
	}
}

func (p *litParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *litParser) expect(c byte) error {
	p.space()
	if p.peek() != c {
		return p.errorf("want %q", c)
	}
	p.i++
	return nil
}

// key reads (h, w, t), bare or inside quotes.
func (p *litParser) key() (Bucket, error) {
	p.space()
	quote := p.peek()
	if quote == '"' || quote == '\'' {
		p.i++
	} else {
		quote = 0
	}
	if err := p.expect('('); err != nil {
		return Bucket{}, fmt.Errorf("%w: a bucket key is a tuple (height, width, frames)", err)
	}
	var b Bucket
	for n := range 3 {
		v, err := p.integer()
		if err != nil {
			return Bucket{}, err
		}
		b.Key[n] = v
		sep := byte(',')
		if n == 2 {
			sep = ')'
		}
		if err := p.expect(sep); err != nil {
			if n == 2 || p.peek() == ')' {
				return Bucket{}, fmt.Errorf("%w: a bucket key has three integers (height, width, frames)", err)
			}
			return Bucket{}, err
		}
	}
	if quote != 0 {
		if p.peek() != quote {
			return Bucket{}, p.errorf("want the closing %q", quote)
		}
		p.i++
	}
	return b, nil
}

func (p *litParser) integer() (int, error) {
	p.space()
	start := p.i
	for p.i < len(p.s) && (p.s[p.i] >= '0' && p.s[p.i] <= '9' || p.i == start && p.s[p.i] == '-') {
		p.i++
	}
	v, err := strconv.Atoi(p.s[start:p.i])
	if err != nil {
		p.i = start
		return 0, p.errorf("want an integer")
	}
	return v, nil
}

func (p *litParser) number() (float64, error) {
	p.space()
	start := p.i
	for p.i < len(p.s) && strings.ContainsRune("0123456789+-.eE", rune(p.s[p.i])) {
		p.i++
	}
	v, err := strconv.ParseFloat(p.s[start:p.i], 64)
	if err != nil {
		p.i = start
		return 0, p.errorf("want a probability (a number)")
	}
	return v, nil
}

// ParseMMLimits reads --random-mm-limit-mm-per-prompt: a JSON object of
// per-modality caps on the items of one request, {"image": 3, "video": 0}.
func ParseMMLimits(s string) (map[string]int, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, fmt.Errorf(`want a JSON object such as {"image": 1, "audio": 1}: %w`, err)
	}
	out := map[string]int{}
	for k, v := range raw {
		switch k {
		case ModalityAudio, ModalityImage, ModalityVideo:
		default:
			return nil, fmt.Errorf("modality %q: want audio, image or video", k)
		}
		var n int
		if err := json.Unmarshal(v, &n); err != nil || n < 0 {
			return nil, fmt.Errorf("%s: %s; want a whole number >= 0", k, v)
		}
		out[k] = n
	}
	return out, nil
}

// MMConfig is the random-mm dataset's media: how many items a request
// carries and of which shapes, in vLLM's terms, and how audio is sent.
type MMConfig struct {
	// BaseItemsPerRequest is n and NumItemsRangeRatio r: each request
	// carries a count drawn uniformly from [floor(n(1−r)), ceil(n(1+r))],
	// the top clamped to the sum of the limits of the modalities sampled.
	BaseItemsPerRequest int
	NumItemsRangeRatio  float64
	// LimitPerPrompt caps each modality's items in one request.
	LimitPerPrompt map[string]int
	// Buckets are the item shapes and their weights.
	Buckets []BucketWeight
	// AudioSampleRate is the synthetic clips' rate in Hz (omnipd's own).
	AudioSampleRate int
	// AudioPart is input_audio (the default) or audio_url (a data: URL, as
	// vllm-omni's random-mm sends audio).
	AudioPart string
}

// mmPlan is a validated MMConfig: the buckets that can be drawn with their
// normalized probabilities, the limits that apply and the count range.
type mmPlan struct {
	buckets            []BucketWeight
	limits             map[string]int
	minItems, maxItems int
}

// plan validates c as vLLM's get_mm_item_sampling_params does, with the same
// errors where vLLM raises one, and checks what omnipd can synthesize.
func (c MMConfig) plan() (*mmPlan, error) {
	if c.BaseItemsPerRequest < 0 {
		return nil, fmt.Errorf("--random-mm-base-items-per-request %d: want >= 0", c.BaseItemsPerRequest)
	}
	r := c.NumItemsRangeRatio
	if !(r >= 0 && r <= 1) {
		return nil, fmt.Errorf("--random-mm-num-mm-items-range-ratio %v: want a number in [0, 1]", r)
	}
	if c.AudioSampleRate < 8000 || c.AudioSampleRate > maxSampleRate {
		return nil, fmt.Errorf("--random-mm-audio-sample-rate %d: want 8000 to %d Hz", c.AudioSampleRate, maxSampleRate)
	}
	switch c.AudioPart {
	case AudioPartInputAudio, AudioPartAudioURL:
	default:
		return nil, fmt.Errorf("--random-mm-audio-part %q: want input_audio or audio_url", c.AudioPart)
	}
	if len(c.Buckets) == 0 {
		return nil, errors.New("--random-mm-bucket-config: no buckets")
	}
	p := &mmPlan{limits: map[string]int{}}
	total := 0.0
	for _, bw := range c.Buckets {
		m := bw.Bucket.Modality()
		if _, ok := c.LimitPerPrompt[m]; !ok {
			return nil, fmt.Errorf("--random-mm-bucket-config: modality %s of bucket %s is not in --random-mm-limit-mm-per-prompt", m, bw.Bucket)
		}
		if bw.Weight < 0 {
			return nil, fmt.Errorf("--random-mm-bucket-config: bucket %s: negative probability", bw.Bucket)
		}
		if bw.Weight == 0 {
			continue // vLLM drops zero-probability buckets before anything else
		}
		if err := bw.Bucket.validate(); err != nil {
			return nil, fmt.Errorf("--random-mm-bucket-config: %w", err)
		}
		p.buckets = append(p.buckets, bw)
		p.limits[m] = c.LimitPerPrompt[m]
		total += bw.Weight
	}
	if len(p.buckets) == 0 {
		return nil, errors.New("--random-mm-bucket-config: every probability is zero")
	}
	for i := range p.buckets {
		p.buckets[i].Weight /= total
	}
	sum := 0
	for _, n := range p.limits {
		sum += n
	}
	n := float64(c.BaseItemsPerRequest)
	p.maxItems = min(sum, int(math.Ceil(n*(1+r))))
	p.minItems = max(0, int(math.Floor(n*(1-r))))
	if p.minItems > p.maxItems {
		return nil, fmt.Errorf("random-mm: at least %d items a request (--random-mm-base-items-per-request %d, range ratio %v) but the limits of the modalities sampled allow %d",
			p.minItems, c.BaseItemsPerRequest, r, p.maxItems)
	}
	return p, nil
}
