package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"

	"github.com/omnipd/omnipd/reference/engine/mmproc"
)

// Config is the geometry and constants of a Qwen3 decoder, as read from a
// Hugging Face config.json.
type Config struct {
	VocabSize, HiddenSize, IntermediateSize, NumLayers, NumHeads, NumKVHeads, HeadDim, MaxPositionEmbeddings int
	RopeTheta, RMSNormEps                                                                                    float64
	TieWordEmbeddings                                                                                        bool
	// BOSTokenID is -1 when config.json has none (null or absent).
	BOSTokenID  int
	EOSTokenIDs []int
	// TTSTokenIDs are the tts_pad, tts_bos and tts_eos tokens whose word
	// embeddings the Thinker hands the Talker, as Qwen3-Omni's config
	// carries them (tts_pad_token_id, tts_bos_token_id, tts_eos_token_id at
	// its top level, Qwen3OmniMoeConfig in transformers); nil when
	// config.json has none.
	TTSTokenIDs []int
	// MRope is the multimodal rotary split (rope_scaling.mrope_section and
	// mrope_interleaved, as Qwen3-Omni's Thinker has them): which of the
	// three position rows (temporal, height, width) each rotary frequency
	// rotates by. The zero value is plain RoPE, every frequency on one
	// position; a text-only prompt, whose three rows are equal, computes
	// the same either way.
	MRope mmproc.RotarySections
}

// Defaults of Qwen3Config in transformers, for keys config.json may omit.
const (
	defaultRopeTheta             = 10000.0
	defaultRMSNormEps            = 1e-6
	defaultMaxPositionEmbeddings = 32768
)

// maxElements bounds every weight matrix so that size arithmetic cannot
// overflow and a hostile config cannot ask for absurd allocations.
const maxElements = 1 << 40

// hfConfig is the subset of config.json the engine reads. Pointers tell an
// absent key from a zero.
type hfConfig struct {
	VocabSize             *int            `json:"vocab_size"`
	HiddenSize            *int            `json:"hidden_size"`
	IntermediateSize      *int            `json:"intermediate_size"`
	NumHiddenLayers       *int            `json:"num_hidden_layers"`
	NumAttentionHeads     *int            `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	RopeTheta             *float64        `json:"rope_theta"`
	RopeParameters        *ropeParameters `json:"rope_parameters"`
	RopeScaling           *ropeParameters `json:"rope_scaling"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	MaxPositionEmbeddings *int            `json:"max_position_embeddings"`
	BOSTokenID            json.RawMessage `json:"bos_token_id"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"`
	TorchDType            *string         `json:"torch_dtype"`
	DType                 *string         `json:"dtype"` // the name transformers ≥ 4.56 writes
	HiddenAct             *string         `json:"hidden_act"`
	AttentionBias         *bool           `json:"attention_bias"`
	UseSlidingWindow      *bool           `json:"use_sliding_window"`
	TTSPadTokenID         *int            `json:"tts_pad_token_id"`
	TTSBosTokenID         *int            `json:"tts_bos_token_id"`
	TTSEosTokenID         *int            `json:"tts_eos_token_id"`
}

// ttsKeys are the config.json keys of Config.TTSTokenIDs, in its order.
var ttsKeys = [3]string{"tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id"}

// ropeParameters is rope_scaling (older transformers) or rope_parameters
// (newer); only plain RoPE is implemented.
type ropeParameters struct {
	RopeType     string   `json:"rope_type"`
	Type         string   `json:"type"`
	RopeTheta    *float64 `json:"rope_theta"`
	MRopeSection []int    `json:"mrope_section"`
	// Qwen3-VL and Qwen3-Omni configs spell the layout flag either way.
	MRopeInterleaved *bool `json:"mrope_interleaved"`
	Interleaved      *bool `json:"interleaved"`
}

