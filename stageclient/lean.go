package stageclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/internal/idleconn"
)

// Connection pool and dial settings, shared by both transports (see
// newTransport for net/http's).
const (
	// The orchestrator keeps hundreds of requests in flight to each of a
	// handful of instances. With Go's default of 2 idle connections per
	// host, nearly every request would dial anew and leave a TIME_WAIT
	// socket behind, which at high request rates exhausts ephemeral ports.
	maxIdleConnsPerHost = 256
	maxIdleConns        = 4096
	// vLLM's API server (uvicorn) drops a connection idle for 5 s
	// (VLLM_HTTP_TIMEOUT_KEEP_ALIVE). Reusing one just as it is dropped
	// fails the POST — which is not sent again once written, see
	// leanTransport.roundTrip — with ErrConnect, so give idle connections
	// up first.
	idleConnTimeout = 4 * time.Second
	// Stage instances sit in the same cluster: a connect that takes seconds
	// means the instance is gone, and the sooner that is ErrConnect the
	// sooner another replica takes over.
	dialTimeout   = 5 * time.Second
	tcpKeepAlive  = 30 * time.Second
	maxHeaderSize = 1 << 20 // all of a response's header lines, 1xx included
	max1xx        = 10      // interim responses skipped before giving up
	// A body up to this size is copied behind the header and sent in one
	// write; a larger one goes out from the caller's slice in one writev,
	// so a multi-megabyte multimodal prompt is not held twice.
	copyBodyLimit = 16 << 10
)

const defaultUserAgent = "Go-http-client/1.1" // what net/http sends, so stage logs do not change

// leanTransport is an HTTP/1.1 client transport for plain-HTTP stage
// instances that does a whole exchange on the caller's goroutine: it takes
// an idle keep-alive connection (or dials), writes the request in one
// system call, parses the response with http.ReadResponse, and hands back a
// body that reads straight from the connection. The connection goes back
// to the idle pool when the body has been read to its framed end, and is
// closed when the body is closed before that, which is how a stage learns
// the client left.
//
// net/http's Transport runs a reader and a writer goroutine per connection
// and hands every request and response between them and the caller over
// channels. Under the orchestrator's load — two stage calls per user
// request, to few hosts — those goroutines, hand-offs and wake-ups were a
// large share of its CPU; this transport starts no goroutines at all.
//
// Cancelling a request's context closes its connection (from the
// context's AfterFunc goroutine), which unblocks a write or read in
// progress and makes it fail; callers classify the failure by the
// context, as with net/http.
//
// Its zero value is not usable; see newLeanTransport.
type leanTransport struct {
	dialer         net.Dialer
	maxIdlePerHost int
	maxIdle        int
	idleTimeout    time.Duration
	now            func() time.Time
	// usable reports whether an idle connection taken from the pool can
	// carry a request; probeConn by default, replaced in tests to stage
	// the race where the server closes a connection just after the probe.
	usable func(*leanConn) bool

	mu         sync.Mutex // guards the fields below
	idle       map[string][]*leanConn
	nidle      int
	sweep      *time.Timer // closes connections idle for idleTimeout
	sweepArmed bool
}

var _ http.RoundTripper = (*leanTransport)(nil)

func newLeanTransport() *leanTransport {
	return &leanTransport{
		dialer:         net.Dialer{Timeout: dialTimeout, KeepAlive: tcpKeepAlive},
		maxIdlePerHost: maxIdleConnsPerHost,
		maxIdle:        maxIdleConns,
		idleTimeout:    idleConnTimeout,
		now:            time.Now,
		usable:         probeConn,
		idle:           make(map[string][]*leanConn),
	}
}

// leanConn is one connection of a leanTransport. While a request is in
// flight it belongs to that request's goroutine; while idle, to the pool.
type leanConn struct {
	conn      net.Conn
	addr      string // the pool key, host:port
	nread     int64  // bytes read so far: did any of a response arrive?
	limit     int64  // while a header is read, nread may not pass it; -1 otherwise
	idleSince time.Time
	abort     func() // closes conn; bound once so cancelling costs no allocation
	probe     idleconn.Probe
}

