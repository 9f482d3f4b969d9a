package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnipd/omnipd/metrics"
)

// The front door under a hostile client: every test here serves the API
// the way omnipd serve does (NewHTTPServer over LimitListener) on a
// loopback listener, and drives it over real sockets.

// ioGuard bounds every read a test makes of the server: a server that
// never answers fails the test instead of hanging it.
const ioGuard = 10 * time.Second

// fakeThinker is a Thinker stage: a whole answer, or a stream of events
// paced by gap, for as long as the client stays. Each request it receives
// is signalled on got.
type fakeThinker struct {
	events int
	gap    time.Duration
	hold   bool // answer nothing until the caller goes away
	got    chan struct{}
}

func (f *fakeThinker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	select {
	case f.got <- struct{}{}:
	default:
	}
	if f.hold {
		<-r.Context().Done()
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"chatcmpl-f","object":"chat.completion","created":1,"model":"omnipd-reference","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range f.events {
		if _, err := fmt.Fprint(w, sseEvents(relayChunk(i))); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-time.After(f.gap):
		case <-r.Context().Done():
			return
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// frontDoor serves the API over stage (a fake Thinker) as omnipd serve
// serves it, and returns its address and metrics.
func frontDoor(t *testing.T, stage http.Handler, cfg Config, hc HTTPConfig) (string, *metrics.Orchestrator) {
	t.Helper()
	o, m := thinkerOrchestrator(t, stage)
	cfg.Orchestrator, cfg.Metrics, cfg.Logger, cfg.ModelName = o, m, quiet, "omnipd-reference"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTPServer(New(cfg), hc)
	go hs.Serve(LimitListener(ln, hc))
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String(), m
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioGuard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readResponse reads one HTTP response from c, guarded.
func readResponse(t *testing.T, c net.Conn, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(ioGuard))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return resp, string(body)
}

// openAIErrorBody checks body is OpenAI's error JSON, with all four fields,
// and returns its detail.
func openAIErrorBody(t *testing.T, body string) map[string]any {
	t.Helper()
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e.Error[k]; !ok {
			t.Errorf("error body without %q: %s", k, body)
		}
	}
	if msg, _ := e.Error["message"].(string); msg == "" {
		t.Errorf("error body without a message: %s", body)
	}
	return e.Error
}

// requestCount is omnipd_requests_total{path,status} as scraped.
func requestCount(t *testing.T, m *metrics.Orchestrator, path, status string) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^omnipd_requests_total\{path="` + path + `",status="` + status + `"\} (\S+)$`)
	if g := re.FindStringSubmatch(scrape(t, m)); g != nil {
		return g[1]
	}
	return "0"
}

const smallChat = `{"messages":[{"role":"user","content":"hello"}],"max_tokens":4}`

// A body that ends before its Content-Length — the client half-closes its
// side after sending less — is the client's error: 400 with OpenAI's body,
// never a 500.
func TestBodyShorterThanContentLength(t *testing.T) {
	addr, m := frontDoor(t, &fakeThinker{got: make(chan struct{}, 1)}, Config{}, HTTPConfig{})
	c := dial(t, addr)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(smallChat)+50, smallChat)
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, body := readResponse(t, c, bufio.NewReader(c))
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("truncated body: %d %s, want 400", resp.StatusCode, body)
	}
	if e := openAIErrorBody(t, body); e["type"] != "invalid_request_error" {
		t.Errorf("truncated body: type %v, want invalid_request_error", e["type"])
	}
	if n := requestCount(t, m, "none", "400"); n != "1" {
		t.Errorf(`omnipd_requests_total{path="none",status="400"} = %s, want 1`, n)
	}
	if strings.Contains(scrape(t, m), `status="500"`) {
		t.Errorf("a truncated body was counted as a 500:\n%s", scrape(t, m))
	}
}

// slowBody opens a connection and sends a chat request's headers and then
// its body one byte per gap, until stop is closed or the body is sent. It
// signals started once the first body byte is out.
func slowBody(addr string, gap time.Duration, stop <-chan struct{}, started chan<- struct{}) error {
	sent := false
	defer func() {
		if !sent {
			started <- struct{}{} // failed early: do not leave the test waiting
		}
	}()
	c, err := net.DialTimeout("tcp", addr, ioGuard)
	if err != nil {
		return err
	}
	defer c.Close()
	body := smallChat + strings.Repeat(" ", 200)
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Length: %d\r\n\r\n", len(body)); err != nil {
		return err
	}
	for i := range len(body) {
		select {
		case <-stop:
			return nil
		case <-time.After(gap):
		}
		if _, err := c.Write([]byte{body[i]}); err != nil {
			return nil // the server hung up: that is its right
		}
		if i == 0 {
			started <- struct{}{}
			sent = true
		}
	}
	return nil
}

// Connections trickling their bodies hold no request slot: with four times
// --max-concurrent of them open, real requests are still served.
func TestSlowBodiesDoNotLockOthersOut(t *testing.T) {
	const slots, slow = 4, 16
	addr, _ := frontDoor(t, &fakeThinker{got: make(chan struct{}, 1)}, Config{MaxConcurrent: slots}, HTTPConfig{})
	stop := make(chan struct{})
	started := make(chan struct{}, slow)
	var wg sync.WaitGroup
	for range slow {
		wg.Go(func() { _ = slowBody(addr, 50*time.Millisecond, stop, started) })
	}
	defer func() { close(stop); wg.Wait() }()
	for range slow {
		<-started // its headers went out a gap ago: it is in the handler, reading its body
	}
	for i := range 3 {
		status, _, body, err := postChat(context.Background(), "http://"+addr, smallChat)
		if err != nil || status != http.StatusOK {
			t.Fatalf("request %d while %d bodies trickle (--max-concurrent %d): %d %v %s", i, slow, slots, status, err, body)
		}
	}
}

// A body that does not arrive within the body timeout is answered 408,
// with OpenAI's body, and the connection closed.
func TestBodyTimeout(t *testing.T) {
	addr, m := frontDoor(t, &fakeThinker{got: make(chan struct{}, 1)}, Config{BodyTimeout: 300 * time.Millisecond}, HTTPConfig{})
	c := dial(t, addr)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Length: %d\r\n\r\n%s", len(smallChat), smallChat[:10])
	br := bufio.NewReader(c)
	resp, body := readResponse(t, c, br)
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled body: %d %s, want 408", resp.StatusCode, body)
	}
	openAIErrorBody(t, body)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after a body timeout the connection should close: read %v", err)
	}
	if n := requestCount(t, m, "none", "408"); n != "1" {
		t.Errorf(`omnipd_requests_total{path="none",status="408"} = %s, want 1`, n)
	}
}

// The body timeout bounds only the body: a stream that lasts many times
// longer is relayed whole.
func TestBodyTimeoutSparesLongStreams(t *testing.T) {
	const events = 12
	addr, _ := frontDoor(t, &fakeThinker{events: events, gap: 50 * time.Millisecond, got: make(chan struct{}, 1)},
		Config{BodyTimeout: 100 * time.Millisecond}, HTTPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), ioGuard)
	defer cancel()
	status, _, body, err := postChat(ctx, "http://"+addr, `{"messages":[{"role":"user","content":"hello"}],"stream":true}`)
	if err != nil || status != http.StatusOK {
		t.Fatalf("stream: %d %v %s", status, err, body)
	}
	if n := strings.Count(body, `"chat.completion.chunk"`); n != events || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("a stream outlasting the body timeout was cut: %d of %d events\n%s", n, events, body)
	}
}

// Connections over the per-client or the total cap are answered at once
// with an OpenAI error and closed; one that closes makes room.
func TestConnectionCaps(t *testing.T) {
	for _, c := range []struct {
		name     string
		hc       HTTPConfig
		held     int
		status   int
		errorTyp string
	}{
		{"per client", HTTPConfig{MaxConnsPerIP: 3, MaxConns: 100}, 3, http.StatusTooManyRequests, "rate_limit_error"},
		{"total", HTTPConfig{MaxConnsPerIP: 100, MaxConns: 2}, 2, http.StatusServiceUnavailable, "server_error"},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, _ := frontDoor(t, &fakeThinker{got: make(chan struct{}, 1)}, Config{}, c.hc)
			var held []net.Conn
			for range c.held {
				held = append(held, dial(t, addr))
			}
			over := dial(t, addr)
			br := bufio.NewReader(over)
			resp, body := readResponse(t, over, br)
			if resp.StatusCode != c.status || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("connection over the cap: %d (Retry-After %q) %s, want %d", resp.StatusCode, resp.Header.Get("Retry-After"), body, c.status)
			}
			if e := openAIErrorBody(t, body); e["type"] != c.errorTyp {
				t.Errorf("over the cap: type %v, want %s", e["type"], c.errorTyp)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("a connection over the cap should be closed: read %v", err)
			}
			// The held connections still work, and closing one makes room.
			fmt.Fprintf(held[0], "GET /v1/models HTTP/1.1\r\nHost: omnipd\r\n\r\n")
			if resp, body := readResponse(t, held[0], bufio.NewReader(held[0])); resp.StatusCode != 200 {
				t.Errorf("a connection under the cap: %d %s", resp.StatusCode, body)
			}
			held[1].Close()
			waitFor(t, "a closed connection to free its place", func() bool {
				status, _, _, err := postChat(context.Background(), "http://"+addr, smallChat)
				return err == nil && status == 200
			})
		})
	}
}

// An idle keep-alive connection is closed after the idle timeout.
func TestIdleConnectionsAreClosed(t *testing.T) {
	addr, _ := frontDoor(t, &fakeThinker{got: make(chan struct{}, 1)}, Config{}, HTTPConfig{IdleTimeout: 200 * time.Millisecond})
	c := dial(t, addr)
	br := bufio.NewReader(c)
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: omnipd\r\n\r\n")
	if resp, body := readResponse(t, c, br); resp.StatusCode != 200 {
		t.Fatalf("GET /v1/models: %d %s", resp.StatusCode, body)
	}
	_ = c.SetReadDeadline(time.Now().Add(ioGuard))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("an idle keep-alive connection should be closed by the server: read %v", err)
	}
}

// Every error the API answers is OpenAI's error JSON: unknown paths, wrong
// methods (with Allow), and /health when a stage is down.
func TestEveryErrorIsAnOpenAIError(t *testing.T) {
	stage := &fakeThinker{got: make(chan struct{}, 1)}
	addr, m := frontDoor(t, stage, Config{Ready: func(context.Context) error {
		return fmt.Errorf("http://127.0.0.1:1: connection refused")
	}}, HTTPConfig{})
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
		message      string
	}{
		{"GET", "/nope", 404, "", "/nope"},
		{"POST", "/v1/nope", 404, "", "/v1/nope"},
		{"GET", "/v1/chat/completions", 405, "POST", "GET"},
		{"DELETE", "/v1/models", 405, "GET, HEAD", "DELETE"},
		{"GET", "/health", 503, "", "connection refused"},
	} {
		req, _ := http.NewRequest(c.method, "http://"+addr+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Errorf("%s %s: %d Allow %q Content-Type %q, want %d Allow %q JSON", c.method, c.path, resp.StatusCode,
				resp.Header.Get("Allow"), resp.Header.Get("Content-Type"), c.status, c.allow)
			continue
		}
		if e := openAIErrorBody(t, string(b)); !strings.Contains(e["message"].(string), c.message) {
			t.Errorf("%s %s: message %q should name %q", c.method, c.path, e["message"], c.message)
		}
	}
	if n := requestCount(t, m, "none", "405"); n != "2" {
		t.Errorf(`omnipd_requests_total{path="none",status="405"} = %s, want 2`, n)
	}
}

// A request whose client went away is counted as cancelled (499), under the
// path it had reached when that is known — never as a 200.
func TestCancelledRequestsAreCounted(t *testing.T) {
	t.Run("mid-stream", func(t *testing.T) {
		addr, m := frontDoor(t, &fakeThinker{events: 1000, gap: 10 * time.Millisecond, got: make(chan struct{}, 1)}, Config{}, HTTPConfig{})
		c := dial(t, addr)
		body := `{"messages":[{"role":"user","content":"hello"}],"stream":true}`
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		br := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(ioGuard))
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream: %v %v", resp, err)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		c.Close()
		waitFor(t, "the cancelled stream to be counted", func() bool { return requestCount(t, m, "colocated", "499") == "1" })
		if n := requestCount(t, m, "colocated", "200"); n != "0" {
			t.Errorf(`a cancelled stream was counted as a 200 (%s)`, n)
		}
	})
	t.Run("before the answer", func(t *testing.T) {
		stage := &fakeThinker{hold: true, got: make(chan struct{}, 1)}
		addr, m := frontDoor(t, stage, Config{}, HTTPConfig{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); postChat(ctx, "http://"+addr, smallChat) }()
		select {
		case <-stage.got:
		case <-time.After(ioGuard):
			t.Fatal("the request never reached the stage")
		}
		cancel()
		<-done
		waitFor(t, "the cancelled request to be counted", func() bool { return requestCount(t, m, "none", "499") == "1" })
		if s := scrape(t, m); strings.Contains(s, `status="200"`) {
			t.Errorf("a cancelled request was counted as a 200:\n%s", s)
		}
	})
}

// waitFor polls cond for a few seconds, bounded in count and time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// pipeListener hands out one end of a net.Pipe per address queued, as if
// a client at that address had connected.
type pipeListener struct {
	conns chan net.Conn
}

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

func (l *pipeListener) Accept() (net.Conn, error) {
	c, ok := <-l.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (l *pipeListener) Close() error   { return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// The per-client cap counts each client address apart (an IPv6 client by
// its /64); a connection over it is answered 429 while other clients are
// still admitted.
func TestConnectionCapIsPerClient(t *testing.T) {
	l := &pipeListener{conns: make(chan net.Conn, 16)}
	ll := LimitListener(l, HTTPConfig{MaxConnsPerIP: 2})
	clients := map[string]net.Conn{}
	connect := func(name, ip string) {
		server, client := net.Pipe()
		t.Cleanup(func() { server.Close(); client.Close() })
		clients[name] = client
		l.conns <- addrConn{Conn: server, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
	}
	for _, c := range []struct{ name, ip string }{
		{"a1", "10.0.0.1"}, {"a2", "10.0.0.1"}, {"a3", "10.0.0.1"}, {"b1", "10.0.0.2"},
		{"v6a", "2001:db8::1"}, {"v6b", "2001:db8::2"}, {"v6c", "2001:db8::3"}, {"v6other", "2001:db8:0:1::1"},
	} {
		connect(c.name, c.ip)
	}
	var got []string
	for range 6 {
		c, err := ll.Accept()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, clientKey(c.RemoteAddr()))
	}
	want := []string{"10.0.0.1", "10.0.0.1", "10.0.0.2", "2001:db8::", "2001:db8::", "2001:db8:0:1::"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
	for _, name := range []string{"a3", "v6c"} {
		_ = clients[name].SetReadDeadline(time.Now().Add(ioGuard))
		resp, err := http.ReadResponse(bufio.NewReader(clients[name]), nil)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s, over its cap: %v %v, want a 429", name, resp, err)
		}
	}
}

// A client that writes its whole body before it reads its answer — as
// Python's urllib does — hears the 413 for a body over the cap, with
// OpenAI's error body, instead of a connection reset: the server reads and
// drops the rest of the body once the answer is out. Declared
// (Content-Length, refused before any of it is read) and chunked (refused
// once the cap is passed).
func TestOversizedBodyWrittenWholeGets413(t *testing.T) {
	const limit = 1 << 20
	// Far more than loopback sockets buffer, so that the client's write
	// blocks unless the server reads on.
	const size = limit + 200<<20
	piece := bytes.Repeat([]byte("x"), 1<<20)
	for _, chunked := range []bool{false, true} {
		t.Run(map[bool]string{false: "content-length", true: "chunked"}[chunked], func(t *testing.T) {
			stage := &fakeThinker{got: make(chan struct{}, 1)}
			addr, m := frontDoor(t, stage, Config{MaxBodyBytes: limit}, HTTPConfig{})
			c := dial(t, addr)
			// A generous bound only a hang reaches.
			_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
			head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
			if chunked {
				head = "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
			}
			_, err := io.WriteString(c, head)
			for sent := 0; err == nil && sent < size; sent += len(piece) {
				if chunked {
					_, err = fmt.Fprintf(c, "%x\r\n%s\r\n", len(piece), piece)
				} else {
					_, err = c.Write(piece)
				}
			}
			if err == nil && chunked {
				_, err = io.WriteString(c, "0\r\n\r\n")
			}
			if err != nil {
				t.Fatalf("writing the whole body before reading: %v", err)
			}
			resp, body := readResponse(t, c, bufio.NewReader(c))
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("oversized body: %d %s, want 413", resp.StatusCode, body)
			}
			if e := openAIErrorBody(t, body); e["code"] != "request_too_large" || !strings.Contains(e["message"].(string), strconv.Itoa(limit)) {
				t.Errorf("oversized body: %v, want code request_too_large and the limit named", e)
			}
			if !resp.Close {
				t.Error("after a refused body the connection should close (Connection: close)")
			}
			select {
			case <-stage.got:
				t.Error("an oversized body reached the stage")
			default:
			}
			if n := requestCount(t, m, "none", "413"); n != "1" {
				t.Errorf(`omnipd_requests_total{path="none",status="413"} = %s, want 1`, n)
			}
		})
	}
}

// floodThinker streams large chunks for as long as its client reads them,
// and closes left once that request's context ends (the orchestrator
// cancelled the leg). Requests that do not stream get fakeThinker's answer.
type floodThinker struct {
	started, left chan struct{}
	flooding      atomic.Bool
}

func (f *floodThinker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if !bytes.Contains(body, []byte(`"stream":true`)) || f.flooding.Swap(true) {
		r.Body = io.NopCloser(bytes.NewReader(body))
		(&fakeThinker{}).ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := sseEvents(fmt.Sprintf(`{"id":"x","object":"chat.completion.chunk","created":1,"model":"omnipd-reference","choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`, strings.Repeat("a", 64<<10)))
	select {
	case f.started <- struct{}{}:
	default:
	}
	defer close(f.left)
	for r.Context().Err() == nil {
		if _, err := io.WriteString(w, chunk); err != nil {
			return
		}
		w.(http.Flusher).Flush()
	}
}

// A client that stops reading a stream holds nothing for good: once a
// write has waited the write timeout it is dropped, its stage leg is
// cancelled and its place is free for the next request.
func TestClientThatStopsReadingIsDropped(t *testing.T) {
	stage := &floodThinker{started: make(chan struct{}, 1), left: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("/", stage)
	addr, m := frontDoor(t, mux, Config{MaxConcurrent: 1, WriteTimeout: 200 * time.Millisecond}, HTTPConfig{})
	c := dial(t, addr)
	body := `{"messages":[{"role":"user","content":"hello"}],"stream":true}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// The client reads nothing from here on.
	<-stage.started
	select {
	case <-stage.left:
	case <-t.Context().Done():
		t.Fatal("the stage leg of a client that stopped reading was never cancelled")
	}
	waitFor(t, "the dropped stream to be counted", func() bool { return requestCount(t, m, "colocated", "499") == "1" })
	if !regexp.MustCompile(`(?m)^omnipd_client_write_timeouts_total 1$`).MatchString(scrape(t, m)) {
		t.Errorf("the dropped client is not counted in omnipd_client_write_timeouts_total")
	}
	// Its place (of one) is free again.
	ctx, cancel := context.WithTimeout(t.Context(), ioGuard)
	defer cancel()
	go func() { <-ctx.Done(); c.Close() }()
	if status, _, b, err := postChat(ctx, "http://"+addr, smallChat); err != nil || status != http.StatusTooManyRequests && status != http.StatusOK {
		t.Fatalf("after the stalled client: %d %v %s", status, err, b)
	} else if status != http.StatusOK {
		t.Errorf("the stalled client still holds its place: %d %s", status, b)
	}
}

// The write deadline bounds each write, not the answer: a stream the
// client reads slowly but steadily, lasting many write timeouts, arrives
// whole, and the next request on the same connection is answered.
func TestWriteTimeoutSparesStreamsBeingRead(t *testing.T) {
	const events = 12
	addr, _ := frontDoor(t, &fakeThinker{events: events, gap: 50 * time.Millisecond, got: make(chan struct{}, 1)},
		Config{WriteTimeout: 100 * time.Millisecond}, HTTPConfig{})
	c := dial(t, addr)
	br := bufio.NewReader(c)
	body := `{"messages":[{"role":"user","content":"hello"}],"stream":true}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: omnipd\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, stream := readResponse(t, c, br)
	if n := strings.Count(stream, `"chat.completion.chunk"`); resp.StatusCode != 200 || n != events || !strings.HasSuffix(stream, "data: [DONE]\n\n") {
		t.Fatalf("a stream outlasting the write timeout: %d, %d of %d events\n%s", resp.StatusCode, n, events, stream)
	}
	// Idle past the write timeout, then one more request on the connection.
	time.Sleep(300 * time.Millisecond)
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: omnipd\r\n\r\n")
	if resp, b := readResponse(t, c, br); resp.StatusCode != 200 {
		t.Errorf("the next request on the connection: %d %s", resp.StatusCode, b)
	}
}
