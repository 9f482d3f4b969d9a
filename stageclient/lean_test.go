package stageclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawServer is a loopback HTTP/1.1 server written against the wire, for
// what httptest cannot do: answer with bytes chosen per request, close a
// connection with a reset, count connections as they come and go.
type rawServer struct {
	ln net.Listener
	// serve answers one request on c; false closes the connection.
	serve func(c net.Conn, req *http.Request, body []byte) bool

	accepted atomic.Int32 // connections accepted
	ended    atomic.Int32 // connections whose serving ended, either side closing
	requests atomic.Int32 // requests read

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newRawServer(t *testing.T, serve func(c net.Conn, req *http.Request, body []byte) bool) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, serve: serve, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.acceptLoop()
	t.Cleanup(s.close)
	return s
}

func (s *rawServer) URL() string  { return "http://" + s.ln.Addr().String() }
func (s *rawServer) addr() string { return s.ln.Addr().String() }

func (s *rawServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

func (s *rawServer) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.ended.Add(1)
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		s.requests.Add(1)
		if !s.serve(c, req, body) {
			return
		}
	}
}

// closeConns closes every open connection from the server's side: with a
// FIN, or with a reset when rst.
func (s *rawServer) closeConns(rst bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if rst {
			_ = c.(*net.TCPConn).SetLinger(0)
		}
		_ = c.Close()
	}
}

func (s *rawServer) close() {
	_ = s.ln.Close()
	s.closeConns(false)
	s.wg.Wait()
}

const okResponse = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

// answer writes raw and keeps the connection.
func answer(raw string) func(net.Conn, *http.Request, []byte) bool {
	return func(c net.Conn, _ *http.Request, _ []byte) bool {
		_, err := io.WriteString(c, raw)
		return err == nil
	}
}

