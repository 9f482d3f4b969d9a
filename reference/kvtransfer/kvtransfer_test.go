package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
)

const (
	testEngine    = "prefill-0"
	testShape     = "layers=2 kv_heads=2 head_dim=8 block=16"
	testLease     = time.Minute
	testIOTimeout = 5 * time.Second
)

// rig is one producer and one consumer on loopback, each with its own store.
type rig struct {
	p     *Producer
	ps    *slabStore
	c     *Consumer
	cs    *slabStore
	clock *fakeClock
	addr  string
}

type rigOpts struct {
	blockBytes, blocks int
	prod, cons         func(*Config)
	consBlockBytes     int  // when set, the consumer's blocks differ in size
	shared             bool // the producer's blocks live in shared memory
}

// transport is one way blocks travel between a producer and a consumer: the
// behaviour tests run once per transport, and must hold on each.
type transport struct {
	name   string
	shared bool
	ticket bool // copies on the producer's tickets (benchmarks only)
}

func (tr transport) opts(o rigOpts) rigOpts {
	o.shared = tr.shared
	return o
}

var transports = []transport{{name: "tcp"}, {name: "shm", shared: true}}

// forEachTransport runs test as a subtest (or sub-benchmark) per transport.
func forEachTransport[T interface {
	testing.TB
	Run(string, func(T)) bool
}](tb T, test func(T, transport)) {
	for _, tr := range transports {
		tb.Run(tr.name, func(tb T) {
			if tr.shared && runtime.GOOS != "linux" {
				tb.Skip("shared memory is Linux-only")
			}
			test(tb, tr)
		})
	}
}

func newRig(t *testing.T, o rigOpts) *rig {
	t.Helper()
	if o.blockBytes == 0 {
		o.blockBytes = 4096
	}
	if o.blocks == 0 {
		o.blocks = 64
	}
	if o.consBlockBytes == 0 {
		o.consBlockBytes = o.blockBytes
	}
	clock := newFakeClock()
	pcfg := Config{EngineID: testEngine, Shape: testShape, LeaseDuration: testLease, IOTimeout: testIOTimeout, Clock: clock.Now, Logger: testLogger(t)}
	ccfg := Config{EngineID: "decode-0", Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}
	if o.prod != nil {
		o.prod(&pcfg)
	}
	if o.cons != nil {
		o.cons(&ccfg)
	}
	ps := newSlabStore(o.blockBytes, o.blocks)
	if o.shared {
		ps = newSharedSlabStore(t, o.blockBytes, o.blocks)
	}
	cs := newSlabStore(o.consBlockBytes, o.blocks)
	cs.descending = true
	p, err := NewProducer(pcfg, ps)
	if err != nil {
		t.Fatal(err)
	}
	c := NewConsumer(ccfg, cs)
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := ps.inUse(); n != 0 {
			t.Errorf("producer store has %d blocks in use after Close", n)
		}
		c.Close()
		// Every transfer of this consumer took the path under test, and
		// its mappings are gone with it.
		st := c.Stats()
		if o.shared && st.StreamedTransfers != 0 || !o.shared && st.SharedTransfers != 0 {
			t.Errorf("consumer stats %+v: a transfer took the other path", st)
		}
		if st.MappedRegions != 0 {
			t.Errorf("consumer still maps %d regions after Close", st.MappedRegions)
		}
	})
	return &rig{p: p, ps: ps, c: c, cs: cs, clock: clock, addr: p.Addr().String()}
}

// export allocates n producer blocks, fills them from seed and exports them.
func (r *rig) export(t *testing.T, key string, n int, seed uint64) []int {
	t.Helper()
	src := r.ps.allocate(t, n)
	fill(r.ps, src, seed)
	if err := r.p.Export(key, src, n*16-3); err != nil {
		t.Fatal(err)
	}
	return src
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantStats(t *testing.T, p *Producer, want ProducerStats) {
	t.Helper()
	if got := p.Stats(); got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}
}

