// Package bench is omnipd's load generator and report, the counterpart of
// vllm bench serve for omnipd's OpenAI API: it sends streamed chat or
// completions requests in an open loop (Poisson or gamma arrivals at a
// request rate) or a closed loop (a fixed number of clients), measures each
// request from its SSE events (TTFT, TPOT, inter-token latencies, end to
// end, and for audio the time to the first packet and the real-time factor),
// and aggregates runs into Markdown, JSON and SVG reports with goodput
// against an SLO.
//
// The measurement and reporting core (datasets, among them random-mm's
// synthetic images and audio clips, arrivals, statistics, SLOs, stream
// parsing, reports, plots) is pure; Run and Sweep are the driver that does
// the IO.
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/openai"
)

// Load is how requests are offered: an open loop at RequestRate (with at
// most MaxConcurrency in flight when set), or a closed loop of Concurrency
// clients each sending its next request when the last one finished. A run
// ends after NumPrompts requests or, when Duration is set, once no request
// may start any more, whichever comes first.
type Load struct {
	// RequestRate is requests per second; +Inf sends everything at once.
	RequestRate float64
	// Burstiness is the gamma shape of the arrival gaps; 1 is Poisson.
	Burstiness     float64
	MaxConcurrency int
	// Concurrency > 0 selects the closed loop.
	Concurrency int
	NumPrompts  int
	Duration    time.Duration
}

// Closed reports whether the load is a closed loop.
func (l Load) Closed() bool { return l.Concurrency > 0 }

// Validate reports a load that would never end or cannot be offered.
func (l Load) Validate() error {
	switch {
	case l.NumPrompts < 0:
		return fmt.Errorf("num-prompts %d: want >= 0", l.NumPrompts)
	case l.Duration < 0:
		return fmt.Errorf("duration %v: want >= 0", l.Duration)
	case l.NumPrompts == 0 && l.Duration == 0:
		return errors.New("a run needs --num-prompts or --duration to end")
	case l.Concurrency < 0 || l.MaxConcurrency < 0:
		return errors.New("concurrency: want >= 0")
	case l.Closed():
		return nil
	case math.IsNaN(l.RequestRate) || l.RequestRate <= 0:
		return fmt.Errorf("request rate %v: want > 0 or inf", l.RequestRate)
	case math.IsNaN(l.Burstiness) || l.Burstiness < 0:
		return fmt.Errorf("burstiness %v: want > 0 (0 is taken as 1, Poisson)", l.Burstiness)
	case math.IsInf(l.RequestRate, 1) && l.NumPrompts == 0 && l.MaxConcurrency == 0:
		return errors.New("an infinite request rate for a duration would send without bound; give --num-prompts or --max-concurrency")
	}
	return nil
}

// Label names the load's point, e.g. "rate 4" or "concurrency 8".
func (l Load) Label() string {
	if l.Closed() {
		return fmt.Sprintf("concurrency %d", l.Concurrency)
	}
	if math.IsInf(l.RequestRate, 1) {
		return "rate inf"
	}
	return "rate " + formatNum(l.RequestRate)
}

// Config is one benchmark.
type Config struct {
	Target  Target
	Dataset Dataset
	Load    Load
	// Warmup requests run before the measured ones, at the run's
	// concurrency, and are left out of every figure.
	Warmup int
	// Timeout bounds each request, stream included; 0 is no bound.
	Timeout time.Duration
	SLO     SLO
	// Seed draws the arrival schedule.
	Seed uint64
	// Client sends the requests; nil is NewHTTPClient sized for the load.
	Client *http.Client
	// Progress reports the run as it goes; nil is quiet.
	Progress *Progress
	// Logger gets a line per failed request, with its request id.
	Logger *slog.Logger
	// RunID prefixes every X-Request-Id; empty picks one.
	RunID string
}

// Result is one run: the load offered, its aggregates and every measured
// request.
type Result struct {
	Load     Load     `json:"load"`
	Summary  Summary  `json:"summary"`
	Requests []Record `json:"requests"`
	// Interrupted runs stopped early; their figures cover what finished.
	Interrupted bool `json:"interrupted"`
}