// Read counts bytes for the retry decision and enforces the header size
// bound; bufio.Reader reads the connection through it.
func (pc *leanConn) Read(p []byte) (int, error) {
	if pc.limit >= 0 {
		room := pc.limit - pc.nread
		if room <= 0 {
			return 0, errHeaderTooLarge
		}
		if int64(len(p)) > room {
			p = p[:room]
		}
	}
	n, err := pc.conn.Read(p)
	pc.nread += int64(n)
	return n, err
}

func (pc *leanConn) close() { _ = pc.conn.Close() }

var errHeaderTooLarge = fmt.Errorf("response header over %d bytes", maxHeaderSize)

// protocolError is a response that is not HTTP this client can take (a
// 101, endless 1xx, an oversized header). classifyDo makes it ErrProtocol.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return e.msg }

// RoundTrip sends req, whose body it reads whole first, and returns the
// response; see leanTransport. Only plain "http" URLs are served.
func (t *leanTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := readRequestBody(req)
	if err != nil {
		return nil, err
	}
	return t.roundTrip(req, body)
}

// readRequestBody reads and closes req.Body, as a RoundTripper must.
func readRequestBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	var buf []byte
	if req.ContentLength > 0 {
		buf = make([]byte, 0, min(req.ContentLength, 64<<20)) // a hint, not a promise
	}
	buf, err := readAllInto(buf, req.Body)
	if err != nil {
		return nil, fmt.Errorf("read request body: %w", err)
	}
	if req.ContentLength > 0 && int64(len(buf)) != req.ContentLength {
		return nil, fmt.Errorf("request body is %d bytes, ContentLength says %d", len(buf), req.ContentLength)
	}
	return buf, nil
}

func readAllInto(buf []byte, r io.Reader) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// roundTrip sends req with body (req.Body is not read) and returns the
// response once its header has arrived.
//
// A request that fails on a reused connection is sent once more on a fresh
// one when the failure shows the server cannot have acted on it:
//
//   - the idle connection was found closed (or holding stray bytes) before
//     anything was written — that is not even a failure, just a connection
//     skipped;
//   - the write failed: the server never had the whole request;
//   - for an idempotent request (GET and the like, as net/http defines
//     them), the connection ended before any byte of a response.
//
// A POST whose write completed and whose connection then ended without a
// byte of response is not retried: that is also what a worker that read
// the request and died looks like, and running a prefill or decode twice
// can hold KV blocks for a transfer nobody completes. The probe before
// reuse leaves only the microseconds between it and the server reading the
// request for the server's idle close to strike, the same window net/http
// has; the idle timeout, under uvicorn's, keeps even that rare.
func (t *leanTransport) roundTrip(req *http.Request, body []byte) (*http.Response, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		return nil, err // before an idle connection is taken only to be closed
	}
	addr, err := canonicalAddr(req)
	if err != nil {
		return nil, err
	}
	w := getWireBuf()
	defer putWireBuf(w)
	if err := w.encode(req, body); err != nil {
		return nil, err
	}
	fresh := false
	for {
		pc, reused, err := t.getConn(ctx, addr, fresh)
		if err != nil {
			return nil, err
		}
		resp, retry, err := t.exchange(ctx, pc, req, w)
		if err == nil {
			return resp, nil
		}
		if !reused || fresh || !retry || ctx.Err() != nil {
			return nil, err
		}
		fresh = true
	}
}

// canonicalAddr is the host:port to dial for req.
func canonicalAddr(req *http.Request) (string, error) {
	u := req.URL
	if u == nil || u.Scheme != "http" {
		return "", errors.New("the plain-HTTP transport serves only http:// URLs")
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("no host in URL %q", u.Redacted())
	}
	return net.JoinHostPort(u.Hostname(), "80"), nil
}

