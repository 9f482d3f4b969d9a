// Package mediafetch owns the IO edge of multimodal input: it resolves the
// media parts of a chat request (openai.MediaItem) to bytes under an
// operator's policy, following the rules of vLLM's media connector.
//
// A Fetcher reads data: URLs and input_audio payloads from the request
// itself, fetches http(s) URLs only from allowed hosts (each redirect hop is
// checked again, and private addresses are refused at dial time unless the
// policy allows them), and reads file: URLs only from under one allowed
// directory. Every source is capped at a byte limit, and every remote fetch
// at a per-modality timeout. The zero Policy allows inline data only.
//
// Errors are *PartError naming the request part, wrapping one of the
// sentinel errors below, so the caller can answer a 400 that names the part.
// Each says what went wrong in the client's terms (ClientMessage: "this
// server does not fetch media from http(s) URLs") apart from the cause for
// the log (the dial error, the file system's error).
package mediafetch

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/omnipd/omnipd/openai"
)

// Sentinel errors, wrapped by every error a Fetcher returns.
var (
	// ErrNotAllowed: the policy forbids the source (host, address, path,
	// redirect or scheme).
	ErrNotAllowed = errors.New("media source not allowed")
	// ErrTooLarge: the media is over the byte limit.
	ErrTooLarge = errors.New("media too large")
	// ErrFetch: the source could not be read: an upstream HTTP status
	// (see StatusError), a network error, a missing file.
	ErrFetch = errors.New("media fetch failed")
	// ErrTimeout: the fetch ran past its modality's timeout.
	ErrTimeout = errors.New("media fetch timed out")
	// ErrBadURL: the source is malformed: a URL that does not parse or has
	// an unsupported scheme, a payload that does not decode, or a data URL
	// whose media type does not fit the part.
	ErrBadURL = errors.New("bad media URL")
)

// PartError is an error about one media item, naming it by its place in the
// request ("messages[i].content[j]").
type PartError struct {
	Path string
	Err  error
}

func (e *PartError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *PartError) Unwrap() error { return e.Err }

// sourceError is an error about a media source, worded for the client that
// sent it (ClientMessage), with the cause underneath for the log (Error).
// It wraps its class, one of the sentinels, and that cause.
type sourceError struct {
	class error
	msg   string
	cause error
}

// refuse is a sourceError of class with a formatted message.
func refuse(class error, format string, args ...any) error {
	return &sourceError{class: class, msg: fmt.Sprintf(format, args...)}
}

// refuseCause is refuse keeping the underlying error for the log.
func refuseCause(class, cause error, format string, args ...any) error {
	return &sourceError{class: class, msg: fmt.Sprintf(format, args...), cause: cause}
}

func (e *sourceError) Error() string {
	if e.cause == nil {
		return e.msg
	}
	return e.msg + ": " + e.cause.Error()
}

// ClientMessage is the message without the cause underneath.
func (e *sourceError) ClientMessage() string { return e.msg }

func (e *sourceError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.class}
	}
	return []error{e.class, e.cause}
}

// StatusError is the non-2xx status an upstream answered; it comes wrapped
// with ErrFetch.
type StatusError struct{ StatusCode int }

