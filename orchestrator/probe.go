package orchestrator

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/omnipd/omnipd/stageclient"
)

// Probe checks every instance each interval until ctx ends (ProbeOnce),
// so that an instance that cannot serve is out of rotation before a
// request finds it, and back once it can.
func (p *Pool) Probe(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		p.ProbeOnce(ctx, interval)
		if ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// ProbeOnce checks every instance once, all at once, each within timeout,
// with stageclient's Ready: its /health answers 200 and it takes the
// deployment secret (vLLM leaves /health open even with an API key, so
// /health alone would keep an instance that refuses every request in
// rotation). One that passes is back in rotation; one that fails sits out
// until a probe passes. A change of state is logged once — out of
// rotation and why, back in — not on every probe.
func (p *Pool) ProbeOnce(ctx context.Context, timeout time.Duration) {
	var wg sync.WaitGroup
	for _, in := range p.Instances {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			err := in.Client.Ready(pctx)
			cancel()
			if ctx.Err() != nil {
				return // the caller gave up: nothing was learned
			}
			if err != nil {
				in.sitOutUntilHealthy(time.Now())
			} else {
				in.ok()
			}
			in.probed.observe(p, in, err)
		})
	}
	wg.Wait()
}

// probeState is what the probe last saw of an instance, so that it logs
// changes rather than every probe.
type probeState struct {
	mu     sync.Mutex
	seen   bool
	reason string // why it is out of rotation; "" when in
}

// observe records a probe's outcome and logs it if the state changed.
func (s *probeState) observe(p *Pool, in *Instance, err error) {
	reason := ""
	if err != nil {
		reason = probeReason(err)
	}
	s.mu.Lock()
	changed := s.reason != reason || (!s.seen && reason != "")
	s.seen, s.reason = true, reason
	s.mu.Unlock()
	if !changed {
		return
	}
	log := p.Logger
	if log == nil {
		log = slog.Default()
	}
	if err != nil {
		log.Warn("stage instance out of rotation: "+reason, "stage", p.Name, "instance", in.Client.BaseURL(), "err", err)
		return
	}
	log.Info("stage instance back in rotation", "stage", p.Name, "instance", in.Client.BaseURL())
}

// probeReason names why a probe failed, in words stable across probes of
// the same fault, so that one fault is logged once.
func probeReason(err error) string {
	var ue *stageclient.UpstreamError
	switch {
	case errors.Is(err, stageclient.ErrSecretRefused):
		return "it refuses omnipd's deployment secret"
	case errors.Is(err, stageclient.ErrConnect):
		return "it cannot be reached"
	case errors.Is(err, stageclient.ErrTimeout):
		return "it did not answer the probe in time"
	case errors.As(err, &ue):
		return "its /health is not 200"
	}
	return "its probe failed"
}