// waitStats waits, bounded, for the producer's stats to become want: a
// transfer returns once its ack is sent, and the producer frees on reading it.
func waitStats(t *testing.T, p *Producer, want ProducerStats) {
	t.Helper()
	waitFor(t, fmt.Sprintf("stats %+v", want), func() bool { return p.Stats() == want })
}

func TestPullRoundTrip(t *testing.T) { forEachTransport(t, testPullRoundTrip) }

func testPullRoundTrip(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{}))
	ctx := testCtx(t)
	src := r.export(t, "req-1", 4, 1)
	wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 4})

	dst := r.cs.allocate(t, 4)
	if fmt.Sprint(src) == fmt.Sprint(dst) {
		t.Fatalf("test wants different ids on each side, both are %v", src)
	}
	n, err := r.c.Pull(ctx, r.addr, testEngine, "req-1", dst)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4*16-3 {
		t.Errorf("numTokens = %d, want %d", n, 4*16-3)
	}
	checkPattern(t, r.cs, dst, 1)
	// Pull returns once its ack is sent; the producer frees on reading it.
	waitFor(t, "the producer to free the pulled blocks", func() bool { return r.ps.inUse() == 0 })
	waitStats(t, r.p, ProducerStats{Completed: 1})

	_, err = r.c.Pull(ctx, r.addr, testEngine, "req-1", dst)
	if !errors.Is(err, ErrUnknownTransfer) {
		t.Fatalf("second pull: err = %v, want ErrUnknownTransfer", err)
	}
	r.cs.Free(dst)
}

func TestPushDecodeArrivesFirst(t *testing.T) { forEachTransport(t, testPushDecodeArrivesFirst) }

func testPushDecodeArrivesFirst(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{prod: func(c *Config) { c.Secret = "s3cret" }, cons: func(c *Config) { c.Secret = "s3cret" }}))
	ctx := testCtx(t)
	dst := r.cs.allocate(t, 3)
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := r.c.Receive(ctx, r.addr, testEngine, "xfer-1", dst)
		done <- result{n, err}
	}()
	waitFor(t, "the consumer to register", func() bool { return r.p.Stats().Waiting == 1 })
	r.export(t, "xfer-1", 3, 2)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.n != 3*16-3 {
		t.Errorf("numTokens = %d", res.n)
	}
	checkPattern(t, r.cs, dst, 2)
	waitStats(t, r.p, ProducerStats{Completed: 1})
	r.cs.Free(dst)
}

func TestPushPrefillExportsFirst(t *testing.T) { forEachTransport(t, testPushPrefillExportsFirst) }

func testPushPrefillExportsFirst(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{}))
	r.export(t, "xfer-2", 5, 3)
	dst := r.cs.allocate(t, 5)
	if _, err := r.c.Receive(testCtx(t), r.addr, testEngine, "xfer-2", dst); err != nil {
		t.Fatal(err)
	}
	checkPattern(t, r.cs, dst, 3)
	waitStats(t, r.p, ProducerStats{Completed: 1})
	r.cs.Free(dst)
}

func TestConcurrentTransfers(t *testing.T) { forEachTransport(t, testConcurrentTransfers) }