func (e *StatusError) Error() string {
	return fmt.Sprintf("upstream answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// Defaults for the zero fields of a Policy. The timeouts are vLLM's
// VLLM_IMAGE_FETCH_TIMEOUT, VLLM_AUDIO_FETCH_TIMEOUT and
// VLLM_VIDEO_FETCH_TIMEOUT; the byte limit is vLLM's
// VLLM_MAX_AUDIO_CLIP_FILESIZE_MB, the tightest of its media size limits.
const (
	DefaultMaxBytes     int64 = 25 << 20
	DefaultImageTimeout       = 5 * time.Second
	DefaultAudioTimeout       = 10 * time.Second
	DefaultVideoTimeout       = 30 * time.Second
	DefaultConcurrency        = 4
	// VLLMMaxRedirects is the number of redirect hops vLLM follows when
	// VLLM_MEDIA_URL_ALLOW_REDIRECTS is on (its default).
	VLLMMaxRedirects = 5
)

// Policy is what an operator allows media sources to be. The zero value
// allows data: URLs and inline input_audio only, up to DefaultMaxBytes.
type Policy struct {
	// AllowedDomains are the hosts http(s) media may come from, matched
	// exactly and without regard to case or port, as vLLM's
	// --allowed-media-domains: "example.com" does not allow
	// "cdn.example.com". IP literals are matched as written (IPv6 without
	// brackets). Empty disables http(s) media unless AllowAnyDomain is set.
	AllowedDomains []string
	// AllowAnyDomain allows every host, which is what vLLM does when
	// --allowed-media-domains is unset. Private addresses stay refused
	// unless AllowPrivateNetworks is also set.
	AllowAnyDomain bool
	// AllowPrivateNetworks lets fetches reach loopback, private,
	// link-local and other non-public addresses, which vLLM refuses by
	// default (VLLM_MEDIA_EGRESS_BLOCK_PRIVATE=1). The check is made on
	// the address actually dialed, for every hop.
	AllowPrivateNetworks bool
	// MaxRedirects is how many redirect hops to follow, each checked
	// against the policy as the first URL was; 0 refuses any redirect.
	// VLLMMaxRedirects matches vLLM.
	MaxRedirects int
	// AllowedLocalPath is the directory file: URLs may read from, as
	// vLLM's --allowed-local-media-path; the file, once symlinks are
	// resolved, must lie beneath it. Empty refuses file: URLs.
	AllowedLocalPath string
	// MaxBytes caps every item, whatever its source (0: DefaultMaxBytes).
	MaxBytes int64
	// Per-modality timeouts for remote fetches, each covering connect,
	// headers and body (0: the Default*Timeout).
	ImageTimeout, AudioTimeout, VideoTimeout time.Duration
	// Concurrency bounds FetchAll's parallel fetches (0:
	// DefaultConcurrency).
	Concurrency int
}

// Fetcher resolves media items under a Policy. It is safe for concurrent
// use.
type Fetcher struct {
	policy  Policy
	domains map[string]bool
	// localRoot is AllowedLocalPath made absolute and with symlinks
	// resolved; empty when file: URLs are refused.
	localRoot string
	blocked   []netip.Prefix
	client    *http.Client
}

// NewFetcher checks p and builds a Fetcher. As vLLM does at startup, it
// refuses an AllowedLocalPath that does not exist or is not a directory.
func NewFetcher(p Policy) (*Fetcher, error) {
	switch {
	case p.MaxBytes < 0:
		return nil, fmt.Errorf("media byte limit %d is negative", p.MaxBytes)
	case p.ImageTimeout < 0 || p.AudioTimeout < 0 || p.VideoTimeout < 0:
		return nil, errors.New("media fetch timeouts must not be negative")
	case p.MaxRedirects < 0:
		return nil, fmt.Errorf("media redirect limit %d is negative", p.MaxRedirects)
	case p.Concurrency < 0:
		return nil, fmt.Errorf("media fetch concurrency %d is negative", p.Concurrency)
	}
	p.MaxBytes = cmpOr(p.MaxBytes, DefaultMaxBytes)
	p.ImageTimeout = cmpOr(p.ImageTimeout, DefaultImageTimeout)
	p.AudioTimeout = cmpOr(p.AudioTimeout, DefaultAudioTimeout)
	p.VideoTimeout = cmpOr(p.VideoTimeout, DefaultVideoTimeout)
	p.Concurrency = cmpOr(p.Concurrency, DefaultConcurrency)

	f := &Fetcher{policy: p, domains: map[string]bool{}, blocked: blockedPrefixes()}
	for _, d := range p.AllowedDomains {
		host, err := normalizeDomain(d)
		if err != nil {
			return nil, fmt.Errorf("allowed media domain %q: %w", d, err)
		}
		f.domains[host] = true
	}
	f.policy.AllowedDomains = nil // the map is the policy from here on
	if p.AllowedLocalPath != "" {
		given, err := filepath.Abs(p.AllowedLocalPath)
		if err != nil {
			return nil, fmt.Errorf("allowed local media path %s: %w", p.AllowedLocalPath, err)
		}
		root, err := filepath.EvalSymlinks(given)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("allowed local media path %s does not exist", given)
		}
		if err != nil {
			return nil, fmt.Errorf("allowed local media path %s: %w", given, err)
		}
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("allowed local media path %s must be a directory", given)
		}
		f.localRoot = root
	}

	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !p.AllowPrivateNetworks {
		dialer.Control = f.refusePrivate
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	// No proxy: a proxy would dial on our behalf, out of reach of the
	// address check, and the policy is about where media comes from.
	transport.Proxy = nil
	transport.DialContext = dialer.DialContext
	f.client = &http.Client{Transport: transport, CheckRedirect: f.checkRedirect}
	return f, nil
}

func cmpOr[T comparable](v, fallback T) T {
	var zero T
	if v == zero {
		return fallback
	}
	return v
}

// normalizeDomain lower-cases a host and checks it is a bare host name or
// IP literal, which is all vLLM's exact match can ever match.
func normalizeDomain(d string) (string, error) {
	host := strings.ToLower(strings.TrimSpace(d))
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(host); err == nil {
		return host, nil
	}
	if host == "" || strings.ContainsAny(host, "/:*@? ") {
		return "", errors.New("want a host name or IP literal, without scheme, port, path or wildcard")
	}
	return host, nil
}

// Fetch resolves one item to its bytes.
func (f *Fetcher) Fetch(ctx context.Context, item openai.MediaItem) ([]byte, error) {
	b, err := f.fetch(ctx, item)
	if err != nil {
		return nil, &PartError{Path: item.Path, Err: err}
	}
	return b, nil
}

func (f *Fetcher) fetch(ctx context.Context, item openai.MediaItem) ([]byte, error) {
	timeout, ok := f.timeout(item.Kind)
	if !ok {
		return nil, refuse(ErrBadURL, "media of kind %q is not supported", item.Kind)
	}
	switch {
	case item.URL == "" && item.Data == "":
		return nil, refuse(ErrBadURL, "the part has neither data nor a URL")
	case item.URL == "":
		return f.decodeBase64(item.Data)
	case len(item.URL) >= 5 && strings.EqualFold(item.URL[:5], "data:"):
		return f.dataURL(item.Kind, item.URL)
	}
	u, err := url.Parse(item.URL)
	if err != nil {
		return nil, refuseCause(ErrBadURL, err, "not a valid URL")
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		return f.fetchHTTP(ctx, u, timeout)
	case "file":
		return f.readFile(ctx, u)
	default:
		return nil, refuse(ErrBadURL, "the URL must be a data:, http(s): or file: URL")
	}
}

func (f *Fetcher) timeout(kind openai.MediaKind) (time.Duration, bool) {
	switch kind {
	case openai.MediaImage:
		return f.policy.ImageTimeout, true
	case openai.MediaAudio:
		return f.policy.AudioTimeout, true
	case openai.MediaVideo:
		return f.policy.VideoTimeout, true
	}
	return 0, false
}

func (f *Fetcher) tooLarge(n int64) error {
	return refuse(ErrTooLarge, "the media is %d bytes, over this server's limit of %d", n, f.policy.MaxBytes)
}

// decodeBase64 decodes standard, padded base64 (what vLLM's decoders take),
// after checking from its length alone that it fits.
func (f *Fetcher) decodeBase64(s string) ([]byte, error) {
	if n := openai.Base64DecodedLen(s); n > f.policy.MaxBytes {
		return nil, f.tooLarge(n)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		var at base64.CorruptInputError
		if errors.As(err, &at) {
			return nil, refuseCause(ErrBadURL, err, "the data is not valid base64 (at byte %d)", int64(at))
		}
		return nil, refuseCause(ErrBadURL, err, "the data is not valid base64")
	}
	return b, nil
}

// dataURL decodes a data URL whose media type is of the item's kind
// ("image/png" for an image). vLLM's "video/jpeg" form, a comma-separated
// list of base64 JPEG frames, is not one video file and is refused.
func (f *Fetcher) dataURL(kind openai.MediaKind, u string) ([]byte, error) {
	d, err := openai.ParseDataURL(u)
	if err != nil {
		// openai's messages are written for the client ("invalid data
		// URL: missing ',' separator").
		return nil, refuse(ErrBadURL, "%s", err)
	}
	if !strings.HasPrefix(d.MediaType, string(kind)+"/") {
		return nil, refuse(ErrBadURL, "the data: URL's media type is %q; this part takes %s/*", d.MediaType, kind)
	}
	if kind == openai.MediaVideo && d.MediaType == "video/jpeg" {
		return nil, refuse(ErrBadURL, "video/jpeg frame lists are not supported; send a video file")
	}
	if d.Base64 {
		return f.decodeBase64(d.Data)
	}
	if n := d.DecodedLen(); n > f.policy.MaxBytes {
		return nil, f.tooLarge(n)
	}
	s, err := url.PathUnescape(d.Data)
	if err != nil {
		return nil, refuseCause(ErrBadURL, err, "the data: URL has invalid percent-encoding")
	}
	return []byte(s), nil
}

// allowedHost reports whether u's host may be fetched from.
func (f *Fetcher) allowedHost(u *url.URL) error {
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return refuse(ErrNotAllowed, "the URL redirects to a %s: URL; media URLs must stay http(s)", u.Scheme)
	}
	host := strings.ToLower(u.Hostname())
	if host == "" {
		return refuse(ErrBadURL, "the URL has no host")
	}
	if f.policy.AllowAnyDomain || f.domains[host] {
		return nil
	}
	if len(f.domains) == 0 {
		return refuse(ErrNotAllowed, "this server does not fetch media from http(s) URLs; send it inline (a data: URL, or input_audio)")
	}
	return refuse(ErrNotAllowed, "this server does not fetch media from %s: it is not one of the allowed media domains", host)
}

