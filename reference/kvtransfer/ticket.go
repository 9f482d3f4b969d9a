package kvtransfer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/omnipd/omnipd/internal/idleconn"
)

// One-sided reads on the producer's ticket, as NIXL reads over RDMA: the
// producer signs, at export, where the lease's blocks lie in its region and
// their generations; the ticket travels with the prefill's answer
// (kv_transfer_params); a consumer that has the region mapped checks the
// signature, copies the blocks and checks their generations without a
// word to the producer, and afterwards tells it, in the background and in
// batches, which leases it may free. That spares the decode's critical
// path the pull's round trip and both sides its control frames.

const (
	ticketVersion = 1
	// maxTicketBlocks bounds a ticket to a few KiB: a lease of more blocks
	// is pulled as before.
	maxTicketBlocks = 1024
	// ticketMACLen is the signature's length: HMAC-SHA256 cut to 128 bits.
	ticketMACLen = 16
	// maxNotifyBatch bounds the keys of one NOTIFY frame's payload.
	maxNotifyBatch = maxControl - 1024
)

// A ticket, before base64url: version, the region's id, then uvarints: the
// token count, the number of blocks, and per block its slot (its offset in
// the block area over the block size) and its generation; then the
// signature. Slots and generations are small numbers, so a block takes a
// few bytes, and the ticket of a short prompt is about a hundred.

// ticket is a decoded ticket: the region it is for, the lease's token
// count and blocks, the signed bytes and their signature.
type ticket struct {
	regionID  []byte
	numTokens uint64
	slots     []ticketBlock
	signed    []byte
	mac       []byte
}

// ticketBlock is a block as a ticket names it: its slot in the block area
// (its offset there over the block size) and its generation.
type ticketBlock struct {
	slot, generation uint64
}

// ticketMAC signs a ticket's bytes together with what the consumer must
// agree on for them to mean the same thing on both sides: the lease's key,
// the producer's engine id and the cache geometry. A consumer computes it
// with its own idea of each, so a ticket for another lease, engine or
// geometry does not verify, and the consumer falls back to a pull, whose
// refusal says what differs.
func ticketMAC(key []byte, lease, engineID, shape string, blockBytes int, signed []byte) []byte {
	var bb [4]byte
	binary.BigEndian.PutUint32(bb[:], uint32(blockBytes))
	return mac(string(key), "ticket", []byte(lease), []byte(engineID), []byte(shape), []byte(nativeByteOrder()), bb[:], signed)[:ticketMACLen]
}

