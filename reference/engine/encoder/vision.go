package encoder

import (
	"fmt"
	"math"

	"github.com/omnipd/omnipd/reference/engine/kernel"
)

// VisionConfig is the geometry of a vision encoder. Field comments give the
// upstream vision_config key.
type VisionConfig struct {
	PatchSize         int // patch_size: pixels per patch side
	TemporalPatchSize int // temporal_patch_size: frames per patch
	InChannels        int // in_channels
	Hidden            int // hidden_size
	Layers            int // depth; 0 leaves only patch embedding, positions and the merger
	Heads             int // num_heads
	IntermediateSize  int // intermediate_size: the block MLP's width
	SpatialMergeSize  int // spatial_merge_size: merge groups are SpatialMergeSize² patches
	OutHidden         int // out_hidden_size: the Thinker's hidden size
	// NumPositionEmbeddings is num_position_embeddings, a square number: the
	// learned table is a √N×√N grid resampled to each image's grid.
	NumPositionEmbeddings int
	RopeTheta             float64 // the 2-D rotary base
	LayerNormEps          float64 // eps of every vision LayerNorm
	// MaxPatches is the largest t·h·w Encode accepts. It is this engine's
	// bound, not an upstream value.
	MaxPatches int
}

// DefaultVisionConfig is the built-in tiny geometry: the real patching
// (16×16 pixels × 2 frames × 3 channels) and 2×2 merge with tiny widths,
// projecting to outHidden (pass the Thinker's hidden size).
func DefaultVisionConfig(outHidden int) VisionConfig {
	return VisionConfig{
		PatchSize:             16,
		TemporalPatchSize:     2,
		InChannels:            3,
		Hidden:                32,
		Layers:                2,
		Heads:                 2,
		IntermediateSize:      128,
		SpatialMergeSize:      2,
		OutHidden:             outHidden,
		NumPositionEmbeddings: 64, // an 8×8 learned grid (the real one is 48×48)
		RopeTheta:             10000,
		LayerNormEps:          1e-6,
		MaxPatches:            16384, // one 2048×2048-pixel image, or 16 frame pairs at 512×512
	}
}

// PatchDim is the length of one patch row: InChannels·TemporalPatchSize·
// PatchSize², ordered channel, frame, row, column (the Conv3d input layout).
func (c VisionConfig) PatchDim() int {
	return c.InChannels * c.TemporalPatchSize * c.PatchSize * c.PatchSize
}

// OutputLength is the number of vision tokens (rows of Encode, and
// <|image_pad|> or <|video_pad|> placeholders) for a t×h×w patch grid:
// t·h·w / SpatialMergeSize².
func (c VisionConfig) OutputLength(gridT, gridH, gridW int) int {
	return gridT * gridH * gridW / (c.SpatialMergeSize * c.SpatialMergeSize)
}

// positionSide is √NumPositionEmbeddings, or 0 when it is not a square.
func (c VisionConfig) positionSide() int {
	s := int(math.Sqrt(float64(c.NumPositionEmbeddings)))
	for s*s > c.NumPositionEmbeddings {
		s--
	}
	for (s+1)*(s+1) <= c.NumPositionEmbeddings {
		s++
	}
	if s*s != c.NumPositionEmbeddings {
		return 0
	}
	return s
}