func testConcurrentTransfers(t *testing.T, tr transport) {
	checkGoroutines(t)
	const transfers, per = 50, 3
	// 2*transfers: every transfer once by pull and once by push.
	r := newRig(t, tr.opts(rigOpts{blockBytes: 64 << 10, blocks: 2 * transfers * per, prod: func(c *Config) { c.Secret = "k" }, cons: func(c *Config) { c.Secret = "k" }}))
	ctx := testCtx(t)

	var wg sync.WaitGroup
	errs := make(chan error, 2*transfers)
	dsts := make([][]int, 2*transfers)
	for i := range 2 * transfers {
		dsts[i] = r.cs.allocate(t, per)
	}
	for i := range transfers {
		key := fmt.Sprintf("pull-%d", i)
		r.export(t, key, per, uint64(i))
		wg.Go(func() {
			if _, err := r.c.Pull(ctx, r.addr, testEngine, key, dsts[i]); err != nil {
				errs <- err
			}
		})
	}
	for i := transfers; i < 2*transfers; i++ {
		key := fmt.Sprintf("push-%d", i)
		wg.Go(func() {
			if _, err := r.c.Receive(ctx, r.addr, testEngine, key, dsts[i]); err != nil {
				errs <- err
			}
		})
		// Exports race the registrations: some pushes find their key
		// exported, others wait for it.
		r.export(t, key, per, uint64(i))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	for i := range 2 * transfers {
		checkPattern(t, r.cs, dsts[i], uint64(i))
		r.cs.Free(dsts[i])
	}
	waitStats(t, r.p, ProducerStats{Completed: 2 * transfers})
	if u := r.ps.inUse(); u != 0 {
		t.Errorf("producer holds %d blocks", u)
	}
}

func TestLeaseExpiry(t *testing.T) { forEachTransport(t, testLeaseExpiry) }

func testLeaseExpiry(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{}))
	r.export(t, "req-exp", 4, 4)
	r.clock.Advance(testLease - time.Nanosecond)
	r.p.ExpireNow()
	wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 4})

	r.clock.Advance(time.Nanosecond)
	r.p.ExpireNow() // the background sweep may have won; the counters say what happened
	wantStats(t, r.p, ProducerStats{Expired: 1})
	if u := r.ps.inUse(); u != 0 {
		t.Fatalf("expired lease left %d blocks in use", u)
	}
	dst := r.cs.allocate(t, 4)
	if _, err := r.c.Pull(testCtx(t), r.addr, testEngine, "req-exp", dst); !errors.Is(err, ErrUnknownTransfer) {
		t.Fatalf("pull after expiry: err = %v, want ErrUnknownTransfer", err)
	}
	r.cs.Free(dst)
}

func TestRelease(t *testing.T) { forEachTransport(t, testRelease) }

func testRelease(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{}))
	r.export(t, "req-rel", 2, 5)
	if !r.p.Release("req-rel") {
		t.Fatal("Release of a leased key = false")
	}
	if r.p.Release("req-rel") {
		t.Fatal("second Release = true")
	}
	wantStats(t, r.p, ProducerStats{Released: 1})
	if u := r.ps.inUse(); u != 0 {
		t.Fatalf("released lease left %d blocks in use", u)
	}
}

func TestReleaseRemote(t *testing.T) { forEachTransport(t, testReleaseRemote) }

func testReleaseRemote(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{prod: func(c *Config) { c.Secret = "k" }, cons: func(c *Config) { c.Secret = "k" }}))
	ctx := testCtx(t)
	r.export(t, "req-rr", 2, 6)
	if err := r.c.ReleaseRemote(ctx, r.addr, "req-rr"); err != nil {
		t.Fatal(err)
	}
	wantStats(t, r.p, ProducerStats{Released: 1})
	if u := r.ps.inUse(); u != 0 {
		t.Fatalf("released lease left %d blocks in use", u)
	}
	if err := r.c.ReleaseRemote(ctx, r.addr, "req-rr"); !errors.Is(err, ErrUnknownTransfer) {
		t.Fatalf("second ReleaseRemote: err = %v, want ErrUnknownTransfer", err)
	}
	// Release is authenticated like everything else.
	r.export(t, "req-rr2", 1, 7)
	stranger := NewConsumer(Config{Secret: "wrong", IOTimeout: testIOTimeout}, r.cs)
	if err := stranger.ReleaseRemote(ctx, r.addr, "req-rr2"); !errors.Is(err, ErrAuth) {
		t.Fatalf("ReleaseRemote with a wrong secret: err = %v, want ErrAuth", err)
	}
	wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 1, Released: 1})
}

// TestRefusals: every refusal names its class, leaves the producer's lease
// intact (no lost blocks, no premature free) and writes nothing into dst.
func TestRefusals(t *testing.T) { forEachTransport(t, testRefusals) }

