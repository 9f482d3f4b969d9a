package worker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/audio"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/simulate"
)

// This file is the audio stages' simulate mode: a Talker or Code2Wav worker
// started with --simulate computes its (tiny) reference model as usual and
// then holds each frame or chunk back until the profile's modeled time has
// passed, timed at a batch of the requests in flight on the worker. See
// docs/simulate.md for the model and its calibration.

// maxCatchUp is how late a frame may begin and still be timed from the
// previous frame's deadline, as the Thinker's steps are: frames then do not
// drift by the host's overhead, and a host stall is not repaid with a burst
// of shortened frames.
const maxCatchUp = 2 * time.Millisecond

// pacer waits on a clock and counts the requests in flight on a stage.
type pacer struct {
	clock    engine.Clock
	inFlight atomic.Int64
}

func newPacer(clock engine.Clock) pacer {
	if clock == nil {
		clock = engine.WallClock{}
	}
	return pacer{clock: clock}
}

// waitUntil sleeps until deadline, if it is still ahead.
func (p *pacer) waitUntil(ctx context.Context, deadline time.Time) {
	if d := deadline.Sub(p.clock.Now()); d > 0 {
		p.clock.Sleep(ctx, d)
	}
}

// talkerSim paces a simulated Talker's frames.
type talkerSim struct {
	cost simulate.Talker
	pacer
}

// Simulate makes the Talker keep the pace of the modeled one: each frame is
// emitted when cost says it would be ready. A zero cost (a profile without
// a talker section) leaves the Talker unpaced; clock nil is the wall clock.
// Call it before serving.
func (s *TalkerServer) Simulate(cost simulate.Talker, clock engine.Clock) {
	if cost.IsZero() {
		s.sim = nil
		return
	}
	s.sim = &talkerSim{cost: cost, pacer: newPacer(clock)}
}

// talkerPace times one request's frames; nil when the Talker is not
// simulated, and then every method does nothing.
type talkerPace struct {
	s        *talkerSim
	deadline time.Time
	first    bool
}

// start begins timing a request whose generation starts now.
func (s *talkerSim) start() *talkerPace {
	if s == nil {
		return nil
	}
	s.inFlight.Add(1)
	return &talkerPace{s: s, deadline: s.clock.Now(), first: true}
}

// frame waits until the request's next frame is due. The first frame is
// due its first-frame time after start, however long the reference model
// took; each later one a frame time after the previous one's deadline, or
// after now when it begins more than maxCatchUp late.
func (p *talkerPace) frame(ctx context.Context) {
	if p == nil {
		return
	}
	n := int(p.s.inFlight.Load())
	if p.first {
		p.first = false
		p.deadline = p.deadline.Add(p.s.cost.FirstFrameTime(n))
	} else {
		if now := p.s.clock.Now(); now.Sub(p.deadline) > maxCatchUp {
			p.deadline = now
		}
		p.deadline = p.deadline.Add(p.s.cost.FrameTime(n))
	}
	p.s.waitUntil(ctx, p.deadline)
}

// done ends the request: it no longer counts toward the batch.
func (p *talkerPace) done() {
	if p != nil {
		p.s.inFlight.Add(-1)
	}
}

// code2wavSim paces a simulated Code2Wav's chunks.
type code2wavSim struct {
	cost simulate.Code2Wav
	pacer
}

// Simulate makes Code2Wav answer each chunk when cost says the modeled
// decoder would have decoded it. A zero cost leaves it unpaced; clock nil is
// the wall clock. Call it before serving.
func (s *Code2WavServer) Simulate(cost simulate.Code2Wav, clock engine.Clock) {
	if cost.IsZero() {
		s.sim = nil
		return
	}
	s.sim = &code2wavSim{cost: cost, pacer: newPacer(clock)}
}

// chunk times one chunk that arrived now; the returned function, called
// with the samples decoded (the new frames' only: none for a refused
// chunk), waits until the modeled decoder has them and ends the request. It
// does nothing when Code2Wav is not simulated.
func (s *code2wavSim) chunk() func(ctx context.Context, samples int) {
	if s == nil {
		return func(context.Context, int) {}
	}
	start := s.clock.Now()
	s.inFlight.Add(1)
	return func(ctx context.Context, samples int) {
		defer s.inFlight.Add(-1)
		newFrames := samples / audio.SamplesPerFrame
		s.waitUntil(ctx, start.Add(s.cost.ChunkTime(newFrames, int(s.inFlight.Load()))))
	}
}
