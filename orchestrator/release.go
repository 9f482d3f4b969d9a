package orchestrator

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/stageclient"
)

// Background releases. What a request leaves behind when it ends early —
// KV a prefill exported for a decode that will not come (releaseKV,
// claimAndDrop), conditioning no Talker will fetch (freeStashes), encoder
// outputs (releaseEncoded) — is handed back by a call nobody waits for.
// Those calls run on at most releaseWorkers goroutines taking from a queue
// of releaseQueue, started when there is work and gone when there is none,
// and they go through the stage clients (their transport, bounds and
// secret): a burst of cancellations costs a bounded number of goroutines and
// connections.
//
// When the queue is full a new call is dropped — neither queued nor run on
// the request's goroutine — and logged and counted in
// omnipd_releases_dropped_total{kind}. What it would have freed is freed
// later by its own clock: the KV lease (a reference prefill's
// lease_seconds), the stash TTL, the encoder outputs' TTL, a vLLM prefill
// engine's abort timeout. Blocking the request that ends would make a
// cancellation storm slow every answer, and an unbounded queue would hold
// memory without bound.
const (
	releaseWorkers = 8
	releaseQueue   = 4096
)

// Kinds of background call: the kind label of the release metrics.
const (
	releaseKVLease = "kv"
	releaseStash   = "conditioning"
	releaseEncoder = "encoder"
	releaseClaim   = "claim"
)

// releaseTimeout bounds one release call; a claim has claimDeadline.
const releaseTimeout = 5 * time.Second

// releaser runs background calls on a bounded set of workers.
type releaser struct {
	workers int
	jobs    chan releaseJob
	metrics *metrics.Orchestrator

	mu      sync.Mutex // guards running, and the queue's emptiness as workers see it
	running int
}

type releaseJob struct {
	kind string
	run  func(context.Context)
}

func newReleaser(workers, queue int, m *metrics.Orchestrator) *releaser {
	return &releaser{workers: workers, jobs: make(chan releaseJob, queue), metrics: m}
}

// submit queues j, starting a worker if fewer than the bound run; false
// when the queue is full.
func (r *releaser) submit(j releaseJob) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case r.jobs <- j:
	default:
		return false
	}
	r.metrics.AddReleasesPending(1)
	if r.running < r.workers {
		r.running++
		go r.work()
	}
	return true
}

// work runs queued calls until the queue is empty. A worker decides to
// stop under the same lock submit queues under, so no call is left queued
// with no worker to run it.
func (r *releaser) work() {
	for {
		r.mu.Lock()
		var j releaseJob
		select {
		case j = <-r.jobs:
		default:
			r.running--
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		timeout := releaseTimeout
		if j.kind == releaseClaim {
			timeout = claimDeadline
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		j.run(ctx)
		cancel()
		r.metrics.AddReleasesPending(-1)
	}
}

// background runs a release call of kind in the background, or drops it
// when the queue is full: logged at WARN with attrs naming what it would
// have freed, and counted. It reports whether the call was queued.
func (o *Orchestrator) background(kind string, log *slog.Logger, run func(context.Context), attrs ...any) bool {
	if o.releases.submit(releaseJob{kind: kind, run: run}) {
		return true
	}
	o.cfg.Metrics.RecordReleaseDropped(kind)
	log.Warn("the background release queue is full; not releasing: freed when its lease or TTL runs out",
		append([]any{"kind", kind, "queue", cap(o.releases.jobs)}, attrs...)...)
	return false
}

// clientFor is the stage client of the instance at url among pools, or nil
// when no pool holds it (none should: every URL a request keeps is one of
// its instances').
func clientFor(url string, pools ...*Pool) *stageclient.Client {
	for _, p := range pools {
		if p == nil {
			continue
		}
		for _, in := range p.Instances {
			if in.Client.BaseURL() == url {
				return in.Client
			}
		}
	}
	return nil
}
