package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// DefaultStageIdleTimeout is Config.StageIdleTimeout when it is zero: as
// long as common proxies allow a stream to sit silent, and longer than any
// whole (non-streamed) answer the reference stages give.
const DefaultStageIdleTimeout = 5 * time.Minute

// errStageIdle is the cause a leg's context ends with when its stage sent
// nothing for StageIdleTimeout.
var errStageIdle = errors.New("the stage sent nothing within the stage idle timeout")

// watchdog ends a stage leg whose stage has gone quiet. It is armed only
// while the orchestrator waits on the stage — for an answer, or for a
// stream's next event — so time spent relaying to a slow client is never
// blamed on the stage. Its context is the leg's: cancelling it aborts the
// HTTP request, which is how the stage learns to stop.
type watchdog struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	stage  string
	d      time.Duration
	timer  *time.Timer // nil when the timeout is disabled
}

// watch starts a watchdog (disarmed) for one leg to stage.
func (o *Orchestrator) watch(ctx context.Context, stage string) *watchdog {
	w := &watchdog{stage: stage, d: o.cfg.StageIdleTimeout}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	if w.d > 0 {
		w.timer = time.AfterFunc(w.d, func() { w.cancel(errStageIdle) })
		w.timer.Stop()
	}
	return w
}

// arm starts the idle clock; disarm stops it.
func (w *watchdog) arm() {
	if w != nil && w.timer != nil {
		w.timer.Reset(w.d)
	}
}

func (w *watchdog) disarm() {
	if w != nil && w.timer != nil {
		w.timer.Stop()
	}
}

// fired reports whether the leg ended because its stage went quiet.
func (w *watchdog) fired() bool {
	return w != nil && errors.Is(context.Cause(w.ctx), errStageIdle)
}

// stop ends the watchdog and releases its context.
func (w *watchdog) stop() {
	if w == nil {
		return
	}
	w.disarm()
	w.cancel(nil)
}

// err is what the client sees of a stage that went quiet: a 504 naming it.
func (w *watchdog) err(cause error) *Error {
	return &Error{
		Status: http.StatusGatewayTimeout,
		Code:   w.stage + "_upstream_timeout",
		Msg:    fmt.Sprintf("the %s stage sent nothing for %v", w.stage, w.d),
		Cause:  cause,
	}
}
