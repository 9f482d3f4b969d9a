package kvtransfer

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"
)

// The same-host fast path. A producer whose blocks live in a SharedMemory
// region names the region in every hello; a consumer on the same host maps
// it read-only once, and from then on a transfer's DATA carries where each
// block lies instead of its bytes, and the consumer copies the blocks
// straight from the producer's memory into its own. Everything else —
// authentication, leases, the ack, release — is the TCP protocol unchanged.

const (
	// sharedHeaderLen is the region's first page: magic, id and size. The
	// blocks start after it, so they stay page-aligned.
	sharedHeaderLen = 4096
	sharedMagic     = "OKVTSHM1"
	sharedIDLen     = 16
)

// SharedMemory is zeroed memory that processes of the same user on this
// host can map read-only, for a producer's cache: NewSharedMemory makes it,
// the engine's cache moves into Bytes or Float32s, and SharedCacheStore
// hands it to a Producer, which offers it to consumers on its host. Its
// header carries a random 128-bit id, which a consumer checks to know that
// it mapped the region the producer named and not something else under the
// same process and descriptor numbers (another host, another process).
//
// Only Linux has it (memfd_create(2), consumers open
// /proc/<pid>/fd/<fd>); elsewhere NewSharedMemory fails and the data path
// stays on TCP.
type SharedMemory struct {
	fd  int
	mem []byte // the whole mapping: header page, then the blocks
	id  [sharedIDLen]byte

	mu     sync.Mutex
	closed bool
}

// NewSharedMemory makes a region of size bytes, mapped read/write.
func NewSharedMemory(size int) (*SharedMemory, error) {
	if size <= 0 || size > maxInt-sharedHeaderLen {
		return nil, fmt.Errorf("kvtransfer: shared memory of %d bytes: %w", size, ErrInvalid)
	}
	fd, mem, err := newSharedMemory(sharedHeaderLen + size)
	if err != nil {
		return nil, fmt.Errorf("kvtransfer: shared memory of %d bytes: %w", size, err)
	}
	m := &SharedMemory{fd: fd, mem: mem}
	rand.Read(m.id[:]) // never fails (crypto/rand crashes the program instead)
	copy(mem, sharedMagic)
	copy(mem[len(sharedMagic):], m.id[:])
	binary.BigEndian.PutUint64(mem[len(sharedMagic)+sharedIDLen:], uint64(len(mem)))
	return m, nil
}

// Bytes is the region's memory, size bytes. It stays valid until Close.
func (m *SharedMemory) Bytes() []byte { return m.mem[sharedHeaderLen:len(m.mem):len(m.mem)] }

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
// header, if b lies wholly within the region's blocks.
func (m *SharedMemory) offset(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > len(m.mem)-sharedHeaderLen {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base+sharedHeaderLen || p-base > uintptr(len(m.mem)-len(b)) {
		return 0, false
	}
	return uint64(p - base), true
}

// sharedStore is an optional BlockStore capability: the region every block
// of the store lies in, or nil. A producer offers it to consumers on its
// host; a block found outside it at Export sends its lease over TCP.
type sharedStore interface {
	SharedMemory() *SharedMemory
}

// checkSharedHeader checks that mem, a consumer's mapping, is the region adv
// names.
func checkSharedHeader(mem []byte, adv *sharedAdvert) error {
	if len(mem) < sharedHeaderLen || string(mem[:len(sharedMagic)]) != sharedMagic {
		return errors.New("not a kvtransfer region")
	}
	if id := mem[len(sharedMagic) : len(sharedMagic)+sharedIDLen]; !bytes.Equal(id, adv.ID) {
		return fmt.Errorf("region id %x, the producer advertised %x", id, adv.ID)
	}
	if size := binary.BigEndian.Uint64(mem[len(sharedMagic)+sharedIDLen:]); size != uint64(adv.Size) {
		return fmt.Errorf("region of %d bytes, the producer advertised %d", size, adv.Size)
	}
	return nil
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
	refs int    // guarded by Consumer.mu
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
	mem, err := mapSharedRegion(adv)
	if err != nil {
		c.log.Debug("kvtransfer: cannot use the producer's shared memory; using TCP", "addr", addr, "pid", adv.PID, "fd", adv.FD, "err", err)
	} else {
		c.mapped.Add(1)
	}
	r := &peerRegion{id: bytes.Clone(adv.ID), size: adv.Size, mem: mem, refs: 1}
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