// exchange writes the request on pc and reads the response header. On
// failure pc is closed, and retry says whether the failure is one that
// roundTrip may retry on a fresh connection.
func (t *leanTransport) exchange(ctx context.Context, pc *leanConn, req *http.Request, w *wireBuf) (resp *http.Response, retry bool, err error) {
	stop := noStop
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, pc.abort)
	}
	werr := w.writeTo(pc.conn)
	if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.WroteRequest != nil {
		// As net/http reports it: the caller learns that the request is
		// with the instance before its answer comes.
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: werr})
	}
	if werr != nil && ctx.Err() != nil {
		stop()
		pc.close()
		return nil, false, fmt.Errorf("write request: %w", werr)
	}
	// Even when the write failed, the server may have answered before it
	// stopped reading and closed — a 413 for a body over its bound — and
	// that answer, not the broken pipe, is the result. The connection is
	// broken then, so the read cannot wait long (and ctx still bounds it).
	start := pc.nread
	br := getReader(pc)
	resp, err = readHeader(br, pc, req)
	if err != nil {
		stop()
		pc.close()
		putReader(br)
		var perr *protocolError
		switch {
		case werr != nil:
			// The server never had the whole request.
			return nil, true, &notSentError{fmt.Errorf("write request: %w", werr)}
		case errors.As(err, &perr):
			return nil, false, err
		}
		// With not a byte of response, this is the connection ending,
		// and only a request the server may see twice is worth another
		// try.
		return nil, pc.nread == start && replayable(req), err
	}
	b := &leanBody{t: t, pc: pc, br: br, body: resp.Body, stop: stop,
		keep: werr == nil && !resp.Close && !wantsClose(req)}
	if resp.Body == http.NoBody {
		b.finish(true, true)
		return resp, false, nil
	}
	resp.Body = b
	return resp, false, nil
}

// readHeader reads a response to req from br, skipping interim (1xx)
// responses, within the bound on header bytes.
func readHeader(br *bufio.Reader, pc *leanConn, req *http.Request) (*http.Response, error) {
	pc.limit = pc.nread + maxHeaderSize
	defer func() { pc.limit = -1 }()
	for n := 0; ; n++ {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			if errors.Is(err, errHeaderTooLarge) {
				return nil, &protocolError{msg: err.Error()}
			}
			return nil, fmt.Errorf("read response: %w", err)
		}
		switch code := resp.StatusCode; {
		case code == http.StatusSwitchingProtocols:
			return nil, &protocolError{msg: "101 Switching Protocols in answer to a request that asked for no upgrade"}
		case code < 100 || code > 199:
			return resp, nil
		case n == max1xx:
			return nil, &protocolError{msg: fmt.Sprintf("more than %d interim (1xx) responses", max1xx)}
		}
	}
}

func noStop() bool { return true }

// replayable reports whether req may be sent twice, by net/http's rule:
// the methods HTTP defines as idempotent, or an Idempotency-Key header.
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

func wantsClose(req *http.Request) bool {
	if req.Close {
		return true
	}
	for _, v := range req.Header["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "close") {
				return true
			}
		}
	}
	return false
}

// getConn returns an idle connection to addr that passes the probe, or a
// new one (always a new one when fresh), and whether it was reused.
func (t *leanTransport) getConn(ctx context.Context, addr string, fresh bool) (*leanConn, bool, error) {
	for !fresh {
		pc := t.take(addr)
		if pc == nil {
			break
		}
		if t.usable(pc) {
			return pc, true, nil
		}
		pc.close()
	}
	c, err := t.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err // a *net.OpError, "dial": ErrConnect
	}
	pc := &leanConn{conn: c, addr: addr, limit: -1}
	pc.abort = pc.close
	return pc, false, nil
}

// take removes and returns the most recently used idle connection to addr,
// or nil. Older ones idle for idleTimeout are closed on the way.
func (t *leanTransport) take(addr string) *leanConn {
	now := t.now()
	t.mu.Lock()
	list := t.idle[addr]
	if len(list) == 0 {
		t.mu.Unlock()
		return nil
	}
	pc := list[len(list)-1]
	if now.Sub(pc.idleSince) >= t.idleTimeout {
		// The newest is stale, so are all the others.
		stale := append([]*leanConn(nil), list...)
		clear(list)
		t.idle[addr] = list[:0]
		t.nidle -= len(stale)
		t.mu.Unlock()
		for _, pc := range stale {
			pc.close()
		}
		return nil
	}
	list[len(list)-1] = nil
	t.idle[addr] = list[:len(list)-1]
	t.nidle--
	t.mu.Unlock()
	return pc
}

