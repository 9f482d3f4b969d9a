package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Orchestrator holds omnipd serve's metrics. A nil *Orchestrator records
// nothing, so tests and tools can leave it out.
type Orchestrator struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	ttft       prometheus.Histogram
	tpot       prometheus.Histogram
	e2e        prometheus.Histogram
	handoff    prometheus.Histogram
	retries    prometheus.Counter
	fallbacks  prometheus.Counter
	decodeOnly prometheus.Counter
	inflight   *prometheus.GaugeVec
	queueFull  *prometheus.CounterVec
	connsOpen  prometheus.Gauge
	refused    *prometheus.CounterVec
	// handoffWithout counts handoffs whose prefill answer lacked a key some
	// engine versions send and others do not (NIXL's remote_request_id).
	handoffWithout  *prometheus.CounterVec
	refusedRetries  *prometheus.CounterVec
	replans         prometheus.Counter
	releasesPending prometheus.Gauge
	releasesDropped *prometheus.CounterVec
	writeTimeouts   prometheus.Counter
}

// StatusClientClosedRequest is the status omnipd_requests_total counts a
// request under when its client went away before the answer was complete:
// 499, nginx's "client closed request". A number rather than a word keeps
// the label one kind of value, so status=~"5.." still selects server
// errors and status=~"4.." client-side ones; and the one convention other
// serving proxies' dashboards already know. A cancelled request never
// counts as a 200, even when its stream had begun.
const StatusClientClosedRequest = 499

// NewOrchestrator registers the orchestrator's metrics.
func NewOrchestrator() *Orchestrator {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	hist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latencyBuckets})
	}
	m := &Orchestrator{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_requests_total", Help: "Requests by the path they took (disaggregated, decode-only, fallback, colocated) and HTTP status.",
		}, []string{"path", "status"}),
		ttft:    hist("omnipd_time_to_first_token_seconds", "Time from the request to its first streamed token; streamed requests only (a whole answer has no first token to time)."),
		tpot:    hist("omnipd_time_per_output_token_seconds", "Time per output token after the first, per streamed request."),
		e2e:     hist("omnipd_e2e_request_latency_seconds", "Time from the request to its last byte."),
		handoff: hist("omnipd_pd_handoff_seconds", "Time from the prefill's answer to the decode's first token; streamed requests on a sequential connector (NIXL, P2pNccl, MoRIIO, LMCache, reference pull) only."),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "omnipd_prefill_retries_total", Help: "Prefill legs retried on another instance: after a failure the instance may have seen (up to pd.prefill_retries), or a refused connection (any number; also in omnipd_stage_refused_retries_total).",
		}),
		handoffWithout: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_kv_handoff_without_key_total", Help: "PD handoffs whose prefill answer lacked a key only some engine versions send (NixlConnector's remote_request_id: vLLM before NIXL connector version 2, llm-d's simulator); the decode found the KV under its own request id.",
		}, []string{"connector", "key"}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "omnipd_pd_fallbacks_total", Help: "Requests the decode prefilled itself because every prefill attempt failed (pd.fallback: local).",
		}),
		decodeOnly: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "omnipd_pd_decode_only_total", Help: "Requests shorter than pd.min_prefill_tokens, sent to the decode alone.",
		}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "omnipd_stage_requests_in_flight", Help: "Requests omnipd has on each stage instance.",
		}, []string{"stage", "instance"}),
		queueFull: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_stage_queue_full_total", Help: "Requests refused with 429 because every instance of a stage was at its queue bound (--max-stage-queue).",
		}, []string{"stage"}),
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "omnipd_http_connections_open", Help: "Client connections open on the API.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_http_connections_refused_total", Help: "Client connections refused at accept: reason per_ip (one client at its connection cap, answered 429) or total (the server at its cap, 503).",
		}, []string{"reason"}),
		refusedRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_stage_refused_retries_total", Help: "Legs sent to another instance of their stage because the instance picked refused the connection, so nothing had reached it; the refusing instance sits out until seen healthy.",
		}, []string{"stage"}),
		replans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "omnipd_pd_replans_total", Help: "PD requests planned again on another decode instance, the prefill run again, because the decode the prefill had addressed its KV to refused the connection (P2pNccl, MoRIIO, LMCache PD).",
		}),
		releasesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "omnipd_releases_pending", Help: "Background calls that free what ended requests left behind (KV leases, conditioning stashes, encoder outputs, KV claims), queued or running.",
		}),
		releasesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "omnipd_releases_dropped_total", Help: "Background release calls not made because their queue was full, by kind (kv, conditioning, encoder, claim); what they would have freed is freed by its lease or TTL.",
		}, []string{"kind"}),
		writeTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "omnipd_client_write_timeouts_total", Help: "Requests dropped because their client read nothing of the answer for --write-timeout; also counted in omnipd_requests_total as 499.",
		}),
	}
	reg.MustRegister(m.requests, m.ttft, m.tpot, m.e2e, m.handoff, m.retries, m.fallbacks, m.decodeOnly, m.inflight, m.queueFull, m.connsOpen, m.refused, m.handoffWithout,
		m.refusedRetries, m.replans, m.releasesPending, m.releasesDropped, m.writeTimeouts)
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Orchestrator) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// RecordRequest counts a finished request and its end-to-end latency.
// status is the HTTP status the client got, or StatusClientClosedRequest
// for a request whose client went away.
func (m *Orchestrator) RecordRequest(path string, status int, e2e time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(path, strconv.Itoa(status)).Inc()
	m.e2e.Observe(e2e.Seconds())
}