// Validate reports whether the config describes a buildable encoder.
func (c VisionConfig) Validate() error {
	if err := checkDims(
		namedDim{"patch_size", c.PatchSize},
		namedDim{"temporal_patch_size", c.TemporalPatchSize},
		namedDim{"in_channels", c.InChannels},
		namedDim{"hidden_size", c.Hidden},
		namedDim{"num_heads", c.Heads},
		namedDim{"intermediate_size", c.IntermediateSize},
		namedDim{"spatial_merge_size", c.SpatialMergeSize},
		namedDim{"out_hidden_size", c.OutHidden},
		namedDim{"num_position_embeddings", c.NumPositionEmbeddings},
	); err != nil {
		return err
	}
	m2 := c.SpatialMergeSize * c.SpatialMergeSize
	switch {
	case c.Layers < 0 || c.Layers > maxDim:
		return fmt.Errorf("%w: depth = %d, want 0..%d", ErrInvalidConfig, c.Layers, maxDim)
	case c.Hidden%c.Heads != 0:
		return fmt.Errorf("%w: hidden_size %d is not a multiple of num_heads %d", ErrInvalidConfig, c.Hidden, c.Heads)
	case (c.Hidden/c.Heads)%4 != 0:
		// The 2-D rotary splits each head into row and column halves, each
		// rotated in pairs.
		return fmt.Errorf("%w: head_dim %d must be a multiple of 4", ErrInvalidConfig, c.Hidden/c.Heads)
	case c.positionSide() == 0:
		return fmt.Errorf("%w: num_position_embeddings %d is not a square", ErrInvalidConfig, c.NumPositionEmbeddings)
	case c.PatchSize > maxDim/c.PatchSize || c.PatchDim() > maxDim:
		return fmt.Errorf("%w: patch of %d·%d·%d² values exceeds %d", ErrInvalidConfig,
			c.InChannels, c.TemporalPatchSize, c.PatchSize, maxDim)
	case c.SpatialMergeSize > maxDim/c.SpatialMergeSize || c.Hidden*m2 > maxDim:
		return fmt.Errorf("%w: merged width %d·%d² exceeds %d", ErrInvalidConfig, c.Hidden, c.SpatialMergeSize, maxDim)
	case !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0):
		return fmt.Errorf("%w: rotary base %v must be finite and above 1", ErrInvalidConfig, c.RopeTheta)
	case !(c.LayerNormEps > 0) || math.IsInf(c.LayerNormEps, 0):
		return fmt.Errorf("%w: layer norm eps %v must be positive and finite", ErrInvalidConfig, c.LayerNormEps)
	case c.MaxPatches < m2 || c.MaxPatches > maxInputLimit:
		return fmt.Errorf("%w: max patches %d, want %d..%d", ErrInvalidConfig, c.MaxPatches, m2, maxInputLimit)
	}
	return nil
}

// VisionEncoder is a built vision encoder. It is immutable, so one encoder
// serves any number of concurrent Encode calls.
type VisionEncoder struct {
	cfg  VisionConfig
	side int // √NumPositionEmbeddings

	patchW, patchB []float32 // [hidden][PatchDim] (the Conv3d weight flattened), [hidden]
	posEmbed       []float32 // [NumPositionEmbeddings][hidden], row-major over the side×side grid
	blocks         []visionBlock

	mergeNormW, mergeNormB []float32 // merger.ln_q, over one patch's hidden state
	merge1W, merge1B       []float32 // [hidden·m²][hidden·m²]
	merge2W, merge2B       []float32 // [OutHidden][hidden·m²]

	invFreq []float64 // [headDim/4] rotary frequencies shared by the row and column halves
}

type visionBlock struct {
	norm1W, norm1B []float32
	qkv, qkvB      []float32 // [3·hidden][hidden]: q, k, v, each heads×head_dim
	proj, projB    []float32 // [hidden][hidden]
	norm2W, norm2B []float32
	fc1, fc1B      []float32 // [intermediate][hidden]
	fc2, fc2B      []float32 // [hidden][intermediate]
}

// visionSalt separates the vision weights' PCG stream from the audio one.
const visionSalt = 0x5eed0f1e1d0f5eed

// NewVisionEncoder builds an encoder with deterministic weights drawn from
// seed: the same config and seed give bit-identical weights on every
// machine.
func NewVisionEncoder(c VisionConfig, seed uint64) (*VisionEncoder, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	e := &VisionEncoder{cfg: c, side: c.positionSide(), blocks: make([]visionBlock, c.Layers)}
	initParams(e.params(), seed, visionSalt)
	// Upstream's axial rotary takes the frequencies of a head_dim/2-wide
	// RoPE, 1/θ^(2k/(head_dim/2)), and uses each for both the row and the
	// column coordinate.
	spatial := c.Hidden / c.Heads / 2
	e.invFreq = make([]float64, spatial/2)
	for k := range e.invFreq {
		e.invFreq[k] = 1 / math.Pow(c.RopeTheta, float64(2*k)/float64(spatial))
	}
	return e, nil
}

// Config returns the encoder's geometry.
func (e *VisionEncoder) Config() VisionConfig { return e.cfg }

