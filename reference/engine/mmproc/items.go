package mmproc

import (
	"fmt"
	"math"
)

// Kind is the modality of a media item.
type Kind int

const (
	Audio Kind = iota + 1 // an audio clip
	Image                 // a still image
	Video                 // a video, optionally with its soundtrack
)

func (k Kind) String() string {
	switch k {
	case Audio:
		return "audio"
	case Image:
		return "image"
	case Video:
		return "video"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Item is one media item of a prompt, described by size and timing only.
// Items are given in the order their placeholders appear in the prompt.
type Item struct {
	Kind Kind
	// AudioFrames is the number of log-mel frames: of the clip for an Audio
	// item, of the video's own soundtrack for a Video item. A video's is
	// read only when Options.UseAudioInVideo is set.
	AudioFrames int
	// Grid is the patch grid of an Image or Video item.
	Grid Grid
	// SecondsPerGrid is the seconds one temporal patch of a Video covers
	// (see SecondsPerGrid). Upstream defaults differ when it is not passed
	// (transformers 2/fps with fps 1, vLLM 2.0 or, earlier, 1.0), so it is
	// required here rather than guessed.
	SecondsPerGrid float64
}

// NewAudio describes an audio clip of melFrames log-mel frames.
func NewAudio(melFrames int) Item { return Item{Kind: Audio, AudioFrames: melFrames} }

// NewImage describes an image of the given patch grid.
func NewImage(g Grid) Item { return Item{Kind: Image, Grid: g} }

// NewVideo describes a video of the given patch grid.
func NewVideo(g Grid, secondsPerGrid float64) Item {
	return Item{Kind: Video, Grid: g, SecondsPerGrid: secondsPerGrid}
}

// NewVideoWithAudio describes a video whose soundtrack of melFrames log-mel
// frames is interleaved with its frames when Options.UseAudioInVideo is set.
func NewVideoWithAudio(g Grid, secondsPerGrid float64, melFrames int) Item {
	return Item{Kind: Video, Grid: g, SecondsPerGrid: secondsPerGrid, AudioFrames: melFrames}
}

// Options are the processor settings a request is expanded and positioned
// with. Prefill and decode must use the same Options.
type Options struct {
	Tokens Tokens
	// SpatialMergeSize is the vision encoder's spatial merge (2 for
	// Qwen3-Omni): merge×merge patches become one token.
	SpatialMergeSize int
	// PositionIDPerSecond is how many temporal position ids one second of
	// video spans (thinker_config.position_id_per_seconds, 13 for
	// Qwen3-Omni); it also scales an image's temporal index.
	PositionIDPerSecond float64
	// UseAudioInVideo interleaves every video's soundtrack with its frames
	// (the processor's use_audio_in_video, a per-request switch upstream).
	UseAudioInVideo bool
}

const (
	// Qwen3OmniSpatialMergeSize is thinker_config.vision_config.spatial_merge_size.
	Qwen3OmniSpatialMergeSize = 2
	// Qwen3OmniPositionIDPerSecond is thinker_config.position_id_per_seconds
	// of the checkpoint and the processor default (the transformers config
	// class default of 25 is a Qwen2.5-Omni leftover).
	Qwen3OmniPositionIDPerSecond = 13.0
)

// Qwen3OmniOptions returns the real model's settings with its token ids and
// audio-in-video off (the processor default). The tiny reference model
// replaces Tokens with its own ids.
func Qwen3OmniOptions() Options {
	return Options{
		Tokens:              Qwen3Omni(),
		SpatialMergeSize:    Qwen3OmniSpatialMergeSize,
		PositionIDPerSecond: Qwen3OmniPositionIDPerSecond,
	}
}

// Validate reports ErrInvalidTokens or ErrInvalidOptions for options no
// prompt can be processed with. Expand and ComputePositions call it.
func (o Options) Validate() error {
	if err := o.Tokens.Validate(); err != nil {
		return err
	}
	if o.SpatialMergeSize <= 0 {
		return fmt.Errorf("spatial merge size %d: %w", o.SpatialMergeSize, ErrInvalidOptions)
	}
	if !(o.PositionIDPerSecond > 0) || math.IsInf(o.PositionIDPerSecond, 0) {
		return fmt.Errorf("position ids per second %v: must be positive and finite: %w", o.PositionIDPerSecond, ErrInvalidOptions)
	}
	return nil
}

// itemShape is an item's sizes as the language model sees them.
type itemShape struct {
	audioTokens           int // the clip's, or the video soundtrack's
	frames, height, width int // merged vision grid
	visionTokens          int
	secondsPerGrid        float64
	// temporalFactor scales a frame index to its temporal position:
	// PositionIDPerSecond for an image, SecondsPerGrid·PositionIDPerSecond
	// for a video (vLLM's t_factor, the product taken first).
	temporalFactor       float64
	interleavedWithAudio bool
}

// maxTemporalPosition bounds the largest temporal offset inside one item so
// that float64 frame times convert to int exactly and without overflow; like
// MaxItemTokens it is a guard, not an upstream limit.
const maxTemporalPosition = 1 << 40

// shape validates an item against the options and derives its token counts.
func (it Item) shape(o Options) (itemShape, error) {
	var s itemShape
	switch it.Kind {
	case Audio:
		n, err := AudioTokens(it.AudioFrames)
		if err != nil {
			return s, err
		}
		s.audioTokens = n
		return s, nil
	case Image, Video:
		t, h, w, err := it.Grid.merged(o.SpatialMergeSize)
		if err != nil {
			return s, err
		}
		s.frames, s.height, s.width, s.visionTokens = t, h, w, t*h*w
	default:
		return s, fmt.Errorf("item kind %v: %w", it.Kind, ErrInvalidSize)
	}
	if it.Kind == Image {
		s.temporalFactor = o.PositionIDPerSecond
		return s, s.checkTemporalRange()
	}
	if !(it.SecondsPerGrid > 0) || math.IsInf(it.SecondsPerGrid, 0) {
		return s, fmt.Errorf("video seconds per grid %v: must be positive and finite: %w", it.SecondsPerGrid, ErrInvalidSize)
	}
	s.secondsPerGrid = it.SecondsPerGrid
	s.temporalFactor = it.SecondsPerGrid * o.PositionIDPerSecond
	if err := s.checkTemporalRange(); err != nil {
		return s, err
	}
	if o.UseAudioInVideo {
		n, err := AudioTokens(it.AudioFrames)
		if err != nil {
			return s, fmt.Errorf("soundtrack of a video with audio-in-video on: %w", err)
		}
		s.audioTokens = n
		s.interleavedWithAudio = true
	}
	return s, nil
}

func (s itemShape) checkTemporalRange() error {
	if last := float64(s.frames-1) * s.temporalFactor; last > maxTemporalPosition {
		return fmt.Errorf("last frame at temporal offset %v, over %v: %w", last, float64(maxTemporalPosition), ErrInvalidSize)
	}
	return nil
}

// itemCursor hands out a prompt's items in order as its placeholders come,
// each checked against the kind its placeholder names.
type itemCursor struct {
	items []Item
	opts  Options
	next  int // index of the next unused item
}

func (c *itemCursor) take(at int, kind Kind) (itemShape, error) {
	if c.next >= len(c.items) {
		return itemShape{}, fmt.Errorf("%v placeholder at token %d has no media item (%d given): %w", kind, at, len(c.items), ErrPlaceholderMismatch)
	}
	it := c.items[c.next]
	if it.Kind != kind {
		return itemShape{}, fmt.Errorf("%v placeholder at token %d but item %d is %v: %w", kind, at, c.next, it.Kind, ErrPlaceholderMismatch)
	}
	s, err := it.shape(c.opts)
	if err != nil {
		return itemShape{}, fmt.Errorf("item %d: %w", c.next, err)
	}
	c.next++
	return s, nil
}
