package visionproc

import (
	"fmt"
	"image"
)

// Grid is the patch grid of one image or video: T temporal patches of
// H × W spatial patches (the processor's grid_thw).
type Grid struct {
	T, H, W int
}

// Patches is the flattened vision input: NumPatches rows of Dim float32
// values, row-major in Values.
//
// Row order is the processor's: for each temporal patch t, the merge groups
// in row-major order over (h / merge, w / merge), and inside each group its
// merge² patches in row-major order over (dh, dw). So every consecutive
// merge² rows form one merge group (one LLM token after the patch merger).
// Within a row the values are ordered [channel][frame in the temporal
// patch][y in patch][x in patch], the layout the patch-embedding Conv3d
// kernel (channels, temporal_patch_size, patch, patch) expects.
type Patches struct {
	Values []float32
	Dim    int
	Grid   Grid
	// MergeSize is the merge the row order was grouped by.
	MergeSize int
	// Width and Height are the resized picture size in pixels.
	Width, Height int
}

// NumPatches is Grid.T·Grid.H·Grid.W.
func (p Patches) NumPatches() int { return p.Grid.T * p.Grid.H * p.Grid.W }

// Patch returns row i.
func (p Patches) Patch(i int) []float32 { return p.Values[i*p.Dim : (i+1)*p.Dim] }

// Tokens is how many LLM placeholder tokens the patches become after the
// merger: t·h·w / merge² (the processor's grid_thw.prod() // merge_size²).
func (p Patches) Tokens() int {
	if p.MergeSize <= 0 {
		return 0
	}
	return p.NumPatches() / (p.MergeSize * p.MergeSize)
}

// normalizeTable maps every 8-bit value of every channel to its rescaled and
// normalized float32, exactly as the numpy path computes it: the rescale is
// a float64 product cast to float32 (transformers' rescale upcasts, multiplies,
// downcasts), then (v − mean) / std in float32.
func normalizeTable(cfg Config) [Channels][256]float32 {
	var t [Channels][256]float32
	for c := 0; c < Channels; c++ {
		for v := 0; v < 256; v++ {
			scaled := float32(float64(v) * cfg.RescaleFactor)
			t[c][v] = (scaled - cfg.Mean[c]) / cfg.Std[c]
		}
	}
	return t
}

// Patchify normalizes frames already resized to the patch grid and flattens
// them in the processor's order (see Patches). All frames must share one
// size divisible by patch_size × merge_size. A frame count that is not a
// multiple of temporal_patch_size is padded by repeating the last frame, as
// the processor does; a single image therefore becomes temporal_patch_size
// identical frames and grid T = 1.
func Patchify(frames []Frame, cfg Config) (Patches, error) {
	if err := cfg.Validate(); err != nil {
		return Patches{}, err
	}
	if len(frames) == 0 {
		return Patches{}, fmt.Errorf("%w: no frames to patchify", ErrInvalidArgument)
	}
	w, h := frames[0].Width, frames[0].Height
	factor := cfg.Factor()
	if w <= 0 || h <= 0 || w%factor != 0 || h%factor != 0 {
		return Patches{}, fmt.Errorf("%w: frame %d×%d is not a positive multiple of %d", ErrInvalidArgument, w, h, factor)
	}
	for i, f := range frames {
		if f.Width != w || f.Height != h || len(f.Pix) != Channels*w*h {
			return Patches{}, fmt.Errorf("%w: frame %d is %d×%d (%d samples), frame 0 is %d×%d",
				ErrInvalidArgument, i, f.Width, f.Height, len(f.Pix), w, h)
		}
	}
	tps, ps, ms := cfg.TemporalPatchSize, cfg.PatchSize, cfg.MergeSize
	grid := Grid{T: (len(frames) + tps - 1) / tps, H: h / ps, W: w / ps}
	n := grid.T * grid.H * grid.W
	if cfg.MaxPatches > 0 && n > cfg.MaxPatches {
		return Patches{}, badInput(ErrTooLarge, "it makes %d patches, over the limit of %d", n, cfg.MaxPatches)
	}
	dim := cfg.PatchDim()
	out := Patches{Values: make([]float32, n*dim), Dim: dim, Grid: grid, MergeSize: ms, Width: w, Height: h}
	table := normalizeTable(cfg)
	plane := w * h
	row := 0
	for t := 0; t < grid.T; t++ {
		for gh := 0; gh < grid.H/ms; gh++ {
			for gw := 0; gw < grid.W/ms; gw++ {
				for dh := 0; dh < ms; dh++ {
					for dw := 0; dw < ms; dw++ {
						py, px := (gh*ms+dh)*ps, (gw*ms+dw)*ps
						dst := out.Values[row*dim : (row+1)*dim]
						k := 0
						for c := 0; c < Channels; c++ {
							lut := &table[c]
							for tt := 0; tt < tps; tt++ {
								// Padding repeats the last frame.
								fi := min(t*tps+tt, len(frames)-1)
								src := frames[fi].Pix[c*plane:]
								for y := 0; y < ps; y++ {
									line := src[(py+y)*w+px : (py+y)*w+px+ps]
									for _, v := range line {
										dst[k] = lut[v]
										k++
									}
								}
							}
						}
						row++
					}
				}
			}
		}
	}
	return out, nil
}

