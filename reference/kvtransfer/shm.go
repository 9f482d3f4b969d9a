package kvtransfer

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The same-host fast path. A producer whose blocks live in a SharedMemory
// region names the region in every hello; a consumer on the same host maps
// it read-only once, and from then on a transfer's DATA carries where each
// block lies instead of its bytes, and the consumer copies the blocks
// straight from the producer's memory into its own. Everything else —
// authentication, leases, the ack, release — is the TCP protocol unchanged.

const (
	// sharedHeaderLen is the region's first page: magic, id, size and where
	// the generation table and the blocks lie (sharedLayout). The table
	// starts after it and the blocks after the table, both page-aligned.
	sharedHeaderLen = 4096
	sharedPage      = 4096
	// sharedMagic names the layout: a consumer that knows another layout
	// (the first one had no generation table) refuses the region and stays
	// on TCP rather than misreading it.
	sharedMagic = "OKVTSHM2"
	sharedIDLen = 16
	// sharedMinBlock is the smallest block that gets a generation counter
	// of its own: the table holds one uint64 per sharedMinBlock bytes of
	// the block area (1/64 of its size, and only the counters in use are
	// ever touched, so the pages behind the rest are never allocated). A
	// producer with smaller blocks keeps them on TCP.
	sharedMinBlock = 512
)

// Header fields after the magic, big-endian.
const (
	sharedIDOff      = len(sharedMagic)          // [16]byte id
	sharedSizeOff    = sharedIDOff + sharedIDLen // u64: the whole file
	sharedTableOff   = sharedSizeOff + 8         // u64: offset of the generation table
	sharedEntriesOff = sharedTableOff + 8        // u64: counters in it
	sharedDataOff    = sharedEntriesOff + 8      // u64: offset of the block area
	// sharedTicketKeyOff holds the key the producer signs its tickets with
	// (see ticket.go): only a process that can map the region can read it,
	// and such a process can read every block anyway.
	sharedTicketKeyOff = sharedDataOff + 8
	sharedTicketKeyLen = 32
)

// sharedLayout is where a region's generation table and blocks lie, as its
// header says. The table has a uint64 counter (native byte order, updated
// atomically) for every block slot: a block of bb bytes at offset off uses
// slot (off-data)/bb, so blocks that do not overlap never share a counter.
// The producer adds one to a block's counter every time a lease lets go of
// the block, before the block goes back to its cache; a consumer that
// copied a block checks, after the copy, that its counter still reads what
// the producer sent when the lease was checked out, which proves that the
// block was not freed, and perhaps rewritten, while it was copied — a
// seqlock, with no round trip to the producer.
type sharedLayout struct {
	table, entries, data uint64
}

// newSharedLayout lays out a region whose block area is size bytes.
func newSharedLayout(size int) (sharedLayout, int, bool) {
	entries := (uint64(size) + sharedMinBlock - 1) / sharedMinBlock
	tableBytes := (8*entries + sharedPage - 1) / sharedPage * sharedPage
	l := sharedLayout{table: sharedHeaderLen, entries: entries, data: sharedHeaderLen + tableBytes}
	if uint64(size) > uint64(maxInt)-l.data {
		return sharedLayout{}, 0, false
	}
	return l, int(l.data) + size, true
}

// slot returns the byte offset, in a mapping of memLen bytes, of the
// counter of the block of bb bytes at off, or false if the block does not
// lie wholly in the block area or has no counter.
func (l sharedLayout) slot(memLen int, off uint64, bb int) (uint64, bool) {
	if bb <= 0 || bb > memLen || off < l.data || off > uint64(memLen-bb) {
		return 0, false
	}
	i := (off - l.data) / uint64(bb)
	if i >= l.entries {
		return 0, false
	}
	return l.table + 8*i, true
}

// counterAt is the generation counter at pos, a slot in mem.
func counterAt(mem []byte, pos uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[pos]))
}

// SharedMemory is zeroed memory that processes of the same user on this
// host can map read-only, for a producer's cache: NewSharedMemory makes it,
// the engine's cache moves into Bytes or Float32s, and SharedCacheStore
// hands it to a Producer, which offers it to consumers on its host. Its
// header carries a random 128-bit id, which a consumer checks to know that
// it mapped the region the producer named and not something else under the
// same process and descriptor numbers (another host, another process).
// Besides the blocks it holds a generation counter per block slot (see
// sharedLayout), so that a consumer can tell that the blocks it copied
// stayed leased throughout.
//
// Only Linux has it (memfd_create(2), consumers open
// /proc/<pid>/fd/<fd>); elsewhere NewSharedMemory fails and the data path
// stays on TCP.
type SharedMemory struct {
	fd        int
	mem       []byte // the whole mapping: header page, generation table, then the blocks
	id        [sharedIDLen]byte
	ticketKey [sharedTicketKeyLen]byte
	lay       sharedLayout

	mu     sync.Mutex
	closed bool
}

