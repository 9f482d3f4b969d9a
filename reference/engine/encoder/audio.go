package encoder

import (
	"fmt"
	"math"

	"github.com/omnipd/omnipd/reference/engine/kernel"
)

// The audio tower's fixed windowing, kept at the real model's values because
// they decide how many audio tokens a clip becomes (config.json's
// audio_config n_window = 50, n_window_infer = 800).
const (
	// audioChunkFrames is n_window·2: the convolution front end runs on
	// independent chunks of this many mel frames (1 s at the 10 ms hop).
	audioChunkFrames = 100
	// audioWindowFrames is n_window_infer: attention runs within windows of
	// this many mel frames, a whole number of chunks.
	audioWindowFrames = 800
	// audioChunksPerWindow is n_window_infer // (n_window·2).
	audioChunksPerWindow = audioWindowFrames / audioChunkFrames
	// audioTokensPerChunk is what three stride-2 convolutions leave of a
	// full chunk, 100 → 50 → 25 → 13: chunkTokens(audioChunkFrames), pinned
	// by a test, and the 13 of upstream's length formula.
	audioTokensPerChunk = 13
	// audioMaxTimescale is SinusoidsPositionEmbedding's max_timescale.
	audioMaxTimescale = 10000
)

// chunkTokens is the number of tokens a chunk of n frames yields.
func chunkTokens(n int) int {
	return convOutLen(convOutLen(convOutLen(n)))
}

// AudioOutputLength is the number of audio tokens (rows of Encode, and
// <|audio_pad|> placeholders in the prompt) for a clip of frames mel frames:
// upstream's _get_feat_extract_output_lengths — 13 tokens per full
// 100-frame chunk, plus the three convolutions' arithmetic on the remainder.
// It is 0 for frames <= 0.
func AudioOutputLength(frames int) int {
	if frames <= 0 {
		return 0
	}
	return frames/audioChunkFrames*audioTokensPerChunk + chunkTokens(frames%audioChunkFrames)
}

// AudioConfig is the geometry of an audio encoder. Field comments give the
// upstream audio_config key.
type AudioConfig struct {
	NumMelBins         int     // num_mel_bins: mel bins per frame
	DModel             int     // d_model: the transformer width
	Layers             int     // encoder_layers; 0 leaves only the conv front end and the projection
	Heads              int     // encoder_attention_heads
	FFNDim             int     // encoder_ffn_dim
	DownsampleChannels int     // downsample_hidden_size: channels of the three Conv2d layers
	OutputDim          int     // output_dim: the Thinker's hidden size
	LayerNormEps       float64 // nn.LayerNorm's default eps (upstream passes none)
	// MaxFrames is the longest clip Encode accepts, in mel frames. It is this
	// engine's bound, not an upstream value: it caps the memory one Encode
	// call can ask for.
	MaxFrames int
}

// DefaultAudioConfig is the built-in tiny geometry: the real front end's
// mel bins and windowing with tiny widths, projecting to outputDim (pass the
// Thinker's hidden size, model.DefaultConfig().HiddenSize for the built-in
// model).
func DefaultAudioConfig(outputDim int) AudioConfig {
	return AudioConfig{
		NumMelBins:         128,
		DModel:             32,
		Layers:             2,
		Heads:              2,
		FFNDim:             128,
		DownsampleChannels: 8,
		OutputDim:          outputDim,
		LayerNormEps:       1e-5,
		MaxFrames:          30000, // 5 minutes at 100 frames per second
	}
}

