package kvtransfer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Consumer is the decode side. Between pulls it keeps finished connections
// idle, per producer address, for the next pull: a pull on a pooled
// connection skips the dial and the hello's round trip, which on a short
// prompt is a large part of its cost. It also keeps, per producer address,
// the mapping of the producer's shared memory when the producer is on this
// host. The only goroutines it starts are the senders of the
// notifications that free leases it copied on their tickets, one per
// producer while there is something to send (an idle connection's timeout
// is a timer). Close sends what is queued, closes the idle connections and
// lets go of the mappings.
type Consumer struct {
	cfg   Config
	store BlockStore
	log   *slog.Logger

	shared, streamed atomic.Uint64 // completed transfers, for Stats
	ticketed         atomic.Uint64 // of the shared ones, those on a ticket
	mapped           atomic.Int64  // live mappings of producers' regions

	mu      sync.Mutex
	closed  bool
	idle    map[string][]*idleConn // by producer address, most recently used last
	regions map[string]*peerRegion // by producer address: the region it last advertised
	// notifies holds, per producer address, the leases copied on their
	// tickets that the producer has yet to hear about; each has a sender
	// in senders while it is there.
	notifies map[string]*notifyQueue
	senders  sync.WaitGroup
	done     chan struct{} // closed by Close: senders flush and end

	// afterSharedCopy, when set (by tests, before use), runs between the
	// copy out of a producer's region and the check of its generations.
	afterSharedCopy func()
}

// ConsumerStats counts a consumer's transfers by the way their blocks came.
type ConsumerStats struct {
	SharedTransfers   uint64 // copied from a producer's shared memory
	TicketTransfers   uint64 // of those, copied on a ticket without asking the producer
	StreamedTransfers uint64 // received over TCP
	MappedRegions     int    // producers' regions mapped now
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{SharedTransfers: c.shared.Load(), TicketTransfers: c.ticketed.Load(), StreamedTransfers: c.streamed.Load(), MappedRegions: int(c.mapped.Load())}
}

// idleConn is a pooled connection whose next frames are the producer's
// hello, after the DONE that ends its last pull when doneOwed.
type idleConn struct {
	conn     *frameConn
	doneOwed bool
	timer    *time.Timer // closes it after cfg.IdleTimeout unused
}

// NewConsumer makes a consumer that receives into store. cfg.Secret and
// cfg.Shape are presented to producers; cfg.IOTimeout bounds each network
// step and cfg.LeaseDuration (plus IOTimeout) bounds how long a push waits
// for the export, in addition to the caller's context. cfg.MaxIdleConns and
// cfg.IdleTimeout bound the connections it keeps for reuse.
func NewConsumer(cfg Config, store BlockStore) *Consumer {
	cfg = cfg.withDefaults()
	return &Consumer{cfg: cfg, store: store, log: cfg.Logger.With("engine_id", cfg.EngineID),
		idle: make(map[string][]*idleConn), regions: make(map[string]*peerRegion),
		notifies: make(map[string]*notifyQueue), done: make(chan struct{})}
}

// Close sends the notifications still queued (each bounded by the IO
// timeout), closes every idle connection and lets go of every producer's
// region (a transfer copying from one unmaps it when it is done). Calls in
// flight finish and close theirs; later calls still work, each on a
// connection of its own and over TCP.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if !c.closed {
		close(c.done)
	}
	c.closed = true
	idle := c.idle
	c.idle = make(map[string][]*idleConn)
	var unmap [][]byte
	for _, r := range c.regions {
		if r.refs--; r.refs == 0 {
			unmap = append(unmap, r.mem)
		}
	}
	c.regions = make(map[string]*peerRegion)
	c.mu.Unlock()
	for _, list := range idle {
		for _, ic := range list {
			ic.timer.Stop()
			ic.conn.Close()
		}
	}
	for _, mem := range unmap {
		c.unmap(mem)
	}
	c.senders.Wait()
	return nil
}

// IdleConns is how many connections wait in the pool, over all producers.
func (c *Consumer) IdleConns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, list := range c.idle {
		n += len(list)
	}
	return n
}

// get takes the most recently used idle connection to addr, if any: the
// newest is the least likely to have been closed by the producer meanwhile.
func (c *Consumer) get(addr string) (conn *frameConn, doneOwed bool) {
	c.mu.Lock()
	list := c.idle[addr]
	if len(list) == 0 {
		c.mu.Unlock()
		return nil, false
	}
	ic := list[len(list)-1]
	list[len(list)-1] = nil
	if len(list) == 1 {
		delete(c.idle, addr)
	} else {
		c.idle[addr] = list[:len(list)-1]
	}
	c.mu.Unlock()
	// If the timer fires now, it no longer finds ic in the pool and leaves
	// the connection alone.
	ic.timer.Stop()
	return ic.conn, ic.doneOwed
}