// checkRedirect is the http.Client hook for every redirect hop: the next URL
// must pass the same checks as the first (vLLM checks every hop too).
func (f *Fetcher) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > f.policy.MaxRedirects {
		if f.policy.MaxRedirects == 0 {
			return refuse(ErrNotAllowed, "the URL redirects, and this server follows no redirects")
		}
		return refuse(ErrFetch, "fetching it failed: it redirects more than %d times", f.policy.MaxRedirects)
	}
	return f.allowedHost(req.URL)
}

// refusePrivate is the dialer's Control hook: it sees the address about to
// be dialed, after name resolution, so no DNS answer can slip a private
// address past it.
func (f *Fetcher) refusePrivate(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return refuseCause(ErrNotAllowed, err, "this server does not fetch media from that address")
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return refuseCause(ErrNotAllowed, err, "this server does not fetch media from that address")
	}
	if f.isBlocked(ip) {
		// The address stays in the log: told to the client, it would map
		// the server's network for whoever probes it.
		return refuseCause(ErrNotAllowed, fmt.Errorf("%s is not a public address", ip),
			"this server does not fetch media from private, loopback or link-local addresses")
	}
	return nil
}

// blockedPrefixes are the ranges refused beside those net/netip classifies
// (loopback, private, link-local, multicast, unspecified): vLLM's extra
// blocks (CGNAT, 6to4, NAT64) and the special-purpose ranges Python's
// ipaddress counts as private, which vLLM's check relies on.
func blockedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24",
		"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4",
		"100::/64", "2001::/23", "2001:db8::/32", "2002::/16", "64:ff9b::/96",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func (f *Fetcher) isBlocked(ip netip.Addr) bool {
	ip = ip.Unmap() // ::ffff:169.254.169.254 is 169.254.169.254
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return true
	}
	for _, p := range f.blocked {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func (f *Fetcher) fetchHTTP(ctx context.Context, u *url.URL, timeout time.Duration) ([]byte, error) {
	if err := f.allowedHost(u); err != nil {
		return nil, err
	}
	fetchCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(fetchCtx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, refuseCause(ErrBadURL, err, "not a valid URL")
	}
	req.Header.Set("User-Agent", "omnipd-mediafetch")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, f.classify(ctx, fetchCtx, timeout, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		se := &StatusError{StatusCode: resp.StatusCode}
		return nil, refuseCause(ErrFetch, se, "fetching it failed: the server answered %d %s", se.StatusCode, http.StatusText(se.StatusCode))
	}
	if resp.ContentLength > f.policy.MaxBytes {
		return nil, f.tooLarge(resp.ContentLength)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.policy.MaxBytes+1))
	if err != nil {
		return nil, f.classify(ctx, fetchCtx, timeout, err)
	}
	if int64(len(body)) > f.policy.MaxBytes {
		return nil, refuse(ErrTooLarge, "the media is over this server's limit of %d bytes", f.policy.MaxBytes)
	}
	return body, nil
}