func testRefusals(t *testing.T, tr transport) {
	secret := func(s string) func(*Config) { return func(c *Config) { c.Secret = s } }
	tests := []struct {
		name      string
		o         rigOpts
		push      bool
		engine    string
		key       string
		dstBlocks int
		want      error
	}{
		{name: "unknown key", key: "nope", want: ErrUnknownTransfer},
		{name: "wrong engine id", engine: "prefill-9", want: ErrEngineMismatch},
		{name: "wrong engine id, push", push: true, engine: "prefill-9", want: ErrEngineMismatch},
		{name: "wrong secret", o: rigOpts{prod: secret("a"), cons: secret("b")}, want: ErrAuth},
		{name: "no secret when required", o: rigOpts{prod: secret("a")}, want: ErrAuth},
		{name: "producer cannot prove the secret", o: rigOpts{cons: secret("a")}, want: ErrAuth},
		{name: "shape mismatch", o: rigOpts{cons: func(c *Config) { c.Shape = "layers=3" }}, want: ErrShape},
		{name: "block size mismatch", o: rigOpts{consBlockBytes: 2048}, want: ErrShape},
		{name: "block count mismatch", dstBlocks: 3, want: ErrBlockCount},
		{name: "block count mismatch, push", push: true, dstBlocks: 5, want: ErrBlockCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkGoroutines(t)
			r := newRig(t, tr.opts(tt.o))
			r.export(t, "req", 4, 8)
			engine, key, n := testEngine, "req", 4
			if tt.engine != "" {
				engine = tt.engine
			}
			if tt.key != "" {
				key = tt.key
			}
			if tt.dstBlocks != 0 {
				n = tt.dstBlocks
			}
			dst := r.cs.allocate(t, n)
			fetch := r.c.Pull
			if tt.push {
				fetch = r.c.Receive
			}
			_, err := fetch(testCtx(t), r.addr, engine, key, dst)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			t.Log(err)
			// The producer may still be letting go of the connection (when
			// the consumer is the one refusing, after the stream started).
			waitFor(t, "the lease to be idle again", func() bool { s := r.p.Stats(); return s.Streaming == 0 && s.Waiting == 0 })
			wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 4})
			for _, id := range dst {
				for _, b := range r.cs.Block(id) {
					if b != 0 {
						t.Fatalf("refused transfer wrote into dst block %d", id)
					}
				}
			}
			r.cs.Free(dst)
			if !r.p.Release("req") {
				t.Fatal("lease gone after a refusal")
			}
			if u := r.ps.inUse(); u != 0 {
				t.Fatalf("%d blocks in use after release", u)
			}
		})
	}
}

// cancelAtBlock makes the consumer's store cancel ctx when the consumer asks
// for the view of its k-th destination block, i.e. mid-stream.
func cancelAtBlock(s *slabStore, k int, cancel context.CancelFunc) {
	var mu sync.Mutex
	calls := 0
	s.onBlock = func(int) {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == k {
			cancel()
		}
	}
}

func TestCancelMidTransfer(t *testing.T) { forEachTransport(t, testCancelMidTransfer) }

