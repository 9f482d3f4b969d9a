package stageclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Health asks the instance's /health. Nil means 200; any other status is an
// *UpstreamError (vLLM answers 503 once its engine is dead), and an
// unreachable instance is ErrConnect.
func (c *Client) Health(ctx context.Context) error {
	resp, what, err := c.get(ctx, "/health", "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readUpstreamError(what, resp)
	}
	// Read the (tiny) body so the connection is reused; a probe every few
	// seconds per instance should not dial every time.
	if _, err := readBounded(resp.Body, maxErrorBody); err != nil && !errors.Is(err, errTooLarge) {
		return classifyRead(ctx, what, err)
	}
	return nil
}

// ErrSecretRefused: the instance answered 401 or 403 to omnipd's deployment
// secret (or to its absence), so every request omnipd sends it fails. It is
// its own class because /health cannot show it: vLLM's /health is open to
// anyone even with VLLM_API_KEY set (vllm/entrypoints/openai/api_server.py,
// v0.8 to v0.11: the authentication middleware guards only paths under
// /v1), and so is the reference worker's.
var ErrSecretRefused = errors.New("refuses omnipd's deployment secret")

// authProbePath is the cheap authenticated route Ready asks: vLLM guards it
// with its API key and answers from memory; the reference worker's front
// door checks the secret before routing, so an omni stage (Talker,
// Code2Wav), which has no such route, answers 404 once the secret passed.
const authProbePath = "/v1/models"

// Ready reports whether a request sent to the instance can succeed: its
// /health is 200 (Health) and it takes the deployment secret this client
// sends. A 401 or 403 on the authenticated probe is ErrSecretRefused; any
// other answer means the credential got past the instance's front door.
func (c *Client) Ready(ctx context.Context) error {
	if err := c.Health(ctx); err != nil {
		return err
	}
	resp, what, err := c.get(ctx, authProbePath, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := readBounded(resp.Body, maxErrorBody); err != nil && !errors.Is(err, errTooLarge) {
		return classifyRead(ctx, what, err)
	}
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		return nil
	}
	if c.auth == "" {
		return fmt.Errorf("%s: %w: it requires a deployment secret and omnipd has none (%d); set OMNIPD_SECRET or --secret-file to the engine's key",
			c.base, ErrSecretRefused, resp.StatusCode)
	}
	return fmt.Errorf("%s %w (%d)", c.base, ErrSecretRefused, resp.StatusCode)
}

// ReadyTarget is one stage instance a Readiness covers.
type ReadyTarget struct {
	// Stage names it in the answer: "stage 0 (thinker-prefill)".
	Stage  string
	Client *Client
}

// DefaultReadyTTL is how long a Readiness answer is reused: /health may be
// polled by load balancers many times a second, and each check costs two
// requests per instance.
const DefaultReadyTTL = time.Second

// Readiness answers "can a request succeed on every stage?" for /health,
// probing each target with Ready, all at once, and reusing the answer for
// TTL. Concurrent checks share one probe. The zero TTL is DefaultReadyTTL;
// Now, when nil, is time.Now.
type Readiness struct {
	Targets []ReadyTarget
	TTL     time.Duration
	Now     func() time.Time

	once  sync.Once
	token chan struct{} // holding it is the right to probe or read the cache
	valid bool
	at    time.Time
	err   error
}

// Check returns nil when every target is ready, else an error naming each
// target that is not, and why.
func (r *Readiness) Check(ctx context.Context) error {
	r.once.Do(func() { r.token = make(chan struct{}, 1) })
	select {
	case r.token <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("stage readiness: %w", ctx.Err())
	}
	defer func() { <-r.token }()
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	ttl := r.TTL
	if ttl <= 0 {
		ttl = DefaultReadyTTL
	}
	if r.valid && now().Sub(r.at) < ttl {
		return r.err
	}
	errs := make([]error, len(r.Targets))
	var wg sync.WaitGroup
	for i, t := range r.Targets {
		wg.Go(func() {
			if err := t.Client.Ready(ctx); err != nil {
				errs[i] = fmt.Errorf("%s: %w", t.Stage, err)
			}
		})
	}
	wg.Wait()
	err := errors.Join(errs...)
	// A caller that gave up learned nothing about the stages; the next
	// caller probes afresh.
	if ctx.Err() == nil {
		r.valid, r.at, r.err = true, now(), err
	}
	return err
}

// Metrics reads the instance's /metrics, in Prometheus' text format, into a
// map from series to value. A series is keyed as its name alone when it has
// no labels, else as name{l1="v1",l2="v2"} with labels sorted by name and
// values as escaped in the exposition, e.g.
//
//	vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"}
//
// Use SumSeries to add up a metric over its label sets without knowing the
// labels. Histograms and summaries appear as their _bucket, _sum and _count
// series; comments, HELP and TYPE lines and timestamps are dropped.
func (c *Client) Metrics(ctx context.Context) (map[string]float64, error) {
	resp, what, err := c.get(ctx, "/metrics", "text/plain;version=0.0.4;q=1.0, */*;q=0.1")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, readUpstreamError(what, resp)
	}
	data, err := readBounded(resp.Body, maxMetricsBody)
	switch {
	case errors.Is(err, errTooLarge):
		return nil, classified(what, ErrProtocol, err)
	case err != nil:
		return nil, classifyRead(ctx, what, err)
	}
	m, err := parseExposition(string(data))
	if err != nil {
		return nil, classified(what, ErrProtocol, err)
	}
	return m, nil
}

