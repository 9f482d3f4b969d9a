package audio

import "slices"

// Chunking defaults, as vllm-omni's Qwen3-Omni deploy config sets them.
const (
	DefaultInitialFrames     = 4  // initial_codec_chunk_frames
	DefaultChunkFrames       = 25 // codec_chunk_frames
	DefaultLeftContextFrames = 25 // codec_left_context_frames
)

// A Chunk is a run of codec frames ready for Code2Wav. The first Context
// frames are left context: they were already emitted in an earlier chunk and
// are repeated only so a decoder with a receptive field reaching back in time
// sees their history. The decoder must drop their Context*SamplesPerFrame
// leading samples.
type Chunk struct {
	Frames  [][]int // left context first, then the new frames
	Context int     // leading frames of Frames that are context
	Start   int     // stream index of the first new frame (Frames[Context])
}

// New returns the chunk's new frames, the ones not emitted before.
func (c Chunk) New() [][]int { return c.Frames[c.Context:] }

// A Chunker groups a stream of codec frames into chunks the way vllm-omni's
// async_chunk mode does: the first chunk after Initial frames, with no left
// context, so that the first audio packet is early; then a chunk for every
// Size new frames carrying up to LeftContext preceding frames; the remainder
// at Flush.
//
// The zero value is ready to use with the defaults: a zero Initial, Size or
// LeftContext means the default (4, 25, 25). Because zero means the default,
// a negative LeftContext asks for no left context at all; a negative Initial
// or Size is treated as the default too.
//
// A Chunker is not safe for concurrent use; one stream owns one Chunker. It
// keeps only the frames it may still need as context.
type Chunker struct {
	Initial     int // frames in the first chunk (initial_codec_chunk_frames)
	Size        int // new frames per later chunk (codec_chunk_frames)
	LeftContext int // max context frames per later chunk (codec_left_context_frames)

	buf     [][]int // retained context followed by pending frames
	pending int     // frames at the end of buf not emitted yet
	emitted int     // frames emitted so far, over the whole stream
}

func (c *Chunker) initial() int {
	if c.Initial <= 0 {
		return DefaultInitialFrames
	}
	return c.Initial
}

func (c *Chunker) size() int {
	if c.Size <= 0 {
		return DefaultChunkFrames
	}
	return c.Size
}

// leftContext returns the effective LeftContext (see the Chunker doc).
func (c *Chunker) leftContext() int {
	switch {
	case c.LeftContext < 0:
		return 0
	case c.LeftContext == 0:
		return DefaultLeftContextFrames
	}
	return c.LeftContext
}

// EffectiveLeftContext reports the left context the Chunker will give, after
// defaults, so a decoder can check it covers its receptive field.
func (c *Chunker) EffectiveLeftContext() int { return c.leftContext() }

// Push adds one frame and returns the chunks that became ready: none or one.
// The frame is copied, so the caller may reuse its slice.
func (c *Chunker) Push(frame []int) []Chunk {
	c.buf = append(c.buf, slices.Clone(frame))
	c.pending++
	want := c.size()
	if c.emitted == 0 {
		want = c.initial()
	}
	if c.pending < want {
		return nil
	}
	return []Chunk{c.emit()}
}

// Flush returns the frames not yet emitted as a final chunk (none if there
// are none) and resets the Chunker for a new stream.
func (c *Chunker) Flush() []Chunk {
	var out []Chunk
	if c.pending > 0 {
		out = []Chunk{c.emit()}
	}
	c.buf, c.pending, c.emitted = nil, 0, 0
	return out
}

// emit turns the pending frames into a chunk with as much retained context
// as allowed, then trims buf to what the next chunk may use as context.
func (c *Chunker) emit() Chunk {
	left := c.leftContext()
	ctx := min(len(c.buf)-c.pending, left)
	frames := slices.Clone(c.buf[len(c.buf)-c.pending-ctx:])
	ch := Chunk{Frames: frames, Context: ctx, Start: c.emitted}
	c.emitted += c.pending
	c.pending = 0
	// Copy rather than reslice so the dropped frames can be collected.
	c.buf = slices.Clone(c.buf[len(c.buf)-min(len(c.buf), left):])
	return ch
}
