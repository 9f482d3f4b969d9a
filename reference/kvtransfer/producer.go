package kvtransfer

import (
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Producer is the prefill side: it holds exported blocks under leases and
// serves them to consumers on its listener. All of its mutable state is in
// the lease table guarded by mu; connection handlers, the expiry loop and the
// public methods all go through it.
type Producer struct {
	cfg   Config
	store BlockStore
	ln    net.Listener
	log   *slog.Logger
	done  chan struct{} // closed by Close: stops the accept and expiry loops
	wg    sync.WaitGroup
	// region is the shared memory the store's blocks live in, offered in
	// every hello as advert; nil when there is none or it is turned off.
	region *SharedMemory
	advert *sharedAdvert

	mu      sync.Mutex
	closed  bool
	leases  map[string]*lease
	owned   map[int]string // block id → key of the lease that holds it; catches double ownership at Export
	waiters map[string]*waiter
	// revoked remembers keys revoked before their export, each until a
	// lease duration after the revocation (injected clock), so that the
	// export, when it comes, is refused. At most maxRevoked are held.
	revoked map[string]time.Time
	conns   map[net.Conn]struct{}
	stats   ProducerStats // only the counters; the gauges are computed in Stats
}

// lease is one exported transfer. While streaming, exactly one connection
// handler reads its blocks and neither expiry nor Release may free them: the
// handler checks the lease back in and the free happens then.
type lease struct {
	key       string
	blocks    []int
	numTokens int
	deadline  time.Time // on the injected clock
	streaming bool
	released  bool   // Release came while streaming; free at check-in
	abort     func() // closes the streaming connection, so Release is prompt
	// offsets are where the blocks lie in the producer's region, for a
	// consumer that maps it, and generations their counters there; both
	// nil when some block lies outside it.
	offsets     []uint64
	generations []*atomic.Uint64
	ticket      string // signed offsets and generations; "" when there is none
}

// waiter is a push consumer that arrived before its key was exported (or
// while another connection held it). Export hands it the lease and wakes it.
type waiter struct {
	conn  net.Conn
	lease *lease // set under mu by whoever hands the lease over
}

// ProducerStats is a snapshot of the lease table. Every exported transfer
// ends exactly once as Completed, Released (by Release, ReleaseRemote or
// Close) or Expired; until then it counts in LeasedTransfers.
type ProducerStats struct {
	LeasedTransfers int
	LeasedBlocks    int
	Streaming       int // leases being sent right now (included in LeasedTransfers)
	Waiting         int // push consumers waiting for an export
	Completed       uint64
	Released        uint64
	Expired         uint64
}

// NewProducer starts listening on cfg.ListenAddr, or on cfg.Listener, and
// serving consumers. Close stops it. When store has its blocks in a
// SharedMemory region (see SharedCacheStore), consumers on this host copy
// them from there.
func NewProducer(cfg Config, store BlockStore) (*Producer, error) {
	cfg = cfg.withDefaults()
	if err := checkProducer(cfg, store); err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
			return nil, fmt.Errorf("kvtransfer: listen on %s: %w", cfg.ListenAddr, err)
		}
	}
	p := &Producer{
		cfg:     cfg,
		store:   store,
		ln:      ln,
		log:     cfg.Logger.With("engine_id", cfg.EngineID),
		done:    make(chan struct{}),
		leases:  make(map[string]*lease),
		owned:   make(map[int]string),
		waiters: make(map[string]*waiter),
		revoked: make(map[string]time.Time),
		conns:   make(map[net.Conn]struct{}),
	}
	if ss, ok := store.(sharedStore); ok && !cfg.DisableSharedMemory {
		switch p.region = ss.SharedMemory(); {
		case p.region == nil:
		case store.BlockBytes() < sharedMinBlock:
			// Two blocks could share a generation counter, and one's free
			// would void copies of the other.
			p.log.Info("kvtransfer: blocks too small for shared memory; consumers on this host use TCP", "block_bytes", store.BlockBytes(), "min", sharedMinBlock)
			p.region = nil
		default:
			p.advert = p.region.advert()
		}
	}
	p.wg.Go(p.acceptLoop)
	p.wg.Go(p.expiryLoop)
	return p, nil
}