// params lists the tensors under their upstream names, in forward order.
func (e *VisionEncoder) params() []param {
	c := e.cfg
	h, m2 := c.Hidden, c.SpatialMergeSize*c.SpatialMergeSize
	ps := []param{
		{"patch_embed.proj.weight", []int{h, c.InChannels, c.TemporalPatchSize, c.PatchSize, c.PatchSize}, &e.patchW, initLinear},
		{"patch_embed.proj.bias", []int{h}, &e.patchB, initBias},
		{"pos_embed.weight", []int{c.NumPositionEmbeddings, h}, &e.posEmbed, initEmbed},
	}
	for i := range e.blocks {
		b := &e.blocks[i]
		p := fmt.Sprintf("blocks.%d.", i)
		ps = append(ps,
			param{p + "norm1.weight", []int{h}, &b.norm1W, initOnes},
			param{p + "norm1.bias", []int{h}, &b.norm1B, initZeros},
			param{p + "attn.qkv.weight", []int{3 * h, h}, &b.qkv, initLinear},
			param{p + "attn.qkv.bias", []int{3 * h}, &b.qkvB, initBias},
			param{p + "attn.proj.weight", []int{h, h}, &b.proj, initLinear},
			param{p + "attn.proj.bias", []int{h}, &b.projB, initBias},
			param{p + "norm2.weight", []int{h}, &b.norm2W, initOnes},
			param{p + "norm2.bias", []int{h}, &b.norm2B, initZeros},
			param{p + "mlp.linear_fc1.weight", []int{c.IntermediateSize, h}, &b.fc1, initGELUIn},
			param{p + "mlp.linear_fc1.bias", []int{c.IntermediateSize}, &b.fc1B, initBias},
			param{p + "mlp.linear_fc2.weight", []int{h, c.IntermediateSize}, &b.fc2, initLinear},
			param{p + "mlp.linear_fc2.bias", []int{h}, &b.fc2B, initBias},
		)
	}
	return append(ps,
		param{"merger.ln_q.weight", []int{h}, &e.mergeNormW, initOnes},
		param{"merger.ln_q.bias", []int{h}, &e.mergeNormB, initZeros},
		param{"merger.mlp.0.weight", []int{h * m2, h * m2}, &e.merge1W, initGELUIn},
		param{"merger.mlp.0.bias", []int{h * m2}, &e.merge1B, initBias},
		param{"merger.mlp.2.weight", []int{c.OutHidden, h * m2}, &e.merge2W, initLinear},
		param{"merger.mlp.2.bias", []int{c.OutHidden}, &e.merge2B, initBias},
	)
}

// patchRowCol decodes the j-th patch of a frame, in the processor's order,
// into its row and column on the h×w patch grid. The Qwen2-VL image
// processor emits a frame's patches block-major over merge×merge blocks —
// (block row, block column, row in block, column in block) — so every
// merge² consecutive patches form one merge group.
func patchRowCol(j, gridW, merge int) (row, col int) {
	blocksW := gridW / merge
	inCol := j % merge
	inRow := j / merge % merge
	blockCol := j / (merge * merge) % blocksW
	blockRow := j / (merge * merge * blocksW)
	return blockRow*merge + inRow, blockCol*merge + inCol
}

// interpolationTaps gives the two source rows (or columns) of the side-long
// learned grid that position index of a size-long axis reads, and their
// bilinear weights: align_corners=True maps index to
// src = index·(side-1)/(size-1), computed in float32 as upstream.
func interpolationTaps(index, size, side int) (lo, hi int, wLo, wHi float32) {
	var src float32
	if size > 1 {
		src = float32(index*(side-1)) / float32(size-1)
	}
	lo = int(src) // src >= 0, so truncation is floor
	hi = min(lo+1, side-1)
	frac := src - float32(lo)
	return lo, hi, 1 - frac, frac
}

// framePositions returns the learned position embedding of every patch of
// one h×w frame in the processor's order ([h·w][hidden]): the table
// bilinearly resampled to the grid, summed over the four taps in the order
// (lo,lo), (lo,hi), (hi,lo), (hi,hi).
func (e *VisionEncoder) framePositions(gridH, gridW int) []float32 {
	hid, side, m := e.cfg.Hidden, e.side, e.cfg.SpatialMergeSize
	frame := gridH * gridW
	out := make([]float32, frame*hid)
	for j := range frame {
		row, col := patchRowCol(j, gridW, m)
		r0, r1, wr0, wr1 := interpolationTaps(row, gridH, side)
		c0, c1, wc0, wc1 := interpolationTaps(col, gridW, side)
		taps := [4]int{r0*side + c0, r0*side + c1, r1*side + c0, r1*side + c1}
		weights := [4]float32{float32(wr0 * wc0), float32(wr0 * wc1), float32(wr1 * wc0), float32(wr1 * wc1)}
		dst := out[j*hid : (j+1)*hid]
		for k := range dst {
			var s float32
			for t, tap := range taps {
				s += float32(weights[t] * e.posEmbed[tap*hid+k])
			}
			dst[k] = s
		}
	}
	return out
}