// Validate reports whether the config describes a buildable encoder.
func (c AudioConfig) Validate() error {
	if err := checkDims(
		namedDim{"num_mel_bins", c.NumMelBins},
		namedDim{"d_model", c.DModel},
		namedDim{"encoder_attention_heads", c.Heads},
		namedDim{"encoder_ffn_dim", c.FFNDim},
		namedDim{"downsample_hidden_size", c.DownsampleChannels},
		namedDim{"output_dim", c.OutputDim},
	); err != nil {
		return err
	}
	switch {
	case c.Layers < 0 || c.Layers > maxDim:
		return fmt.Errorf("%w: encoder_layers = %d, want 0..%d", ErrInvalidConfig, c.Layers, maxDim)
	case c.DModel%c.Heads != 0:
		return fmt.Errorf("%w: d_model %d is not a multiple of encoder_attention_heads %d", ErrInvalidConfig, c.DModel, c.Heads)
	case c.DModel%2 != 0 || c.DModel < 4:
		// The sinusoids split d_model into sin and cos halves and divide by
		// d_model/2 - 1.
		return fmt.Errorf("%w: d_model %d must be even and at least 4", ErrInvalidConfig, c.DModel)
	case !(c.LayerNormEps > 0) || math.IsInf(c.LayerNormEps, 0):
		return fmt.Errorf("%w: layer norm eps %v must be positive and finite", ErrInvalidConfig, c.LayerNormEps)
	case c.MaxFrames < 1 || c.MaxFrames > maxInputLimit:
		return fmt.Errorf("%w: max frames %d, want 1..%d", ErrInvalidConfig, c.MaxFrames, maxInputLimit)
	case c.DownsampleChannels*convOutLen(convOutLen(convOutLen(c.NumMelBins))) > maxDim:
		return fmt.Errorf("%w: conv_out input %d·%d exceeds %d", ErrInvalidConfig,
			c.DownsampleChannels, convOutLen(convOutLen(convOutLen(c.NumMelBins))), maxDim)
	}
	return nil
}

// AudioEncoder is a built audio encoder. It is immutable, so one encoder
// serves any number of concurrent Encode calls.
type AudioEncoder struct {
	cfg AudioConfig

	// freq[i] is the frequency extent after i convolutions (freq[0] is
	// NumMelBins); the time extent of a chunk goes 100, 50, 25, 13.
	freq [4]int

	conv    [3]convLayer // conv2d1..3, weights [out][in][3][3]
	convOut []float32    // [d_model][channels·freq[3]], no bias
	layers  []audioLayer

	lnPostW, lnPostB []float32 // [d_model]
	proj1W, proj1B   []float32 // [d_model][d_model], [d_model]
	proj2W, proj2B   []float32 // [output_dim][d_model], [output_dim]

	// positions is the sinusoid table for the positions of one chunk
	// ([audioTokensPerChunk][d_model]); upstream adds positions 0..12 to
	// every chunk, so no later row is ever used.
	positions []float32
}

type convLayer struct {
	w, b []float32
}

// audioLayer is one pre-LayerNorm transformer layer.
type audioLayer struct {
	attnNormW, attnNormB []float32 // self_attn_layer_norm
	q, qB, k, kB         []float32 // [d_model][d_model], [d_model]
	v, vB, o, oB         []float32
	ffnNormW, ffnNormB   []float32 // final_layer_norm
	fc1, fc1B            []float32 // [ffn][d_model], [ffn]
	fc2, fc2B            []float32 // [d_model][ffn], [d_model]
}

// audioSalt separates the audio weights' PCG stream from the vision one.
const audioSalt = 0xa0d10a0d10a0d10a

// NewAudioEncoder builds an encoder with deterministic weights drawn from
// seed: the same config and seed give bit-identical weights on every
// machine.
func NewAudioEncoder(c AudioConfig, seed uint64) (*AudioEncoder, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	e := &AudioEncoder{cfg: c, layers: make([]audioLayer, c.Layers)}
	e.freq[0] = c.NumMelBins
	for i := 1; i < len(e.freq); i++ {
		e.freq[i] = convOutLen(e.freq[i-1])
	}
	initParams(e.params(), seed, audioSalt)
	e.positions = sinusoids(audioTokensPerChunk, c.DModel)
	return e, nil
}

// Config returns the encoder's geometry.
func (e *AudioEncoder) Config() AudioConfig { return e.cfg }