// RecordStreamTiming records a streamed request's time to first token and
// mean time per output token after it.
func (m *Orchestrator) RecordStreamTiming(ttft time.Duration, tokens int, total time.Duration) {
	if m == nil {
		return
	}
	m.ttft.Observe(ttft.Seconds())
	if tokens > 1 {
		m.tpot.Observe((total - ttft).Seconds() / float64(tokens-1))
	}
}

// RecordHandoff records the time from the prefill's answer to the decode's
// first token.
func (m *Orchestrator) RecordHandoff(d time.Duration) {
	if m != nil {
		m.handoff.Observe(d.Seconds())
	}
}

// RecordHandoffWithout counts a handoff whose prefill answer lacked key.
func (m *Orchestrator) RecordHandoffWithout(connector, key string) {
	if m != nil {
		m.handoffWithout.WithLabelValues(connector, key).Inc()
	}
}

// RecordPrefillRetry counts a prefill leg retried elsewhere.
func (m *Orchestrator) RecordPrefillRetry() {
	if m != nil {
		m.retries.Inc()
	}
}

// RecordFallback counts a request the decode prefilled itself.
func (m *Orchestrator) RecordFallback() {
	if m != nil {
		m.fallbacks.Inc()
	}
}

// RecordDecodeOnly counts a request too short to disaggregate.
func (m *Orchestrator) RecordDecodeOnly() {
	if m != nil {
		m.decodeOnly.Inc()
	}
}

// AddInFlight moves the in-flight count of one stage instance.
func (m *Orchestrator) AddInFlight(stage, instance string, delta int) {
	if m != nil {
		m.inflight.WithLabelValues(stage, instance).Add(float64(delta))
	}
}

// RecordStageQueueFull counts a request refused because every instance of
// stage was at its queue bound.
func (m *Orchestrator) RecordStageQueueFull(stage string) {
	if m != nil {
		m.queueFull.WithLabelValues(stage).Inc()
	}
}

// RecordConnRefused counts a client connection refused at accept, by why
// ("per_ip" or "total").
func (m *Orchestrator) RecordConnRefused(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

// AddOpenConns moves the count of open client connections.
func (m *Orchestrator) AddOpenConns(delta int) {
	if m != nil {
		m.connsOpen.Add(float64(delta))
	}
}

// RecordRefusedRetry counts a leg of stage moved to another instance
// because the one picked refused the connection.
func (m *Orchestrator) RecordRefusedRetry(stage string) {
	if m != nil {
		m.refusedRetries.WithLabelValues(stage).Inc()
	}
}

// RecordReplan counts a PD request planned again on another decode.
func (m *Orchestrator) RecordReplan() {
	if m != nil {
		m.replans.Inc()
	}
}

// AddReleasesPending moves the count of background release calls queued
// or running.
func (m *Orchestrator) AddReleasesPending(delta int) {
	if m != nil {
		m.releasesPending.Add(float64(delta))
	}
}

// RecordReleaseDropped counts a background release of kind dropped
// because its queue was full.
func (m *Orchestrator) RecordReleaseDropped(kind string) {
	if m != nil {
		m.releasesDropped.WithLabelValues(kind).Inc()
	}
}

// RecordClientWriteTimeout counts a request dropped because its client
// stopped reading its answer.
func (m *Orchestrator) RecordClientWriteTimeout() {
	if m != nil {
		m.writeTimeouts.Inc()
	}
}