func testCancelMidTransfer(t *testing.T, tr transport) {
	checkGoroutines(t)
	const blocks = 48 // 48 MiB: far more than the loopback socket buffers hold
	for _, end := range []string{"release", "expiry", "retry"} {
		t.Run(end, func(t *testing.T) {
			r := newRig(t, tr.opts(rigOpts{blockBytes: 1 << 20, blocks: blocks}))
			r.export(t, "big", blocks, 9)
			dst := r.cs.allocate(t, blocks)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			cancelAtBlock(r.cs, 3, cancel)
			start := time.Now()
			_, err := r.c.Pull(ctx, r.addr, testEngine, "big", dst)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			// Prompt means well before any IO timeout would have fired.
			if d := time.Since(start); d >= testIOTimeout {
				t.Fatalf("cancelled pull took %v", d)
			}
			r.cs.onBlock = nil
			// The lease survives the cancelled stream, whether or not the
			// producer has noticed yet.
			if s := r.p.Stats(); s.LeasedTransfers != 1 || s.LeasedBlocks != blocks || s.Completed+s.Released+s.Expired != 0 {
				t.Fatalf("stats after cancel = %+v, want the lease of %d blocks intact", s, blocks)
			}

			switch end {
			case "release":
				if !r.p.Release("big") {
					t.Fatal("Release = false after a cancelled pull")
				}
				waitFor(t, "the blocks to be freed", func() bool { return r.ps.inUse() == 0 })
				wantStats(t, r.p, ProducerStats{Released: 1})
			case "expiry":
				r.clock.Advance(testLease)
				// Expiry skips a lease still streaming; it is idle again once
				// the producer notices the consumer left.
				waitFor(t, "the lease to expire", func() bool { r.p.ExpireNow(); return r.p.Stats().Expired == 1 })
				wantStats(t, r.p, ProducerStats{Expired: 1})
				if u := r.ps.inUse(); u != 0 {
					t.Fatalf("%d blocks in use after expiry", u)
				}
			case "retry":
				var err error
				waitFor(t, "a retry to succeed", func() bool {
					_, err = r.c.Pull(testCtx(t), r.addr, testEngine, "big", dst)
					if err != nil && !errors.Is(err, ErrBusy) {
						t.Fatalf("retry: %v", err)
					}
					return err == nil
				})
				checkPattern(t, r.cs, dst, 9)
				waitStats(t, r.p, ProducerStats{Completed: 1})
			}
			r.cs.Free(dst)
		})
	}
}

// stalledPull starts a pull of key by a second consumer whose store blocks
// inside its first destination block until unstall is called, so the producer
// is left mid-stream. It returns once the stall has begun.
func stalledPull(t *testing.T, ctx context.Context, r *rig, key string, blocks int) (unstall func(), done <-chan error) {
	t.Helper()
	s := newSlabStore(r.ps.bb, blocks)
	stall, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.onBlock = func(int) { once.Do(func() { close(stall); <-release }) }
	c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout}, s)
	t.Cleanup(func() { c.Close() })
	dst := s.allocate(t, blocks)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, r.addr, testEngine, key, dst)
		errc <- err
	}()
	select {
	case <-stall:
	case err := <-errc:
		t.Fatalf("stalled pull ended early: %v", err)
	}
	waitFor(t, "the producer to stream", func() bool { return r.p.Stats().Streaming == 1 })
	return sync.OnceFunc(func() { close(release) }), errc
}

// TestBusyAndHandOver: while one consumer holds a stream, a pull is refused as
// busy and a push waits; when the first consumer gives up, the waiting push
// gets the blocks.
func TestBusyAndHandOver(t *testing.T) { forEachTransport(t, testBusyAndHandOver) }

func testBusyAndHandOver(t *testing.T, tr transport) {
	checkGoroutines(t)
	const blocks = 16
	r := newRig(t, tr.opts(rigOpts{blockBytes: 1 << 20, blocks: blocks}))
	r.export(t, "k", blocks, 10)
	ctx := testCtx(t)
	aCtx, aCancel := context.WithCancel(ctx)
	unstall, aDone := stalledPull(t, aCtx, r, "k", blocks)
	defer unstall()

	dst := r.cs.allocate(t, blocks)
	if _, err := r.c.Pull(ctx, r.addr, testEngine, "k", dst); !errors.Is(err, ErrBusy) {
		t.Fatalf("pull during another stream: err = %v, want ErrBusy", err)
	}
	pushDone := make(chan error, 1)
	go func() {
		_, err := r.c.Receive(ctx, r.addr, testEngine, "k", dst)
		pushDone <- err
	}()
	waitFor(t, "the push to wait", func() bool { return r.p.Stats().Waiting == 1 })

	aCancel()
	unstall()
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("stalled consumer: err = %v, want context.Canceled", err)
	}
	if err := <-pushDone; err != nil {
		t.Fatalf("waiting push after hand-over: %v", err)
	}
	checkPattern(t, r.cs, dst, 10)
	waitStats(t, r.p, ProducerStats{Completed: 1})
	r.cs.Free(dst)
}

