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
	}
	reg.MustRegister(w.promptBySource, w.promptTokens, w.genTokens, w.success, w.ttft, w.itl, w.e2e, w.kvImportFail)
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
