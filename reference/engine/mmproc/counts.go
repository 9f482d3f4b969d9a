package mmproc

import (
	"fmt"
	"math"
)

const (
	// audioWindowFrames is the audio encoder's window in log-mel frames
	// (2·n_window, n_window = 50): the encoder convolves each window
	// separately, so the token count is computed window by window.
	audioWindowFrames = 100
	// audioTokensPerWindow is what a full window yields: three stride-2
	// convolutions take 100 frames to 50, 25, then 13.
	audioTokensPerWindow = 13

	// MaxItemTokens bounds the placeholder tokens of one media item. It is
	// not an upstream limit: it keeps a request carrying absurd sizes from
	// making a worker allocate without bound (2^20 tokens is far beyond the
	// 65536-position context of Qwen3-Omni).
	MaxItemTokens = 1 << 20
)

// AudioTokens returns how many <|audio_pad|> tokens (audio encoder outputs)
// an audio clip of melFrames log-mel frames occupies — transformers'
// _get_feat_extract_output_lengths for Qwen3-Omni: each full 100-frame
// window gives 13 tokens, and the remaining r = melFrames mod 100 frames go
// through three stride-2 convolutions, each mapping L to ⌊(L−1)/2⌋+1 (which
// is 0 for r = 0, else ⌈r/8⌉).
func AudioTokens(melFrames int) (int, error) {
	if melFrames <= 0 {
		return 0, fmt.Errorf("audio of %d mel frames: need at least one: %w", melFrames, ErrInvalidSize)
	}
	rest := melFrames % audioWindowFrames
	tail := halveConv(halveConv(halveConv(rest)))
	n := tail + (melFrames/audioWindowFrames)*audioTokensPerWindow
	if n > MaxItemTokens {
		return 0, fmt.Errorf("audio of %d mel frames gives %d tokens, over %d: %w", melFrames, n, MaxItemTokens, ErrInvalidSize)
	}
	return n, nil
}

// halveConv is one stride-2 convolution's output length, ⌊(L−1)/2⌋+1, with
// Python's floor division: for L = 0 it must give 0 (−1//2 = −1), where Go's
// truncating division would give 1.
func halveConv(length int) int {
	return floorDiv(length-1, 2) + 1
}

func floorDiv(a, b int) int {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// Grid is a vision item's patch grid as the vision preprocessing reports it
// (image_grid_thw / video_grid_thw): T temporal patches, H×W spatial
// patches, before the 2×2 spatial merge.
type Grid struct {
	T, H, W int
}

// merged returns the grid the language model sees: T frames of
// (H/merge)×(W/merge) tokens.
func (g Grid) merged(mergeSize int) (t, h, w int, err error) {
	if g.T <= 0 || g.H <= 0 || g.W <= 0 {
		return 0, 0, 0, fmt.Errorf("grid %v: every side must be positive: %w", g, ErrInvalidSize)
	}
	if mergeSize <= 0 {
		return 0, 0, 0, fmt.Errorf("spatial merge size %d: %w", mergeSize, ErrInvalidOptions)
	}
	// Upstream divides the token count by merge² but the positions by merge
	// per side; a grid that is not divisible would give the two different
	// lengths, so it is refused rather than truncated.
	if g.H%mergeSize != 0 || g.W%mergeSize != 0 {
		return 0, 0, 0, fmt.Errorf("grid %v is not divisible by the spatial merge size %d: %w", g, mergeSize, ErrInvalidSize)
	}
	t, h, w = g.T, g.H/mergeSize, g.W/mergeSize
	if t > MaxItemTokens || h > MaxItemTokens || w > MaxItemTokens || t*h > MaxItemTokens || t*h*w > MaxItemTokens {
		return 0, 0, 0, fmt.Errorf("grid %v gives more than %d tokens: %w", g, MaxItemTokens, ErrInvalidSize)
	}
	return t, h, w, nil
}

// VisionTokens returns how many <|image_pad|> or <|video_pad|> tokens a
// vision item of the given patch grid occupies: T·H·W / mergeSize² (the
// processor's grid_thw.prod() // merge_size**2). Images and videos use the
// same formula.
func VisionTokens(g Grid, mergeSize int) (int, error) {
	t, h, w, err := g.merged(mergeSize)
	if err != nil {
		return 0, err
	}
	return t * h * w, nil
}

// SecondsPerGrid returns how many seconds of video one temporal patch
// covers: temporal_patch_size / fps, as the transformers processor computes
// video_second_per_grid. Qwen3-Omni's temporal_patch_size is 2.
func SecondsPerGrid(temporalPatchSize int, fps float64) (float64, error) {
	if temporalPatchSize <= 0 {
		return 0, fmt.Errorf("temporal patch size %d: %w", temporalPatchSize, ErrInvalidSize)
	}
	if !(fps > 0) || math.IsInf(fps, 0) {
		return 0, fmt.Errorf("fps %v: must be positive and finite: %w", fps, ErrInvalidSize)
	}
	return float64(temporalPatchSize) / fps, nil
}
