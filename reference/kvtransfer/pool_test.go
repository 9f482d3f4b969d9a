package kvtransfer

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// pooled returns the consumer's idle connections to addr, oldest first.
func (c *Consumer) pooled(addr string) []net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	var conns []net.Conn
	for _, ic := range c.idle[addr] {
		conns = append(conns, ic.conn)
	}
	return conns
}

// dropConns closes the producer's end of every connection, as its idle
// bound or a restart would, and waits until it serves none.
func (p *Producer) dropConns(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	waitFor(t, "the producer to drop its connections", func() bool { return p.producerConns() == 0 })
}

// producerConns is how many connections the producer is serving.
func (p *Producer) producerConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// pullOnce exports n blocks under key and pulls them, checking the bytes.
func (r *rig) pullOnce(t *testing.T, key string, n int, seed uint64) {
	t.Helper()
	r.export(t, key, n, seed)
	dst := r.cs.allocate(t, n)
	defer r.cs.Free(dst)
	before := r.p.Stats().Completed
	if _, err := r.c.Pull(testCtx(t), r.addr, testEngine, key, dst); err != nil {
		t.Fatal(err)
	}
	checkPattern(t, r.cs, dst, seed)
	// Pull returns once its ack is sent; the producer frees on reading it.
	waitFor(t, "the producer to take the ack", func() bool { return r.p.Stats().Completed > before })
}

func TestPooledConnectionReused(t *testing.T) { forEachTransport(t, testPooledConnectionReused) }

func testPooledConnectionReused(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{prod: func(c *Config) { c.Secret = "s" }, cons: func(c *Config) { c.Secret = "s" }}))
	defer r.c.Close()
	r.pullOnce(t, "a", 3, 1)
	first := r.c.pooled(r.addr)
	if len(first) != 1 {
		t.Fatalf("%d idle connections after a pull, want 1", len(first))
	}
	// A release has a connection of its own; the next pull rides the
	// pooled one.
	r.export(t, "b", 2, 2)
	if err := r.c.ReleaseRemote(testCtx(t), r.addr, "b"); err != nil {
		t.Fatal(err)
	}
	r.pullOnce(t, "c", 4, 3)
	if got := r.c.pooled(r.addr); len(got) != 1 || got[0] != first[0] {
		t.Fatalf("idle connections %v, want the first one again %v", got, first)
	}
	// So does a push, registered before the export, and the pull after it.
	dst := r.cs.allocate(t, 2)
	defer r.cs.Free(dst)
	pushed := make(chan error, 1)
	go func() {
		_, err := r.c.Receive(testCtx(t), r.addr, testEngine, "d", dst)
		pushed <- err
	}()
	waitFor(t, "the push to wait", func() bool { return r.p.Stats().Waiting == 1 })
	if got := r.c.pooled(r.addr); len(got) != 0 {
		t.Fatalf("idle connections %v while the push waits on the pooled one", got)
	}
	r.export(t, "d", 2, 4)
	if err := <-pushed; err != nil {
		t.Fatal(err)
	}
	checkPattern(t, r.cs, dst, 4)
	r.pullOnce(t, "e", 1, 5)
	if got := r.c.pooled(r.addr); len(got) != 1 || got[0] != first[0] {
		t.Fatalf("idle connections %v, want the first one again %v", got, first)
	}
	waitFor(t, "the release's connection to close", func() bool { return r.p.producerConns() == 1 })
	waitStats(t, r.p, ProducerStats{Completed: 4, Released: 1})
}

func TestStalePooledConnectionRetried(t *testing.T) {
	forEachTransport(t, testStalePooledConnectionRetried)
}

func testStalePooledConnectionRetried(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{}))
	defer r.c.Close()
	r.pullOnce(t, "a", 2, 1)
	stale := r.c.pooled(r.addr)
	if len(stale) != 1 {
		t.Fatalf("%d idle connections, want 1", len(stale))
	}
	// The producer drops its end, as after an idle timeout or a restart;
	// the consumer has already buffered the last pull's DONE and the next
	// hello, so it notices only when its request goes unanswered.
	r.p.dropConns(t)

	r.pullOnce(t, "b", 2, 2)
	if got := r.c.pooled(r.addr); len(got) != 1 || got[0] == stale[0] {
		t.Fatalf("idle connections %v, want one fresh connection, not %v", got, stale)
	}
	waitStats(t, r.p, ProducerStats{Completed: 2})
}