// TestReleaseAbortsStream: Release of a lease being streamed cuts the stream
// (the consumer gets an error, never a partial success) and frees the blocks
// once the stream has let go of them.
func TestReleaseAbortsStream(t *testing.T) { forEachTransport(t, testReleaseAbortsStream) }

func testReleaseAbortsStream(t *testing.T, tr transport) {
	checkGoroutines(t)
	const blocks = 16
	r := newRig(t, tr.opts(rigOpts{blockBytes: 1 << 20, blocks: blocks}))
	r.export(t, "k", blocks, 13)
	unstall, done := stalledPull(t, testCtx(t), r, "k", blocks)
	defer unstall()
	if !r.p.Release("k") {
		t.Fatal("Release of a streaming lease = false")
	}
	// The stream lets go of the blocks as soon as its connection is cut,
	// before the stalled consumer goes on: then a copy out of shared
	// memory finds their generations moved.
	waitFor(t, "the blocks to be freed", func() bool { return r.ps.inUse() == 0 })
	unstall()
	if err := <-done; err == nil {
		t.Fatal("pull of a released lease succeeded")
	}
	wantStats(t, r.p, ProducerStats{Released: 1})
}

func TestReceiveCancelledWhileWaiting(t *testing.T) {
	forEachTransport(t, testReceiveCancelledWhileWaiting)
}

func testReceiveCancelledWhileWaiting(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{}))
	dst := r.cs.allocate(t, 2)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := r.c.Receive(ctx, r.addr, testEngine, "later", dst)
		done <- err
	}()
	waitFor(t, "the consumer to register", func() bool { return r.p.Stats().Waiting == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	waitFor(t, "the producer to drop the waiter", func() bool { return r.p.Stats().Waiting == 0 })
	// The prefill finishes after the decode gave up: the lease holds the
	// blocks until it expires.
	r.export(t, "later", 2, 11)
	r.clock.Advance(testLease)
	r.p.ExpireNow()
	wantStats(t, r.p, ProducerStats{Expired: 1})
	r.cs.Free(dst)
}

func TestPushWaitIsBounded(t *testing.T) { forEachTransport(t, testPushWaitIsBounded) }

func testPushWaitIsBounded(t *testing.T, tr transport) {
	checkGoroutines(t)
	// A real clock and a short lease: the producer stops waiting for an
	// export after one lease duration and says so.
	r := newRig(t, tr.opts(rigOpts{prod: func(c *Config) { c.LeaseDuration = 50 * time.Millisecond; c.Clock = nil }}))
	dst := r.cs.allocate(t, 2)
	if _, err := r.c.Receive(testCtx(t), r.addr, testEngine, "never", dst); !errors.Is(err, ErrUnknownTransfer) {
		t.Fatalf("err = %v, want ErrUnknownTransfer", err)
	}
	wantStats(t, r.p, ProducerStats{})
	r.cs.Free(dst)
}

func TestCloseFreesLeases(t *testing.T) { forEachTransport(t, testCloseFreesLeases) }

func testCloseFreesLeases(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{blockBytes: 1 << 20, blocks: 32})) // the streamed lease must not fit in socket buffers
	for i := range 3 {
		r.export(t, fmt.Sprintf("k%d", i), 2, uint64(i))
	}
	dst := r.cs.allocate(t, 2)
	done := make(chan error, 1)
	go func() {
		_, err := r.c.Receive(testCtx(t), r.addr, testEngine, "waiting", dst)
		done <- err
	}()
	waitFor(t, "the consumer to register", func() bool { return r.p.Stats().Waiting == 1 })
	r.export(t, "streaming", 16, 3)
	unstall, pullDone := stalledPull(t, testCtx(t), r, "streaming", 16)
	defer unstall()
	if err := r.p.Close(); err != nil {
		t.Fatal(err)
	}
	if u := r.ps.inUse(); u != 0 {
		t.Fatalf("%d blocks in use after Close", u)
	}
	wantStats(t, r.p, ProducerStats{Released: 4})
	if err := <-done; err == nil {
		t.Fatal("waiting push succeeded after Close")
	}
	unstall()
	if err := <-pullDone; err == nil {
		t.Fatal("pull cut by Close succeeded")
	}
	src := r.ps.allocate(t, 1)
	if err := r.p.Export("after", src, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Export after Close: err = %v, want ErrClosed", err)
	}
	r.ps.Free(src)
	if err := r.p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	r.cs.Free(dst)
}