// PreprocessFrames smart-resizes frames (which must share one size) to the
// patch grid with ResizeBicubic and patchifies them. It checks the patch
// budget before resizing anything.
func PreprocessFrames(frames []Frame, cfg Config) (Patches, error) {
	if err := cfg.Validate(); err != nil {
		return Patches{}, err
	}
	if len(frames) == 0 {
		return Patches{}, fmt.Errorf("%w: no frames", ErrInvalidArgument)
	}
	rh, rw, err := SmartResize(frames[0].Height, frames[0].Width, cfg.Factor(), cfg.MinPixels, cfg.MaxPixels)
	if err != nil {
		return Patches{}, fmt.Errorf("smart resize: %w", err)
	}
	if err := checkPatchBudget(len(frames), rh, rw, cfg); err != nil {
		return Patches{}, err
	}
	rs := newResizer(frames[0].Width, frames[0].Height, rw, rh)
	resized := make([]Frame, len(frames))
	for i, f := range frames {
		if f.Width != frames[0].Width || f.Height != frames[0].Height || len(f.Pix) != Channels*f.Width*f.Height {
			return Patches{}, fmt.Errorf("%w: frame %d is %d×%d, frame 0 is %d×%d",
				ErrInvalidArgument, i, f.Width, f.Height, frames[0].Width, frames[0].Height)
		}
		resized[i] = rs.resize(f)
	}
	return Patchify(resized, cfg)
}

// checkPatchBudget refuses, before any resizing, an output larger than
// cfg.MaxPatches.
func checkPatchBudget(frames, height, width int, cfg Config) error {
	if cfg.MaxPatches == 0 {
		return nil
	}
	t := (frames + cfg.TemporalPatchSize - 1) / cfg.TemporalPatchSize
	n := int64(t) * int64(height/cfg.PatchSize) * int64(width/cfg.PatchSize)
	if n > int64(cfg.MaxPatches) {
		if frames == 1 {
			return badInput(ErrTooLarge, "resized to %d×%d it makes %d patches, over the limit of %d", width, height, n, cfg.MaxPatches)
		}
		return badInput(ErrTooLarge, "its %d sampled frames, resized to %d×%d, make %d patches, over the limit of %d",
			frames, width, height, n, cfg.MaxPatches)
	}
	return nil
}

// ProcessImage turns a decoded image into the vision encoder's input: RGB
// conversion, smart resize, bicubic resampling, rescale and normalization,
// and the flatten with the image repeated to temporal_patch_size frames.
func ProcessImage(img image.Image, cfg Config) (Patches, error) {
	if err := cfg.Validate(); err != nil {
		return Patches{}, err
	}
	f, err := ToRGB(img, cfg.Alpha)
	if err != nil {
		return Patches{}, fmt.Errorf("image to RGB: %w", err)
	}
	return PreprocessFrames([]Frame{f}, cfg)
}

// ProcessImageBytes decodes data under limits and processes it with cfg. It
// returns the patches and the detected format.
func ProcessImageBytes(data []byte, limits ImageLimits, cfg Config) (Patches, string, error) {
	img, format, err := DecodeImage(data, limits)
	if err != nil {
		return Patches{}, format, err
	}
	p, err := ProcessImage(img, cfg)
	if err != nil {
		return Patches{}, format, fmt.Errorf("%s image: %w", format, err)
	}
	return p, format, nil
}