// classify words a transport error: the policy's own refusals pass
// through; the caller's cancellation is returned as such; running out the
// fetch's own deadline (timeout) is ErrTimeout; anything else is ErrFetch.
func (f *Fetcher) classify(parent, fetchCtx context.Context, timeout time.Duration, err error) error {
	switch {
	case errors.Is(err, ErrNotAllowed), errors.Is(err, ErrFetch), errors.Is(err, ErrBadURL):
		return err
	case parent.Err() != nil:
		return fmt.Errorf("media fetch abandoned: %w", context.Cause(parent))
	case errors.Is(fetchCtx.Err(), context.DeadlineExceeded):
		return refuseCause(ErrTimeout, err, "fetching it timed out after %v", timeout)
	default:
		return refuseCause(ErrFetch, err, "fetching it failed: %s", transportReason(err))
	}
}

// transportReason says why a fetch failed in the client's terms; the error
// itself (a dial or TLS error naming addresses) goes to the log.
func transportReason(err error) string {
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	switch {
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return "its host name does not resolve"
	case errors.As(err, &dnsErr):
		return "its host name could not be resolved"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "the connection was refused"
	case errors.As(err, &certErr):
		return "the server's TLS certificate is not valid"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the response was cut short"
	}
	return "the server could not be reached"
}