func (c *Config) defaults() error {
	if err := c.Target.Validate(); err != nil {
		return err
	}
	if err := c.Load.Validate(); err != nil {
		return err
	}
	if c.Dataset == nil {
		return errors.New("bench: no dataset")
	}
	if c.SLO.NeedsAudio() && !c.Target.Audio {
		return errors.New("an audio SLO (ttfp, rtf) needs --modalities text,audio")
	}
	if c.Load.Burstiness == 0 {
		c.Load.Burstiness = 1
	}
	if c.Client == nil {
		c.Client = ClientFor(c.Load)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RunID == "" {
		c.RunID = newRunID()
	}
	return nil
}

// newRunID is a short prefix that tells this run's requests apart in the
// server's logs.
func newRunID() string { return "bench-" + openai.NewID("")[:8] }

// ClientFor is NewHTTPClient with room for every request the loads may
// have in flight at once.
func ClientFor(loads ...Load) *http.Client {
	conns := 0
	for _, l := range loads {
		conns = max(conns, connsFor(l))
	}
	return NewHTTPClient(conns)
}

// connsFor is how many requests a load may have in flight at once.
func connsFor(l Load) int {
	switch {
	case l.Closed():
		return l.Concurrency
	case l.MaxConcurrency > 0:
		return l.MaxConcurrency
	case l.NumPrompts > 0:
		return min(l.NumPrompts, 4096)
	}
	return 1024
}

// Run sends the warmup requests, then the measured load, and aggregates
// it. When ctx ends mid-run, requests in flight are cancelled and Run
// returns what finished, marked Interrupted, with no error: a partial
// report is still a report.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if cfg.Warmup > 0 {
		warm := cfg.Load
		warm.NumPrompts, warm.Duration, warm.RequestRate = cfg.Warmup, 0, math.Inf(1)
		wcfg := cfg
		wcfg.Load, wcfg.RunID, wcfg.Progress = warm, cfg.RunID+"-warmup", nil
		// Warmup prompts come after the measured ones' indexes so neither
		// set repeats the other.
		wcfg.Dataset = offset{cfg.Dataset, 1 << 30}
		drive(ctx, wcfg, "warmup")
	}
	return drive(ctx, cfg, cfg.Load.Label()), nil
}

// Sweep runs cfg at each load in turn (the warmup only before the first)
// and stops early, with the runs so far, when ctx ends.
func Sweep(ctx context.Context, cfg Config, loads []Load) ([]*Result, error) {
	if cfg.RunID == "" {
		cfg.RunID = newRunID()
	}
	if cfg.Client == nil {
		cfg.Client = ClientFor(loads...)
	}
	var out []*Result
	for i, l := range loads {
		c := cfg
		c.Load = l
		if len(loads) > 1 {
			c.RunID = fmt.Sprintf("%s-p%d", cfg.RunID, i)
		}
		if i > 0 {
			c.Warmup = 0
		}
		res, err := Run(ctx, c)
		if err != nil {
			return out, err
		}
		out = append(out, res)
		if res.Interrupted {
			break
		}
	}
	return out, nil
}

type offset struct {
	Dataset
	by int
}

func (o offset) Prompt(i int) Prompt { return o.Dataset.Prompt(i + o.by) }

// drive offers one load and collects its records.
func drive(ctx context.Context, cfg Config, label string) *Result {
	l := cfg.Load
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu      sync.Mutex
		records []Record
		wg      sync.WaitGroup
	)
	start := time.Now()
	cfg.Progress.begin(label, l.NumPrompts, l.Duration)
	one := func(i int) {
		rec := Record{Index: i, RequestID: fmt.Sprintf("%s-%d", cfg.RunID, i), SentAtMS: ms(time.Since(start))}
		send(runCtx, cfg.Client, cfg.Target, cfg.Dataset.Prompt(i), &rec, cfg.Timeout)
		if !rec.Success && !rec.Canceled {
			cfg.Logger.Warn("request failed", "request_id", rec.RequestID, "status", rec.Status, "err", rec.Error)
		}
		cfg.Progress.done(rec.Success, rec.Canceled)
		mu.Lock()
		records = append(records, rec)
		mu.Unlock()
	}
	// expired reports whether the run's time is up for new requests.
	expired := func() bool { return l.Duration > 0 && time.Since(start) >= l.Duration }

	if l.Closed() {
		var next atomic.Int64
		for range l.Concurrency {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if (l.NumPrompts > 0 && i >= l.NumPrompts) || expired() || runCtx.Err() != nil {
						return
					}
					one(i)
				}
			})
		}
	} else {
		arrivals := NewArrivals(l.RequestRate, l.Burstiness, cfg.Seed)
		var slots chan struct{}
		if l.MaxConcurrency > 0 {
			slots = make(chan struct{}, l.MaxConcurrency)
		}
		// Stopped until the first wait; since Go 1.23 Reset needs no drain.
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		var at time.Duration
	offer:
		for i := 0; l.NumPrompts == 0 || i < l.NumPrompts; i++ {
			if i > 0 {
				at += arrivals.Next()
			}
			if l.Duration > 0 && at >= l.Duration {
				break
			}
			if wait := at - time.Since(start); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-runCtx.Done():
					timer.Stop()
					break offer
				}
			}
			if slots != nil {
				select {
				case slots <- struct{}{}:
				case <-runCtx.Done():
					break offer
				}
				if expired() {
					<-slots
					break
				}
			} else if runCtx.Err() != nil {
				break
			}
			wg.Go(func() {
				one(i)
				if slots != nil {
					<-slots
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	cfg.Progress.end()
	interrupted := ctx.Err() != nil
	sortRecords(records)
	res := &Result{Load: l, Requests: records, Interrupted: interrupted}
	res.Summary = Aggregate(records, elapsed, cfg.SLO)
	return res
}
