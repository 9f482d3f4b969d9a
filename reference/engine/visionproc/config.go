package visionproc

import (
	"fmt"
	"math"
)

// Qwen3-Omni vision constants; docs/multimodal/vision.md cites where each
// comes from.
const (
	// PatchSize is the vision encoder's spatial patch (16 for Qwen3-Omni's
	// SigLIP2-style encoder; Qwen2/2.5-VL used 14).
	PatchSize = 16
	// TemporalPatchSize is how many consecutive frames one patch spans.
	TemporalPatchSize = 2
	// MergeSize is the spatial merge of the patch merger: merge_size² patches
	// become one LLM token.
	MergeSize = 2
	// Channels is RGB.
	Channels = 3

	// ImageMinPixels and ImageMaxPixels are min_pixels and max_pixels of the
	// checkpoint's preprocessor_config.json.
	ImageMinPixels = 3136
	ImageMaxPixels = 12845056

	// VideoMinPixels and VideoMaxPixels are the per-frame size bounds the
	// Qwen3-Omni processor passes to its video processor
	// (size.shortest_edge = 128·32·32, size.longest_edge = 768·32·32).
	VideoMinPixels = 128 * 32 * 32
	VideoMaxPixels = 768 * 32 * 32

	// VideoFPS, VideoMinFrames and VideoMaxFrames are the frame sampling
	// defaults: 2 frames per second (qwen-vl-utils' FPS, the sampler the Qwen
	// Omni cookbooks use) bounded to [4, 768] frames (the video processor's
	// min_frames/max_frames).
	VideoFPS       = 2.0
	VideoMinFrames = 4
	VideoMaxFrames = 768

	// DefaultMaxPatches bounds the flattened output (patches × 1536 float32,
	// about 400 MB at this cap). It never triggers for images under
	// ImageMaxPixels (at most 50176 patches); it stops a long, large video
	// before anything is allocated.
	DefaultMaxPatches = 65536
)

// RescaleFactor is the processor's rescale_factor, 1/255.
const RescaleFactor = 1.0 / 255

// AlphaMode says what ToRGB does with transparency.
type AlphaMode int

const (
	// AlphaDrop discards alpha, keeping the stored colour, as PIL's
	// convert("RGB") (what the transformers image processor calls) does.
	AlphaDrop AlphaMode = iota
	// AlphaOnWhite composites onto white, as qwen-vl-utils' to_rgb does for
	// RGBA images before they reach the processor.
	AlphaOnWhite
)

// Config holds the image-processor parameters. The zero value is not usable;
// start from DefaultImageConfig or DefaultVideoConfig().Config.
type Config struct {
	PatchSize         int
	TemporalPatchSize int
	MergeSize         int
	// MinPixels and MaxPixels bound the resized area (smart_resize).
	MinPixels int
	MaxPixels int
	// RescaleFactor multiplies each 8-bit value before normalization.
	RescaleFactor float64
	// Mean and Std normalize each channel: (v·rescale − mean) / std.
	Mean [Channels]float32
	Std  [Channels]float32
	// Alpha selects the transparency handling of ToRGB.
	Alpha AlphaMode
	// MaxPatches caps the number of output patches; 0 means no cap.
	MaxPatches int
}

// DefaultImageConfig returns Qwen3-Omni's image processor settings.
func DefaultImageConfig() Config {
	return Config{
		PatchSize:         PatchSize,
		TemporalPatchSize: TemporalPatchSize,
		MergeSize:         MergeSize,
		MinPixels:         ImageMinPixels,
		MaxPixels:         ImageMaxPixels,
		RescaleFactor:     RescaleFactor,
		Mean:              [Channels]float32{0.5, 0.5, 0.5},
		Std:               [Channels]float32{0.5, 0.5, 0.5},
		Alpha:             AlphaDrop,
		MaxPatches:        DefaultMaxPatches,
	}
}