// NewSharedMemory makes a region with size bytes for blocks, mapped
// read/write. The file is a little larger: a header page and the
// generation table come first.
func NewSharedMemory(size int) (*SharedMemory, error) {
	lay, total, ok := newSharedLayout(size)
	if size <= 0 || !ok {
		return nil, fmt.Errorf("kvtransfer: shared memory of %d bytes: %w", size, ErrInvalid)
	}
	fd, mem, err := newSharedMemory(total)
	if err != nil {
		return nil, fmt.Errorf("kvtransfer: shared memory of %d bytes: %w", size, err)
	}
	m := &SharedMemory{fd: fd, mem: mem, lay: lay}
	rand.Read(m.id[:]) // never fails (crypto/rand crashes the program instead)
	rand.Read(m.ticketKey[:])
	copy(mem, sharedMagic)
	copy(mem[sharedIDOff:], m.id[:])
	copy(mem[sharedTicketKeyOff:], m.ticketKey[:])
	binary.BigEndian.PutUint64(mem[sharedSizeOff:], uint64(len(mem)))
	binary.BigEndian.PutUint64(mem[sharedTableOff:], lay.table)
	binary.BigEndian.PutUint64(mem[sharedEntriesOff:], lay.entries)
	binary.BigEndian.PutUint64(mem[sharedDataOff:], lay.data)
	return m, nil
}

// Bytes is the region's memory, size bytes. It stays valid until Close.
func (m *SharedMemory) Bytes() []byte { return m.mem[m.lay.data:len(m.mem):len(m.mem)] }