func checkProducer(cfg Config, store BlockStore) error {
	if cfg.EngineID == "" {
		return fmt.Errorf("%w: producer needs an EngineID: consumers check it", ErrInvalid)
	}
	if store == nil || store.BlockBytes() <= 0 || store.BlockBytes() > 1<<32-1 {
		return fmt.Errorf("%w: producer needs a store with a block size in (0, 4 GiB)", ErrInvalid)
	}
	return nil
}

// Addr is the bound side-channel address, to be advertised to consumers.
func (p *Producer) Addr() net.Addr { return p.ln.Addr() }

// Close stops listening, drops every connection, waits for every goroutine
// and frees every leased block (counted as Released).
func (p *Producer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	close(p.done)
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()

	err := p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()

	// Every handler has checked its lease back in, so nothing streams now.
	p.mu.Lock()
	var free []int
	for _, l := range p.leases {
		free = append(free, p.dropLocked(l)...)
		p.stats.Released++
	}
	p.mu.Unlock()
	if len(free) > 0 {
		p.store.Free(free)
		p.log.Info("kvtransfer: closed with leases outstanding; freed", "blocks", len(free))
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("kvtransfer: close listener: %w", err)
	}
	return nil
}

// Export hands the blocks of a finished prefill to the data path under a
// lease. On success the producer owns the blocks and frees them when a
// consumer has received them, on Release, on expiry or on Close; on error the
// caller still owns them.
func (p *Producer) Export(key string, blocks []int, numTokens int) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("kvtransfer: export: %w", err)
	}
	if err := checkBlocks(p.store, blocks); err != nil {
		return fmt.Errorf("kvtransfer: export %q: %w", key, err)
	}
	if numTokens < 0 {
		return fmt.Errorf("kvtransfer: export %q: %w: numTokens %d", key, ErrInvalid, numTokens)
	}
	l := &lease{key: key, blocks: slices.Clone(blocks), numTokens: numTokens, deadline: p.cfg.Clock().Add(p.cfg.LeaseDuration)}
	l.offsets, l.generations = p.sharedOffsets(l.blocks)
	l.ticket = p.ticketFor(l)

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("kvtransfer: export %q: %w", key, ErrClosed)
	}
	if _, gone := p.revoked[key]; gone {
		delete(p.revoked, key)
		p.mu.Unlock()
		return fmt.Errorf("kvtransfer: export %q: %w", key, ErrRevoked)
	}
	if _, dup := p.leases[key]; dup {
		p.mu.Unlock()
		return fmt.Errorf("kvtransfer: export %q: %w: key already exported", key, ErrInvalid)
	}
	for _, id := range l.blocks {
		if other, ok := p.owned[id]; ok {
			p.mu.Unlock()
			return fmt.Errorf("kvtransfer: export %q: %w: block %d is already leased under %q", key, ErrInvalid, id, other)
		}
	}
	p.leases[key] = l
	for _, id := range l.blocks {
		p.owned[id] = key
	}
	handed := p.handOverLocked(l)
	p.mu.Unlock()
	p.log.Debug("kvtransfer: exported", "key", key, "blocks", len(blocks), "num_tokens", numTokens, "push_waiting", handed)
	return nil
}

// sharedOffsets is where blocks lie in the producer's region and their
// generation counters, or nils when there is no region, some block lies
// outside it, or there are more blocks than one frame can list: such a
// lease goes over TCP to every consumer.
func (p *Producer) sharedOffsets(blocks []int) ([]uint64, []*atomic.Uint64) {
	if p.region == nil || len(blocks) > maxSharedBlocks {
		return nil, nil
	}
	offsets := make([]uint64, len(blocks))
	generations := make([]*atomic.Uint64, len(blocks))
	bb := p.store.BlockBytes()
	for i, id := range blocks {
		b := p.store.Block(id)
		off, ok := p.region.offset(b)
		var g *atomic.Uint64
		if ok && len(b) == bb {
			g = p.region.generation(off, bb)
		}
		if g == nil {
			p.log.Debug("kvtransfer: block outside the shared memory region; its lease goes over TCP", "block", id)
			return nil, nil
		}
		offsets[i], generations[i] = off, g
	}
	return offsets, generations
}

