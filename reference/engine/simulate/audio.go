package simulate

import "time"

// The audio stages' model. Each cost is Base + PerUnit·n with n the requests
// in flight on the stage worker, the one being timed included: the batch a
// vLLM-served Talker or Code2Wav would run them in.
//
//	Talker first frame   first_frame(n) + code_predictor(n)   prefill and first step, then its 15 residual codebooks
//	Talker later frame   frame(n) + code_predictor(n)         one backbone step, then its residual codebooks
//	Code2Wav chunk       chunk(n) + F·frame(n)                F = new frames in the chunk (left context excluded)

// Talker is the Talker stage's cost.
type Talker struct {
	// FirstFrame is the backbone's time to its first codec token: the
	// prompt's prefill and the first decode step.
	FirstFrame Linear
	// Frame is one later backbone step (the first codebook of a frame).
	Frame Linear
	// CodePredictor is the multi-token head's time for one frame's other
	// 15 codebooks, paid by every frame.
	CodePredictor Linear
}

// FirstFrameTime is the time from a request's start to its first frame
// with inFlight requests on the worker.
func (t Talker) FirstFrameTime(inFlight int) time.Duration {
	n := max(inFlight, 1)
	return addSat(t.FirstFrame.At(n), t.CodePredictor.At(n))
}

// FrameTime is the time of each frame after the first with inFlight
// requests on the worker.
func (t Talker) FrameTime(inFlight int) time.Duration {
	n := max(inFlight, 1)
	return addSat(t.Frame.At(n), t.CodePredictor.At(n))
}

// IsZero reports whether the Talker costs nothing (a profile without a
// talker section): a worker then never waits.
func (t Talker) IsZero() bool { return t == Talker{} }

// Code2Wav is the Code2Wav stage's cost.
type Code2Wav struct {
	// Chunk is the fixed cost of decoding one chunk.
	Chunk Linear
	// Frame is the cost of each new frame the chunk decodes.
	Frame Linear
}

// ChunkTime is the time to decode a chunk of frames new frames with
// inFlight requests on the worker; an empty chunk costs nothing.
func (c Code2Wav) ChunkTime(frames, inFlight int) time.Duration {
	if frames <= 0 {
		return 0
	}
	n := max(inFlight, 1)
	return addSat(c.Chunk.At(n), mulSat(c.Frame.At(n), int64(frames)))
}

// IsZero reports whether Code2Wav costs nothing.
func (c Code2Wav) IsZero() bool { return c == Code2Wav{} }