func (c *Client) get(ctx context.Context, path, accept string) (*http.Response, string, error) {
	req, what, err := c.newRequest(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		return nil, "", err
	}
	if accept != "" {
		// Ask for the classic text format: Prometheus clients may
		// otherwise negotiate OpenMetrics or protobuf.
		req.Header.Set("Accept", accept)
	}
	resp, err := c.do(req, nil)
	if err != nil {
		return nil, "", classifyDo(ctx, what, err)
	}
	return resp, what, nil
}

// SumSeries adds up every series of the metric name in samples (as Metrics
// returns them), whatever its labels, and reports whether there was any. It
// is how to read a gauge such as vllm:num_requests_running, which vLLM
// labels with the model name and engine index.
func SumSeries(samples map[string]float64, name string) (float64, bool) {
	var sum float64
	found := false
	for k, v := range samples {
		if k == name || (strings.HasPrefix(k, name) && k[len(name)] == '{') {
			sum += v
			found = true
		}
	}
	return sum, found
}

// parseExposition parses the sample lines of Prometheus' text exposition
// format (version 0.0.4). It is strict — a line it cannot read is an error
// rather than a silently missing series — but only about what it needs:
// comment lines are skipped whatever they say, and an OpenMetrics exemplar
// after the value is ignored.
func parseExposition(text string) (map[string]float64, error) {
	out := make(map[string]float64)
	lineNo := 0
	for line := range strings.Lines(text) {
		lineNo++
		line = strings.TrimRight(line, "\r\n")
		line = strings.TrimLeft(line, " \t")
		if line == "" || line[0] == '#' {
			continue
		}
		key, value, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w: %.120q", lineNo, err, line)
		}
		out[key] = value
	}
	return out, nil
}

type label struct{ name, rawValue string }

func parseSample(line string) (string, float64, error) {
	i := 0
	for i < len(line) && isNameChar(line[i], i == 0, true) {
		i++
	}
	if i == 0 {
		return "", 0, errors.New("no metric name")
	}
	name := line[:i]
	var labels []label
	rest := line[i:]
	// Blanks may separate any two tokens, the name and its "{" included.
	if trimmed := strings.TrimLeft(rest, " \t"); strings.HasPrefix(trimmed, "{") {
		var err error
		labels, rest, err = parseLabels(trimmed[1:])
		if err != nil {
			return "", 0, err
		}
	} else if rest == "" || (rest[0] != ' ' && rest[0] != '\t') {
		return "", 0, errors.New("bad character in the metric name, or no value")
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", 0, errors.New("no value")
	}
	value, err := strconv.ParseFloat(fields[0], 64) // also +Inf, -Inf, NaN
	if err != nil {
		return "", 0, fmt.Errorf("bad value %q", fields[0])
	}
	tail := fields[1:]
	if len(tail) > 0 && !strings.HasPrefix(tail[0], "#") {
		if _, err := strconv.ParseFloat(tail[0], 64); err != nil {
			return "", 0, fmt.Errorf("bad timestamp %q", tail[0])
		}
		tail = tail[1:]
	}
	if len(tail) > 0 && !strings.HasPrefix(tail[0], "#") {
		return "", 0, fmt.Errorf("unexpected %q after the value", tail[0])
	}
	return seriesKey(name, labels), value, nil
}

// parseLabels reads `name="value",...}` (the opening brace already
// consumed) and returns the labels and the text after the closing brace.
// Values stay escaped, since they are only put back into a key.
func parseLabels(s string) ([]label, string, error) {
	var labels []label
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		i := 0
		for i < len(s) && isNameChar(s[i], i == 0, false) {
			i++
		}
		if i == 0 {
			return nil, "", errors.New("bad label name")
		}
		name := s[:i]
		s = strings.TrimLeft(s[i:], " \t")
		if !strings.HasPrefix(s, "=") {
			return nil, "", fmt.Errorf("no = after label %q", name)
		}
		s = strings.TrimLeft(s[1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return nil, "", fmt.Errorf("label %q: value not quoted", name)
		}
		end := -1
		for j := 1; j < len(s); j++ {
			if s[j] == '\\' {
				j++ // skip the escaped character (\\, \", \n)
				continue
			}
			if s[j] == '"' {
				end = j
				break
			}
		}
		if end < 0 {
			return nil, "", fmt.Errorf("label %q: unterminated value", name)
		}
		labels = append(labels, label{name: name, rawValue: s[1:end]})
		s = strings.TrimLeft(s[end+1:], " \t")
		switch {
		case strings.HasPrefix(s, ","):
			s = s[1:]
		case strings.HasPrefix(s, "}"):
		default:
			return nil, "", fmt.Errorf("label %q: expected , or } after the value", name)
		}
	}
}

// seriesKey renders a series canonically: labels sorted by name, so a key
// does not depend on the order an exporter happens to write them in.
func seriesKey(name string, labels []label) string {
	if len(labels) == 0 {
		return name
	}
	slices.SortStableFunc(labels, func(a, b label) int { return strings.Compare(a.name, b.name) })
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('{')
	for i, l := range labels {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.name)
		b.WriteString(`="`)
		b.WriteString(l.rawValue)
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// isNameChar reports whether c may appear in a metric name (colons
// allowed, as in vllm:...) or label name, first or later.
func isNameChar(c byte, first, metric bool) bool {
	switch {
	case c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'):
		return true
	case c == ':':
		return metric
	case c >= '0' && c <= '9':
		return !first
	}
	return false
}