// put returns pc to the idle pool, or closes it if the pool is full.
func (t *leanTransport) put(pc *leanConn) {
	now := t.now()
	t.mu.Lock()
	list := t.idle[pc.addr]
	if len(list) >= t.maxIdlePerHost || t.nidle >= t.maxIdle {
		t.mu.Unlock()
		pc.close()
		return
	}
	pc.idleSince = now
	t.idle[pc.addr] = append(list, pc)
	t.nidle++
	if !t.sweepArmed {
		t.sweepArmed = true
		if t.sweep == nil {
			t.sweep = time.AfterFunc(t.idleTimeout, t.sweepIdle)
		} else {
			t.sweep.Reset(t.idleTimeout)
		}
	}
	t.mu.Unlock()
}

// sweepIdle closes connections idle for idleTimeout, so that a pool nobody
// takes from does not keep sockets the server has long closed, and
// re-arms itself for the oldest that remains. It runs on its timer, at most
// once per idleTimeout while connections are idle.
func (t *leanTransport) sweepIdle() {
	now := t.now()
	var stale []*leanConn
	t.mu.Lock()
	var oldest time.Time
	for addr, list := range t.idle {
		n := 0
		for n < len(list) && now.Sub(list[n].idleSince) >= t.idleTimeout {
			n++
		}
		if n > 0 {
			stale = append(stale, list[:n]...)
			rest := copy(list, list[n:])
			clear(list[rest:])
			list = list[:rest]
			t.idle[addr] = list
			t.nidle -= n
		}
		if len(list) > 0 && (oldest.IsZero() || list[0].idleSince.Before(oldest)) {
			oldest = list[0].idleSince
		}
	}
	t.sweepArmed = !oldest.IsZero()
	if t.sweepArmed && t.sweep != nil {
		t.sweep.Reset(max(oldest.Add(t.idleTimeout).Sub(now), time.Millisecond))
	}
	t.mu.Unlock()
	for _, pc := range stale {
		pc.close()
	}
}

// CloseIdleConnections closes every idle connection.
func (t *leanTransport) CloseIdleConnections() {
	var all []*leanConn
	t.mu.Lock()
	for addr, list := range t.idle {
		all = append(all, list...)
		clear(list)
		t.idle[addr] = list[:0]
	}
	t.nidle = 0
	if t.sweep != nil {
		t.sweep.Stop()
	}
	t.sweepArmed = false
	t.mu.Unlock()
	for _, pc := range all {
		pc.close()
	}
}

// idleCount is the number of idle connections to addr.
func (t *leanTransport) idleCount(addr string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.idle[addr])
}

// leanBody is a response body read from its connection. At the end of a
// body framed by Content-Length or chunked encoding, with nothing after it
// and no "Connection: close", the connection goes back to the pool;
// closing the body before then closes the connection.
type leanBody struct {
	t    *leanTransport
	pc   *leanConn
	br   *bufio.Reader
	body io.ReadCloser // http.ReadResponse's, reading from br
	stop func() bool   // unregisters the cancellation of pc
	keep bool          // the framing allows reuse
	// state is bodyOpen until the body ended (bodyEOF) or was closed
	// (bodyClosed); the one who moves it on owns pc from then.
	state atomic.Int32
}

const (
	bodyOpen = iota
	bodyEOF
	bodyClosed
)

var errBodyClosed = errors.New("read on closed response body")

func (b *leanBody) Read(p []byte) (int, error) {
	switch b.state.Load() {
	case bodyEOF:
		return 0, io.EOF
	case bodyClosed:
		return 0, errBodyClosed
	}
	n, err := b.body.Read(p)
	if err != nil {
		b.finish(err == io.EOF, true)
	}
	return n, err
}

// Close closes the connection unless the body had been read to its end.
// It may be called while Read is blocked in another goroutine, and makes
// that Read return.
func (b *leanBody) Close() error {
	b.finish(false, false)
	return nil
}

// finish ends the body: at its end (atEOF) the connection is pooled if it
// can be, else closed. reader says the caller is the reading goroutine, so
// that br is no longer in use and can be recycled.
func (b *leanBody) finish(atEOF, reader bool) {
	next := int32(bodyClosed)
	if atEOF {
		next = bodyEOF
	}
	if !b.state.CompareAndSwap(bodyOpen, next) {
		return
	}
	// stop is false when the context's AfterFunc has run or is running:
	// the connection is being closed under us.
	live := b.stop()
	if atEOF && live && b.keep && b.br.Buffered() == 0 {
		putReader(b.br)
		b.t.put(b.pc)
		return
	}
	b.pc.close()
	if reader {
		putReader(b.br)
	}
}

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