// params lists the tensors under their upstream names, in forward order.
func (e *AudioEncoder) params() []param {
	c := e.cfg
	d, ch := c.DModel, c.DownsampleChannels
	ps := []param{
		{"conv2d1.weight", []int{ch, 1, 3, 3}, &e.conv[0].w, initGELUIn},
		{"conv2d1.bias", []int{ch}, &e.conv[0].b, initBias},
		{"conv2d2.weight", []int{ch, ch, 3, 3}, &e.conv[1].w, initGELUIn},
		{"conv2d2.bias", []int{ch}, &e.conv[1].b, initBias},
		{"conv2d3.weight", []int{ch, ch, 3, 3}, &e.conv[2].w, initGELUIn},
		{"conv2d3.bias", []int{ch}, &e.conv[2].b, initBias},
		{"conv_out.weight", []int{d, ch * e.freq[3]}, &e.convOut, initLinear},
	}
	for i := range e.layers {
		l := &e.layers[i]
		p := fmt.Sprintf("layers.%d.", i)
		ps = append(ps,
			param{p + "self_attn_layer_norm.weight", []int{d}, &l.attnNormW, initOnes},
			param{p + "self_attn_layer_norm.bias", []int{d}, &l.attnNormB, initZeros},
			param{p + "self_attn.q_proj.weight", []int{d, d}, &l.q, initLinear},
			param{p + "self_attn.q_proj.bias", []int{d}, &l.qB, initBias},
			param{p + "self_attn.k_proj.weight", []int{d, d}, &l.k, initLinear},
			param{p + "self_attn.k_proj.bias", []int{d}, &l.kB, initBias},
			param{p + "self_attn.v_proj.weight", []int{d, d}, &l.v, initLinear},
			param{p + "self_attn.v_proj.bias", []int{d}, &l.vB, initBias},
			param{p + "self_attn.out_proj.weight", []int{d, d}, &l.o, initLinear},
			param{p + "self_attn.out_proj.bias", []int{d}, &l.oB, initBias},
			param{p + "final_layer_norm.weight", []int{d}, &l.ffnNormW, initOnes},
			param{p + "final_layer_norm.bias", []int{d}, &l.ffnNormB, initZeros},
			param{p + "fc1.weight", []int{c.FFNDim, d}, &l.fc1, initGELUIn},
			param{p + "fc1.bias", []int{c.FFNDim}, &l.fc1B, initBias},
			param{p + "fc2.weight", []int{d, c.FFNDim}, &l.fc2, initLinear},
			param{p + "fc2.bias", []int{d}, &l.fc2B, initBias},
		)
	}
	return append(ps,
		param{"ln_post.weight", []int{d}, &e.lnPostW, initOnes},
		param{"ln_post.bias", []int{d}, &e.lnPostB, initZeros},
		param{"proj1.weight", []int{d, d}, &e.proj1W, initGELUIn},
		param{"proj1.bias", []int{d}, &e.proj1B, initBias},
		param{"proj2.weight", []int{c.OutputDim, d}, &e.proj2W, initLinear},
		param{"proj2.bias", []int{c.OutputDim}, &e.proj2B, initBias},
	)
}

// sinusoids is SinusoidsPositionEmbedding's table for positions
// 0..length-1: row t is [sin(t·ω_0..ω_{h-1}), cos(t·ω_0..ω_{h-1})] with
// h = channels/2 and ω_k = exp(-k·ln(10000)/(h-1)), computed in float64 and
// rounded once.
func sinusoids(length, channels int) []float32 {
	half := channels / 2
	step := math.Log(audioMaxTimescale) / float64(half-1)
	out := make([]float32, length*channels)
	for t := range length {
		row := out[t*channels : (t+1)*channels]
		for k := range half {
			sin, cos := math.Sincos(float64(t) * math.Exp(-step*float64(k)))
			row[k], row[half+k] = float32(sin), float32(cos)
		}
	}
	return out
}