// Release drops key's lease without transferring and frees its blocks. If the
// blocks are being streamed right now, the stream is aborted and they are
// freed as soon as the handler lets go of them. It reports whether key was
// leased.
func (p *Producer) Release(key string) bool {
	return p.end(key, &p.stats.Released, "kvtransfer: released")
}

// maxRevoked bounds the keys Revoke remembers before their export: each is
// one cancelled request of the last lease duration, so the bound is only
// reached by a caller revoking keys that are never exported. Past it a
// revocation before the export is not remembered, and that export's lease
// is freed when it expires.
const maxRevoked = 1 << 16

// Revoke is Release for a request that is gone: it drops key's lease, as
// Release does, and when key is not leased yet — its prefill is still
// running, or its answer is still on the way — it remembers key for one
// lease duration so that the export, when it comes, is refused with
// ErrRevoked rather than leased for nobody. It reports whether key was
// leased.
func (p *Producer) Revoke(key string) bool {
	if checkKey(key) != nil {
		return false
	}
	p.mu.Lock()
	if _, ok := p.leases[key]; ok {
		p.mu.Unlock()
		// A consumer may claim it first; then nothing is left to free.
		return p.Release(key)
	}
	if len(p.revoked) >= maxRevoked {
		p.sweepRevokedLocked(p.cfg.Clock())
	}
	if len(p.revoked) < maxRevoked {
		p.revoked[key] = p.cfg.Clock().Add(p.cfg.LeaseDuration)
	}
	p.mu.Unlock()
	return false
}

// sweepRevokedLocked forgets revocations older than a lease.
func (p *Producer) sweepRevokedLocked(now time.Time) {
	for key, until := range p.revoked {
		if !now.Before(until) {
			delete(p.revoked, key)
		}
	}
}

// end drops key's lease and frees its blocks, counting it in counter
// (Released, or Completed for a copy a consumer notified). A lease being
// streamed has its stream aborted and is freed, as Released, once the
// stream lets go of it. It reports whether key was leased.
func (p *Producer) end(key string, counter *uint64, msg string) bool {
	p.mu.Lock()
	l, ok := p.leases[key]
	if !ok {
		p.mu.Unlock()
		return false
	}
	if l.streaming {
		l.released = true
		abort := l.abort
		p.mu.Unlock()
		abort()
		p.log.Debug("kvtransfer: lease ended while streamed; aborting the stream", "key", key, "why", msg)
		return true
	}
	free := p.dropLocked(l)
	*counter++
	p.mu.Unlock()
	p.store.Free(free)
	p.log.Debug(msg, "key", key, "blocks", len(free))
	return true
}

// ExpireNow frees every idle lease whose deadline has passed on the injected
// clock and returns how many it expired. The expiry loop calls it
// periodically; tests call it after moving a fake clock.
func (p *Producer) ExpireNow() int {
	now := p.cfg.Clock()
	p.mu.Lock()
	p.sweepRevokedLocked(now)
	var free []int
	var keys []string
	for _, l := range p.leases {
		// A streaming lease is skipped: its blocks are being read. If the
		// stream fails, the lease is checked back in and expires next sweep.
		if l.streaming || now.Before(l.deadline) {
			continue
		}
		free = append(free, p.dropLocked(l)...)
		keys = append(keys, l.key)
		p.stats.Expired++
	}
	p.mu.Unlock()
	if len(free) > 0 {
		p.store.Free(free)
	}
	for _, k := range keys {
		p.log.Warn("kvtransfer: lease expired unclaimed; blocks freed", "key", k, "lease", p.cfg.LeaseDuration)
	}
	return len(keys)
}

// Stats returns a snapshot of the lease table.
func (p *Producer) Stats() ProducerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.LeasedTransfers = len(p.leases)
	s.LeasedBlocks = len(p.owned)
	s.Waiting = len(p.waiters)
	for _, l := range p.leases {
		if l.streaming {
			s.Streaming++
		}
	}
	return s
}

// dropLocked removes l from the table and returns its blocks for freeing
// outside the lock. Every free of leased blocks comes through here, so this
// is where their generation counters move: before the blocks go back to the
// store, and so before anyone can allocate and rewrite them, a consumer
// still copying them out of the region finds the counters changed and
// throws the copy away (the cache's own lock orders the add before any
// later writer's stores).
func (p *Producer) dropLocked(l *lease) []int {
	delete(p.leases, l.key)
	for _, id := range l.blocks {
		delete(p.owned, id)
	}
	for _, g := range l.generations {
		g.Add(1)
	}
	return l.blocks
}