func TestExportInvalid(t *testing.T) { forEachTransport(t, testExportInvalid) }

func testExportInvalid(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{blocks: 8}))
	held := r.ps.allocate(t, 4)
	if err := r.p.Export("ok", held[:2], 20); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		key    string
		blocks []int
		tokens int
	}{
		{"empty key", "", held[2:], 1},
		{"no blocks", "k", nil, 0},
		{"duplicate block", "k", []int{held[2], held[2]}, 1},
		{"block out of range", "k", []int{8}, 1},
		{"negative block", "k", []int{-1}, 1},
		{"block already leased", "k", []int{held[2], held[0]}, 1},
		{"key already exported", "ok", held[2:], 1},
		{"negative tokens", "k", held[2:], -1},
	}
	for _, tt := range tests {
		if err := r.p.Export(tt.key, tt.blocks, tt.tokens); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tt.name, err)
		}
	}
	wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 2})
	r.ps.Free(held[2:]) // refused exports left them with the caller
	if _, err := NewProducer(Config{}, r.ps); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewProducer without EngineID: err = %v, want ErrInvalid", err)
	}
	if _, err := r.c.Pull(testCtx(t), r.addr, testEngine, "ok", []int{1, 1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Pull into duplicate dst ids: err = %v, want ErrInvalid", err)
	}
}

// TestCacheStore moves blocks between two real kvcache.Caches and checks
// every key and value float; with shared memory, the producer's cache lives
// in a region, as a worker's does.
func TestCacheStore(t *testing.T) { forEachTransport(t, testCacheStore) }

func testCacheStore(t *testing.T, tr transport) {
	checkGoroutines(t)
	shape := kvcache.Shape{Layers: 2, KVHeads: 2, HeadDim: 8, BlockSize: 4}
	pc, err := kvcache.New(shape, 8)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := kvcache.New(shape, 8)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{EngineID: testEngine, Shape: fmt.Sprint(shape), IOTimeout: testIOTimeout, Logger: testLogger(t)}
	store := CacheStore(pc)
	if tr.shared {
		m, err := NewSharedMemory(8 * shape.BlockBytes())
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := pc.MoveTo(m.Float32s()); err != nil {
			t.Fatal(err)
		}
		store = SharedCacheStore(pc, m)
	}
	p, err := NewProducer(cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	const tokens = 10
	src, err := pc.Allocate(shape.BlocksFor(tokens))
	if err != nil {
		t.Fatal(err)
	}
	val := func(pos, layer, i int, v bool) float32 {
		f := float32(pos*1000+layer*100+i) + 0.25
		if v {
			return -f
		}
		return f
	}
	for pos := range tokens {
		for layer := range shape.Layers {
			b, s := pc.Position(src, pos)
			for i := range pc.K(b, layer, s) {
				pc.K(b, layer, s)[i] = val(pos, layer, i, false)
				pc.V(b, layer, s)[i] = val(pos, layer, i, true)
			}
		}
	}
	if err := p.Export("req-cache", src, tokens); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Allocate(3); err != nil { // so dst ids differ from src ids
		t.Fatal(err)
	}
	dst, err := dc.Allocate(len(src))
	if err != nil {
		t.Fatal(err)
	}
	c := NewConsumer(cfg, CacheStore(dc))
	defer c.Close()
	n, err := c.Pull(testCtx(t), p.Addr().String(), testEngine, "req-cache", dst)
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); tr.shared && st.SharedTransfers != 1 || !tr.shared && st.StreamedTransfers != 1 {
		t.Errorf("consumer stats %+v: the pull took the other path", st)
	}
	if n != tokens {
		t.Errorf("numTokens = %d, want %d", n, tokens)
	}
	for pos := range tokens {
		for layer := range shape.Layers {
			b, s := dc.Position(dst, pos)
			for i := range dc.K(b, layer, s) {
				if k, v := dc.K(b, layer, s)[i], dc.V(b, layer, s)[i]; k != val(pos, layer, i, false) || v != val(pos, layer, i, true) {
					t.Fatalf("pos %d layer %d [%d]: k=%v v=%v", pos, layer, i, k, v)
				}
			}
		}
	}
	waitFor(t, "the producer to free the pulled blocks", func() bool { return pc.Used() == 0 })
}

