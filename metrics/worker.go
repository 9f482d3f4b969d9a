// Package metrics owns every Prometheus metric omnipd exposes. Call sites
// record through typed methods; each process builds its own registry, so
// tests and several servers in one process never share counters.
//
// Worker metrics use vLLM's names where vLLM has the metric, so dashboards
// built for vllm serve read the reference worker unchanged.
package metrics

import (
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Prompt token sources, as vLLM labels vllm:prompt_tokens_by_source.
const (
	SourceLocalCompute       = "local_compute"
	SourceExternalKVTransfer = "external_kv_transfer"
)

// WorkerLoad is what the worker's gauges read at scrape time.
type WorkerLoad interface {
	Running() int
	Waiting() int
	KVCacheUsage() float64 // 0 to 1
}

// KVLeaseStats is what the KV side channel's gauges read at scrape time:
// the producer's leases, and how the consumer's imports came.
type KVLeaseStats interface {
	LeasedBlocks() int
	ExpiredLeases() uint64
	// Imports counts completed KV imports by path: copied on the
	// prefill's ticket, copied out of its shared memory after a request,
	// received over TCP.
	Imports() (ticket, sharedMemory, tcp uint64)
}

// KV import paths, as omnipd_kv_imports_total labels them.
const (
	importTicket       = "ticket"
	importSharedMemory = "shared_memory"
	importTCP          = "tcp"
)

// Worker holds a stage worker's metrics.
type Worker struct {
	reg *prometheus.Registry

	promptBySource *prometheus.CounterVec
	promptTokens   prometheus.Counter
	genTokens      prometheus.Counter
	success        *prometheus.CounterVec
	ttft           prometheus.Histogram
	itl            prometheus.Histogram
	e2e            prometheus.Histogram
	kvImportFail   prometheus.Counter
	errors         *prometheus.CounterVec
	encoderRuns    *prometheus.CounterVec
}

var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}

// NewWorker registers the worker's metrics for model, reading load from
// load and, when kv is not nil, KV lease figures from kv.
func NewWorker(model string, load WorkerLoad, kv KVLeaseStats) *Worker {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	labels := prometheus.Labels{"model_name": model}
	w := &Worker{
		reg: reg,
		promptBySource: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:prompt_tokens_by_source_total", Help: "Prompt tokens by where their KV came from.", ConstLabels: labels,
		}, []string{"source"}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:prompt_tokens_total", Help: "Prompt tokens processed.", ConstLabels: labels,
		}),
		genTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:generation_tokens_total", Help: "Tokens generated.", ConstLabels: labels,
		}),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Finished requests by finish reason.", ConstLabels: labels,
		}, []string{"finished_reason"}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:time_to_first_token_seconds", Help: "Time to first token.", ConstLabels: labels, Buckets: latencyBuckets,
		}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:inter_token_latency_seconds", Help: "Time between consecutive output tokens.", ConstLabels: labels, Buckets: latencyBuckets,
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:e2e_request_latency_seconds", Help: "End-to-end request latency.", ConstLabels: labels, Buckets: latencyBuckets,
		}),
		kvImportFail: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "omnipd_kv_import_failures_total", Help: "Decode requests whose KV import from the prefill failed.", ConstLabels: labels,
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_request_errors_total", Help: "Requests answered with an error, by HTTP status.", ConstLabels: labels,
		}, []string{"status"}),
		encoderRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_encoder_runs_total", ConstLabels: labels,
			Help: "Media items this worker ran an encoder on, by modality; a decode whose KV import brought the prompt runs none.",
		}, []string{"modality"}),
	}
	for _, m := range []string{"audio", "image", "video"} {
		w.encoderRuns.WithLabelValues(m)
	}
	reg.MustRegister(w.promptBySource, w.promptTokens, w.genTokens, w.success, w.ttft, w.itl, w.e2e, w.kvImportFail, w.errors, w.encoderRuns)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_running", Help: "Requests computing in the engine.", ConstLabels: labels},
			func() float64 { return float64(load.Running()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting", Help: "Requests waiting for the engine.", ConstLabels: labels},
			func() float64 { return float64(load.Waiting()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc", Help: "Fraction of KV cache blocks in use (0 to 1).", ConstLabels: labels},
			func() float64 { return load.KVCacheUsage() }),
	)
	if kv != nil {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "omnipd_kv_leased_blocks", Help: "KV blocks exported and waiting for their decode.", ConstLabels: labels},
				func() float64 { return float64(kv.LeasedBlocks()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "omnipd_kv_lease_expired_total", Help: "Exported KV transfers that nobody claimed before their lease ran out.", ConstLabels: labels},
				func() float64 { return float64(kv.ExpiredLeases()) }),
		)
		for i, path := range []string{importTicket, importSharedMemory, importTCP} {
			pathLabels := prometheus.Labels{"path": path}
			maps.Copy(pathLabels, labels)
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "omnipd_kv_imports_total", ConstLabels: pathLabels,
				Help: "KV imports completed by this decode, by path: copied on the prefill's ticket without a request, copied out of its shared memory after one, or received over TCP.",
			}, func() float64 {
				ticket, shared, tcp := kv.Imports()
				return float64([...]uint64{ticket, shared, tcp}[i])
			}))
		}
	}
	for _, s := range []string{SourceLocalCompute, SourceExternalKVTransfer} {
		w.promptBySource.WithLabelValues(s)
	}
	return w
}

