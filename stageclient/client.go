// Package stageclient owns omnipd's HTTP client for one stage instance: a
// stock `vllm serve` or an omnipd reference worker, both speaking vLLM's
// OpenAI-compatible API. It sends a request body the orchestrator has already
// built, with the request id and deployment secret, and hands back the
// response — whole, or event by event for streams — or an error in one of a
// few classes (ErrConnect — and within it ErrNotSent, the request provably
// never reached the instance — ErrTimeout, ErrCanceled, ErrTruncated,
// ErrProtocol, *UpstreamError) from which the orchestrator decides between
// retrying on another replica, failing, or giving up because the client left.
//
// It also reads an instance's /health and its Prometheus /metrics, which the
// orchestrator uses for replica choice, and frees what an ended request left
// on a worker (ReleaseKV, ReleaseConditioning, ReleaseEncoderLease): every
// call omnipd makes to a stage goes through a Client, with its transport,
// bounds, secret and error classes.
//
// Deadlines come only from the caller's context: a prefill of a long prompt
// and a decode streaming for minutes are both normal, so no fixed timeout
// fits. Cancelling the context, or closing a stream early, aborts the HTTP
// request, which is how vLLM learns to stop generating and free the request's
// KV blocks.
package stageclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/omnipd/omnipd/openai"
)

// Size bounds. A body or event over its bound is ErrProtocol: a worker that
// sends that much is broken, and reading it would let one bad instance
// exhaust the orchestrator's memory.
const (
	// DefaultMaxBodyBytes bounds a non-streaming response body. Completions
	// with logprobs for many tokens are the largest legitimate ones.
	DefaultMaxBodyBytes = 64 << 20
	// maxErrorBody bounds an error body: the message is what matters, and
	// ParseErrorResponse falls back to the first bytes of text anyway.
	maxErrorBody = 1 << 20
	// maxMetricsBody bounds /metrics. vLLM's exposition, histograms
	// included, is a few hundred KiB per engine.
	maxMetricsBody = 16 << 20
)

// Config configures a Client. Only BaseURL is required.
type Config struct {
	// BaseURL is the instance's root, "http://host:port" (a path prefix is
	// allowed, for instances behind a proxy).
	BaseURL string
	// HTTP sends the requests. Nil means a client shared by every Client in
	// the process, tuned for many concurrent requests to a few hosts and with
	// no overall timeout (deadlines come from each call's context); for a
	// plain-HTTP instance it sends over leanTransport, which does each
	// exchange on the calling goroutine. A caller-supplied client is used as
	// is, redirects and timeouts included.
	HTTP *http.Client
	// Secret, when set, is sent as "Authorization: Bearer <Secret>" on every
	// request: the deployment secret workers may require.
	Secret string
	// MaxBodyBytes bounds a non-streaming response body; <= 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxEventBytes bounds one SSE event of a stream; <= 0 means
	// openai.DefaultMaxEventSize. A stream's total size is not bounded: a
	// long generation or audio stream is legitimate, and only one event is
	// held in memory at a time.
	MaxEventBytes int
}

// Client sends requests to one stage instance. It is safe for concurrent
// use and holds no per-request state.
type Client struct {
	base     string
	http     *http.Client
	lean     *leanTransport // sends the requests instead of http when set
	auth     string         // the Authorization header value, or ""
	maxBody  int64
	maxEvent int
}

// New validates cfg and returns a client for its instance.
func New(cfg Config) (*Client, error) {
	base, err := parseBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	c := &Client{base: base, http: cfg.HTTP, maxBody: cfg.MaxBodyBytes, maxEvent: cfg.MaxEventBytes}
	if c.http == nil {
		c.http = sharedHTTP
		if probe, err := http.NewRequest(http.MethodGet, base, nil); err == nil && sharedHTTP.Transport.(*stageTransport).useLean(probe) {
			c.lean = sharedLean
		}
	}
	if c.maxBody <= 0 {
		c.maxBody = DefaultMaxBodyBytes
	}
	if c.maxEvent <= 0 {
		c.maxEvent = openai.DefaultMaxEventSize
	}
	if cfg.Secret != "" {
		if !validHeaderValue(cfg.Secret) {
			return nil, errors.New("stageclient: secret contains characters not allowed in an HTTP header")
		}
		c.auth = "Bearer " + cfg.Secret
	}
	return c, nil
}

func parseBaseURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("stageclient: base URL: %w", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("stageclient: base URL %q: scheme must be http or https", raw)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("stageclient: base URL %q: no host", raw)
	case u.User != nil:
		// Credentials in a URL end up in logs and error messages; the
		// secret has its own field.
		return "", fmt.Errorf("stageclient: base URL %q: user info is not allowed; use Secret", raw)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", fmt.Errorf("stageclient: base URL %q: query and fragment are not allowed", raw)
	}
	if p := u.Port(); p != "" {
		if _, err := net.LookupPort("tcp", p); err != nil {
			return "", fmt.Errorf("stageclient: base URL %q: bad port", raw)
		}
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u.String(), nil
}

// BaseURL is the instance's root URL, without a trailing slash.
func (c *Client) BaseURL() string { return c.base }

// sharedHTTP is the default client. Sharing one transport across Clients
// lets connections to an instance be reused whichever Client holds it.
var sharedHTTP = &http.Client{
	Transport: &stageTransport{lean: sharedLean, std: newTransport()},
	// A stage instance has no reason to redirect; following one would turn
	// a POST into a GET. The 3xx becomes an *UpstreamError instead.
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// sharedLean carries the default client's plain-HTTP traffic. Clients for
// such instances call it directly rather than through sharedHTTP: with
// redirects off and no timeout, http.Client would add only its own cost.
var sharedLean = newLeanTransport()

// stageTransport sends plain-HTTP requests over leanTransport and the rest
// — https, requests an HTTP_PROXY setting applies to, upgrades — over
// net/http's Transport.
type stageTransport struct {
	lean *leanTransport
	std  *http.Transport
}

var _ http.RoundTripper = (*stageTransport)(nil)

func (t *stageTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.useLean(req) && req.TransferEncoding == nil && req.Trailer == nil && req.Header.Get("Upgrade") == "" {
		return t.lean.RoundTrip(req)
	}
	return t.std.RoundTrip(req)
}

// useLean reports whether req's URL is one leanTransport serves: plain
// HTTP, not sent through a proxy.
func (t *stageTransport) useLean(req *http.Request) bool {
	if req.URL == nil || req.URL.Scheme != "http" {
		return false
	}
	if t.std.Proxy != nil {
		if proxy, err := t.std.Proxy(req); err != nil || proxy != nil {
			return false
		}
	}
	return true
}

// CloseIdleConnections closes both transports' idle connections.
func (t *stageTransport) CloseIdleConnections() {
	t.lean.CloseIdleConnections()
	t.std.CloseIdleConnections()
}

// newTransport is net/http's transport for stage instances, tuned as
// leanTransport is.
func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = maxIdleConnsPerHost
	t.MaxIdleConns = maxIdleConns
	t.IdleConnTimeout = idleConnTimeout
	t.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: tcpKeepAlive}).DialContext
	// Transparent gzip would let an intermediary buffer SSE events until a
	// compression block fills; stage traffic is on a fast network anyway.
	// (leanTransport never asks for compression.)
	t.DisableCompression = true
	return t
}

// Response is a successful (2xx) non-streaming response.
type Response struct {
	Status int
	Header http.Header
	// Body is the whole body: a JSON document (or empty for 204).
	Body []byte
}

// Post sends body (a JSON request) to path — "/v1/completions",
// "/v1/chat/completions", or a stage API path — with X-Request-Id set to
// requestID, and waits for the whole response. The request must not ask to
// stream. Only a 2xx with a JSON body is a Response; anything else is an
// error (see the package's error classes).
func (c *Client) Post(ctx context.Context, path, requestID string, body []byte) (*Response, error) {
	return c.PostWith(ctx, path, requestID, nil, body)
}