// handOverLocked gives idle lease l to a push consumer waiting for its key,
// if there is one, and wakes it by interrupting its blocked read with a
// deadline in the past. The wake-up happens under mu: the handler can only
// see its lease, and so set later deadlines of its own, after mu is released,
// so a late wake-up can never cut short its stream.
func (p *Producer) handOverLocked(l *lease) (handed bool) {
	w := p.waiters[l.key]
	if w == nil {
		return false
	}
	delete(p.waiters, l.key)
	w.lease = l
	l.streaming = true
	conn := w.conn
	l.abort = func() { conn.Close() }
	conn.SetReadDeadline(aLongTimeAgo)
	return true
}

// checkout claims key's lease for streaming on conn.
func (p *Producer) checkout(key string, blocks int, conn net.Conn) (*lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.leases[key]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: no lease for %q", ErrUnknownTransfer, key)
	case l.streaming:
		return nil, fmt.Errorf("%w: %q is being sent on another connection", ErrBusy, key)
	case len(l.blocks) != blocks:
		return nil, fmt.Errorf("%w: %q has %d blocks, consumer expects %d", ErrBlockCount, key, len(l.blocks), blocks)
	}
	l.streaming = true
	l.abort = func() { conn.Close() }
	return l, nil
}

// checkin ends a stream of l. Acked: the consumer has every byte, so free.
// Otherwise the lease goes back to the table (or to a push consumer already
// waiting for it), unless Release came meanwhile.
func (p *Producer) checkin(l *lease, acked bool) {
	p.mu.Lock()
	l.streaming, l.abort = false, nil
	var free []int
	switch {
	case acked:
		free = p.dropLocked(l)
		p.stats.Completed++
	case l.released:
		free = p.dropLocked(l)
		p.stats.Released++
	default:
		p.handOverLocked(l)
	}
	p.mu.Unlock()
	if free != nil {
		p.store.Free(free)
	}
}

func (p *Producer) acceptLoop() {
	var backoff time.Duration
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			// Out of file descriptors and the like: back off as net/http does
			// rather than spin, and keep serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("kvtransfer: accept failed; retrying", "err", err, "backoff", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-p.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			conn.Close()
			return
		}
		p.conns[conn] = struct{}{}
		p.wg.Go(func() { p.serve(conn) })
		p.mu.Unlock()
	}
}

// expiryLoop sweeps on a real-time ticker but judges deadlines on the
// injected clock, so a fake clock plus ExpireNow tests expiry without sleeping.
func (p *Producer) expiryLoop() {
	t := time.NewTicker(min(max(p.cfg.LeaseDuration/8, 10*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.ExpireNow()
		}
	}
}

// serve runs one consumer connection: a hello with a fresh nonce, one
// request, and, when that request succeeded, the next hello on the same
// connection, so a consumer that pools its connections pays for the dial and
// the hello's round trip once rather than per transfer. Every request is
// authenticated against the nonce of the hello just before it; an ERROR frame
// ends the connection.
func (p *Producer) serve(raw net.Conn) {
	defer func() {
		raw.Close()
		p.mu.Lock()
		delete(p.conns, raw)
		p.mu.Unlock()
	}()
	conn := newFrameConn(raw)
	log := p.log.With("remote", conn.RemoteAddr().String())
	// prefix is what the previous request still owes the consumer (its DONE
	// or ACCEPT); it leaves in the same write as the next hello.
	var prefix []byte
	for first := true; ; first = false {
		if err := conn.SetDeadline(time.Now().Add(p.cfg.IOTimeout)); err != nil {
			return
		}
		serverNonce := make([]byte, nonceLen)
		rand.Read(serverNonce) // never fails (crypto/rand crashes the program instead)
		hello, err := appendJSONFrame(prefix, frameHello, helloMsg{Nonce: serverNonce, SharedMemory: p.advert})
		if err != nil {
			return
		}
		if _, err := conn.Write(hello); err != nil {
			log.Debug("kvtransfer: hello failed", "err", err)
			return
		}
		if !first {
			// The connection idles in the consumer's pool until its next
			// transfer; a consumer that vanished without closing it is
			// dropped once its pool would have dropped it anyway.
			if err := conn.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout + p.cfg.IOTimeout)); err != nil {
				return
			}
		}
		var req requestMsg
		if err := readJSON(conn, frameRequest, &req); err != nil {
			if !first && (closedByPeer(err) || isTimeout(err)) {
				return // an idle pooled connection closed or abandoned: normal
			}
			log.Info("kvtransfer: bad request", "err", err)
			refuse(conn, err)
			return
		}
		if err := conn.SetDeadline(time.Now().Add(p.cfg.IOTimeout)); err != nil {
			return
		}
		var ok bool
		if prefix, ok = p.handle(conn, &req, serverNonce, log); !ok {
			return
		}
	}
}