func TestPoolBounded(t *testing.T) {
	c := NewConsumer(Config{MaxIdleConns: 2}, newSlabStore(16, 1))
	defer c.Close()
	var peers []net.Conn
	for range 4 {
		a, b := net.Pipe()
		defer b.Close()
		peers = append(peers, b)
		c.put("p:1", newFrameConn(a), true)
	}
	if n := c.IdleConns(); n != 2 {
		t.Fatalf("%d idle connections, want the bound, 2", n)
	}
	// The ones beyond the bound are closed: their peers read EOF.
	for i, b := range peers[2:] {
		b.SetReadDeadline(time.Now().Add(testIOTimeout))
		if _, err := b.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("connection %d beyond the bound: read %v, want EOF (closed)", i+2, err)
		}
	}

	off := NewConsumer(Config{MaxIdleConns: -1}, newSlabStore(16, 1))
	a, b := net.Pipe()
	defer b.Close()
	off.put("p:1", newFrameConn(a), true)
	if n := off.IdleConns(); n != 0 {
		t.Fatalf("reuse off: %d idle connections, want 0", n)
	}
}

func TestIdleConnectionsClosed(t *testing.T) { forEachTransport(t, testIdleConnectionsClosed) }

func testIdleConnectionsClosed(t *testing.T, tr transport) {
	checkGoroutines(t)
	t.Run("on Close", func(t *testing.T) {
		r := newRig(t, tr.opts(rigOpts{}))
		r.pullOnce(t, "a", 2, 1)
		if n := r.c.IdleConns(); n != 1 {
			t.Fatalf("%d idle connections, want 1", n)
		}
		r.c.Close()
		if n := r.c.IdleConns(); n != 0 {
			t.Fatalf("%d idle connections after Close, want 0", n)
		}
		waitFor(t, "the producer to see the close", func() bool { return r.p.producerConns() == 0 })
		// Still usable, without pooling.
		r.pullOnce(t, "b", 2, 2)
		if n := r.c.IdleConns(); n != 0 {
			t.Fatalf("%d idle connections after Close and a pull, want 0", n)
		}
	})
	t.Run("after the idle timeout", func(t *testing.T) {
		r := newRig(t, tr.opts(rigOpts{cons: func(c *Config) { c.IdleTimeout = 20 * time.Millisecond }}))
		defer r.c.Close()
		r.pullOnce(t, "a", 2, 1)
		waitFor(t, "the idle connection to time out", func() bool { return r.c.IdleConns() == 0 })
		waitFor(t, "the producer to see the close", func() bool { return r.p.producerConns() == 0 })
	})
}

// TestAuthPerRequestOnReusedConnection: every request on a kept connection
// answers a fresh nonce, so a proof recorded for an earlier hello is refused.
func TestAuthPerRequestOnReusedConnection(t *testing.T) {
	forEachTransport(t, testAuthPerRequestOnReusedConnection)
}

func testAuthPerRequestOnReusedConnection(t *testing.T, tr transport) {
	checkGoroutines(t)
	const secret = "s3cret"
	r := newRig(t, tr.opts(rigOpts{prod: func(c *Config) { c.Secret = secret }}))
	r.export(t, "a", 1, 1)
	r.export(t, "b", 1, 2)

	conn, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testIOTimeout))
	release := func(key string, serverNonce []byte) requestMsg {
		req := requestMsg{Op: opRelease, Key: key, Nonce: bytes.Repeat([]byte{7}, nonceLen)}
		req.MAC = consumerMAC(secret, serverNonce, &req)
		return req
	}

	var h1 helloMsg
	if err := readJSON(conn, frameHello, &h1); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(conn, frameRequest, release("a", h1.Nonce)); err != nil {
		t.Fatal(err)
	}
	var acc acceptMsg
	if err := readJSON(conn, frameAccept, &acc); err != nil {
		t.Fatalf("first request: %v", err)
	}
	var h2 helloMsg
	if err := readJSON(conn, frameHello, &h2); err != nil {
		t.Fatalf("no second hello on the kept connection: %v", err)
	}
	if bytes.Equal(h1.Nonce, h2.Nonce) {
		t.Fatal("the second hello repeats the first nonce")
	}
	// A proof made for the first nonce: refused, and the connection ends.
	if err := writeJSON(conn, frameRequest, release("b", h1.Nonce)); err != nil {
		t.Fatal(err)
	}
	if err := readJSON(conn, frameAccept, &acc); !errors.Is(err, ErrAuth) {
		t.Fatalf("stale proof: err = %v, want ErrAuth", err)
	}
	if _, _, err := readFrame(conn); !errors.Is(err, io.EOF) {
		t.Fatalf("after a refusal: %v, want the producer to close", err)
	}
	wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 1, Released: 1})
}
