package orchestrator

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"time"

	"github.com/omnipd/omnipd/stageclient"
)

// Rotation. An instance that failed a leg in a way the next leg would
// likely meet too sits out: pick passes it over while any other instance of
// its stage is in rotation. How long depends on what was seen:
//
//   - it refused the connection (stageclient.ErrNotSent), or the health
//     probe found it down or refusing the deployment secret: until it is
//     seen healthy again — a probe that passes (Pool.Probe, ProbeOnce) or a
//     leg it answers. A dead instance is never picked again on a clock's
//     say-so, so no request is sent to it only to be refused.
//   - it went quiet past the stage idle timeout, its stream broke off, or
//     its connection ended before any answer after the request was written:
//     for ejectFor. Such an instance may well be alive (a stalled engine, a
//     restart under way); the probe, when it runs, puts it back sooner.
//
// A leg an instance refused at connect reached nothing, so it always goes
// to another instance of the stage (failover): the client sees an error
// only when no instance of the stage can be reached.

// ejectFor is how long an instance that went quiet or broke off sits out.
const ejectFor = 5 * time.Second

// untilHealthy is the sit-out that ends only when the instance is seen
// healthy again.
const untilHealthy = math.MaxInt64

// pick returns the least-loaded instance in rotation not in tried; ties go
// round robin so that equal instances share the load. When every instance
// not tried sits out, the one whose sit-out ends first (of those sitting
// out until healthy, the one out longest) is tried rather than none.
func (p *Pool) pick(now time.Time, tried map[*Instance]bool) *Instance {
	var best *Instance
	start := int(p.next.Add(1))
	n := len(p.Instances)
	for i := range n {
		in := p.Instances[(start+i)%n]
		if tried[in] || in.ejectedUntil.Load() > now.UnixNano() {
			continue
		}
		if best == nil || in.inflight.Load() < best.inflight.Load() {
			best = in
		}
	}
	if best != nil {
		return best
	}
	for _, in := range p.Instances {
		if tried[in] {
			continue
		}
		if best == nil || in.ejectedUntil.Load() < best.ejectedUntil.Load() ||
			(in.ejectedUntil.Load() == best.ejectedUntil.Load() && in.ejectedAt.Load() < best.ejectedAt.Load()) {
			best = in
		}
	}
	return best
}

// eject sits the instance out for ejectFor.
func (in *Instance) eject(now time.Time) { in.sitOut(now, now.Add(ejectFor).UnixNano()) }

// sitOutUntilHealthy sits the instance out until a probe passes or a leg
// succeeds on it.
func (in *Instance) sitOutUntilHealthy(now time.Time) { in.sitOut(now, untilHealthy) }

// sitOut takes the instance out of rotation until the moment until (unix
// nanoseconds); a longer sit-out already under way stands.
func (in *Instance) sitOut(now time.Time, until int64) {
	for {
		cur := in.ejectedUntil.Load()
		if cur >= until || in.ejectedUntil.CompareAndSwap(cur, until) {
			break
		}
	}
	in.ejectedAt.Store(now.UnixNano())
}

// ok puts the instance back in rotation: it was seen healthy.
func (in *Instance) ok() {
	if in.ejectedUntil.Swap(0) != 0 {
		// Back from a sit-out: it may have restarted as another release.
		in.rel.forget()
	}
}

// Healthy reports whether the instance is currently in rotation.
func (in *Instance) Healthy(now time.Time) bool { return in.ejectedUntil.Load() <= now.UnixNano() }

// refused reports a leg that provably never reached its instance: the
// dial failed, or the connection broke before the whole request was
// written.
func refused(err error) bool { return errors.Is(err, stageclient.ErrNotSent) }

// failover moves a leg that in refused at connect onto another instance of
// p: in sits out until seen healthy and joins tried, and the next instance
// not tried is taken (the leg counted onto it, as take does). The retry is
// counted and logged: it is never silent. It returns nil and the error the
// client sees when no instance is left — a 429 when every other instance
// is at its queue bound, else the stage's unreachable error naming every
// instance that refused.
func (o *Orchestrator) failover(p *Pool, stage string, in *Instance, tried map[*Instance]bool, err error, log *slog.Logger) (*Instance, error) {
	in.sitOutUntilHealthy(o.now())
	tried[in] = true
	next, terr := o.take(p, tried)
	if terr != nil {
		return nil, terr
	}
	if next == nil {
		var refusing []*Instance
		for _, x := range p.Instances {
			if tried[x] {
				refusing = append(refusing, x)
			}
		}
		return nil, unreachableAll(stage, refusing, err)
	}
	o.refusedRetry(p, in, next, err, log)
	return next, nil
}

// unreachable is what a leg that got no HTTP response (ErrConnect) means
// for the client, naming the instance: a supervised worker omnipd is
// restarting, or a stage at its URL that refuses connections (an external
// engine down, or never started) or dropped the connection before any
// answer. The decode's is a 503 decode_unavailable, which tells clients to
// retry; the prefill's keeps 502 prefill_upstream_unavailable, the code
// pd.fallback and clients already key on. Nil for other errors.
func unreachable(stage string, in *Instance, err error) error {
	if !errors.Is(err, stageclient.ErrConnect) || in == nil {
		return nil
	}
	status, code := unreachableStatus(stage)
	url := in.Client.BaseURL()
	var op *net.OpError
	var msg string
	switch {
	case in.Supervised:
		msg = fmt.Sprintf("the %s stage at %s is restarting; retry shortly", stage, url)
	case errors.As(err, &op) && op.Op == "dial":
		msg = fmt.Sprintf("the %s stage at %s is unreachable: it refuses connections (not started, or down)", stage, url)
	default:
		msg = fmt.Sprintf("the %s stage at %s closed the connection before answering", stage, url)
	}
	return &Error{Status: status, Code: code, Msg: msg, Cause: err}
}

// unreachableAll is unreachable for a stage none of whose instances could
// be reached: every one in refusing refused the connection; err is the
// last refusal.
func unreachableAll(stage string, refusing []*Instance, err error) error {
	if len(refusing) <= 1 {
		var in *Instance
		if len(refusing) == 1 {
			in = refusing[0]
		}
		if e := unreachable(stage, in, err); e != nil {
			return e
		}
		return err
	}
	status, code := unreachableStatus(stage)
	urls := make([]string, len(refusing))
	supervised := true
	for i, in := range refusing {
		urls[i] = in.Client.BaseURL()
		supervised = supervised && in.Supervised
	}
	msg := fmt.Sprintf("no %s instance can be reached: %s refuse connections (not started, or down)", stage, strings.Join(urls, ", "))
	if supervised {
		msg = fmt.Sprintf("every %s instance (%s) is restarting; retry shortly", stage, strings.Join(urls, ", "))
	}
	return &Error{Status: status, Code: code, Msg: msg, Cause: err}
}

func unreachableStatus(stage string) (int, string) {
	if stage == "prefill" {
		return 502, "prefill_upstream_unavailable"
	}
	return 503, stage + "_unavailable"
}