// Encode turns one clip's log-mel features, mel[bin][frame] (upstream's
// input_features layout, NumMelBins rows of equal length), into
// AudioOutputLength(frames) rows of OutputDim values.
//
// As upstream, the frames are cut into chunks of 100 that the three
// convolutions see independently (a short last chunk zero-padded to 100,
// its rows past the formula's count dropped), each chunk's 13 positions get
// sinusoid positions 0..12, and attention runs within windows of 8 chunks
// (104 tokens). A row therefore depends only on the frames of its window.
func (e *AudioEncoder) Encode(mel [][]float32) ([][]float32, error) {
	frames, err := e.checkMel(mel)
	if err != nil {
		return nil, err
	}
	c := &e.cfg
	d := c.DModel
	n := AudioOutputLength(frames)
	x := make([]float32, n*d) // the residual stream of every token

	cs := e.newConvScratch()
	row := 0
	for start := 0; start < frames; start += audioChunkFrames {
		length := min(audioChunkFrames, frames-start)
		e.convChunk(cs, mel, start, length)
		row = e.embedChunk(cs, x, row, chunkTokens(length))
	}

	window := audioChunksPerWindow * audioTokensPerChunk
	ls := newAudioLayerScratch(c, window)
	for l := range e.layers {
		for s := 0; s < n; s += window {
			e.layerWindow(l, x[s*d:min(s+window, n)*d], ls)
		}
	}

	out := make([][]float32, n)
	normed, mid := ls.normed[:d], ls.tmp[:d]
	for i := range n {
		layerNorm(normed, x[i*d:(i+1)*d], e.lnPostW, e.lnPostB, c.LayerNormEps)
		linear(mid, e.proj1W, e.proj1B, normed)
		for j, v := range mid {
			mid[j] = geluErf(v)
		}
		out[i] = make([]float32, c.OutputDim)
		linear(out[i], e.proj2W, e.proj2B, mid)
	}
	return out, nil
}

func (e *AudioEncoder) checkMel(mel [][]float32) (int, error) {
	c := &e.cfg
	if len(mel) != c.NumMelBins {
		return 0, fmt.Errorf("%w: %d mel bins, encoder takes %d", ErrInvalidInput, len(mel), c.NumMelBins)
	}
	frames := len(mel[0])
	for b, r := range mel {
		if len(r) != frames {
			return 0, fmt.Errorf("%w: mel bin %d has %d frames, bin 0 has %d", ErrInvalidInput, b, len(r), frames)
		}
	}
	switch {
	case frames == 0:
		return 0, fmt.Errorf("%w: no mel frames", ErrInvalidInput)
	case frames > c.MaxFrames:
		return 0, fmt.Errorf("%w: %d mel frames, limit %d", ErrInputTooLarge, frames, c.MaxFrames)
	}
	return frames, nil
}

// convScratch is the front end's working memory, sized once per Encode and
// reused by every chunk.
type convScratch struct {
	in     []float32 // [bins][100], the chunk zero-padded
	act    [3][]float32
	col    []float32 // one output position's 3×3 receptive field over all input channels
	feat   []float32 // one time step's conv_out input, channel-major
	widths [4]int    // the time extent after each convolution: 100, 50, 25, 13
}

func (e *AudioEncoder) newConvScratch() *convScratch {
	ch := e.cfg.DownsampleChannels
	s := &convScratch{
		in:   make([]float32, e.freq[0]*audioChunkFrames),
		col:  make([]float32, max(1, ch)*9),
		feat: make([]float32, ch*e.freq[3]),
	}
	s.widths[0] = audioChunkFrames
	for i := range s.act {
		s.widths[i+1] = convOutLen(s.widths[i])
		s.act[i] = make([]float32, ch*e.freq[i+1]*s.widths[i+1])
	}
	return s
}

// convChunk runs the three GELU convolutions over frames
// start..start+length-1, zero-padded to a full chunk: upstream pads every
// chunk to the longest in its batch, which is a full chunk whenever the
// clip (or any clip batched with it) has 100 frames or more, so padding
// always makes a chunk's rows independent of what it is batched with.
func (e *AudioEncoder) convChunk(s *convScratch, mel [][]float32, start, length int) {
	for b, r := range mel {
		dst := s.in[b*audioChunkFrames : (b+1)*audioChunkFrames]
		copy(dst, r[start:start+length])
		clear(dst[length:])
	}
	in, inCh := s.in, 1
	for i, cl := range e.conv {
		conv3x3Stride2GELU(s.act[i], in, inCh, e.freq[i], s.widths[i], cl.w, cl.b, e.cfg.DownsampleChannels, s.col)
		in, inCh = s.act[i], e.cfg.DownsampleChannels
	}
}