// LoadConfig reads a Hugging Face config.json of a Qwen3 model.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("model: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses and validates the contents of a config.json.
func ParseConfig(b []byte) (Config, error) {
	var h hfConfig
	if err := json.Unmarshal(b, &h); err != nil {
		return Config{}, err
	}
	var c Config
	for _, f := range []struct {
		key string
		src *int
		dst *int
	}{
		{"vocab_size", h.VocabSize, &c.VocabSize},
		{"hidden_size", h.HiddenSize, &c.HiddenSize},
		{"intermediate_size", h.IntermediateSize, &c.IntermediateSize},
		{"num_hidden_layers", h.NumHiddenLayers, &c.NumLayers},
		{"num_attention_heads", h.NumAttentionHeads, &c.NumHeads},
	} {
		if f.src == nil {
			return Config{}, fmt.Errorf("%s: missing", f.key)
		}
		*f.dst = *f.src
	}
	c.NumKVHeads = c.NumHeads // transformers' default: plain multi-head attention
	if h.NumKeyValueHeads != nil {
		c.NumKVHeads = *h.NumKeyValueHeads
	}
	switch {
	case h.HeadDim != nil:
		c.HeadDim = *h.HeadDim
	case c.NumHeads > 0 && c.HiddenSize%c.NumHeads != 0:
		return Config{}, fmt.Errorf("head_dim: absent, and hidden_size %d is not a multiple of num_attention_heads %d", c.HiddenSize, c.NumHeads)
	case c.NumHeads > 0:
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	c.RopeTheta = defaultRopeTheta
	for _, rp := range []struct {
		key string
		p   *ropeParameters
	}{{"rope_scaling", h.RopeScaling}, {"rope_parameters", h.RopeParameters}} {
		if rp.p == nil {
			continue
		}
		if t := cmpOr(rp.p.RopeType, rp.p.Type); t != "" && t != "default" {
			return Config{}, fmt.Errorf("%s: rope_type %q is not supported; only plain RoPE (\"default\")", rp.key, t)
		}
		if rp.p.RopeTheta != nil {
			c.RopeTheta = *rp.p.RopeTheta
		}
		if sec := rp.p.MRopeSection; sec != nil {
			if len(sec) != 3 {
				return Config{}, fmt.Errorf("%s.mrope_section: want 3 sections (temporal, height, width), got %d", rp.key, len(sec))
			}
			c.MRope = mmproc.RotarySections{Temporal: sec[0], Height: sec[1], Width: sec[2]}
			for _, b := range []*bool{rp.p.MRopeInterleaved, rp.p.Interleaved} {
				if b != nil && *b {
					c.MRope.Interleaved = true
				}
			}
		}
	}
	if h.RopeTheta != nil {
		c.RopeTheta = *h.RopeTheta
	}
	c.RMSNormEps = defaultRMSNormEps
	if h.RMSNormEps != nil {
		c.RMSNormEps = *h.RMSNormEps
	}
	if h.TieWordEmbeddings != nil {
		c.TieWordEmbeddings = *h.TieWordEmbeddings
	}
	c.MaxPositionEmbeddings = defaultMaxPositionEmbeddings
	if h.MaxPositionEmbeddings != nil {
		c.MaxPositionEmbeddings = *h.MaxPositionEmbeddings
	}
	var err error
	if c.BOSTokenID, err = parseBOS(h.BOSTokenID); err != nil {
		return Config{}, err
	}
	if c.EOSTokenIDs, err = parseEOS(h.EOSTokenID); err != nil {
		return Config{}, err
	}
	if c.TTSTokenIDs, err = parseTTS([3]*int{h.TTSPadTokenID, h.TTSBosTokenID, h.TTSEosTokenID}); err != nil {
		return Config{}, err
	}
	if err := checkUnsupported(&h); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkUnsupported refuses configs whose architecture this engine would
// silently compute wrong.
func checkUnsupported(h *hfConfig) error {
	if h.HiddenAct != nil && *h.HiddenAct != "silu" {
		return fmt.Errorf("hidden_act: %q is not supported; only \"silu\"", *h.HiddenAct)
	}
	if h.AttentionBias != nil && *h.AttentionBias {
		return errors.New("attention_bias: true is not supported (Qwen3 has no attention biases)")
	}
	if h.UseSlidingWindow != nil && *h.UseSlidingWindow {
		return errors.New("use_sliding_window: true is not supported")
	}
	for _, d := range []*string{h.TorchDType, h.DType} {
		if d == nil {
			continue
		}
		switch *d {
		case "float32", "bfloat16", "float16", "auto":
		default:
			return fmt.Errorf("torch_dtype: %q is not supported; want float32, bfloat16 or float16", *d)
		}
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

func parseBOS(raw json.RawMessage) (int, error) {
	if isNull(raw) {
		return -1, nil
	}
	var id int
	if err := json.Unmarshal(raw, &id); err != nil {
		return 0, fmt.Errorf("bos_token_id: want an integer, got %s", raw)
	}
	return id, nil
}

func parseEOS(raw json.RawMessage) ([]int, error) {
	if isNull(raw) {
		return nil, nil
	}
	var id int
	if err := json.Unmarshal(raw, &id); err == nil {
		return []int{id}, nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, fmt.Errorf("eos_token_id: want an integer or a list of integers, got %s", raw)
	}
	return ids, nil
}

// parseTTS takes the three TTS token ids, all or none: a Talker needs
// every one of them.
func parseTTS(ids [3]*int) ([]int, error) {
	var out []int
	for i, id := range ids {
		if id != nil {
			out = append(out, *id)
			continue
		}
		if ids != [3]*int{} {
			return nil, fmt.Errorf("%s: missing; give all three TTS token ids or none", ttsKeys[i])
		}
	}
	return out, nil
}

// Validate reports the first inconsistency, naming the config.json key.
func (c Config) Validate() error {
	for _, f := range []struct {
		key string
		v   int
	}{
		{"vocab_size", c.VocabSize},
		{"hidden_size", c.HiddenSize},
		{"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumLayers},
		{"num_attention_heads", c.NumHeads},
		{"num_key_value_heads", c.NumKVHeads},
		{"head_dim", c.HeadDim},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%s: must be positive, got %d", f.key, f.v)
		}
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("num_key_value_heads: %d does not divide num_attention_heads %d", c.NumKVHeads, c.NumHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("head_dim: must be even for rotary embeddings, got %d", c.HeadDim)
	}
	for _, f := range []struct {
		key  string
		dims []int
	}{
		{"vocab_size × hidden_size", []int{c.VocabSize, c.HiddenSize}},
		{"num_attention_heads × head_dim × hidden_size", []int{c.NumHeads, c.HeadDim, c.HiddenSize}},
		{"intermediate_size × hidden_size", []int{c.IntermediateSize, c.HiddenSize}},
	} {
		if n, ok := product(f.dims); !ok || n > maxElements {
			return fmt.Errorf("%s: %v elements is too large", f.key, f.dims)
		}
	}
	if c.MRope != (mmproc.RotarySections{}) {
		if _, err := c.MRope.FrequencyRows(c.HeadDim / 2); err != nil {
			return fmt.Errorf("rope_scaling.mrope_section: %w", err)
		}
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		return fmt.Errorf("rope_theta: must be positive and finite, got %v", c.RopeTheta)
	}
	if !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		return fmt.Errorf("rms_norm_eps: must be positive and finite, got %v", c.RMSNormEps)
	}
	if c.BOSTokenID < -1 || c.BOSTokenID >= c.VocabSize {
		return fmt.Errorf("bos_token_id: %d is outside the vocabulary (size %d)", c.BOSTokenID, c.VocabSize)
	}
	for _, id := range c.EOSTokenIDs {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("eos_token_id: %d is outside the vocabulary (size %d)", id, c.VocabSize)
		}
	}
	return c.validateTTS()
}

func (c Config) validateTTS() error {
	if c.TTSTokenIDs == nil {
		return nil
	}
	if len(c.TTSTokenIDs) != len(ttsKeys) {
		return fmt.Errorf("tts token ids: want %d (pad, bos, eos), got %v", len(ttsKeys), c.TTSTokenIDs)
	}
	for i, id := range c.TTSTokenIDs {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("%s: %d is outside the vocabulary (size %d)", ttsKeys[i], id, c.VocabSize)
		}
		if j := slices.Index(c.TTSTokenIDs[:i], id); j >= 0 {
			return fmt.Errorf("%s: %d is %s too", ttsKeys[i], id, ttsKeys[j])
		}
	}
	return nil
}

// product multiplies positive dims, reporting false on overflow.
func product(dims []int) (int, bool) {
	n := 1
	for _, d := range dims {
		if d > math.MaxInt/n {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// hfConfigOut is what Save writes: a config.json transformers loads as
// Qwen3ForCausalLM.
type hfConfigOut struct {
	Architectures         []string `json:"architectures"`
	ModelType             string   `json:"model_type"`
	VocabSize             int      `json:"vocab_size"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"`
	HeadDim               int      `json:"head_dim"`
	HiddenAct             string   `json:"hidden_act"`
	AttentionBias         bool     `json:"attention_bias"`
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	RopeTheta             float64  `json:"rope_theta"`
	RopeScaling           *ropeOut `json:"rope_scaling"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	UseSlidingWindow      bool     `json:"use_sliding_window"`
	BOSTokenID            *int     `json:"bos_token_id"`
	EOSTokenID            any      `json:"eos_token_id"`
	TTSPadTokenID         *int     `json:"tts_pad_token_id,omitempty"`
	TTSBosTokenID         *int     `json:"tts_bos_token_id,omitempty"`
	TTSEosTokenID         *int     `json:"tts_eos_token_id,omitempty"`
	TorchDType            string   `json:"torch_dtype"`
}

// ropeOut is rope_scaling as Save writes it: only for multimodal rotary
// positions (null otherwise, plain RoPE).
type ropeOut struct {
	RopeType         string `json:"rope_type"`
	MRopeSection     []int  `json:"mrope_section"`
	MRopeInterleaved bool   `json:"mrope_interleaved"`
}

func (c Config) marshal(torchDType string) ([]byte, error) {
	out := hfConfigOut{
		Architectures:         []string{"Qwen3ForCausalLM"},
		ModelType:             "qwen3",
		VocabSize:             c.VocabSize,
		HiddenSize:            c.HiddenSize,
		IntermediateSize:      c.IntermediateSize,
		NumHiddenLayers:       c.NumLayers,
		NumAttentionHeads:     c.NumHeads,
		NumKeyValueHeads:      c.NumKVHeads,
		HeadDim:               c.HeadDim,
		HiddenAct:             "silu",
		MaxPositionEmbeddings: c.MaxPositionEmbeddings,
		RopeTheta:             c.RopeTheta,
		RMSNormEps:            c.RMSNormEps,
		TieWordEmbeddings:     c.TieWordEmbeddings,
		TorchDType:            torchDType,
	}
	if c.BOSTokenID >= 0 {
		out.BOSTokenID = &c.BOSTokenID
	}
	if r := c.MRope; r != (mmproc.RotarySections{}) {
		out.RopeScaling = &ropeOut{RopeType: "default", MRopeSection: []int{r.Temporal, r.Height, r.Width}, MRopeInterleaved: r.Interleaved}
	}
	if ids := c.TTSTokenIDs; len(ids) == len(ttsKeys) {
		out.TTSPadTokenID, out.TTSBosTokenID, out.TTSEosTokenID = &ids[0], &ids[1], &ids[2]
	}
	switch len(c.EOSTokenIDs) {
	case 0:
	case 1:
		out.EOSTokenID = c.EOSTokenIDs[0]
	default:
		out.EOSTokenID = c.EOSTokenIDs
	}
	b, err := json.MarshalIndent(out, "", "  ")
	return append(b, '\n'), err
}