// handle answers one authenticated-or-refused request. ok means the request
// succeeded and the connection may carry another; then done is the final
// frame still to send, which serve sends with the next hello.
func (p *Producer) handle(conn net.Conn, req *requestMsg, serverNonce []byte, log *slog.Logger) (done []byte, ok bool) {
	log = log.With("key", req.Key, "op", req.Op)
	if err := p.admit(req, serverNonce); err != nil {
		log.Info("kvtransfer: request refused", "err", err)
		refuse(conn, err)
		return nil, false
	}
	var acc acceptMsg
	if p.cfg.Secret != "" {
		acc.MAC = producerMAC(p.cfg.Secret, serverNonce, req.Nonce, req.Key)
	}
	accept, err := appendJSONFrame(nil, frameAccept, acc)
	if err != nil {
		return nil, false
	}

	switch req.Op {
	case opNotify:
		if _, err := conn.Write(accept); err != nil {
			return nil, false
		}
		p.notified(conn, log)
		return nil, false
	case opRelease:
		if !p.Release(req.Key) {
			refuse(conn, fmt.Errorf("%w: no lease for %q", ErrUnknownTransfer, req.Key))
			return nil, false
		}
		return accept, true
	case opPull:
		l, err := p.checkout(req.Key, req.Blocks, conn)
		if err != nil {
			log.Info("kvtransfer: pull refused", "err", err)
			refuse(conn, err)
			return nil, false
		}
		// The accept rides in the data's writev: one segment train, one
		// wake-up on the consumer's side.
		return doneFrame, p.stream(conn, l, accept, req.SharedMemory, log)
	case opPush:
		return doneFrame, p.push(conn, req, accept, log)
	}
	return nil, false
}

