package server

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/omnipd/omnipd/openai"
)

// Defaults of HTTPConfig, and what each is measured against.
const (
	// DefaultReadHeaderTimeout bounds a request's headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultIdleTimeout is Traefik's idle timeout for its entry points
	// (traefik/traefik#1340). It must outlast the clients' own: a server
	// that closes a pooled connection just as a client reuses it fails
	// that client's POST, which no client retries. Go's
	// http.DefaultTransport gives up idle connections after 90 s,
	// omnipd's stage client after 4 s.
	DefaultIdleTimeout = 180 * time.Second
	// DefaultMaxConns bounds open connections: four times --max-concurrent's
	// default, room for every request slot and the idle keep-alive
	// connections of the clients that fill them.
	DefaultMaxConns = 4096
	// DefaultMaxConnsPerIP is Envoy's default for the connections it opens
	// to one upstream cluster (circuit_breakers max_connections, 1024), so
	// an Envoy or Istio proxy in front of omnipd is never refused at its
	// defaults, while four clients are needed to fill DefaultMaxConns.
	DefaultMaxConnsPerIP = 1024
)

// HTTPConfig is what omnipd's HTTP servers — serve's public API and every
// reference worker — allow a connection. The zero value of each field is
// its default; a negative value means no limit.
type HTTPConfig struct {
	// ReadHeaderTimeout bounds the read of a request's headers
	// (DefaultReadHeaderTimeout). A request's body has its own bound
	// (Config.BodyTimeout); the response has none, so streams may last
	// as long as they need.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that waits this long for
	// its next request (DefaultIdleTimeout).
	IdleTimeout time.Duration
	// MaxConns bounds the connections open at once (DefaultMaxConns). One
	// more is answered 503 and closed.
	MaxConns int
	// MaxConnsPerIP bounds the connections open at once from one client
	// address (DefaultMaxConnsPerIP); an IPv6 client is its /64. One more
	// is answered 429 and closed. Behind a proxy every client has the
	// proxy's address: raise it to what the proxy opens, or turn it off.
	MaxConnsPerIP int
	// Metrics, when set, counts refused connections and open ones.
	Metrics ConnRecorder
	// ErrorLog receives net/http's own complaints (default: the standard
	// logger, as http.Server's).
	ErrorLog *log.Logger
}

// ConnRecorder is what LimitListener reports to; *metrics.Orchestrator is
// one.
type ConnRecorder interface {
	// RecordConnRefused counts a connection refused, with why: "per_ip"
	// or "total".
	RecordConnRefused(reason string)
	// AddOpenConns moves the count of open connections.
	AddOpenConns(delta int)
}

// withDefaults fills zero fields, and turns negative ones into net/http's
// "none".
func (c HTTPConfig) withDefaults() HTTPConfig {
	pick := func(v, def time.Duration) time.Duration {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	c.ReadHeaderTimeout = pick(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.IdleTimeout = pick(c.IdleTimeout, DefaultIdleTimeout)
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	return c
}

// NewHTTPServer is the http.Server omnipd serves h with. It has no
// ReadTimeout and no WriteTimeout: net/http keeps ReadTimeout's deadline on
// the connection while the handler runs, and when it passes its background
// read cancels the request — a stream would be cut mid-answer — and
// WriteTimeout bounds a whole answer, however long a stream the client is
// reading. Bodies are bounded by the handler instead (Config.BodyTimeout),
// and each write of an answer by the write deadline the handler pushes out
// before it (Config.WriteTimeout), which net/http lifts once the answer is
// flushed (conn.serve, after finishRequest), before the next request on
// the connection.
func NewHTTPServer(h http.Handler, cfg HTTPConfig) *http.Server {
	cfg = cfg.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          cfg.ErrorLog,
	}
}

// LimitListener wraps ln so that at most cfg.MaxConns connections are open
// at once, and at most cfg.MaxConnsPerIP from one client. A connection over
// either is answered at once — 429 (this client has too many) or 503 (the
// server is full), OpenAI's error body, Retry-After — and closed; Accept
// goes on with the next, so a flood of connections never stalls the
// others'.
func LimitListener(ln net.Listener, cfg HTTPConfig) net.Listener {
	cfg = cfg.withDefaults()
	return &limitListener{
		Listener: ln, max: cfg.MaxConns, perIP: cfg.MaxConnsPerIP, rec: cfg.Metrics,
		byIP: map[string]int{}, refusing: make(chan struct{}, maxRefusing),
	}
}

// maxRefusing bounds the refusals in progress. A refused connection is
// answered and then read until the client closes it (briefly), because
// closing a socket with the client's request unread makes the kernel reset
// it, and a reset can destroy the answer before the client reads it. Past
// this many, a refused connection is closed without an answer.
const maxRefusing = 64

// refuseLinger bounds how long a refused connection is read after its
// answer.
const refuseLinger = 500 * time.Millisecond

type limitListener struct {
	net.Listener
	max, perIP int
	rec        ConnRecorder
	refusing   chan struct{}

	mu   sync.Mutex
	open int
	byIP map[string]int
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := clientKey(c.RemoteAddr())
		if reason := l.admit(key); reason != "" {
			if l.rec != nil {
				l.rec.RecordConnRefused(reason)
			}
			l.refuse(c, reason)
			continue
		}
		if l.rec != nil {
			l.rec.AddOpenConns(1)
		}
		return &limitedConn{Conn: c, release: func() { l.release(key) }}, nil
	}
}

// admit takes a place for a connection from key, or says why there is none.
func (l *limitListener) admit(key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perIP > 0 && l.byIP[key] >= l.perIP {
		return "per_ip"
	}
	if l.max > 0 && l.open >= l.max {
		return "total"
	}
	l.open++
	l.byIP[key]++
	return ""
}

func (l *limitListener) release(key string) {
	l.mu.Lock()
	l.open--
	if l.byIP[key]--; l.byIP[key] <= 0 {
		delete(l.byIP, key)
	}
	l.mu.Unlock()
	if l.rec != nil {
		l.rec.AddOpenConns(-1)
	}
}

// refuse answers a connection over a limit and closes it.
func (l *limitListener) refuse(c net.Conn, reason string) {
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		e := openai.Unavailable("omnipd has as many connections open as it allows; retry shortly")
		if reason == "per_ip" {
			e = openai.RateLimited("too many connections from this client; reuse one, or retry shortly")
		}
		body, _ := json.Marshal(e)
		_ = c.SetDeadline(time.Now().Add(refuseLinger))
		_, err := fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s",
			e.Status, http.StatusText(e.Status), len(body), body)
		if err != nil {
			return
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}

// clientKey is the address connections are counted under: the client's
// IP, or for IPv6 its /64, which one host can fill with addresses.
func clientKey(a net.Addr) string {
	var ip net.IP
	switch a := a.(type) {
	case *net.TCPAddr:
		ip = a.IP
	default:
		host, _, err := net.SplitHostPort(a.String())
		if err != nil {
			return a.String()
		}
		ip = net.ParseIP(host)
		if ip == nil {
			return host
		}
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String()
}

// limitedConn gives its place back when it closes (once: net/http may
// close a connection more than once).
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite passes on the half-close net/http sends before it closes a
// connection, so the client reads the end of the answer before any reset.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
