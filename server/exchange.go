package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
)

// exchange is what the server knows of one request while it runs: its
// ids, and what its access line reports. Only the request's own goroutine
// touches it.
type exchange struct {
	// id is the request's id inside omnipd, the one its stage legs carry;
	// clientID is the one the client knows it by (its X-Request-Id, or id).
	id, clientID string
	start        time.Time
	// bodyRead says the body was read to its end.
	bodyRead bool
	// cancelled says the client left before the end of its answer.
	cancelled bool
	// A stream's events relayed, and how long the first took to come.
	streamed   bool
	events     int
	firstEvent time.Duration
}

func newExchange(header string) *exchange {
	client, id := requestIDs(header)
	return &exchange{id: id, clientID: client, start: time.Now()}
}

type exchangeKey struct{}

// exchangeOf is ctx's exchange; a fresh one outside ServeHTTP (a handler
// called on its own), so that callers need not check.
func exchangeOf(ctx context.Context) *exchange {
	if ex, ok := ctx.Value(exchangeKey{}).(*exchange); ok {
		return ex
	}
	return newExchange("")
}

// RequestID returns the request id the server assigned to ctx's request:
// the id its stage legs carry and its log lines name as request_id.
func RequestID(ctx context.Context) string {
	if ex, ok := ctx.Value(exchangeKey{}).(*exchange); ok {
		return ex.id
	}
	return ""
}

// ClientRequestID returns the id ctx's client knows its request by: its
// X-Request-Id as sent, or the id omnipd made when it sent none (then
// RequestID's). The answer's id is "chatcmpl-" (or "cmpl-") and it; log
// lines name it client_request_id.
func ClientRequestID(ctx context.Context) string {
	if ex, ok := ctx.Value(exchangeKey{}).(*exchange); ok {
		return ex.clientID
	}
	return ""
}

// requestLog is the logger for lines about ctx's request: each carries
// both ids, so a grep for either finds them all.
func (s *Server) requestLog(ctx context.Context) *slog.Logger {
	return s.log.With("request_id", RequestID(ctx), "client_request_id", ClientRequestID(ctx))
}

// logAccess writes the request's access line: one a request, at info,
// after its answer (errors keep their own lines, with their causes). Probes
// and scrapes that succeed (/health, /metrics) log at debug, so that a load
// balancer polling every second does not drown the rest.
func (s *Server) logAccess(r *http.Request, sw *statusWriter, ex *exchange) {
	status := sw.status
	if ex.cancelled {
		status = metrics.StatusClientClosedRequest
	}
	level := slog.LevelInfo
	if (r.URL.Path == "/health" || r.URL.Path == "/metrics") && status < 400 {
		level = slog.LevelDebug
	}
	ctx := r.Context()
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs,
		slog.String("request_id", ex.id), slog.String("client_request_id", ex.clientID),
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", status), slog.Duration("duration", time.Since(ex.start)))
	if p := sw.Header().Get(openai.PDPathHeader); p != "" {
		attrs = append(attrs, slog.String("pd_path", p))
	}
	if ex.streamed {
		attrs = append(attrs, slog.Int("events", ex.events))
		if ex.events > 0 {
			attrs = append(attrs, slog.Duration("first_event", ex.firstEvent))
		}
	}
	if sw.timedOut {
		attrs = append(attrs, slog.Bool("write_timeout", true))
	}
	s.log.LogAttrs(ctx, level, "request", attrs...)
}

// statusWriter is the response writer every handler gets. It remembers
// the status written, for the access line and the request metric; it
// passes flushes on (SSE needs them); and it bounds each write by the
// write timeout, pushing the connection's write deadline out before every
// write, so that only a client that reads nothing for the whole timeout
// meets it. net/http lifts the deadline once the answer is flushed, before
// the next request on the connection.
type statusWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController // of ResponseWriter
	timeout  time.Duration            // 0: none
	deadline time.Time                // the write deadline last set
	status   int
	wrote    bool // the status has gone out
	timedOut bool // a write failed at the write deadline
}

func newStatusWriter(w http.ResponseWriter, ex *exchange, timeout time.Duration) *statusWriter {
	sw := &statusWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout, status: http.StatusOK}
	// Whatever goes out for this request, net/http's own writes after the
	// handler included, is bounded from here on.
	sw.arm(ex.start)
	return sw
}

// arm pushes the write deadline to now plus the timeout. It is set again
// only once a sixteenth of the timeout has passed since it last was, so a
// stream of small events costs a clock read an event rather than a
// deadline update: every write still has at least 15/16 of the timeout.
func (w *statusWriter) arm(now time.Time) {
	if w.timeout <= 0 {
		return
	}
	d := now.Add(w.timeout)
	if d.Sub(w.deadline) < w.timeout/16 {
		return
	}
	if w.rc.SetWriteDeadline(d) == nil {
		w.deadline = d
	}
}

// note records a write that failed at the deadline.
func (w *statusWriter) note(err error) {
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		w.timedOut = true
	}
}

func (w *statusWriter) WriteHeader(code int) {
	w.arm(time.Now())
	if !w.wrote && code >= 200 {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.arm(time.Now())
	w.wrote = true
	n, err := w.ResponseWriter.Write(b)
	w.note(err)
	return n, err
}

// FlushError flushes what was written, within the write deadline; it is
// what http.ResponseController.Flush calls.
func (w *statusWriter) FlushError() error {
	w.arm(time.Now())
	w.wrote = true
	err := w.rc.Flush()
	w.note(err)
	return err
}

// Unwrap lets http.ResponseController reach the underlying writer's
// deadlines and full-duplex switch.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