// admit checks a request in the order that reveals least to a stranger:
// authentication first, then the geometry, then the engine.
func (p *Producer) admit(req *requestMsg, serverNonce []byte) error {
	if p.cfg.Secret != "" {
		if len(req.MAC) == 0 {
			return fmt.Errorf("%w: producer requires a secret; request carries no proof", ErrAuth)
		}
		if !hmac.Equal(req.MAC, consumerMAC(p.cfg.Secret, serverNonce, req)) {
			return fmt.Errorf("%w: wrong secret", ErrAuth)
		}
	}
	if len(req.Nonce) != nonceLen {
		return fmt.Errorf("%w: client nonce of %d bytes, want %d", ErrProtocol, len(req.Nonce), nonceLen)
	}
	if req.Op == opNotify {
		return nil // keys come in the frames that follow
	}
	if err := checkKey(req.Key); err != nil {
		return fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	switch req.Op {
	case opRelease:
		return nil
	case opPull, opPush:
	default:
		return fmt.Errorf("%w: unknown op %q", ErrProtocol, req.Op)
	}
	if req.ByteOrder != nativeByteOrder() {
		return fmt.Errorf("%w: consumer is %s-endian, producer is %s-endian", ErrShape, req.ByteOrder, nativeByteOrder())
	}
	if req.Shape != p.cfg.Shape {
		return fmt.Errorf("%w: consumer shape %q, producer shape %q", ErrShape, req.Shape, p.cfg.Shape)
	}
	if req.BlockBytes != p.store.BlockBytes() {
		return fmt.Errorf("%w: consumer blocks are %d bytes, producer blocks are %d", ErrShape, req.BlockBytes, p.store.BlockBytes())
	}
	if req.EngineID != p.cfg.EngineID {
		return fmt.Errorf("%w: consumer expects engine %q, this is %q", ErrEngineMismatch, req.EngineID, p.cfg.EngineID)
	}
	if req.Blocks < 1 {
		return fmt.Errorf("%w: consumer expects %d blocks", ErrBlockCount, req.Blocks)
	}
	return nil
}

// push serves a Mooncake-shaped consumer: it gets the lease at once if the
// key is exported and idle, or else waits, blocked in a read, until Export or
// a failed stream hands the lease over and wakes it, the consumer hangs up,
// or a lease duration passes with no export.
func (p *Producer) push(conn net.Conn, req *requestMsg, accept []byte, log *slog.Logger) bool {
	// Arm the wait bound before registering: once registered, a wake-up (a
	// deadline in the past) may come at any moment and must not be
	// overwritten.
	if err := conn.SetReadDeadline(time.Now().Add(p.cfg.LeaseDuration)); err != nil {
		return false
	}
	w := &waiter{conn: conn}
	p.mu.Lock()
	l := p.leases[req.Key]
	switch {
	case p.waiters[req.Key] != nil:
		p.mu.Unlock()
		refuse(conn, fmt.Errorf("%w: another consumer is already waiting for %q", ErrBusy, req.Key))
		return false
	case l != nil && !l.streaming:
		l.streaming = true
		l.abort = func() { conn.Close() }
	default:
		l = nil
		p.waiters[req.Key] = w
	}
	p.mu.Unlock()

	_, err := conn.Write(accept)
	if l == nil {
		var rerr error
		if err == nil {
			var one [1]byte
			_, rerr = conn.Read(one[:])
		}
		p.mu.Lock()
		l = w.lease
		if l == nil && p.waiters[req.Key] == w {
			delete(p.waiters, req.Key)
		}
		p.mu.Unlock()
		if l == nil {
			if ne, ok := rerr.(net.Error); ok && ne.Timeout() {
				log.Info("kvtransfer: push consumer waited a whole lease for the export; giving up")
				conn.SetWriteDeadline(time.Now().Add(p.cfg.IOTimeout))
				refuse(conn, fmt.Errorf("%w: %q not exported within %v", ErrUnknownTransfer, req.Key, p.cfg.LeaseDuration))
			}
			return false
		}
		// Only a timeout can be our wake-up; anything else (EOF, a closed
		// connection, a stray byte) means this consumer is gone or broken.
		if ne, ok := rerr.(net.Error); err != nil || !ok || !ne.Timeout() {
			p.checkin(l, false)
			return false
		}
	} else if err != nil {
		p.checkin(l, false)
		return false
	}
	if len(l.blocks) != req.Blocks {
		conn.SetWriteDeadline(time.Now().Add(p.cfg.IOTimeout))
		refuse(conn, fmt.Errorf("%w: %q has %d blocks, consumer expects %d", ErrBlockCount, req.Key, len(l.blocks), req.Blocks))
		p.checkin(l, false)
		return false
	}
	return p.stream(conn, l, nil, req.SharedMemory, log)
}

// stream sends l's blocks straight from the store's memory, after prefix
// (the pull's accept) in the same writev — or, to a consumer that has the
// producer's region mapped (shared), only where they lie in it and their
// generations — waits for the consumer's ack, and only then frees them. The
// DONE that answers the ack is the caller's to send. It reports whether the
// consumer acknowledged every byte.
func (p *Producer) stream(conn net.Conn, l *lease, prefix []byte, shared bool, log *slog.Logger) bool {
	start := time.Now()
	var err error
	if shared = shared && l.offsets != nil; shared {
		err = p.sendOffsets(conn, l, prefix)
	} else {
		err = p.sendBlocks(conn, l, prefix)
	}
	if err == nil {
		err = p.readAck(conn)
	}
	if err != nil {
		p.checkin(l, false)
		log.Info("kvtransfer: transfer failed; blocks stay leased", "err", err)
		return false
	}
	p.checkin(l, true)
	log.Debug("kvtransfer: transfer complete", "blocks", len(l.blocks), "num_tokens", l.numTokens, "shared_memory", shared, "elapsed", time.Since(start))
	return true
}

func (p *Producer) sendBlocks(conn net.Conn, l *lease, prefix []byte) error {
	bb := p.store.BlockBytes()
	hdr := make([]byte, len(prefix)+headerLen+dataHdrLen)
	copy(hdr, prefix)
	putHeader(hdr[len(prefix):], frameData, dataHdrLen)
	copy(hdr[len(prefix)+headerLen:], dataHeader{blocks: uint32(len(l.blocks)), blockBytes: uint32(bb), numTokens: uint64(l.numTokens)}.bytes())

	perBatch := max(1, batchBytes/bb)
	bufs := make(net.Buffers, 0, perBatch+1)
	bufs = append(bufs, hdr)
	for i, id := range l.blocks {
		b := p.store.Block(id)
		if len(b) != bb {
			return fmt.Errorf("block %d is %d bytes, store says %d", id, len(b), bb)
		}
		bufs = append(bufs, b)
		if len(bufs) < perBatch && i < len(l.blocks)-1 {
			continue
		}
		// One writev per batch; the deadline bounds how long a stalled
		// consumer can pin the lease in the streaming state.
		if err := conn.SetWriteDeadline(time.Now().Add(p.cfg.IOTimeout)); err != nil {
			return err
		}
		if _, err := bufs.WriteTo(socket(conn)); err != nil {
			return fmt.Errorf("send blocks: %w", err)
		}
		bufs = bufs[:0:cap(bufs)]
	}
	return nil
}

// sendOffsets sends, after prefix, a DATA_SHM frame: the data header, and
// the offset of every block in the producer's region with its generation.
// The lease is checked out, so nothing frees its blocks, and no counter
// read here moves, until this stream checks it back in.
func (p *Producer) sendOffsets(conn net.Conn, l *lease, prefix []byte) error {
	n := dataHdrLen + sharedBlockLen*len(l.offsets)
	b := make([]byte, len(prefix)+headerLen, len(prefix)+headerLen+n)
	copy(b, prefix)
	putHeader(b[len(prefix):], frameDataShared, n)
	b = append(b, dataHeader{blocks: uint32(len(l.blocks)), blockBytes: uint32(p.store.BlockBytes()), numTokens: uint64(l.numTokens)}.bytes()...)
	for i, off := range l.offsets {
		b = appendSharedBlock(b, sharedBlock{offset: off, generation: l.generations[i].Load()})
	}
	if err := conn.SetWriteDeadline(time.Now().Add(p.cfg.IOTimeout)); err != nil {
		return err
	}
	if _, err := conn.Write(b); err != nil {
		return fmt.Errorf("send block offsets: %w", err)
	}
	return nil
}

func (p *Producer) readAck(conn net.Conn) error {
	if err := conn.SetReadDeadline(time.Now().Add(p.cfg.IOTimeout)); err != nil {
		return err
	}
	typ, _, err := readFrame(conn)
	if err != nil {
		return fmt.Errorf("read ack: %w", err)
	}
	if typ != frameAck {
		return fmt.Errorf("%w: got frame type %d, want ack", ErrProtocol, typ)
	}
	return nil
}

// refuse tells the consumer why, best effort: the connection closes next.
func refuse(conn net.Conn, err error) {
	writeJSON(conn, frameError, errorMsg{Code: codeOf(err), Message: err.Error()})
}

func checkKey(key string) error {
	if key == "" || len(key) > maxKeyLen {
		return fmt.Errorf("%w: key must be 1 to %d bytes, got %d", ErrInvalid, maxKeyLen, len(key))
	}
	return nil
}

// checkBlocks refuses empty lists, duplicates and (when the store can tell)
// ids out of range: a duplicate would be freed twice or written twice.
func checkBlocks(store BlockStore, ids []int) error {
	if len(ids) == 0 || len(ids) > 1<<32-1 {
		return fmt.Errorf("%w: %d blocks", ErrInvalid, len(ids))
	}
	n := -1
	if bc, ok := store.(blockCounter); ok {
		n = bc.NumBlocks()
	}
	seen := make(map[int]struct{}, len(ids))
	for _, id := range ids {
		if id < 0 || (n >= 0 && id >= n) {
			return fmt.Errorf("%w: block id %d out of range", ErrInvalid, id)
		}
		if _, dup := seen[id]; dup {
			return fmt.Errorf("%w: block id %d listed twice", ErrInvalid, id)
		}
		seen[id] = struct{}{}
	}
	return nil
}