// put pools conn, whose next frames are a hello, after a DONE when
// doneOwed, or closes it when the pool for addr is full, reuse is off or
// the consumer is closed.
func (c *Consumer) put(addr string, conn *frameConn, doneOwed bool) {
	c.mu.Lock()
	if c.closed || c.cfg.MaxIdleConns < 0 || len(c.idle[addr]) >= c.cfg.MaxIdleConns {
		c.mu.Unlock()
		conn.Close()
		return
	}
	ic := &idleConn{conn: conn, doneOwed: doneOwed}
	ic.timer = time.AfterFunc(c.cfg.IdleTimeout, func() { c.expire(addr, ic) })
	c.idle[addr] = append(c.idle[addr], ic)
	c.mu.Unlock()
}

// expire drops ic from the pool and closes it, unless get took it first.
func (c *Consumer) expire(addr string, ic *idleConn) {
	c.mu.Lock()
	list := c.idle[addr]
	i := slices.Index(list, ic)
	if i < 0 {
		c.mu.Unlock()
		return
	}
	list = slices.Delete(list, i, i+1)
	if len(list) == 0 {
		delete(c.idle, addr)
	} else {
		c.idle[addr] = list
	}
	c.mu.Unlock()
	ic.conn.Close()
}

// Pull (NIXL-shaped) fetches the blocks exported under key from the producer
// at addr into dst, which must hold as many blocks as were exported, and
// returns how many token positions they hold. Success means dst holds every
// byte and the consumer has sent its acknowledgement; the producer frees its
// copies when the ack arrives (if the ack is lost, the transfer still
// succeeds here and the producer's lease expiry frees them). Pull does not
// wait for the producer's DONE that answers the ack: that is a round trip
// the decode need not wait for, so it is read by the connection's next pull.
// That holds for blocks copied out of the shared memory of a producer on
// this host too: their generation counters, read after the copy, prove that
// the producer held them until the copy was over. On any failure, including
// ctx ending mid-transfer, the producer's lease stays in place for a retry,
// a release or expiry (unless it was freed, which a copy from shared memory
// reports as ErrUnknownTransfer), and the contents of dst are undefined.
func (c *Consumer) Pull(ctx context.Context, addr, remoteEngineID, key string, dst []int) (numTokens int, err error) {
	return c.fetch(ctx, opPull, addr, remoteEngineID, key, dst)
}

// Receive (Mooncake-shaped) registers with the producer at addr for key and
// waits, until ctx ends, for the producer to export it and push the blocks
// into dst. It may be called before the prefill has run. Like Pull, it
// returns once its ack is sent.
func (c *Consumer) Receive(ctx context.Context, addr, remoteEngineID, key string, dst []int) (numTokens int, err error) {
	return c.fetch(ctx, opPush, addr, remoteEngineID, key, dst)
}

// ReleaseRemote tells the producer to drop key's lease without transferring,
// for a request cancelled between prefill and decode.
func (c *Consumer) ReleaseRemote(ctx context.Context, addr, key string) error {
	_, err := c.fetch(ctx, opRelease, addr, "", key, nil)
	return err
}

func (c *Consumer) fetch(ctx context.Context, op, addr, engineID, key string, dst []int) (n int, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("kvtransfer: %s %q from %s: %w", op, key, addr, err)
		}
	}()
	if err := checkKey(key); err != nil {
		return 0, err
	}
	if op != opRelease {
		if err := checkBlocks(c.store, dst); err != nil {
			return 0, err
		}
	}
	for retried := false; ; retried = true {
		// Pulls and pushes reuse connections, which spares both sides a
		// dial, an accept and a hello per transfer; a release runs in the
		// background, where a connection of its own costs nothing that
		// matters.
		pool := op != opRelease
		var conn *frameConn
		var doneOwed bool
		if pool && !retried {
			// A retry dials: if one pooled connection was stale, the
			// others to this producer may well be too.
			conn, doneOwed = c.get(addr)
		}
		reused := conn != nil
		if conn == nil {
			d := net.Dialer{Timeout: c.cfg.IOTimeout}
			raw, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return 0, err
			}
			conn = newFrameConn(raw)
		}
		// Closing the connection is what makes cancellation prompt: it
		// unblocks any read or write at once, and unlike a deadline it
		// cannot be undone by the next SetDeadline.
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		var next connState
		n, next, err = c.exchange(ctx, conn, addr, doneOwed, op, engineID, key, dst)
		if stop() && err == nil && next.reusable && pool {
			c.put(addr, conn, next.doneOwed)
		} else {
			conn.Close()
		}
		var st *staleError
		if err != nil && reused && !retried && errors.As(err, &st) && ctx.Err() == nil {
			// The producer closed this idle connection (restart, idle
			// timeout) before it saw our request: nothing happened on
			// its side, so a fresh connection may try again, once.
			c.log.Debug("kvtransfer: pooled connection was stale; redialing", "addr", addr, "err", err)
			continue
		}
		if err != nil && ctx.Err() != nil {
			var r *refusal
			if !errors.As(err, &r) {
				return 0, ctx.Err()
			}
		}
		return n, err
	}
}