// leanClient is a Client for base over a transport of its own, so a test
// can set the transport's knobs and count its idle connections.
func leanClient(t *testing.T, base string, tr *leanTransport) *Client {
	t.Helper()
	c, err := New(Config{BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	if c.lean == nil {
		t.Fatalf("%s: the default client does not use the plain-HTTP transport", base)
	}
	c.lean = tr
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

// waitUntil polls cond until it holds, failing the test after wait.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// idleConn is the pooled connection to addr, which must be the only one.
func idleConn(t *testing.T, tr *leanTransport, addr string) *leanConn {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if n := len(tr.idle[addr]); n != 1 {
		t.Fatalf("%d idle connections, want 1", n)
	}
	return tr.idle[addr][0]
}

// closeIdleConn has srv close (reset, when rst) the one connection tr holds
// idle for it, and waits until the client's side of it sees the close.
func closeIdleConn(t *testing.T, tr *leanTransport, srv *rawServer, rst bool) {
	t.Helper()
	pc := idleConn(t, tr, srv.addr())
	srv.closeConns(rst)
	waitUntil(t, "the client's side sees the close", func() bool { return !probeConn(pc) })
}

func TestLeanChosen(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		lean bool
	}{
		{Config{BaseURL: "http://127.0.0.1:8000"}, true},
		{Config{BaseURL: "http://lb.internal/stage/0"}, true},
		{Config{BaseURL: "https://prefill-0.svc:443"}, false},
		{Config{BaseURL: "http://127.0.0.1:8000", HTTP: &http.Client{}}, false},
	} {
		c, err := New(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.lean != nil; got != tc.lean {
			t.Errorf("%+v: lean transport %v, want %v", tc.cfg, got, tc.lean)
		}
	}
	// A proxy the environment sets for a URL keeps it on net/http.
	proxied := &stageTransport{lean: sharedLean, std: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy:3128"})}}
	req, _ := http.NewRequest(http.MethodGet, "http://10.0.0.1:8000/health", nil)
	if proxied.useLean(req) {
		t.Error("a proxied URL goes over the plain-HTTP transport")
	}
}

// Framing decides reuse: a body that ended where its header said it would,
// with nothing after it and no "Connection: close", frees its connection;
// anything else closes it. Responses that are not HTTP are errors of the
// same classes as with net/http.
func TestLeanFraming(t *testing.T) {
	for _, tc := range []struct {
		name  string
		raw   string
		close bool  // the server closes the connection after raw
		want  error // class, or nil for success
		reuse bool
	}{
		{name: "content-length", raw: okResponse, reuse: true},
		{name: "chunked", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n", reuse: true},
		{name: "chunked with trailer", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n2\r\n{}\r\n0\r\nX-T: 1\r\n\r\n", reuse: true},
		{name: "no content", raw: "HTTP/1.1 204 No Content\r\n\r\n", reuse: true},
		{name: "interim responses", raw: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + okResponse, reuse: true},
		{name: "connection close", raw: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"},
		{name: "http/1.0", raw: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"},
		{name: "until close", raw: "HTTP/1.1 200 OK\r\n\r\n{}", close: true},
		{name: "bytes after the body", raw: okResponse + "HTTP/1.1 200 OK\r\n"},
		{name: "cut content-length", raw: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", close: true, want: ErrTruncated},
		{name: "cut chunked", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}", close: true, want: ErrTruncated},
		{name: "cut header", raw: "HTTP/1.1 200 OK\r\nContent-", close: true, want: ErrConnect},
		{name: "not http", raw: "SSH-2.0-OpenSSH_9.6\r\n", close: true, want: ErrProtocol},
		{name: "switching protocols", raw: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", want: ErrProtocol},
		{name: "endless interim", raw: strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", max1xx+1) + okResponse, want: ErrProtocol},
		{name: "oversized header", raw: "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", maxHeaderSize) + "\r\n\r\n", close: true, want: ErrProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			srv := newRawServer(t, func(c net.Conn, req *http.Request, body []byte) bool {
				if n.Add(1) > 1 {
					_, err := io.WriteString(c, okResponse)
					return err == nil
				}
				_, _ = io.WriteString(c, tc.raw)
				return !tc.close
			})
			tr := newLeanTransport()
			c := leanClient(t, srv.URL(), tr)
			ctx := testCtx(t)
			_, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`))
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
			} else {
				assertClass(t, "Post", err, tc.want)
			}
			if got := tr.idleCount(srv.addr()) == 1; got != tc.reuse {
				t.Errorf("connection pooled: %v, want %v", got, tc.reuse)
			}
			// The next request works either way: on the same connection,
			// or, if it was not kept, on a new one.
			if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			wantConns := int32(2)
			if tc.reuse {
				wantConns = 1
			}
			if got := srv.accepted.Load(); got != wantConns {
				t.Errorf("%d connections, want %d", got, wantConns)
			}
		})
	}
}

// Post, Stream, Health and Metrics share connections; a stream closed
// before its end does not give its connection back.
func TestLeanReuseAcrossCalls(t *testing.T) {
	var newConns, closedConns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/v1/completions":
			_, _ = io.WriteString(w, `{}`)
		case "/health":
		case "/metrics":
			_, _ = io.WriteString(w, "vllm:num_requests_running 1\n")
		case "/forever":
			sseHeaders(w)
			writeEvents(w, `{"i":0}`)
			<-r.Context().Done()
		default:
			sseHeaders(w)
			writeEvents(w, `{"i":0}`, `{"i":1}`, "[DONE]")
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			newConns.Add(1)
		case http.StateClosed:
			closedConns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := newLeanTransport()
	c := leanClient(t, srv.URL, tr)
	ctx := testCtx(t)
	for range 3 {
		if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		s, err := c.Stream(ctx, "/v1/chat/completions", "r", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		readN(t, s, 2)
		if _, err := s.Next(); err != io.EOF {
			t.Fatalf("end of stream: %v", err)
		}
		s.Close()
		if err := c.Health(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Metrics(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := newConns.Load(); n != 1 {
		t.Fatalf("%d connections for sequential calls, want 1", n)
	}
	s, err := c.Stream(ctx, "/forever", "r", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	readN(t, s, 1)
	s.Close()
	waitUntil(t, "the server sees the connection closed", func() bool { return closedConns.Load() == 1 })
	if n := tr.idleCount(strings.TrimPrefix(srv.URL, "http://")); n != 0 {
		t.Errorf("%d idle connections after a stream closed early, want 0", n)
	}
	if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if n := newConns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// Closing a body before its end closes the connection, and the server sees
// its request context cancelled; the closed body reads no more.
func TestLeanCloseBeforeEOF(t *testing.T) {
	gone := make(chan struct{})
	var closed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, "partial")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
		close(gone)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := newLeanTransport()
	t.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/x", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "partial" {
		t.Fatalf("read %q, %v", buf, err)
	}
	resp.Body.Close()
	awaitGone(t, gone)
	waitUntil(t, "the server sees the connection closed", func() bool { return closed.Load() == 1 })
	if _, err := resp.Body.Read(buf); !errors.Is(err, errBodyClosed) {
		t.Errorf("read after Close: %v", err)
	}
	if n := tr.idleCount(strings.TrimPrefix(srv.URL, "http://")); n != 0 {
		t.Errorf("%d idle connections, want 0", n)
	}
}

// A context that ends while the request is being written aborts the write
// and classifies as the context says.
func TestLeanCancelMidWrite(t *testing.T) {
	for _, deadline := range []bool{false, true} {
		t.Run(fmt.Sprintf("deadline=%v", deadline), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			started := make(chan struct{})
			done := make(chan struct{})
			served := make(chan struct{})
			go func() {
				defer close(served)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				// Read the request line, so the write has begun, then
				// stop reading: the body is far larger than the socket
				// buffers, so the client stays blocked in the write.
				if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					close(started)
				}
				<-done
			}()
			t.Cleanup(func() {
				close(done)
				ln.Close()
				<-served
			})
			c := leanClient(t, "http://"+ln.Addr().String(), newLeanTransport())
			body := bytes.Repeat([]byte("x"), 64<<20)
			if deadline {
				// Whether the deadline strikes mid-write or (on a slow
				// machine) earlier, the class is the same.
				ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
				defer cancel()
				_, err := c.Post(ctx, "/v1/completions", "r", body)
				assertClass(t, "Post", err, ErrTimeout)
				return
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				_, err := c.Post(ctx, "/v1/completions", "r", body)
				errc <- err
			}()
			select {
			case <-started:
			case <-time.After(wait):
				t.Fatal("the request never started")
			}
			cancel()
			select {
			case err := <-errc:
				assertClass(t, "Post", err, ErrCanceled)
			case <-time.After(wait):
				t.Fatal("cancelling did not abort the write")
			}
		})
	}
}

// A context that ends while the response is awaited, or partway through
// its body, closes the connection: the server sees its request cancelled.
func TestLeanCancelMidRead(t *testing.T) {
	for _, midBody := range []bool{false, true} {
		t.Run(fmt.Sprintf("midBody=%v", midBody), func(t *testing.T) {
			arrived := make(chan struct{})
			gone := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				if midBody {
					w.Header().Set("Content-Length", "100")
					_, _ = io.WriteString(w, `{"id":`)
					_ = http.NewResponseController(w).Flush()
				}
				close(arrived)
				<-r.Context().Done()
				close(gone)
			}))
			t.Cleanup(srv.Close)
			tr := newLeanTransport()
			c := leanClient(t, srv.URL, tr)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go func() {
				<-arrived
				cancel()
			}()
			_, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`))
			assertClass(t, "Post", err, ErrCanceled)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%v does not wrap context.Canceled", err)
			}
			awaitGone(t, gone)
			if n := tr.idleCount(strings.TrimPrefix(srv.URL, "http://")); n != 0 {
				t.Errorf("%d idle connections, want 0", n)
			}
		})
	}
}

// okOrHealth answers /health with an empty 200 and anything else with {}.
func okOrHealth(c net.Conn, req *http.Request, _ []byte) bool {
	raw := okResponse
	if req.URL.Path == "/health" {
		raw = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	}
	_, err := io.WriteString(c, raw)
	return err == nil
}

// When the server closes an idle connection, the next request goes out on
// a new one and succeeds: found closed before the write by the probe, or,
// if the close slips in after the probe, by the write failing.
func TestLeanServerClosedIdle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rst   bool
		probe bool
		size  int // of the second request's body
	}{
		{"closed, probed", false, true, 2},
		{"reset, probed", true, true, 2},
		{"reset after the probe", true, false, 2},
		{"reset after the probe, large body", true, false, 4 * copyBodyLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lastBody atomic.Int64
			srv := newRawServer(t, func(c net.Conn, req *http.Request, body []byte) bool {
				lastBody.Store(int64(len(body)))
				return okOrHealth(c, req, body)
			})
			tr := newLeanTransport()
			c := leanClient(t, srv.URL(), tr)
			ctx := testCtx(t)
			if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			closeIdleConn(t, tr, srv, tc.rst)
			if !tc.probe {
				tr.usable = func(*leanConn) bool { return true }
			}
			if _, err := c.Post(ctx, "/v1/completions", "r", bytes.Repeat([]byte(" "), tc.size)); err != nil {
				t.Fatal(err)
			}
			if n := srv.accepted.Load(); n != 2 {
				t.Errorf("%d connections, want 2", n)
			}
			if n := srv.requests.Load(); n != 2 {
				t.Errorf("the server read %d requests, want 2", n)
			}
			if n := lastBody.Load(); n != int64(tc.size) {
				t.Errorf("the server read a %d-byte body, want %d", n, tc.size)
			}
		})
	}
}

// A POST written whole on a reused connection that then ends without a
// byte of answer is not sent again — that is also how a worker that took
// the request and died looks — while a GET is.
func TestLeanNoRetryAfterWrite(t *testing.T) {
	srv := newRawServer(t, okOrHealth)
	tr := newLeanTransport()
	c := leanClient(t, srv.URL(), tr)
	ctx := testCtx(t)
	if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	closeIdleConn(t, tr, srv, false)
	tr.usable = func(*leanConn) bool { return true } // the close came after the probe
	_, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`))
	assertClass(t, "Post", err, ErrConnect)
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections: the POST was sent again", n)
	}

	tr.usable = probeConn
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	closeIdleConn(t, tr, srv, false)
	tr.usable = func(*leanConn) bool { return true }
	if err := c.Health(ctx); err != nil {
		t.Fatalf("GET not retried: %v", err)
	}
	if n := srv.accepted.Load(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
}

// The retry is one: a fresh connection that fails too is the answer.
func TestLeanRetriesOnce(t *testing.T) {
	var first atomic.Bool
	srv := newRawServer(t, func(c net.Conn, req *http.Request, body []byte) bool {
		if first.CompareAndSwap(false, true) {
			return okOrHealth(c, req, body)
		}
		return false // close without an answer
	})
	tr := newLeanTransport()
	c := leanClient(t, srv.URL(), tr)
	ctx := testCtx(t)
	if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	closeIdleConn(t, tr, srv, true)
	tr.usable = func(*leanConn) bool { return true }
	_, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`))
	assertClass(t, "Post", err, ErrConnect)
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A connection idle for idleTimeout is not reused but closed: when the
// next request looks for one, or when the sweep runs.
func TestLeanIdleTimeout(t *testing.T) {
	srv := newRawServer(t, okOrHealth)
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	tr := newLeanTransport()
	tr.now = clock.Now
	c := leanClient(t, srv.URL(), tr)
	ctx := testCtx(t)
	post := func() {
		t.Helper()
		if _, err := c.Post(ctx, "/v1/completions", "r", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	post()
	clock.advance(idleConnTimeout - time.Millisecond)
	post() // reused
	if n := srv.accepted.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	clock.advance(idleConnTimeout)
	post() // the idle one is stale: closed, and a new one dialled
	if n := srv.accepted.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	waitUntil(t, "the server sees the stale connection closed", func() bool { return srv.ended.Load() == 1 })

	clock.advance(idleConnTimeout - time.Millisecond)
	tr.sweepIdle()
	if n := tr.idleCount(srv.addr()); n != 1 {
		t.Fatalf("the sweep closed a connection idle for less than the timeout: %d idle", n)
	}
	clock.advance(time.Millisecond)
	tr.sweepIdle()
	if n := tr.idleCount(srv.addr()); n != 0 {
		t.Fatalf("%d idle connections after the sweep, want 0", n)
	}
	waitUntil(t, "the server sees the swept connection closed", func() bool { return srv.ended.Load() == 2 })
}

// The sweep runs by itself: a pool nobody takes from empties.
func TestLeanIdleSweepTimer(t *testing.T) {
	srv := newRawServer(t, okOrHealth)
	tr := newLeanTransport()
	tr.idleTimeout = 20 * time.Millisecond
	c := leanClient(t, srv.URL(), tr)
	if _, err := c.Post(testCtx(t), "/v1/completions", "r", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the idle connection is closed", func() bool {
		return tr.idleCount(srv.addr()) == 0 && srv.ended.Load() == 1
	})
}

// openBodies starts n requests whose bodies are left unread, so each holds
// a connection of its own.
func openBodies(t *testing.T, tr *leanTransport, url string, n int) []*http.Response {
	t.Helper()
	var resps []*http.Response
	for range n {
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, url, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	return resps
}

func drain(t *testing.T, resps []*http.Response) {
	t.Helper()
	for _, resp := range resps {
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
}

// The pool keeps at most maxIdlePerHost connections to a host, and
// maxIdle in all; the others are closed when their bodies end.
func TestLeanIdleBounds(t *testing.T) {
	a := newRawServer(t, answer(okResponse))
	b := newRawServer(t, answer(okResponse))
	tr := newLeanTransport()
	t.Cleanup(tr.CloseIdleConnections)
	tr.maxIdlePerHost = 2
	tr.maxIdle = 3
	drain(t, openBodies(t, tr, a.URL(), 3))
	if n := tr.idleCount(a.addr()); n != 2 {
		t.Errorf("%d idle connections to a, want 2", n)
	}
	waitUntil(t, "a sees the third connection closed", func() bool { return a.ended.Load() == 1 })
	drain(t, openBodies(t, tr, b.URL(), 2))
	if n := tr.idleCount(b.addr()); n != 1 {
		t.Errorf("%d idle connections to b, want 1 (3 in all)", n)
	}
	waitUntil(t, "b sees one connection closed", func() bool { return b.ended.Load() == 1 })
	tr.CloseIdleConnections()
	waitUntil(t, "every idle connection is closed", func() bool { return a.ended.Load() == 3 && b.ended.Load() == 2 })
}

// Connections in use or idle have no goroutines of their own on the
// client's side: the only ones are the server's, one a connection.
func TestLeanNoGoroutinesPerConnection(t *testing.T) {
	srv := newRawServer(t, answer(okResponse))
	tr := newLeanTransport()
	t.Cleanup(tr.CloseIdleConnections)
	base := runtime.NumGoroutine()
	const n = 8
	resps := openBodies(t, tr, srv.URL(), n)
	waitUntil(t, "the server serves every connection", func() bool { return srv.accepted.Load() == n })
	if got := runtime.NumGoroutine(); got > base+n {
		t.Errorf("%d goroutines with %d connections in use, want at most %d", got, n, base+n)
	}
	drain(t, resps)
	if got := tr.idleCount(srv.addr()); got != n {
		t.Fatalf("%d idle connections, want %d", got, n)
	}
	if got := runtime.NumGoroutine(); got > base+n {
		t.Errorf("%d goroutines with %d idle connections, want at most %d", got, n, base+n)
	}
}

// Bodies above the copy limit go out from the caller's slice; both paths,
// and a request sent through sharedHTTP as an http.RoundTripper, arrive
// whole.
func TestLeanRequestBodies(t *testing.T) {
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	srv := newRawServer(t, func(c net.Conn, req *http.Request, body []byte) bool {
		reply := fmt.Sprintf(`{"sum":%q,"type":%q,"id":%q}`, sum(body), req.Header.Get("Content-Type"), req.Header.Get("X-Request-Id"))
		_, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(reply), reply)
		return err == nil
	})
	c := leanClient(t, srv.URL(), newLeanTransport())
	ctx := testCtx(t)
	for _, size := range []int{1, copyBodyLimit, copyBodyLimit + 1, 3 << 20} {
		body := bytes.Repeat([]byte("y"), size)
		body[0] = '{'
		resp, err := c.Post(ctx, "/v1/completions", "r1", body)
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		want := fmt.Sprintf(`{"sum":%q,"type":"application/json","id":"r1"}`, sum(body))
		if string(resp.Body) != want {
			t.Errorf("%d bytes: got %s", size, resp.Body)
		}
		hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/x", bytes.NewReader(body))
		hresp, err := sharedHTTP.Do(hreq)
		if err != nil {
			t.Fatalf("through sharedHTTP, %d bytes: %v", size, err)
		}
		got, _ := io.ReadAll(hresp.Body)
		hresp.Body.Close()
		if want := fmt.Sprintf(`{"sum":%q,"type":"","id":""}`, sum(body)); string(got) != want {
			t.Errorf("through sharedHTTP, %d bytes: got %s", size, got)
		}
	}
}

// A request that would split or smuggle a header is refused before a byte
// is sent.
func TestLeanRefusesBadRequests(t *testing.T) {
	srv := newRawServer(t, func(c net.Conn, req *http.Request, _ []byte) bool {
		t.Errorf("request sent: %s %s %v", req.Method, req.URL, req.Header)
		return false
	})
	tr := newLeanTransport()
	t.Cleanup(tr.CloseIdleConnections)
	for name, mutate := range map[string]func(*http.Request){
		"header value": func(r *http.Request) { r.Header.Set("X-A", "1\r\nX-Evil: 1") },
		"header name":  func(r *http.Request) { r.Header["X A"] = []string{"1"} },
		"method":       func(r *http.Request) { r.Method = "GET /x HTTP/1.1\r\n" },
		"host":         func(r *http.Request) { r.Host = "a\r\nX-Evil: 1" },
		"scheme":       func(r *http.Request) { r.URL.Scheme = "https" },
	} {
		req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, srv.URL()+"/x", nil)
		mutate(req)
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
			t.Errorf("%s: request accepted", name)
		}
	}
}

// The request head is what net/http would send, less the header order.
func TestLeanRequestHead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		url    string
		header map[string]string
		close  bool
		body   string
		want   string
	}{
		{
			name: "post", method: http.MethodPost, url: "http://127.0.0.1:8000/stage/0/v1/completions",
			header: map[string]string{"X-Request-Id": "r1"}, body: `{}`,
			want: "POST /stage/0/v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 2\r\nX-Request-Id: r1\r\n\r\n{}",
		},
		{
			name: "empty post", method: http.MethodPost, url: "http://h:1/x",
			want: "POST /x HTTP/1.1\r\nHost: h:1\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 0\r\n\r\n",
		},
		{
			name: "get, no user agent, zone, query", method: http.MethodGet, url: "http://[fe80::1%25eth0]:8000/a%20b?c=d",
			header: map[string]string{"User-Agent": ""},
			want:   "GET /a%20b?c=d HTTP/1.1\r\nHost: [fe80::1]:8000\r\n\r\n",
		},
		{
			name: "close", method: http.MethodGet, url: "http://h/", close: true,
			header: map[string]string{"User-Agent": "probe/1"},
			want:   "GET / HTTP/1.1\r\nHost: h\r\nUser-Agent: probe/1\r\nConnection: close\r\n\r\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			req.Close = tc.close
			w := getWireBuf()
			defer putWireBuf(w)
			if err := w.encode(req, []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			if got := string(w.head); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
	if addr, err := canonicalAddr(&http.Request{URL: &url.URL{Scheme: "http", Host: "lb.internal"}}); err != nil || addr != "lb.internal:80" {
		t.Errorf("canonicalAddr without a port: %q, %v", addr, err)
	}
}

// A worker that answers before it has read the whole request — a 413 for a
// body over its bound — and closes makes the write fail; the answer, not
// the broken pipe, is the result, as with net/http.
func TestLeanAnswerBeforeWholeRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20)); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = io.WriteString(w, `{"error":{"message":"request body too large","type":"invalid_request_error","code":413}}`)
			return
		}
		_, _ = io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	tr := newLeanTransport()
	c := leanClient(t, srv.URL, tr)
	// Far more than the socket buffers hold, so the server's close comes
	// while the body is still being written.
	body := bytes.Repeat([]byte("x"), 32<<20)
	for range 3 {
		_, err := c.Post(testCtx(t), "/v1/completions", "r", body)
		var ue *UpstreamError
		if !errors.As(err, &ue) || ue.Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("got %v, want the 413", err)
		}
		if n := tr.idleCount(strings.TrimPrefix(srv.URL, "http://")); n != 0 {
			t.Fatalf("%d idle connections: a connection whose write failed was kept", n)
		}
	}
}