// Float32s is the region's memory seen as float32s, for a float32 cache.
func (m *SharedMemory) Float32s() []float32 {
	b := m.Bytes()
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// Close unmaps the region and closes its descriptor. Nothing may use its
// memory afterwards; consumers that mapped it keep their own mappings
// (until they let go of them, the pages stay allocated).
func (m *SharedMemory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	if err := releaseSharedMemory(m.fd, m.mem); err != nil {
		return fmt.Errorf("kvtransfer: close shared memory: %w", err)
	}
	return nil
}

// advert is what the producer's hellos say about the region.
func (m *SharedMemory) advert() *sharedAdvert {
	return &sharedAdvert{PID: os.Getpid(), FD: m.fd, ID: m.id[:], Size: int64(len(m.mem))}
}

// offset is where b lies in the region, counted from the start of the
// header, if b lies wholly within the region's block area.
func (m *SharedMemory) offset(b []byte) (uint64, bool) {
	data := int(m.lay.data)
	if len(b) == 0 || len(b) > len(m.mem)-data {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base+uintptr(data) || p-base > uintptr(len(m.mem)-len(b)) {
		return 0, false
	}
	return uint64(p - base), true
}

// generation is the counter of the block of bb bytes at off (from offset),
// or nil if it has none.
func (m *SharedMemory) generation(off uint64, bb int) *atomic.Uint64 {
	pos, ok := m.lay.slot(len(m.mem), off, bb)
	if !ok {
		return nil
	}
	return counterAt(m.mem, pos)
}

// sharedStore is an optional BlockStore capability: the region every block
// of the store lies in, or nil. A producer offers it to consumers on its
// host; a block found outside it at Export sends its lease over TCP.
type sharedStore interface {
	SharedMemory() *SharedMemory
}

// checkSharedHeader checks that mem, a consumer's mapping, is the region adv
// names, and returns its layout once it has checked that the table and the
// block area lie within the mapping, the table 8-aligned and clear of the
// header and the blocks.
func checkSharedHeader(mem []byte, adv *sharedAdvert) (sharedLayout, error) {
	if len(mem) < sharedHeaderLen || string(mem[:len(sharedMagic)]) != sharedMagic {
		return sharedLayout{}, errors.New("not a kvtransfer region of this layout")
	}
	if id := mem[sharedIDOff : sharedIDOff+sharedIDLen]; !bytes.Equal(id, adv.ID) {
		return sharedLayout{}, fmt.Errorf("region id %x, the producer advertised %x", id, adv.ID)
	}
	size := binary.BigEndian.Uint64(mem[sharedSizeOff:])
	if size != uint64(adv.Size) || size != uint64(len(mem)) {
		return sharedLayout{}, fmt.Errorf("region of %d bytes, the producer advertised %d", size, adv.Size)
	}
	l := sharedLayout{
		table:   binary.BigEndian.Uint64(mem[sharedTableOff:]),
		entries: binary.BigEndian.Uint64(mem[sharedEntriesOff:]),
		data:    binary.BigEndian.Uint64(mem[sharedDataOff:]),
	}
	if l.table < sharedHeaderLen || l.table%8 != 0 || l.table > size || l.entries > (size-l.table)/8 ||
		l.data < l.table+8*l.entries || l.data > size {
		return sharedLayout{}, fmt.Errorf("generation table at %d (%d counters) and blocks at %d do not fit a region of %d bytes", l.table, l.entries, l.data, size)
	}
	return l, nil
}

// peerRegion is a producer's region as a consumer sees it: mapped, or found
// unusable from here (mem nil), so that a producer on another host costs
// one failed open, not one per transfer. A mapping is unmapped when its
// last holder lets go: the consumer holds one reference while the region is
// the one its producer advertises, and every transfer copying from it
// another.
type peerRegion struct {
	id   []byte
	size int64
	mem  []byte // read-only mapping of the whole file; nil when unusable
	lay  sharedLayout
	refs int // guarded by Consumer.mu
}

// ticketKey is the key the producer signs its tickets with, from the
// region's header; all zeros (a producer that signs none) takes no ticket.
func (r *peerRegion) ticketKey() ([]byte, bool) {
	k := r.mem[sharedTicketKeyOff : sharedTicketKeyOff+sharedTicketKeyLen]
	return k, !bytes.Equal(k, make([]byte, sharedTicketKeyLen))
}

func (r *peerRegion) is(adv *sharedAdvert) bool {
	return r.size == adv.Size && bytes.Equal(r.id, adv.ID)
}

// region returns the mapping of the region a producer at addr advertised,
// holding a reference for the caller, or nil to use TCP. A producer that
// restarted advertises a new id; its old mapping is let go then.
func (c *Consumer) region(addr string, adv *sharedAdvert) *peerRegion {
	if adv == nil || c.cfg.DisableSharedMemory {
		return nil
	}
	c.mu.Lock()
	if r := c.regions[addr]; !c.closed && r != nil && r.is(adv) {
		defer c.mu.Unlock()
		return c.holdLocked(r)
	}
	c.mu.Unlock()

	// Map outside the lock: a few system calls, once per producer region.
	mem, lay, err := mapSharedRegion(adv)
	if err != nil {
		c.log.Debug("kvtransfer: cannot use the producer's shared memory; using TCP", "addr", addr, "pid", adv.PID, "fd", adv.FD, "err", err)
	} else {
		c.mapped.Add(1)
	}
	r := &peerRegion{id: bytes.Clone(adv.ID), size: adv.Size, mem: mem, lay: lay, refs: 1}
	c.mu.Lock()
	if c.closed {
		// Not kept: the mapping is this transfer's alone, and goes when
		// the transfer lets go of it.
		c.mu.Unlock()
		if mem == nil {
			return nil
		}
		return r
	}
	old := c.regions[addr]
	if old != nil && old.is(adv) {
		// Another transfer mapped the region first.
		held := c.holdLocked(old)
		c.mu.Unlock()
		c.unmap(mem)
		return held
	}
	c.regions[addr] = r
	held := c.holdLocked(r)
	var drop []byte
	if old != nil {
		if old.refs--; old.refs == 0 {
			drop = old.mem
		}
	}
	c.mu.Unlock()
	c.unmap(drop)
	return held
}

// holdLocked takes a reference on r for a transfer, or returns nil if r is
// a region found unusable.
func (c *Consumer) holdLocked(r *peerRegion) *peerRegion {
	if r.mem == nil {
		return nil
	}
	r.refs++
	return r
}

// letGo drops a transfer's reference on r.
func (c *Consumer) letGo(r *peerRegion) {
	c.mu.Lock()
	r.refs--
	last := r.refs == 0
	c.mu.Unlock()
	if last {
		c.unmap(r.mem)
	}
}

// unmap releases a mapping (nil: nothing to do).
func (c *Consumer) unmap(mem []byte) {
	if mem == nil {
		return
	}
	c.mapped.Add(-1)
	releasePeerMapping(mem)
}