// conv3x3Stride2GELU sets out = GELU(conv(in)) for a 3×3 kernel, stride 2
// and zero padding 1 on both axes (nn.Conv2d(in, out, 3, 2, padding=1) and
// F.gelu). in is [inCh][inH][inW], out [outCh][outH][outW], weights
// [outCh][inCh][3][3]. Each output gathers its receptive field in weight
// order and takes one kernel.Dot, so the summation order is fixed.
func conv3x3Stride2GELU(out, in []float32, inCh, inH, inW int, w, b []float32, outCh int, col []float32) {
	outH, outW := convOutLen(inH), convOutLen(inW)
	k := inCh * 9
	col = col[:k]
	for fo := range outH {
		for to := range outW {
			idx := 0
			for ci := range inCh {
				for kf := range 3 {
					f := 2*fo - 1 + kf
					for kt := range 3 {
						t := 2*to - 1 + kt
						if f < 0 || f >= inH || t < 0 || t >= inW {
							col[idx] = 0
						} else {
							col[idx] = in[(ci*inH+f)*inW+t]
						}
						idx++
					}
				}
			}
			for co := range outCh {
				out[(co*outH+fo)*outW+to] = geluErf(kernel.Dot(w[co*k:(co+1)*k], col) + b[co])
			}
		}
	}
}

// embedChunk projects the first tokens time steps of the last convolution
// into rows row.. of x (conv_out over the channel-major flattening
// permute(0,3,1,2).view(b, t, c·f)), adds the chunk's sinusoid positions,
// and returns the next row.
func (e *AudioEncoder) embedChunk(s *convScratch, x []float32, row, tokens int) int {
	d, f3, t3 := e.cfg.DModel, e.freq[3], s.widths[3]
	last := s.act[2]
	for t := range tokens {
		for c := range e.cfg.DownsampleChannels {
			for f := range f3 {
				s.feat[c*f3+f] = last[(c*f3+f)*t3+t]
			}
		}
		dst := x[row*d : (row+1)*d]
		linear(dst, e.convOut, nil, s.feat)
		kernel.Add(dst, e.positions[t*d:(t+1)*d])
		row++
	}
	return row
}

// audioLayerScratch is one window's working memory for a layer.
type audioLayerScratch struct {
	normed, q, k, v, attn []float32 // [window][d_model]
	scores                []float32 // [window]
	tmp                   []float32 // [d_model]
	ffn                   []float32 // [ffn]
}

func newAudioLayerScratch(c *AudioConfig, window int) *audioLayerScratch {
	d := c.DModel
	return &audioLayerScratch{
		normed: make([]float32, window*d),
		q:      make([]float32, window*d),
		k:      make([]float32, window*d),
		v:      make([]float32, window*d),
		attn:   make([]float32, window*d),
		scores: make([]float32, window),
		tmp:    make([]float32, d),
		ffn:    make([]float32, c.FFNDim),
	}
}

// layerWindow applies layer l to the tokens of one attention window, x
// holding their residual streams.
func (e *AudioEncoder) layerWindow(l int, x []float32, s *audioLayerScratch) {
	c := &e.cfg
	w := &e.layers[l]
	d := c.DModel
	tokens := len(x) / d
	for i := range tokens {
		xi, ni := x[i*d:(i+1)*d], s.normed[i*d:(i+1)*d]
		layerNorm(ni, xi, w.attnNormW, w.attnNormB, c.LayerNormEps)
		linear(s.q[i*d:(i+1)*d], w.q, w.qB, ni)
		linear(s.k[i*d:(i+1)*d], w.k, w.kB, ni)
		linear(s.v[i*d:(i+1)*d], w.v, w.vB, ni)
	}
	attendSegment(s.attn, s.q, s.k, s.v, tokens, c.Heads, d/c.Heads, s.scores)
	for i := range tokens {
		xi := x[i*d : (i+1)*d]
		linear(s.tmp, w.o, w.oB, s.attn[i*d:(i+1)*d])
		kernel.Add(xi, s.tmp)

		ni := s.normed[:d]
		layerNorm(ni, xi, w.ffnNormW, w.ffnNormB, c.LayerNormEps)
		linear(s.ffn, w.fc1, w.fc1B, ni)
		for j, v := range s.ffn {
			s.ffn[j] = geluErf(v)
		}
		linear(s.tmp, w.fc2, w.fc2B, s.ffn)
		kernel.Add(xi, s.tmp)
	}
}