// Factor is the side every resized dimension must divide by:
// patch_size × merge_size.
func (c Config) Factor() int { return c.PatchSize * c.MergeSize }

// PatchDim is the length of one flattened patch:
// channels × temporal_patch_size × patch_size².
func (c Config) PatchDim() int {
	return Channels * c.TemporalPatchSize * c.PatchSize * c.PatchSize
}

// Validate reports a configuration the formulas cannot use.
func (c Config) Validate() error {
	switch {
	case c.PatchSize <= 0 || c.TemporalPatchSize <= 0 || c.MergeSize <= 0:
		return fmt.Errorf("%w: patch %d, temporal patch %d, merge %d must be positive",
			ErrInvalidArgument, c.PatchSize, c.TemporalPatchSize, c.MergeSize)
	case c.MinPixels < 0 || c.MaxPixels <= 0:
		return fmt.Errorf("%w: min_pixels %d must be ≥ 0 and max_pixels %d > 0",
			ErrInvalidArgument, c.MinPixels, c.MaxPixels)
	case c.MaxPatches < 0:
		return fmt.Errorf("%w: max patches %d is negative", ErrInvalidArgument, c.MaxPatches)
	case !(c.RescaleFactor > 0) || math.IsInf(c.RescaleFactor, 0):
		return fmt.Errorf("%w: rescale factor %v", ErrInvalidArgument, c.RescaleFactor)
	case c.Alpha != AlphaDrop && c.Alpha != AlphaOnWhite:
		return fmt.Errorf("%w: alpha mode %d", ErrInvalidArgument, c.Alpha)
	}
	for ch, s := range c.Std {
		if !(s > 0) || math.IsInf(float64(s), 0) || math.IsNaN(float64(c.Mean[ch])) {
			return fmt.Errorf("%w: channel %d mean %v std %v", ErrInvalidArgument, ch, c.Mean[ch], s)
		}
	}
	return nil
}

// FrameIndexRule selects how sampled frame indices are spread over a video.
type FrameIndexRule int

const (
	// IndicesProcessor is Qwen2VLVideoProcessor.sample_frames:
	// torch.arange(0, total, total/n).int().
	IndicesProcessor FrameIndexRule = iota
	// IndicesLinspaceRound is qwen-vl-utils' reader:
	// torch.linspace(0, total-1, n).round().
	IndicesLinspaceRound
)

// VideoConfig adds frame sampling to the processor parameters.
type VideoConfig struct {
	Config
	// FPS is the sampling rate in frames per second of source time.
	FPS float64
	// MinFrames and MaxFrames bound the sampled count before it is rounded
	// down to a multiple of TemporalPatchSize.
	MinFrames int
	MaxFrames int
	// Indices selects the index rule.
	Indices FrameIndexRule
}

// DefaultVideoConfig returns Qwen3-Omni's video processing settings.
func DefaultVideoConfig() VideoConfig {
	c := DefaultImageConfig()
	c.MinPixels = VideoMinPixels
	c.MaxPixels = VideoMaxPixels
	return VideoConfig{
		Config:    c,
		FPS:       VideoFPS,
		MinFrames: VideoMinFrames,
		MaxFrames: VideoMaxFrames,
		Indices:   IndicesProcessor,
	}
}

// Validate reports a configuration the sampling formulas cannot use.
func (c VideoConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	switch {
	case !(c.FPS > 0) || math.IsInf(c.FPS, 0):
		return fmt.Errorf("%w: sampling fps %v", ErrInvalidArgument, c.FPS)
	case c.MinFrames < 0 || c.MaxFrames <= 0:
		return fmt.Errorf("%w: min frames %d, max frames %d", ErrInvalidArgument, c.MinFrames, c.MaxFrames)
	case c.Indices != IndicesProcessor && c.Indices != IndicesLinspaceRound:
		return fmt.Errorf("%w: frame index rule %d", ErrInvalidArgument, c.Indices)
	}
	return nil
}
