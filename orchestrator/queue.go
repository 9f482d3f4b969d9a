package orchestrator

import (
	"errors"
	"fmt"
	"maps"
	"net/http"

	"github.com/omnipd/omnipd/stageclient"
)

// ErrStageBusy is the cause of the 429 a request gets when every instance
// of a stage it needs is at its pool's MaxQueue.
var ErrStageBusy = errors.New("every instance of the stage is at its queue bound")

// busy reports whether in cannot take another leg under p's bound.
func (p *Pool) busy(in *Instance) bool {
	return p.MaxQueue > 0 && in.inflight.Load() >= int64(p.MaxQueue)
}

// tryCount counts a leg onto in unless that would pass bound (0: none).
// It compares and swaps, so concurrent legs never overshoot the bound
// together and a refusal means in was full at that moment.
func (in *Instance) tryCount(bound int) bool {
	for {
		n := in.inflight.Load()
		if bound > 0 && n >= int64(bound) {
			return false
		}
		if in.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// take picks an instance of p not in tried, least loaded first, and counts
// a leg onto it. Picking and counting are one step for the caller: when a
// concurrent request takes the last place on the instance picked, take
// moves on to the next one, so a request is refused (429) only when every
// candidate instance is full. Once one is full, an instance sitting out
// after a failure (which pick falls back to when nothing else is left) is
// not tried instead: the client hears 429 and retries. It returns nil, nil
// when p has no instance left to try. The caller must release the leg with
// track(p, in, -1).
func (o *Orchestrator) take(p *Pool, tried map[*Instance]bool) (*Instance, error) {
	skip, sawFull := tried, false
	for {
		now := o.now()
		in := p.pick(now, skip)
		if in == nil || (sawFull && in.ejectedUntil.Load() > now.UnixNano()) {
			if sawFull {
				return nil, o.queueFull(p)
			}
			return nil, nil
		}
		if in.tryCount(p.MaxQueue) {
			o.cfg.Metrics.AddInFlight(p.Name, in.Client.BaseURL(), 1)
			return in, nil
		}
		if !sawFull {
			skip = maps.Clone(tried)
			if skip == nil {
				skip = map[*Instance]bool{}
			}
			sawFull = true
		}
		skip[in] = true
	}
}

// admit counts a leg onto an instance the request is already bound to (a
// decode its prefill addressed the KV to), or refuses it when in is full.
func (o *Orchestrator) admit(p *Pool, in *Instance) error {
	if !in.tryCount(p.MaxQueue) {
		return o.queueFull(p)
	}
	o.cfg.Metrics.AddInFlight(p.Name, in.Client.BaseURL(), 1)
	return nil
}

// preflight refuses a request up front when a stage it will need later has
// no room now, so that no earlier leg (a prefill whose KV would then wait
// out its lease, a Thinker whose conditioning nobody fetches) runs for a
// request that cannot finish. admit remains the bound itself.
func (o *Orchestrator) preflight(pools ...*Pool) error {
	for _, p := range pools {
		if p == nil || p.MaxQueue <= 0 {
			continue
		}
		if in := p.pick(o.now(), nil); in != nil && p.busy(in) {
			return o.queueFull(p)
		}
	}
	return nil
}

func (o *Orchestrator) queueFull(p *Pool) *Error {
	o.cfg.Metrics.RecordStageQueueFull(p.Name)
	return &Error{
		Status: http.StatusTooManyRequests,
		Code:   "stage_queue_full",
		Msg:    fmt.Sprintf("every %s instance has %d requests queued or in flight; retry shortly", p.Name, p.MaxQueue),
		Cause:  ErrStageBusy,
	}
}

// credentialRefused is the failure of a leg the stage refused for want of
// the deployment secret (401, or 403 behind some proxies): a deployment
// misconfiguration, not the client's doing, so the client gets 502 rather
// than the stage's 401 (which would read as its own API key being wrong).
// Nil when err is something else.
func credentialRefused(stage string, err error) *Error {
	var ue *stageclient.UpstreamError
	if !errors.As(err, &ue) || (ue.Status != http.StatusUnauthorized && ue.Status != http.StatusForbidden) {
		return nil
	}
	return &Error{
		Status: http.StatusBadGateway,
		Code:   stage + "_unauthorized",
		Msg:    "the " + stage + " stage refused omnipd's deployment secret; check OMNIPD_SECRET and the engines' --api-key",
		Cause:  err,
	}
}