// ticketFor signs l's blocks for consumers that map the region, or returns
// "" when l has no places in it, has too many blocks for a ticket, or has
// a block that does not start on a slot boundary.
func (p *Producer) ticketFor(l *lease) string {
	if l.offsets == nil || len(l.offsets) > maxTicketBlocks {
		return ""
	}
	bb := uint64(p.store.BlockBytes())
	b := make([]byte, 0, 1+sharedIDLen+2*binary.MaxVarintLen64+4*len(l.offsets)+ticketMACLen)
	b = append(b, ticketVersion)
	b = append(b, p.region.id[:]...)
	b = binary.AppendUvarint(b, uint64(l.numTokens))
	b = binary.AppendUvarint(b, uint64(len(l.offsets)))
	for i, off := range l.offsets {
		rel := off - p.region.lay.data // sharedOffsets placed it in the block area
		if rel%bb != 0 {
			return ""
		}
		// The caller owns the blocks until Export returns and the lease
		// holds them after, so no counter moves until the lease ends.
		b = binary.AppendUvarint(b, rel/bb)
		b = binary.AppendUvarint(b, l.generations[i].Load())
	}
	b = append(b, ticketMAC(p.region.ticketKey[:], l.key, p.cfg.EngineID, p.cfg.Shape, int(bb), b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Ticket returns the ticket of key's lease, for the prefill's answer: with
// it, a consumer on this host that has this producer's region mapped
// copies the blocks without asking (PullWithTicket). It is "" when there is
// none (no region, too many blocks, no such lease); a consumer given none
// pulls.
func (p *Producer) Ticket(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.leases[key]; l != nil {
		return l.ticket
	}
	return ""
}

// parseTicket decodes a ticket. It checks the form only; the signature is
// checked against the region's key, which the caller has, and the slots
// against the region's layout.
func parseTicket(s string) (*ticket, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not base64url: %w", err)
	}
	if len(b) < 1+sharedIDLen+2+ticketMACLen || b[0] != ticketVersion {
		return nil, errors.New("not a ticket of this version")
	}
	signed, sig := b[:len(b)-ticketMACLen], b[len(b)-ticketMACLen:]
	t := &ticket{regionID: signed[1 : 1+sharedIDLen], signed: signed, mac: sig}
	rest := signed[1+sharedIDLen:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(rest)
		if n <= 0 {
			return 0, false
		}
		rest = rest[n:]
		return v, true
	}
	var ok bool
	var n uint64
	if t.numTokens, ok = next(); !ok {
		return nil, errors.New("no token count")
	}
	if n, ok = next(); !ok || n == 0 || n > maxTicketBlocks {
		return nil, fmt.Errorf("%d blocks", n)
	}
	t.slots = make([]ticketBlock, n)
	for i := range t.slots {
		slot, ok1 := next()
		gen, ok2 := next()
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("block %d of %d cut short", i, n)
		}
		t.slots[i] = ticketBlock{slot: slot, generation: gen}
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%d bytes after the blocks", len(rest))
	}
	return t, nil
}

// PullWithTicket is Pull for an export that came with a ticket
// (Producer.Ticket). When this consumer already has the producer's region
// mapped (from an earlier pull), the ticket verifies under the region's
// key for this key, engine and geometry, and it names as many blocks as
// dst, it copies the blocks out of the region, checks that none was freed
// meanwhile, and returns without a round trip; the producer learns that it
// may free them from a notification sent afterwards, in the background,
// with those of other transfers (if that is lost, the lease expires). In
// every other case — an empty ticket, no mapping yet, a ticket that does
// not verify, shared memory turned off — it pulls as Pull does. Like Pull,
// it fails with ErrUnknownTransfer if the producer freed the blocks while
// they were copied.
func (c *Consumer) PullWithTicket(ctx context.Context, addr, remoteEngineID, key, ticket string, dst []int) (int, error) {
	if ticket != "" && !c.cfg.DisableSharedMemory {
		n, used, err := c.readTicket(ctx, addr, remoteEngineID, key, ticket, dst)
		if used {
			if err != nil {
				return 0, fmt.Errorf("kvtransfer: pull %q from %s on its ticket: %w", key, addr, err)
			}
			return n, nil
		}
	}
	return c.Pull(ctx, addr, remoteEngineID, key, dst)
}

// readTicket copies the blocks s places in addr's region into dst. used is
// false when the ticket cannot be used, and nothing was done.
func (c *Consumer) readTicket(ctx context.Context, addr, engineID, key, s string, dst []int) (n int, used bool, err error) {
	if checkKey(key) != nil || checkBlocks(c.store, dst) != nil {
		return 0, false, nil // the pull says what is wrong
	}
	t, err := parseTicket(s)
	if err != nil {
		c.log.Warn("kvtransfer: malformed ticket; pulling instead", "addr", addr, "key", key, "err", err)
		return 0, false, nil
	}
	r := c.mappedRegion(addr, t.regionID)
	if r == nil {
		// Not mapped yet (the pull maps it, for the next ticket), or the
		// producer has restarted since.
		return 0, false, nil
	}
	defer c.letGo(r)
	bb := c.store.BlockBytes()
	if k, ok := r.ticketKey(); !ok || !hmac.Equal(t.mac, ticketMAC(k, key, engineID, c.cfg.Shape, bb, t.signed)) {
		c.log.Warn("kvtransfer: ticket does not verify for this key, engine and geometry; pulling instead", "addr", addr, "key", key, "engine_id", engineID)
		return 0, false, nil
	}
	if len(t.slots) != len(dst) {
		return 0, false, nil // the pull reports the count
	}
	if t.numTokens > uint64(maxInt) {
		return 0, true, fmt.Errorf("%w: num_tokens %d", ErrProtocol, t.numTokens)
	}
	blocks := make([]sharedBlock, len(t.slots))
	for i, tb := range t.slots {
		// copyShared refuses a block outside the block area; a slot this
		// far out would wrap the offset, so it is refused first.
		if tb.slot >= uint64(len(r.mem)/bb) {
			return 0, true, fmt.Errorf("%w: block %d in slot %d, past the producer's region of %d bytes", ErrProtocol, i, tb.slot, len(r.mem))
		}
		blocks[i] = sharedBlock{offset: r.lay.data + tb.slot*uint64(bb), generation: tb.generation}
	}
	if err := c.copyShared(ctx, r, blocks, dst); err != nil {
		return 0, true, err
	}
	c.shared.Add(1)
	c.ticketed.Add(1)
	c.notify(addr, key)
	return int(t.numTokens), true, nil
}

// mappedRegion is the region of addr's producer with the given id, held
// for the caller, if this consumer has it mapped; it maps nothing.
func (c *Consumer) mappedRegion(addr string, id []byte) *peerRegion {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.regions[addr]
	if c.closed || r == nil || string(r.id) != string(id) {
		return nil
	}
	return c.holdLocked(r)
}

// copyShared copies blocks, places in r, into dst and then checks that
// their generations still read what the producer gave: otherwise it freed
// (and may have reused) a block while it was copied, and the copy is void
// (ErrUnknownTransfer). Every place is checked before a byte is copied: a
// producer that names memory outside its region's block area, or a block
// without a counter, is broken or hostile.
func (c *Consumer) copyShared(ctx context.Context, r *peerRegion, blocks []sharedBlock, dst []int) error {
	bb := c.store.BlockBytes()
	for i, blk := range blocks {
		if _, ok := r.lay.slot(len(r.mem), blk.offset, bb); !ok {
			return fmt.Errorf("%w: block %d at offset %d lies outside the block area of the producer's region of %d bytes", ErrProtocol, i, blk.offset, len(r.mem))
		}
	}
	for i, id := range dst {
		// Nothing here watches a connection, so a cancelled request stops
		// at the next block rather than when the copy is over.
		if err := ctx.Err(); err != nil {
			return err
		}
		b := c.store.Block(id)
		if len(b) != bb {
			return fmt.Errorf("block %d is %d bytes, store says %d", id, len(b), bb)
		}
		off := blocks[i].offset
		copy(b, r.mem[off:off+uint64(bb)])
	}
	if c.afterSharedCopy != nil {
		c.afterSharedCopy()
	}
	// The copy's loads must be done before the counters are read, or a
	// block rewritten after its counter was read could slip through. Go
	// has no bare fence; its atomic read-modify-writes order every earlier
	// load before every later one on the architectures it supports, while
	// a load-acquire alone would not hold back the loads before it (arm64).
	copyFence.Add(1)
	for i, blk := range blocks {
		pos, _ := r.lay.slot(len(r.mem), blk.offset, bb)
		if got := counterAt(r.mem, pos).Load(); got != blk.generation {
			return fmt.Errorf("%w: the producer freed block %d of %d (generation %d, now %d) while it was being copied; the copy is void", ErrUnknownTransfer, i, len(blocks), blk.generation, got)
		}
	}
	return nil
}

// copyFence is the target of the read-modify-write that separates a copy
// out of a producer's region from the check of its generation counters.
var copyFence atomic.Uint32

// notifyQueue is what a consumer still has to tell one producer: the keys
// of leases it copied on their tickets. One goroutine per producer drains
// it while it is not empty, and for an idle timeout after.
type notifyQueue struct {
	keys []string      // guarded by Consumer.mu
	wake chan struct{} // one pending wake-up
}

// notifyMsg is a NOTIFY frame's payload: leases the consumer has copied.
type notifyMsg struct {
	Keys []string `json:"keys"`
}

// notify queues key for addr's producer, starting its sender if none runs.
// A closed consumer sends at once, on a connection of its own.
func (c *Consumer) notify(addr, key string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		if conn := c.sendNotify(nil, addr, []string{key}); conn != nil {
			conn.Close()
		}
		return
	}
	q := c.notifies[addr]
	if q == nil {
		q = &notifyQueue{wake: make(chan struct{}, 1)}
		c.notifies[addr] = q
		c.senders.Go(func() { c.notifyLoop(addr, q) })
	}
	q.keys = append(q.keys, key)
	c.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// notifyLoop sends addr's queued keys, each batch in one write, on one
// connection it keeps while keys keep coming. It ends, closing it, once
// the queue has been empty for the idle timeout, or is empty and the
// consumer closed.
func (c *Consumer) notifyLoop(addr string, q *notifyQueue) {
	var conn *frameConn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	idle := time.NewTimer(c.cfg.IdleTimeout)
	defer idle.Stop()
	stop := false
	for {
		c.mu.Lock()
		keys := q.keys
		q.keys = nil
		if len(keys) == 0 && (stop || c.closed) {
			delete(c.notifies, addr)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if len(keys) > 0 {
			conn = c.sendNotify(conn, addr, keys)
			idle.Reset(c.cfg.IdleTimeout)
			continue
		}
		select {
		case <-q.wake:
		case <-idle.C:
			stop = true
		case <-c.done:
		}
	}
}

// sendNotify writes keys to addr's producer on conn, or on a fresh
// connection when conn is nil or turns out to be broken, and returns the
// connection for the next batch (nil after a failure, which it logs: the
// leases then wait for their expiry).
func (c *Consumer) sendNotify(conn *frameConn, addr string, keys []string) *frameConn {
	frames, err := notifyFrames(keys)
	var probe idleconn.Probe
	if conn != nil && probe.Check(conn.Conn) != nil {
		// The producer dropped it (a restart, its idle bound) or sent
		// something on a stream that carries nothing its way: the first
		// write would seem to succeed and be lost.
		conn.Close()
		conn = nil
	}
	for attempt := 0; err == nil && attempt < 2; attempt++ {
		if conn == nil {
			if conn, err = c.openNotify(addr); err != nil {
				break
			}
		}
		if err = conn.SetWriteDeadline(time.Now().Add(c.cfg.IOTimeout)); err == nil {
			if _, err = conn.Write(frames); err == nil {
				return conn
			}
		}
		conn.Close()
		conn = nil
		if attempt == 0 {
			err = nil // a connection the producer dropped: once more on a new one
		}
	}
	c.log.Warn("kvtransfer: could not tell the producer that leases were copied; they wait for their expiry", "addr", addr, "leases", len(keys), "err", err)
	return nil
}

// notifyFrames is keys as NOTIFY frames, as many as the frame bound needs.
func notifyFrames(keys []string) ([]byte, error) {
	var out []byte
	for len(keys) > 0 {
		n, size := 0, 0
		for n < len(keys) && (n == 0 || size+len(keys[n])+8 <= maxNotifyBatch) {
			size += len(keys[n]) + 8
			n++
		}
		var err error
		if out, err = appendJSONFrame(out, frameNotify, notifyMsg{Keys: keys[:n]}); err != nil {
			return nil, err
		}
		keys = keys[n:]
	}
	return out, nil
}

// openNotify dials addr's producer and opens a notification stream: the
// hello, a "notify" request (authenticated like any other) and its accept.
func (c *Consumer) openNotify(addr string) (*frameConn, error) {
	raw, err := net.DialTimeout("tcp", addr, c.cfg.IOTimeout)
	if err != nil {
		return nil, err
	}
	conn := newFrameConn(raw)
	if err := c.handshakeNotify(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("open a notification stream: %w", err)
	}
	return conn, nil
}

func (c *Consumer) handshakeNotify(conn *frameConn) error {
	if err := conn.SetDeadline(time.Now().Add(c.cfg.IOTimeout)); err != nil {
		return err
	}
	var h helloMsg
	if err := readJSON(conn, frameHello, &h); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if len(h.Nonce) != nonceLen {
		return fmt.Errorf("%w: server nonce of %d bytes, want %d", ErrProtocol, len(h.Nonce), nonceLen)
	}
	req := requestMsg{Op: opNotify, Nonce: make([]byte, nonceLen)}
	rand.Read(req.Nonce)
	if c.cfg.Secret != "" {
		req.MAC = consumerMAC(c.cfg.Secret, h.Nonce, &req)
	}
	if err := writeJSON(conn, frameRequest, req); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	var acc acceptMsg
	if err := readJSON(conn, frameAccept, &acc); err != nil {
		return err
	}
	if c.cfg.Secret != "" && !hmac.Equal(acc.MAC, producerMAC(c.cfg.Secret, h.Nonce, req.Nonce, "")) {
		return fmt.Errorf("%w: producer did not prove it knows the secret", ErrAuth)
	}
	return conn.SetDeadline(time.Time{})
}

// notified serves a notification stream after its accept: it frees the
// leases each NOTIFY frame names, until the consumer closes the stream or
// leaves it idle longer than its own idle timeout would.
func (p *Producer) notified(conn net.Conn, log *slog.Logger) {
	for {
		if err := conn.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout + p.cfg.IOTimeout)); err != nil {
			return
		}
		var m notifyMsg
		if err := readJSON(conn, frameNotify, &m); err != nil {
			if !closedByPeer(err) && !isTimeout(err) && !errors.Is(err, net.ErrClosed) {
				log.Info("kvtransfer: bad notification", "err", err)
			}
			return
		}
		for _, key := range m.Keys {
			p.copied(key)
		}
	}
}

// copied ends the lease a consumer copied on its ticket, as an ack would.
// A lease already gone (expired or released after the copy) needs nothing;
// one being streamed to another consumer right now is released as Release
// would.
func (p *Producer) copied(key string) {
	p.end(key, &p.stats.Completed, "kvtransfer: copied on its ticket")
}