// frameRotary returns the rotary cos and sin of every patch of one frame in
// the processor's order ([h·w][head_dim/2]): the first head_dim/4 angles are
// row·ω_k, the next head_dim/4 col·ω_k (upstream's cat(freq_h, freq_w)),
// each pairing element i with i+head_dim/2 of a head.
func (e *VisionEncoder) frameRotary(gridH, gridW int) (cos, sin []float32) {
	half := e.cfg.Hidden / e.cfg.Heads / 2
	quarter := len(e.invFreq)
	frame := gridH * gridW
	cos, sin = make([]float32, frame*half), make([]float32, frame*half)
	for j := range frame {
		row, col := patchRowCol(j, gridW, e.cfg.SpatialMergeSize)
		for k, f := range e.invFreq {
			sr, cr := math.Sincos(float64(row) * f)
			sc, cc := math.Sincos(float64(col) * f)
			cos[j*half+k], sin[j*half+k] = float32(cr), float32(sr)
			cos[j*half+quarter+k], sin[j*half+quarter+k] = float32(cc), float32(sc)
		}
	}
	return cos, sin
}

// Encode turns one image's or video's patches into
// OutputLength(gridT, gridH, gridW) rows of OutHidden values. patches has
// gridT·gridH·gridW rows of PatchDim values in the Qwen2-VL image
// processor's order: frame group by frame group, each frame block-major
// over SpatialMergeSize² blocks; an image is one frame group (the processor
// repeats it over TemporalPatchSize frames). Row r of the result merges
// patches r·m²..r·m²+m²-1.
//
// As upstream, every frame group gets the same learned positions and 2-D
// rotary angles, and attention is full within a frame group and absent
// across groups, so a row depends only on the patches of its frame group.
func (e *VisionEncoder) Encode(patches [][]float32, gridT, gridH, gridW int) ([][]float32, error) {
	if err := e.checkPatches(patches, gridT, gridH, gridW); err != nil {
		return nil, err
	}
	c := &e.cfg
	hid := c.Hidden
	n, frame := len(patches), gridH*gridW

	x := make([]float32, n*hid) // the residual stream of every patch
	pos := e.framePositions(gridH, gridW)
	for i, p := range patches {
		dst := x[i*hid : (i+1)*hid]
		linear(dst, e.patchW, e.patchB, p)
		kernel.Add(dst, pos[i%frame*hid:(i%frame+1)*hid])
	}

	cos, sin := e.frameRotary(gridH, gridW)
	s := newVisionScratch(c, frame)
	for l := range e.blocks {
		for t := range gridT {
			e.blockFrame(l, x[t*frame*hid:(t+1)*frame*hid], cos, sin, s)
		}
	}
	return e.merge(x, n), nil
}

func (e *VisionEncoder) checkPatches(patches [][]float32, gridT, gridH, gridW int) error {
	c := &e.cfg
	m := c.SpatialMergeSize
	switch {
	case gridT < 1 || gridH < 1 || gridW < 1:
		return fmt.Errorf("%w: grid %d×%d×%d has an empty axis", ErrInvalidInput, gridT, gridH, gridW)
	case gridH%m != 0 || gridW%m != 0:
		return fmt.Errorf("%w: grid %d×%d is not a multiple of the merge size %d", ErrInvalidInput, gridH, gridW, m)
	case gridT > c.MaxPatches || gridH > c.MaxPatches || gridW > c.MaxPatches ||
		gridH*gridW > c.MaxPatches || gridT*gridH*gridW > c.MaxPatches:
		// Each factor is checked first so the product cannot overflow.
		return fmt.Errorf("%w: grid %d×%d×%d, limit %d patches", ErrInputTooLarge, gridT, gridH, gridW, c.MaxPatches)
	case len(patches) != gridT*gridH*gridW:
		return fmt.Errorf("%w: %d patches for a %d×%d×%d grid", ErrInvalidInput, len(patches), gridT, gridH, gridW)
	}
	want := c.PatchDim()
	for i, p := range patches {
		if len(p) != want {
			return fmt.Errorf("%w: patch %d has %d values, want %d", ErrInvalidInput, i, len(p), want)
		}
	}
	return nil
}