// staleError is a failure before the producer answered a request in any
// way: on a pooled connection, the sign that the producer had closed it.
type staleError struct{ err error }

func (e *staleError) Error() string { return e.err.Error() }
func (e *staleError) Unwrap() error { return e.err }

// closedByPeer reports whether err is the peer's close rather than a
// timeout, a protocol error or a refusal.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// connState is what a connection is good for after a request on it.
type connState struct {
	// reusable: the request completed, and the producer's next frames are
	// (when doneOwed) that request's DONE, then a fresh hello, so the
	// connection may be pooled.
	reusable, doneOwed bool
}

// exchange runs one request on conn. doneOwed means conn comes from the
// pool with the DONE of its previous pull still unread. addr keys the
// producer's shared memory.
func (c *Consumer) exchange(ctx context.Context, conn *frameConn, addr string, doneOwed bool, op, engineID, key string, dst []int) (int, connState, error) {
	var next connState
	n, err := c.exchange1(ctx, conn, addr, doneOwed, op, engineID, key, dst, &next)
	return n, next, err
}

func (c *Consumer) exchange1(ctx context.Context, conn *frameConn, addr string, doneOwed bool, op, engineID, key string, dst []int, next *connState) (int, error) {
	if err := conn.SetDeadline(time.Now().Add(c.cfg.IOTimeout)); err != nil {
		return 0, err
	}
	if doneOwed {
		// Any failure here is before this request began on either side: a
		// fresh connection may try again.
		typ, _, err := readFrame(conn)
		if err == nil && typ != frameDone {
			err = fmt.Errorf("%w: got frame type %d, want the previous pull's done", ErrProtocol, typ)
		}
		if err != nil {
			return 0, fmt.Errorf("done of the previous pull: %w", &staleError{err})
		}
	}
	var h helloMsg
	if err := readJSON(conn, frameHello, &h); err != nil {
		if closedByPeer(err) {
			err = &staleError{err}
		}
		return 0, fmt.Errorf("hello: %w", err)
	}
	if len(h.Nonce) != nonceLen {
		return 0, fmt.Errorf("%w: server nonce of %d bytes, want %d", ErrProtocol, len(h.Nonce), nonceLen)
	}
	req := requestMsg{Op: op, Key: key, EngineID: engineID, Nonce: make([]byte, nonceLen)}
	rand.Read(req.Nonce)
	var region *peerRegion
	if op != opRelease {
		req.Blocks = len(dst)
		req.BlockBytes = c.store.BlockBytes()
		req.Shape = c.cfg.Shape
		req.ByteOrder = nativeByteOrder()
		if region = c.region(addr, h.SharedMemory); region != nil {
			defer c.letGo(region)
			req.SharedMemory = true
		}
	}
	if c.cfg.Secret != "" {
		req.MAC = consumerMAC(c.cfg.Secret, h.Nonce, &req)
	}
	if err := writeJSON(conn, frameRequest, req); err != nil {
		if closedByPeer(err) {
			err = &staleError{err}
		}
		return 0, fmt.Errorf("request: %w", err)
	}
	var acc acceptMsg
	if err := readJSON(conn, frameAccept, &acc); err != nil {
		if closedByPeer(err) && !errors.Is(err, io.ErrUnexpectedEOF) {
			// Not a byte of an answer: the producer closed the connection
			// before it read the request (a request it reads, it answers).
			err = &staleError{err}
		}
		return 0, err
	}
	// Check the producer too: without this, anything listening at addr could
	// feed us blocks.
	if c.cfg.Secret != "" && !hmac.Equal(acc.MAC, producerMAC(c.cfg.Secret, h.Nonce, req.Nonce, key)) {
		return 0, fmt.Errorf("%w: producer did not prove it knows the secret", ErrAuth)
	}
	if op == opRelease {
		next.reusable = true
		return 0, nil
	}

	if op == opPush {
		// The producer gives up on an export after its lease duration; this
		// bound only matters if it vanished without closing the connection.
		if err := conn.SetReadDeadline(time.Now().Add(c.cfg.LeaseDuration + c.cfg.IOTimeout)); err != nil {
			return 0, err
		}
	}
	typ, payload, err := readFrame(conn)
	switch {
	case err != nil:
		return 0, fmt.Errorf("data header: %w", err)
	case typ == frameError:
		return 0, refusalFrom(payload)
	case typ == frameData:
		return c.receiveStream(conn, key, payload, dst, next)
	case typ == frameDataShared && region != nil:
		return c.receiveShared(ctx, conn, key, region, payload, dst, next)
	}
	return 0, fmt.Errorf("%w: got frame type %d, want data", ErrProtocol, typ)
}