// dialRaw connects to a producer by hand and reads its hello; the
// connection closes when the test ends.
func dialRaw(t *testing.T, addr string) (net.Conn, helloMsg) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(testIOTimeout))
	var h helloMsg
	if err := readJSON(conn, frameHello, &h); err != nil {
		t.Fatal(err)
	}
	return conn, h
}

// rawSession speaks the protocol by hand up to the producer's answer to req.
func rawSession(t *testing.T, addr string, req requestMsg) (typ byte, payload []byte) {
	t.Helper()
	conn, _ := dialRaw(t, addr)
	defer conn.Close()
	req.Nonce = make([]byte, nonceLen)
	if err := writeJSON(conn, frameRequest, req); err != nil {
		t.Fatal(err)
	}
	typ, payload, err := readFrame(conn)
	if err != nil {
		t.Fatal(err)
	}
	return typ, payload
}

func TestProtocolAbuse(t *testing.T) { forEachTransport(t, testProtocolAbuse) }

func testProtocolAbuse(t *testing.T, tr transport) {
	checkGoroutines(t)
	r := newRig(t, tr.opts(rigOpts{prod: func(c *Config) { c.IOTimeout = 200 * time.Millisecond }}))
	r.export(t, "req", 2, 12)

	t.Run("foreign byte order", func(t *testing.T) {
		other := "big"
		if nativeByteOrder() == "big" {
			other = "little"
		}
		typ, payload := rawSession(t, r.addr, requestMsg{Op: opPull, Key: "req", EngineID: testEngine, Blocks: 2,
			BlockBytes: r.ps.bb, Shape: testShape, ByteOrder: other})
		if typ != frameError {
			t.Fatalf("frame type %d, want error", typ)
		}
		if err := refusalFrom(payload); !errors.Is(err, ErrShape) {
			t.Fatalf("err = %v, want ErrShape", err)
		}
	})
	t.Run("unknown op", func(t *testing.T) {
		typ, payload := rawSession(t, r.addr, requestMsg{Op: "steal", Key: "req"})
		if err := refusalFrom(payload); typ != frameError || !errors.Is(err, ErrProtocol) {
			t.Fatalf("type %d err = %v, want ErrProtocol", typ, err)
		}
	})
	// Each of these must end with the producer closing the connection,
	// bounded by its IO timeout, without a panic.
	for name, send := range map[string][]byte{
		"garbage":         []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"oversized frame": {'O', 'K', 'V', 'T', version, frameRequest, 0, 0, 0xff, 0xff, 0xff, 0xff},
		"wrong version":   {'O', 'K', 'V', 'T', 9, frameRequest, 0, 0, 0, 0, 0, 0},
		"silence":         nil,
		"half a header":   {'O', 'K'},
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", r.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(testIOTimeout))
			if _, err := conn.Write(send); err != nil {
				t.Fatal(err)
			}
			// EOF or a reset (unread garbage) both mean closed; only our
			// own deadline firing means the producer kept it open.
			if _, err := io.Copy(io.Discard, conn); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("producer did not close the connection: %v", err)
				}
			}
		})
	}
	wantStats(t, r.p, ProducerStats{LeasedTransfers: 1, LeasedBlocks: 2})
}