func getReader(pc *leanConn) *bufio.Reader {
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(pc)
	return br
}

func putReader(br *bufio.Reader) {
	br.Reset(nil) // drop the connection
	readerPool.Put(br)
}

// wireBuf holds a request as it goes on the wire: the header, with the
// body appended when it is small, else the body beside it for one writev.
type wireBuf struct {
	head []byte
	body []byte // a body too big to copy into head, else nil
	vec  [2][]byte
	bufs net.Buffers
}

var wirePool = sync.Pool{New: func() any { return &wireBuf{head: make([]byte, 0, 1024)} }}

func getWireBuf() *wireBuf { return wirePool.Get().(*wireBuf) }

func putWireBuf(w *wireBuf) {
	w.body = nil
	w.vec = [2][]byte{}
	w.bufs = nil
	if cap(w.head) > 64<<10 {
		return // a one-off giant header; let it go
	}
	w.head = w.head[:0]
	wirePool.Put(w)
}

// encode renders req's request line and header, and the body, for the
// wire. It refuses what would let a header be split or smuggled.
func (w *wireBuf) encode(req *http.Request, body []byte) error {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !validToken(method) {
		return fmt.Errorf("invalid method %q", method)
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !validHeaderValue(host) || strings.ContainsAny(host, " \t/") {
		return fmt.Errorf("invalid Host %q", host)
	}
	host = removeZone(host)
	uri := req.URL.RequestURI()
	if !validHeaderValue(uri) || strings.ContainsAny(uri, " \t") {
		return errors.New("invalid request URI")
	}
	b := w.head[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	// The default User-Agent unless the header names one; an empty one
	// means none.
	if ua, ok := req.Header["User-Agent"]; !ok {
		b = append(b, "User-Agent: "+defaultUserAgent+"\r\n"...)
	} else if len(ua) > 0 && ua[0] != "" {
		if !validHeaderValue(ua[0]) {
			return errors.New("invalid header field value for \"User-Agent\"")
		}
		b = append(b, "User-Agent: "...)
		b = append(b, textproto.TrimString(ua[0])...)
		b = append(b, "\r\n"...)
	}
	if len(body) > 0 || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n"...)
	}
	if req.Close && req.Header["Connection"] == nil {
		b = append(b, "Connection: close\r\n"...)
	}
	for name, values := range req.Header {
		switch name {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if !validToken(name) {
			return fmt.Errorf("invalid header field name %q", name)
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return fmt.Errorf("invalid header field value for %q", name)
			}
			b = append(b, name...)
			b = append(b, ": "...)
			b = append(b, textproto.TrimString(v)...)
			b = append(b, "\r\n"...)
		}
	}
	b = append(b, "\r\n"...)
	w.body = nil
	if len(body) > copyBodyLimit {
		w.body = body
	} else {
		b = append(b, body...)
	}
	w.head = b
	return nil
}

// writeTo writes the request in one system call (more only if the kernel
// takes a large body in parts). It may be called again to resend.
func (w *wireBuf) writeTo(c net.Conn) error {
	if w.body == nil {
		_, err := c.Write(w.head)
		return err
	}
	// WriteTo trims and clears the slices it is given as it goes, so it
	// gets fresh ones each time.
	w.vec = [2][]byte{w.head, w.body}
	w.bufs = w.vec[:]
	_, err := w.bufs.WriteTo(c)
	return err
}

// removeZone drops an IPv6 zone ("%eth0") from a Host header: it names an
// interface of this machine, which means nothing to the server (RFC 6874).
func removeZone(host string) string {
	if !strings.HasPrefix(host, "[") {
		return host
	}
	i := strings.LastIndex(host, "]")
	if i < 0 {
		return host
	}
	j := strings.LastIndex(host[:i], "%")
	if j < 0 {
		return host
	}
	return host[:j] + host[i:]
}

// validToken reports whether s is an HTTP token (a method or field name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// probeConn reports whether an idle connection can carry a request: the
// server has not closed it, reset it, or sent anything unasked (a 408
// before closing, say) — the check net/http's per-connection reader
// goroutine makes by sitting in a read while the connection is idle.
func probeConn(pc *leanConn) bool { return pc.probe.Check(pc.conn) == nil }
