package visionproc

import (
	"fmt"
	"math"
)

// SampleFrameCount is how many frames the video processor samples from a
// video of total frames at sourceFPS (Qwen2VLVideoProcessor.sample_frames
// with fps given):
//
//	max' = ⌊min(max_frames, total) / tps⌋ · tps
//	n    = min(max(total / source_fps · fps, min_frames), max', total)
//	n    = ⌊n / tps⌋ · tps
//
// qwen-vl-utils' smart_nframes gives the same count for the default bounds
// (it additionally rounds min_frames up to a multiple of tps). A result of
// zero (a video shorter than one temporal patch) is ErrTooFewFrames, where
// upstream fails with a division by zero or a range error.
func SampleFrameCount(total int, sourceFPS float64, cfg VideoConfig) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	if total <= 0 || !(sourceFPS > 0) || math.IsInf(sourceFPS, 0) {
		return 0, fmt.Errorf("%w: %d frames at %v fps", ErrInvalidArgument, total, sourceFPS)
	}
	tps := cfg.TemporalPatchSize
	maxFrames := min(cfg.MaxFrames, total) / tps * tps
	// Python evaluates total / metadata.fps * fps left to right in float64.
	n := float64(float64(total)/sourceFPS) * cfg.FPS
	n = math.Min(math.Min(math.Max(n, float64(cfg.MinFrames)), float64(maxFrames)), float64(total))
	count := int(math.Floor(n/float64(tps))) * tps
	if count <= 0 {
		return 0, badInput(ErrTooFewFrames, "the video is too short: its %d frames at %.3g fps sample to %d, and the processor needs at least %d", total, sourceFPS, count, tps)
	}
	return count, nil
}

// FrameIndices spreads n samples over total frames by rule.
//
// IndicesProcessor reproduces torch.arange(0, total, total/n).int(): element
// i is float32(i·step) truncated, with step = total/n in float64 (torch
// computes in double and stores the default float32 dtype). Its length is
// ⌈total/step⌉, which floating point can make n+1 — upstream then gets an odd
// frame count and pads it, and so does Patchify.
//
// IndicesLinspaceRound reproduces torch.linspace(0, total−1, n).round():
// evenly spaced including both ends, rounded half to even. It is computed in
// float64; torch uses float32, which could only differ on a value within
// float32 rounding of a .5 tie.
func FrameIndices(total, n int, rule FrameIndexRule) ([]int, error) {
	if total <= 0 || n <= 0 || n > total {
		return nil, fmt.Errorf("%w: %d samples of %d frames", ErrInvalidArgument, n, total)
	}
	switch rule {
	case IndicesProcessor:
		step := float64(total) / float64(n)
		length := int(math.Ceil(float64(total) / step))
		idx := make([]int, length)
		for i := range idx {
			idx[i] = min(int(float32(float64(i)*step)), total-1)
		}
		return idx, nil
	case IndicesLinspaceRound:
		idx := make([]int, n)
		if n == 1 {
			return idx, nil
		}
		step := float64(total-1) / float64(n-1)
		for i := range idx {
			idx[i] = int(math.RoundToEven(float64(float64(i) * step)))
		}
		idx[n-1] = total - 1
		return idx, nil
	}
	return nil, fmt.Errorf("%w: frame index rule %d", ErrInvalidArgument, rule)
}

// Video is a processed video input.
type Video struct {
	Patches
	// FrameIndices are the source frames that were sampled, in order.
	FrameIndices []int
	// SourceFPS, SourceFrames and SourceDuration describe the container's
	// video stream.
	SourceFPS      float64
	SourceFrames   int
	SourceDuration float64
	// SecondsPerGrid is the time one temporal patch spans, which the rotary
	// positions scale by: temporal_patch_size / fps, the processor's
	// video_second_per_grid (fps being the sampling rate, VideoConfig.FPS).
	SecondsPerGrid float64
	// Audio is the container's PCM track, nil when it has none.
	Audio *PCMAudio
}

// ProcessVideo parses a Motion-JPEG AVI, samples frames at cfg.FPS, decodes
// only those, smart-resizes them to one patch grid, normalizes and flattens
// them over temporal-patch pairs. The patch budget is checked after the
// first sampled frame is decoded and before the others are.
func ProcessVideo(data []byte, limits ContainerLimits, cfg VideoConfig) (Video, error) {
	if err := cfg.Validate(); err != nil {
		return Video{}, err
	}
	avi, err := ParseAVI(data, limits)
	if err != nil {
		return Video{}, err
	}
	n, err := SampleFrameCount(avi.FrameCount, avi.FPS, cfg)
	if err != nil {
		return Video{}, fmt.Errorf("sample %d frames at %.3f fps: %w", avi.FrameCount, avi.FPS, err)
	}
	indices, err := FrameIndices(avi.FrameCount, n, cfg.Indices)
	if err != nil {
		return Video{}, fmt.Errorf("frame indices: %w", err)
	}
	frames := make([]Frame, len(indices))
	var rs *resizer
	var srcW, srcH int
	for i, fi := range indices {
		if i > 0 && fi == indices[i-1] {
			frames[i] = frames[i-1] // repeated index: decode once
			continue
		}
		img, err := avi.DecodeFrame(fi)
		if err != nil {
			return Video{}, err
		}
		f, err := ToRGB(img, cfg.Alpha)
		if err != nil {
			return Video{}, fmt.Errorf("frame %d to RGB: %w", fi, err)
		}
		if rs == nil {
			srcW, srcH = f.Width, f.Height
			rh, rw, err := SmartResize(srcH, srcW, cfg.Factor(), cfg.MinPixels, cfg.MaxPixels)
			if err != nil {
				return Video{}, fmt.Errorf("smart resize: %w", err)
			}
			if err := checkPatchBudget(len(indices), rh, rw, cfg.Config); err != nil {
				return Video{}, err
			}
			rs = newResizer(srcW, srcH, rw, rh)
		} else if f.Width != srcW || f.Height != srcH {
			return Video{}, badAVI("video frame %d is %d×%d but frame %d is %d×%d",
				fi, f.Width, f.Height, indices[0], srcW, srcH)
		}
		frames[i] = rs.resize(f)
	}
	p, err := Patchify(frames, cfg.Config)
	if err != nil {
		return Video{}, err
	}
	return Video{
		Patches:        p,
		FrameIndices:   indices,
		SourceFPS:      avi.FPS,
		SourceFrames:   avi.FrameCount,
		SourceDuration: avi.Duration(),
		SecondsPerGrid: float64(cfg.TemporalPatchSize) / cfg.FPS,
		Audio:          avi.Audio,
	}, nil
}
