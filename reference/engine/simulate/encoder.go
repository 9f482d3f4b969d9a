package simulate

import (
	"math"
	"time"
)

// The multimodal encoders' model. An item of n placeholder tokens, its
// tokens in s equal attention segments, costs
//
//	per_item + per_token·n + attention_1k·s·(n/s/1000)²
//
// and one encoder call (the items of one modality that an engine step
// encodes together) costs base plus the sum of its items. Items batch
// additively: vLLM runs a step's items in one encoder forward, whose work
// grows with the tokens, and the measurements docs/simulate.md cites show
// no fixed cost shared between items (21 clips cost 21 times one).

// Modality names an Encoder takes, as vLLM and mmproc.Kind.String spell them.
const (
	EncoderAudio = "audio"
	EncoderImage = "image"
	EncoderVideo = "video"
)

// Encoder is the cost of the Thinker's multimodal encoders: the audio
// encoder (Qwen3-Omni's AuT) and the vision encoder, which encodes images
// and videos. The zero value costs nothing.
type Encoder struct {
	Audio, Image, Video EncoderCost
}

// EncoderCost is one modality's encoder cost.
type EncoderCost struct {
	// Base is paid once per encoder call, however many items it encodes.
	Base time.Duration
	// PerItem is paid by every item.
	PerItem time.Duration
	// PerToken is paid by every placeholder token of an item.
	PerToken time.Duration
	// Attention1K is the full-attention term of one segment of 1000
	// tokens; a segment of n tokens pays Attention1K·(n/1000)². Zero for an
	// encoder whose attention windows are short and fixed (the audio
	// encoder's 104-token windows), whose attention PerToken then covers.
	Attention1K time.Duration
}

// EncoderItem is one media item as the model sees it.
type EncoderItem struct {
	// Kind is EncoderAudio, EncoderImage or EncoderVideo.
	Kind string
	// Tokens is the placeholder tokens the item expands to in the prompt
	// (mmproc's count: 13 a second of audio, grid_t·grid_h·grid_w/4 for an
	// image or video).
	Tokens int
	// Segments is how many equal segments the tokens attend within: a
	// video's temporal patch groups (grid_t), each attended alone; 1 (or
	// 0) for an image or an audio clip.
	Segments int
}

// For returns the cost of kind, and false for a kind the model does not know.
func (e Encoder) For(kind string) (EncoderCost, bool) {
	switch kind {
	case EncoderAudio:
		return e.Audio, true
	case EncoderImage:
		return e.Image, true
	case EncoderVideo:
		return e.Video, true
	}
	return EncoderCost{}, false
}

// ItemTime is one item's share of an encoder call: per_item, per_token·tokens
// and the attention term over segments (< 1 is one). Rounded up to the
// nanosecond; 0 for no tokens.
func (c EncoderCost) ItemTime(tokens, segments int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	segments = max(segments, 1)
	t := addSat(c.PerItem, mulSat(c.PerToken, int64(tokens)))
	if c.Attention1K > 0 {
		n := float64(tokens) / 1000
		ns := math.Ceil(float64(c.Attention1K) * n * n / float64(segments))
		if ns >= math.MaxInt64 {
			return math.MaxInt64
		}
		t = addSat(t, time.Duration(ns))
	}
	return t
}

// Time is the encoder time of one item of kind encoded alone: its call's
// base and the item, one attention segment. A kind the model does not
// know costs nothing.
func (e Encoder) Time(kind string, tokens int) time.Duration {
	return e.BatchTime([]EncoderItem{{Kind: kind, Tokens: tokens, Segments: 1}})
}

// BatchTime is the encoder time of the items one engine step encodes: for
// each modality among them one base, and every item's ItemTime. Items of
// an unknown kind, or without tokens, cost nothing.
func (e Encoder) BatchTime(items []EncoderItem) time.Duration {
	var total time.Duration
	var seen [3]bool
	for _, it := range items {
		c, ok := e.For(it.Kind)
		if !ok || it.Tokens <= 0 {
			continue
		}
		if k := encoderIndex(it.Kind); !seen[k] {
			seen[k] = true
			total = addSat(total, c.Base)
		}
		total = addSat(total, c.ItemTime(it.Tokens, it.Segments))
	}
	return total
}

func encoderIndex(kind string) int {
	switch kind {
	case EncoderAudio:
		return 0
	case EncoderImage:
		return 1
	}
	return 2
}

// IsZero reports whether the encoders cost nothing (a profile without an
// encoder section).
func (e Encoder) IsZero() bool { return e == Encoder{} }