// visionScratch is one frame group's working memory for a block.
type visionScratch struct {
	normed, q, k, v, attn []float32 // [frame][hidden]
	qkv                   []float32 // [3·hidden]
	scores                []float32 // [frame]
	tmp                   []float32 // [hidden]
	mlp                   []float32 // [intermediate]
}

func newVisionScratch(c *VisionConfig, frame int) *visionScratch {
	h := c.Hidden
	return &visionScratch{
		normed: make([]float32, frame*h),
		q:      make([]float32, frame*h),
		k:      make([]float32, frame*h),
		v:      make([]float32, frame*h),
		attn:   make([]float32, frame*h),
		qkv:    make([]float32, 3*h),
		scores: make([]float32, frame),
		tmp:    make([]float32, h),
		mlp:    make([]float32, c.IntermediateSize),
	}
}

// blockFrame applies block l to one frame group's patches, x holding their
// residual streams: x += proj(attn(norm1(x))); x += fc2(gelu_tanh(fc1(norm2(x)))).
func (e *VisionEncoder) blockFrame(l int, x, cos, sin []float32, s *visionScratch) {
	c := &e.cfg
	b := &e.blocks[l]
	h, hd := c.Hidden, c.Hidden/c.Heads
	half := hd / 2
	patches := len(x) / h
	for j := range patches {
		nj := s.normed[j*h : (j+1)*h]
		layerNorm(nj, x[j*h:(j+1)*h], b.norm1W, b.norm1B, c.LayerNormEps)
		linear(s.qkv, b.qkv, b.qkvB, nj)
		q, k := s.q[j*h:(j+1)*h], s.k[j*h:(j+1)*h]
		copy(q, s.qkv[:h])
		copy(k, s.qkv[h:2*h])
		copy(s.v[j*h:(j+1)*h], s.qkv[2*h:])
		cj, sj := cos[j*half:(j+1)*half], sin[j*half:(j+1)*half]
		for hh := range c.Heads {
			kernel.RotateHalf(q[hh*hd:(hh+1)*hd], cj, sj)
			kernel.RotateHalf(k[hh*hd:(hh+1)*hd], cj, sj)
		}
	}
	attendSegment(s.attn, s.q, s.k, s.v, patches, c.Heads, hd, s.scores)
	for j := range patches {
		xj := x[j*h : (j+1)*h]
		linear(s.tmp, b.proj, b.projB, s.attn[j*h:(j+1)*h])
		kernel.Add(xj, s.tmp)

		nj := s.normed[:h]
		layerNorm(nj, xj, b.norm2W, b.norm2B, c.LayerNormEps)
		linear(s.mlp, b.fc1, b.fc1B, nj)
		for i, v := range s.mlp {
			s.mlp[i] = geluTanh(v)
		}
		linear(s.tmp, b.fc2, b.fc2B, s.mlp)
		kernel.Add(xj, s.tmp)
	}
}

// merge is the patch merger: each patch normalised by ln_q, every m²
// consecutive patches concatenated, then Linear → GELU (exact) → Linear to
// OutHidden.
func (e *VisionEncoder) merge(x []float32, n int) [][]float32 {
	c := &e.cfg
	h, m2 := c.Hidden, c.SpatialMergeSize*c.SpatialMergeSize
	wide := h * m2
	cat, mid := make([]float32, wide), make([]float32, wide)
	out := make([][]float32, n/m2)
	for g := range out {
		for p := range m2 {
			i := g*m2 + p
			layerNorm(cat[p*h:(p+1)*h], x[i*h:(i+1)*h], e.mergeNormW, e.mergeNormB, c.LayerNormEps)
		}
		linear(mid, e.merge1W, e.merge1B, cat)
		for i, v := range mid {
			mid[i] = geluErf(v)
		}
		out[g] = make([]float32, c.OutHidden)
		linear(out[g], e.merge2W, e.merge2B, mid)
	}
	return out
}