// fileReason says why a file could not be read, without the file system's
// wording.
func fileReason(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "the file does not exist"
	case errors.Is(err, fs.ErrPermission):
		return "the file is not readable by this server"
	}
	return "the file could not be read"
}

// readFile reads a file: URL from beneath the allowed directory. The path is
// resolved (symlinks and "..") and checked before opening, as vLLM does,
// and then opened through os.Root, which refuses any escape a concurrent
// change to the tree could make after the check.
// notBeneath refuses a file outside the allowed local media path.
const notBeneath = "the file is not beneath this server's allowed local media path"

var errNotBeneath = refuse(ErrNotAllowed, notBeneath)

func (f *Fetcher) readFile(ctx context.Context, u *url.URL) ([]byte, error) {
	if f.localRoot == "" {
		return nil, refuse(ErrNotAllowed, "this server does not read media from file: URLs")
	}
	if u.Opaque != "" || (u.Host != "" && !strings.EqualFold(u.Host, "localhost")) {
		return nil, refuse(ErrBadURL, "a file: URL must be file:///absolute/path")
	}
	if !filepath.IsAbs(u.Path) {
		return nil, refuse(ErrBadURL, "the file path must be absolute")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("media fetch abandoned: %w", context.Cause(ctx))
	}
	clean := filepath.Clean(u.Path)
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		// Say "not found" only where the path would have been allowed, so
		// a refusal does not tell what exists elsewhere: judge by the
		// deepest ancestor that does exist, resolved.
		if ancestor := resolvedAncestor(clean); ancestor != f.localRoot && !beneath(f.localRoot, ancestor) {
			return nil, errNotBeneath
		}
		return nil, refuseCause(ErrFetch, err, "%s", fileReason(err))
	}
	if !beneath(f.localRoot, resolved) {
		return nil, errNotBeneath
	}
	rel, err := filepath.Rel(f.localRoot, resolved)
	if err != nil {
		return nil, refuseCause(ErrNotAllowed, err, notBeneath)
	}
	root, err := os.OpenRoot(f.localRoot)
	if err != nil {
		return nil, refuseCause(ErrFetch, err, "%s", fileReason(err))
	}
	defer root.Close()
	file, err := root.Open(rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return nil, refuseCause(ErrFetch, err, "%s", fileReason(err))
		}
		return nil, refuseCause(ErrNotAllowed, err, notBeneath)
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return nil, refuseCause(ErrFetch, err, "%s", fileReason(err))
	}
	if !info.Mode().IsRegular() {
		return nil, refuse(ErrFetch, "not a regular file")
	}
	if info.Size() > f.policy.MaxBytes {
		return nil, f.tooLarge(info.Size())
	}
	// Read one byte past the limit: a file growing under us is still caught.
	b, err := io.ReadAll(io.LimitReader(file, f.policy.MaxBytes+1))
	if err != nil {
		return nil, refuseCause(ErrFetch, err, "%s", fileReason(err))
	}
	if int64(len(b)) > f.policy.MaxBytes {
		return nil, refuse(ErrTooLarge, "the file is over this server's limit of %d bytes", f.policy.MaxBytes)
	}
	return b, nil
}

// resolvedAncestor is the deepest existing ancestor of path (or path
// itself) with symlinks resolved; "" if none resolves.
func resolvedAncestor(path string) string {
	for dir := path; ; dir = filepath.Dir(dir) {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return r
		}
		if dir == filepath.Dir(dir) {
			return ""
		}
	}
}

// beneath reports whether path lies strictly beneath dir (both clean and
// absolute), as vLLM requires of a local media file.
func beneath(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// FetchAll fetches items concurrently, at most Policy.Concurrency at a time,
// and returns their bytes in item order. On the first failure it cancels
// the fetches still running, starts no more, and returns that failure.
func (f *Fetcher) FetchAll(ctx context.Context, items []openai.MediaItem) ([][]byte, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	out := make([][]byte, len(items))
	slots := make(chan struct{}, f.policy.Concurrency)
	var wg sync.WaitGroup
launch:
	for i, item := range items {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break launch
		}
		wg.Go(func() {
			defer func() { <-slots }()
			b, err := f.Fetch(ctx, item)
			if err != nil {
				cancel(err) // only the first cause is kept
				return
			}
			out[i] = b
		})
	}
	wg.Wait()
	// The cause is the first item's error, or the caller's own
	// cancellation if that came first.
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}
