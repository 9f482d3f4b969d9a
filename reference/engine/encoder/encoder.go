// Package encoder owns the reference engine's multimodal input encoders:
// a tiny audio encoder shaped like Qwen3-Omni's AuT audio tower and a tiny
// vision encoder shaped like its Qwen3-VL-style vision tower. Each turns one
// input item (log-mel frames, or an image's or video's patches in the
// processor's order) into rows of the Thinker's hidden size, one row per
// placeholder token the real model would use, so the token counts and the
// positional and attention structure match the real model while the widths
// and depths are tiny.
//
// Like the rest of the reference engine the encoders are float32 and
// deterministic: every product is rounded explicitly (float32(a*b)) so no
// compiler fuses it into an FMA, every reduction has a fixed order, and an
// item's rows depend only on that item and the weights, never on what was
// encoded before or alongside it. Encoders are immutable after
// construction; Encode is safe for concurrent use, does no IO and starts no
// goroutines.
//
// docs/multimodal/encoders.md maps every part to the upstream model and
// cites where each constant comes from.
package encoder

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Sentinel errors; returned errors wrap one of them, so callers can tell a
// bad configuration from a bad input from an input the limits refuse.
var (
	// ErrInvalidConfig reports a configuration Validate rejects.
	ErrInvalidConfig = errors.New("encoder: invalid config")
	// ErrInvalidInput reports an input of the wrong shape (ragged rows, a
	// wrong feature count, a grid that cannot be merged, no frames).
	ErrInvalidInput = errors.New("encoder: invalid input")
	// ErrInputTooLarge reports an input beyond the config's MaxFrames or
	// MaxPatches, refused before anything is allocated for it.
	ErrInputTooLarge = errors.New("encoder: input too large")
)

// maxDim bounds every configured width, so weight sizes cannot overflow and
// a mistaken config cannot ask for absurd allocations. The real model's
// largest width (the audio conv_out input, 480·16 = 7680) is far below it.
const maxDim = 1 << 16

// maxInputLimit bounds MaxFrames and MaxPatches.
const maxInputLimit = 1 << 24

// initKind says how a parameter is initialised.
type initKind int

const (
	initLinear initKind = iota // uniform ±sqrt(3/fan_in): unit-variance outputs
	initGELUIn                 // uniform ±sqrt(3·geluGain/fan_in): a layer whose output feeds a GELU
	initBias                   // uniform ±biasBound
	initOnes                   // LayerNorm weights
	initZeros                  // LayerNorm biases
	initEmbed                  // uniform ±embedBound (learned position table)
)

const (
	// geluGain is the weight variance gain of a layer feeding a GELU. GELU
	// is about x/2 near zero, so unit-variance weights would shrink the
	// signal about fourfold per conv layer and the audio front end's output
	// would vanish under the position embeddings; a variance of 3/fan_in
	// keeps the three GELU convolutions' mean squares near 0.3 (measured).
	geluGain = 3
	// biasBound keeps biases small next to unit-scale activations while
	// still making every bias matter.
	biasBound = 0.1
	// embedBound makes the learned vision position table visible next to
	// the patch embeddings (whose scale is about 0.6 for pixels in ±1)
	// without swamping them.
	embedBound = 0.5
)

// param is one tensor: its upstream name (relative to thinker.audio_tower.
// or thinker.visual.), shape and storage. The ordered list an encoder builds
// is the single source of names, shapes and initialisation order.
type param struct {
	name  string
	shape []int
	w     *[]float32
	kind  initKind
}

func (p param) size() int {
	n := 1
	for _, d := range p.shape {
		n *= d
	}
	return n
}

// initParams fills every parameter from one fixed-seed PCG stream. salt
// keeps the audio and vision streams apart for the same seed.
func initParams(ps []param, seed, salt uint64) {
	r := rand.New(rand.NewPCG(seed, seed^salt))
	for _, p := range ps {
		w := make([]float32, p.size())
		switch p.kind {
		case initLinear:
			fanIn := p.size() / p.shape[0]
			fill(r, w, float32(math.Sqrt(3/float64(fanIn))))
		case initGELUIn:
			fanIn := p.size() / p.shape[0]
			fill(r, w, float32(math.Sqrt(3*geluGain/float64(fanIn))))
		case initBias:
			fill(r, w, biasBound)
		case initOnes:
			for i := range w {
				w[i] = 1
			}
		case initZeros:
		case initEmbed:
			fill(r, w, embedBound)
		default:
			panic(fmt.Sprintf("encoder: parameter %s has unknown init kind %d", p.name, p.kind))
		}
		*p.w = w
	}
}

// fill draws uniform values on [-bound, bound) through 24-bit integers: every
// step is exact but the final scaling, a single IEEE rounding, so no
// platform's float library can change a weight (the habit of reference/engine/model).
func fill(r *rand.Rand, w []float32, bound float32) {
	for i := range w {
		u := float32(r.Uint32()>>8) * (1.0 / (1 << 24))
		w[i] = (2*u - 1) * bound
	}
}

// namedDim is a config width and the upstream name it stands for, so a
// rejection names the field the way config.json does.
type namedDim struct {
	name string
	v    int
}

// checkDims validates positive widths against maxDim.
func checkDims(dims ...namedDim) error {
	for _, d := range dims {
		if d.v < 1 || d.v > maxDim {
			return fmt.Errorf("%w: %s = %d, want 1..%d", ErrInvalidConfig, d.name, d.v, maxDim)
		}
	}
	return nil
}