// PostWith is Post with header added to this one request: a leg's own
// routing headers, such as the X-data-parallel-rank that pins a request to
// one data-parallel rank of a vLLM instance. header may not set the headers
// the client owns (ownedHeaders).
func (c *Client) PostWith(ctx context.Context, path, requestID string, header http.Header, body []byte) (*Response, error) {
	req, what, err := c.newRequest(ctx, http.MethodPost, path, requestID, body)
	if err != nil {
		return nil, err
	}
	if err := addLegHeader(req, what, header); err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.do(req, body)
	if err != nil {
		return nil, classifyDo(ctx, what, err)
	}
	defer resp.Body.Close()
	if !is2xx(resp.StatusCode) {
		return nil, readUpstreamError(what, resp)
	}
	data, err := readBounded(resp.Body, c.maxBody)
	switch {
	case errors.Is(err, errTooLarge):
		return nil, classified(what, ErrProtocol, err)
	case err != nil:
		return nil, classifyRead(ctx, what, err)
	}
	if !openai.ValidJSON(data) && !(resp.StatusCode == http.StatusNoContent && len(data) == 0) {
		return nil, classified(what, ErrProtocol, fmt.Errorf("%d response body (Content-Type %q) is not JSON: %.80q",
			resp.StatusCode, resp.Header.Get("Content-Type"), data))
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: data}, nil
}

// newRequest builds a request to path, with the headers every call carries.
// what names it in error messages.
func (c *Client) newRequest(ctx context.Context, method, path, requestID string, body []byte) (*http.Request, string, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, "", fmt.Errorf("stageclient: path %q does not start with /", path)
	}
	target := c.base + path
	what := fmt.Sprintf("stageclient: %s %s", method, target)
	if body != nil {
		// Every call that carries a body is about a user request, and the
		// request id is how legs of one request are tied together across
		// instances (some KV connectors match transfers by it), so a
		// missing one is a bug to surface, not to paper over with a
		// random id.
		if requestID == "" {
			return nil, "", fmt.Errorf("%s: empty request id", what)
		}
		if !validHeaderValue(requestID) {
			return nil, "", fmt.Errorf("%s: request id %q contains characters not allowed in an HTTP header", what, requestID)
		}
		what += " (request " + requestID + ")"
	}
	var rd io.Reader
	if body != nil && c.lean == nil {
		// A *bytes.Reader lets the transport replay the body if the request
		// was never written on a reused connection that turned out dead.
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", what, err)
	}
	if body != nil && c.lean != nil {
		// leanTransport takes the body as a slice, from do; the request
		// only says how long it is.
		req.ContentLength = int64(len(body))
	}
	if requestID != "" {
		req.Header.Set(openai.RequestIDHeader, requestID)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	return req, what, nil
}

// ownedHeaders are set by the client on every call; a leg's header would
// otherwise detach the leg from its request id, its credentials or its
// body's type.
var ownedHeaders = []string{openai.RequestIDHeader, "Authorization", "Content-Type", "Content-Length", "Accept", "Host", "Connection", "Transfer-Encoding"}

// addLegHeader adds header to req, refusing owned headers and values that
// would split headers.
func addLegHeader(req *http.Request, what string, header http.Header) error {
	for name, values := range header {
		for _, owned := range ownedHeaders {
			if strings.EqualFold(name, owned) {
				return fmt.Errorf("%s: header %s is set by the client", what, name)
			}
		}
		if !validHeaderValue(name) || strings.ContainsAny(name, " :") {
			return fmt.Errorf("%s: header name %q is not allowed", what, name)
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return fmt.Errorf("%s: header %s value %q contains characters not allowed in an HTTP header", what, name, v)
			}
			req.Header.Add(name, v)
		}
	}
	return nil
}

// do sends req, whose body is body. leanTransport takes the body as a
// slice, which it writes from directly (a request built for it has
// ContentLength set and no Body); net/http reads req.Body.
func (c *Client) do(req *http.Request, body []byte) (*http.Response, error) {
	if c.lean != nil {
		return c.lean.roundTrip(req, body)
	}
	return c.http.Do(req)
}

// validHeaderValue rejects control characters, which would either make
// net/http refuse the request late or, worse, split headers.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

func is2xx(status int) bool { return status >= 200 && status <= 299 }

var errTooLarge = errors.New("response body too large")

// readBounded reads r to the end, failing if it holds more than limit bytes.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return data, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: over %d bytes", errTooLarge, limit)
	}
	return data, nil
}

// readUpstreamError turns a non-2xx response into an *UpstreamError. A
// failure reading the body is not reported: the status already says what
// happened, and a partial body still parses into a message.
func readUpstreamError(what string, resp *http.Response) *UpstreamError {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return newUpstreamError(what, resp.StatusCode, raw)
}

// mediaType is Content-Type without parameters, lower-cased; "" if absent
// or unparsable.
func mediaType(h http.Header) string {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		return ""
	}
	return mt
}