// checkDataHeader checks a DATA or DATA_SHM header against dst.
func (c *Consumer) checkDataHeader(dh dataHeader, dst []int) error {
	if int(dh.blocks) != len(dst) {
		return fmt.Errorf("%w: producer sends %d blocks, want %d", ErrBlockCount, dh.blocks, len(dst))
	}
	if bb := c.store.BlockBytes(); int(dh.blockBytes) != bb {
		return fmt.Errorf("%w: producer sends %d-byte blocks, want %d", ErrShape, dh.blockBytes, bb)
	}
	if dh.numTokens > uint64(maxInt) {
		return fmt.Errorf("%w: num_tokens %d", ErrProtocol, dh.numTokens)
	}
	return nil
}

// receiveStream reads the blocks that follow a DATA header off conn into
// dst and acks them.
func (c *Consumer) receiveStream(conn *frameConn, key string, header []byte, dst []int, next *connState) (int, error) {
	dh, err := parseDataHeader(header)
	if err != nil {
		return 0, err
	}
	if err := c.checkDataHeader(dh, dst); err != nil {
		return 0, err
	}
	bb := c.store.BlockBytes()

	// Straight into the cache's memory, no staging buffer, a batch of
	// blocks per read deadline and per vectored read.
	perBatch := min(max(1, batchBytes/bb), maxIOV)
	batch := make([][]byte, 0, min(perBatch, len(dst)))
	for first := 0; first < len(dst); first += perBatch {
		batch = batch[:0]
		for _, id := range dst[first:min(first+perBatch, len(dst))] {
			b := c.store.Block(id)
			if len(b) != bb {
				return 0, fmt.Errorf("block %d is %d bytes, store says %d", id, len(b), bb)
			}
			batch = append(batch, b)
		}
		if err := conn.SetReadDeadline(time.Now().Add(c.cfg.IOTimeout)); err != nil {
			return 0, err
		}
		if got, err := conn.readBuffers(batch); err != nil {
			return 0, fmt.Errorf("block %d of %d: %w", first+got/bb, len(dst), err)
		}
	}

	// From here dst is complete, so nothing turns this into a failure, not
	// even ctx ending: only the producer's free is in doubt, and its lease
	// expiry covers that.
	c.streamed.Add(1)
	conn.SetDeadline(time.Now().Add(c.cfg.IOTimeout))
	if err := writeFrame(conn, frameAck, nil); err != nil {
		c.log.Warn("kvtransfer: ack not sent; producer frees on lease expiry", "key", key, "err", err)
		return int(dh.numTokens), nil
	}
	// The producer's DONE is not waited for: a pooled connection's next pull
	// reads it first, and closing a connection with it unread is harmless,
	// as the producer has read the ack by the time it sends the DONE.
	*next = connState{reusable: true, doneOwed: true}
	return int(dh.numTokens), nil
}

// receiveShared copies the blocks a DATA_SHM frame places in the producer's
// region into dst, checks that none was freed meanwhile, and acks. Like a
// stream, it does not wait for the DONE: the producer frees leased blocks
// on the ack, or else on Release, Close or expiry (which a lease whose
// stream failed comes back to), and every free moves the freed blocks'
// generation counters first, so a counter that still reads what the
// producer sent proves that its block stayed leased, and unwritten, until
// the copy was over.
func (c *Consumer) receiveShared(ctx context.Context, conn *frameConn, key string, r *peerRegion, payload []byte, dst []int, next *connState) (int, error) {
	dh, blocks, err := parseSharedData(payload)
	if err != nil {
		return 0, err
	}
	if err := c.checkDataHeader(dh, dst); err != nil {
		return 0, err
	}
	if err := c.copyShared(ctx, r, blocks, dst); err != nil {
		return 0, err
	}

	// From here dst is complete and sound, so nothing turns this into a
	// failure, as after a stream.
	c.shared.Add(1)
	conn.SetDeadline(time.Now().Add(c.cfg.IOTimeout))
	if err := writeFrame(conn, frameAck, nil); err != nil {
		c.log.Warn("kvtransfer: ack not sent; producer frees on lease expiry", "key", key, "err", err)
		return int(dh.numTokens), nil
	}
	*next = connState{reusable: true, doneOwed: true}
	return int(dh.numTokens), nil
}

const maxInt = int(^uint(0) >> 1)