// WatchStashes exposes the number of conditioning stashes a worker holds.
func (w *Worker) WatchStashes(count func() int) {
	w.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "omnipd_conditioning_stashes", Help: "Conditioning stashes waiting to be fetched by the Talker.",
	}, func() float64 { return float64(count()) }))
}

// WatchEncoderCache exposes an encoder worker's held outputs (E/P/D):
// entries the request that asked for them has not yet released.
func (w *Worker) WatchEncoderCache(count func() int) {
	w.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "omnipd_encoder_cache_entries", Help: "Media items' encoder outputs held for a prefill to fetch.",
	}, func() float64 { return float64(count()) }))
}

// Handler serves the registry in the Prometheus text format.
func (w *Worker) Handler() http.Handler {
	return promhttp.HandlerFor(w.reg, promhttp.HandlerOpts{})
}

// RecordPromptTokens counts a finished request's prompt tokens by source.
func (w *Worker) RecordPromptTokens(localCompute, externalKV int) {
	w.promptTokens.Add(float64(localCompute + externalKV))
	w.promptBySource.WithLabelValues(SourceLocalCompute).Add(float64(localCompute))
	w.promptBySource.WithLabelValues(SourceExternalKVTransfer).Add(float64(externalKV))
}

// RecordToken records one generated token and the gap since the previous
// one (zero for the first).
func (w *Worker) RecordToken(sincePrevious time.Duration) {
	w.genTokens.Inc()
	if sincePrevious > 0 {
		w.itl.Observe(sincePrevious.Seconds())
	}
}

// RecordFirstToken records the time to first token.
func (w *Worker) RecordFirstToken(d time.Duration) { w.ttft.Observe(d.Seconds()) }

// RecordFinished records a finished request.
func (w *Worker) RecordFinished(reason string, e2e time.Duration) {
	w.success.WithLabelValues(reason).Inc()
	w.e2e.Observe(e2e.Seconds())
}

// RecordKVImportFailure counts a failed KV import.
func (w *Worker) RecordKVImportFailure() { w.kvImportFail.Inc() }

// RecordError counts a request a worker answered with an error, by HTTP
// status; a client that went away is not one.
func (w *Worker) RecordError(status int) { w.errors.WithLabelValues(strconv.Itoa(status)).Inc() }

// RecordEncoderRun counts one media item encoded: modality is "audio",
// "image" or "video" (a video's own audio counts as audio).
func (w *Worker) RecordEncoderRun(modality string) { w.encoderRuns.WithLabelValues(modality).Inc() }

// Outcomes of a Talker or Code2Wav request, as omnipd_stage_requests_total
// labels them.
const (
	OutcomeOK             = "ok"
	OutcomeInvalid        = "invalid_request"          // 400: the request itself is wrong
	OutcomeNoConditioning = "conditioning_unavailable" // the Thinker's conditioning could not be fetched
	OutcomeFailed         = "failed"                   // the model failed, before or during the stream
	OutcomeCancelled      = "cancelled"                // the caller went away
)

// Stage holds the metrics of an omni stage worker (Talker or Code2Wav):
// requests by outcome, latency, requests in flight and what it produced.
// Latency and in-flight use vLLM's names, so one dashboard reads every
// worker; the rest, which vLLM has no equivalent for, are omnipd_.
type Stage struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	e2e       prometheus.Histogram
	firstItem prometheus.Histogram
	inFlight  prometheus.Gauge
	produced  prometheus.Counter
	// The Talker's reads of conditioning that grows (async chunk).
	condReads, condRows, condWaits, condWaitSeconds prometheus.Counter
}

// NewStage registers a stage worker's metrics. stage is "talker" (which
// produces codec frames) or "code2wav" (audio samples); model labels them
// as model_name labels the Thinker's.
func NewStage(stage, model string) *Stage {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	labels := prometheus.Labels{"model_name": model, "stage": stage}
	unit, what := "frames", "Codec frames the Talker generated."
	if stage != "talker" {
		unit, what = "samples", "Audio samples Code2Wav decoded."
	}
	s := &Stage{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_stage_requests_total", ConstLabels: labels,
			Help: "Finished stage requests by outcome: ok, invalid_request, conditioning_unavailable, failed, cancelled.",
		}, []string{"outcome"}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:e2e_request_latency_seconds", Help: "End-to-end request latency.", ConstLabels: labels, Buckets: latencyBuckets,
		}),
		firstItem: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "omnipd_stage_time_to_first_output_seconds", ConstLabels: labels, Buckets: latencyBuckets,
			Help: "Time from a request's arrival to its first codec frame (Talker) or its samples (Code2Wav).",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vllm:num_requests_running", Help: "Requests being served.", ConstLabels: labels,
		}),
		produced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "omnipd_" + stage + "_" + unit + "_total", Help: what, ConstLabels: labels,
		}),
	}
	reg.MustRegister(s.requests, s.e2e, s.firstItem, s.inFlight, s.produced)
	for _, o := range []string{OutcomeOK, OutcomeInvalid, OutcomeFailed, OutcomeCancelled} {
		s.requests.WithLabelValues(o)
	}
	if stage == "talker" {
		s.requests.WithLabelValues(OutcomeNoConditioning)
		counter := func(name, help string) prometheus.Counter {
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
			reg.MustRegister(c)
			return c
		}
		s.condReads = counter("omnipd_talker_conditioning_reads_total", "Reads of Thinker conditioning that grows (async chunk), one HTTP request each.")
		s.condRows = counter("omnipd_talker_conditioning_rows_total", "Conditioning rows those reads brought; rows per read shows how the transport batches.")
		s.condWaits = counter("omnipd_talker_conditioning_waits_total", "Reads that found the Talker ahead of the Thinker: no row at the offset yet (vllm-omni's WAITING_FOR_CHUNK).")
		s.condWaitSeconds = counter("omnipd_talker_conditioning_wait_seconds_total", "Time spent in those reads, waiting for the Thinker's next row.")
	}
	return s
}

// ConditioningRead records one read of conditioning that grows: the rows
// it brought, whether the Thinker had no row at the offset yet, and how
// long it took. Only the Talker's metrics count these.
func (r *StageRequest) ConditioningRead(rows int, waited bool, took time.Duration) {
	s := r.s
	if s.condReads == nil {
		return
	}
	s.condReads.Inc()
	s.condRows.Add(float64(rows))
	if waited {
		s.condWaits.Inc()
		s.condWaitSeconds.Add(took.Seconds())
	}
}

// Handler serves the registry in the Prometheus text format.
func (s *Stage) Handler() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
}

// StageRequest is one request being served; End it exactly once.
type StageRequest struct {
	s       *Stage
	start   time.Time
	started bool
}

// Start counts a request in flight from now.
func (s *Stage) Start() *StageRequest {
	s.inFlight.Inc()
	return &StageRequest{s: s, start: time.Now()}
}

// Produced records n frames or samples made for the request; the first
// call also records the time to first output.
func (r *StageRequest) Produced(n int) {
	if !r.started {
		r.started = true
		r.s.firstItem.Observe(time.Since(r.start).Seconds())
	}
	r.s.produced.Add(float64(n))
}

// End records the request's outcome and latency and takes it out of flight.
func (r *StageRequest) End(outcome string) {
	r.s.inFlight.Dec()
	r.s.requests.WithLabelValues(outcome).Inc()
	r.s.e2e.Observe(time.Since(r.start).Seconds())
}
