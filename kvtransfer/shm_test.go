//go:build linux

package kvtransfer

import (
	"bytes"
	"errors"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// newRegion is a SharedMemory of size bytes, closed when the test ends.
func newRegion(t *testing.T, size int) *SharedMemory {
	t.Helper()
	m, err := NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// sharedBlocks fills n blocks of bb bytes at the start of m's memory with
// the pattern of seed and returns their bytes and offsets.
func sharedBlocks(m *SharedMemory, n, bb int, seed uint64) ([][]byte, []uint64) {
	var blocks [][]byte
	var offsets []uint64
	for i := range n {
		b := m.Bytes()[i*bb : (i+1)*bb]
		pattern(b, seed<<20+uint64(i))
		off, _ := m.offset(b)
		blocks, offsets = append(blocks, b), append(offsets, off)
	}
	return blocks, offsets
}

// TestSharedMemoryFallsBackToTCP: whatever keeps a consumer from mapping
// and verifying the advertised region, or from wanting to, the transfer
// still happens, over TCP, and nothing stays mapped.
func TestSharedMemoryFallsBackToTCP(t *testing.T) {
	checkGoroutines(t)
	const n, bb = 3, 4096
	region := newRegion(t, n*bb)
	blocks, _ := sharedBlocks(region, n, bb, 21)
	real := region.advert()
	withID := func(id []byte) *sharedAdvert { a := *real; a.ID = id; return &a }
	otherID := bytes.Clone(real.ID)
	otherID[0] ^= 1
	withSize := *real
	withSize.Size += 4096
	noFD := *real
	noFD.FD = 1 << 20
	noPID := *real
	noPID.PID = math.MaxInt32
	// An open file that is not a region: not sealed, no header.
	plain, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.Truncate(real.Size); err != nil {
		t.Fatal(err)
	}
	notRegion := *real
	notRegion.FD = int(plain.Fd())

	tests := []struct {
		name    string
		advert  *sharedAdvert
		optOut  bool
		mapping bool // the consumer may ask for shared memory
	}{
		{name: "producer offers none", advert: nil},
		{name: "no such descriptor", advert: &noFD},
		{name: "no such process", advert: &noPID},
		{name: "other id", advert: withID(otherID)},
		{name: "short id", advert: withID(real.ID[:8])},
		{name: "other size", advert: &withSize},
		{name: "not a sealed region", advert: &notRegion},
		{name: "consumer opts out", advert: real, optOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeProducer(t, tt.advert, streamAnswer(blocks, 40))
			cs := newSlabStore(bb, n)
			c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout, DisableSharedMemory: tt.optOut, Logger: testLogger(t)}, cs)
			defer c.Close()
			dst := cs.allocate(t, n)
			got, err := c.Pull(testCtx(t), f.addr(), testEngine, "k", dst)
			if err != nil {
				t.Fatal(err)
			}
			if got != 40 {
				t.Errorf("numTokens = %d, want 40", got)
			}
			checkPattern(t, cs, dst, 21)
			if req := <-f.requests; req.SharedMemory {
				t.Error("the request asks for shared memory it could not have mapped")
			}
			if st := c.Stats(); st != (ConsumerStats{StreamedTransfers: 1}) {
				t.Errorf("stats = %+v, want one streamed transfer and no mapping", st)
			}
		})
	}
}

// TestSharedMemoryBadOffsets: a producer that names memory outside its
// region, or sends offsets nobody asked for, is a protocol error, and the
// consumer copies nothing.
func TestSharedMemoryBadOffsets(t *testing.T) {
	checkGoroutines(t)
	const n, bb = 2, 4096
	region := newRegion(t, 4*bb)
	_, good := sharedBlocks(region, n, bb, 22)
	size := uint64(region.advert().Size)
	tests := []struct {
		name    string
		advert  *sharedAdvert
		offsets []uint64
		blocks  int
	}{
		{name: "past the end", advert: region.advert(), offsets: []uint64{good[0], size}},
		{name: "straddling the end", advert: region.advert(), offsets: []uint64{good[0], size - bb + 1}},
		{name: "in the header", advert: region.advert(), offsets: []uint64{0, good[1]}},
		{name: "wrapping around", advert: region.advert(), offsets: []uint64{good[0], math.MaxUint64 - bb + 2}},
		{name: "fewer offsets than blocks", advert: region.advert(), offsets: good[:1]},
		{name: "not asked for", advert: nil, offsets: good},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeProducer(t, tt.advert, sharedAnswer(n, bb, 30, tt.offsets))
			cs := newSlabStore(bb, n)
			c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}, cs)
			defer c.Close()
			dst := cs.allocate(t, n)
			_, err := c.Pull(testCtx(t), f.addr(), testEngine, "k", dst)
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
			t.Log(err)
			for _, id := range dst {
				if !bytes.Equal(cs.Block(id), make([]byte, bb)) {
					t.Fatalf("dst block %d written by a refused transfer", id)
				}
			}
		})
	}
}

// TestSharedMemoryWhenNot: a producer with its region turned off does not
// offer it, and a lease whose blocks lie outside the region goes over TCP
// although the region is offered.
func TestSharedMemoryWhenNot(t *testing.T) {
	checkGoroutines(t)
	const n, bb = 2, 4096
	tests := []struct {
		name   string
		store  func(t *testing.T) *slabStore
		optOut bool
		offers bool
	}{
		{name: "producer opts out", store: func(t *testing.T) *slabStore { return newSharedSlabStore(t, bb, 2*n) }, optOut: true},
		{name: "blocks outside the region", store: func(t *testing.T) *slabStore {
			s := newSlabStore(bb, 2*n)
			s.shm = newRegion(t, 2*n*bb)
			return s
		}, offers: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := tt.store(t)
			p, err := NewProducer(Config{EngineID: testEngine, Shape: testShape, IOTimeout: testIOTimeout, DisableSharedMemory: tt.optOut, Logger: testLogger(t)}, ps)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if offers := p.advert != nil; offers != tt.offers {
				t.Errorf("producer offers its region: %v, want %v", offers, tt.offers)
			}
			src := ps.allocate(t, n)
			fill(ps, src, 23)
			if err := p.Export("k", src, 20); err != nil {
				t.Fatal(err)
			}
			cs := newSlabStore(bb, n)
			c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}, cs)
			defer c.Close()
			dst := cs.allocate(t, n)
			if _, err := c.Pull(testCtx(t), p.Addr().String(), testEngine, "k", dst); err != nil {
				t.Fatal(err)
			}
			checkPattern(t, cs, dst, 23)
			if st := c.Stats(); st.StreamedTransfers != 1 || st.SharedTransfers != 0 {
				t.Errorf("stats = %+v, want one streamed transfer", st)
			}
			waitStats(t, p, ProducerStats{Completed: 1})
		})
	}
}

// TestSharedMemoryOldConsumer: a consumer that knows nothing of shared
// memory (no "shm" in its request) gets the bytes, as before.
func TestSharedMemoryOldConsumer(t *testing.T) {
	checkGoroutines(t)
	r := newRig(t, rigOpts{shared: true})
	r.export(t, "k", 2, 24)
	conn, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testIOTimeout))
	var h helloMsg
	if err := readJSON(conn, frameHello, &h); err != nil {
		t.Fatal(err)
	}
	if h.SharedMemory == nil {
		t.Fatal("the hello offers no region")
	}
	req := requestMsg{Op: opPull, Key: "k", EngineID: testEngine, Blocks: 2, BlockBytes: r.ps.bb, Shape: testShape,
		ByteOrder: nativeByteOrder(), Nonce: make([]byte, nonceLen)}
	if err := writeJSON(conn, frameRequest, req); err != nil {
		t.Fatal(err)
	}
	var acc acceptMsg
	if err := readJSON(conn, frameAccept, &acc); err != nil {
		t.Fatal(err)
	}
	if typ, _, err := readFrame(conn); err != nil || typ != frameData {
		t.Fatalf("frame type %d, err %v; want DATA", typ, err)
	}
	r.p.Release("k")
}

// TestSharedMemoryProducerRestart: a producer that comes back on the same
// address with a new region is mapped afresh, and the old mapping goes.
func TestSharedMemoryProducerRestart(t *testing.T) {
	checkGoroutines(t)
	const n, bb = 2, 4096
	cs := newSlabStore(bb, n)
	c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}, cs)
	defer c.Close()
	addr := "127.0.0.1:0"
	for round := range 2 {
		ps := newSharedSlabStore(t, bb, n)
		p, err := NewProducer(Config{EngineID: testEngine, Shape: testShape, ListenAddr: addr, IOTimeout: testIOTimeout, Logger: testLogger(t)}, ps)
		if err != nil {
			t.Fatal(err)
		}
		addr = p.Addr().String()
		src := ps.allocate(t, n)
		fill(ps, src, uint64(round))
		if err := p.Export("k", src, 20); err != nil {
			t.Fatal(err)
		}
		dst := cs.allocate(t, n)
		if _, err := c.Pull(testCtx(t), addr, testEngine, "k", dst); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		checkPattern(t, cs, dst, uint64(round))
		cs.Free(dst)
		if st := c.Stats(); st.SharedTransfers != uint64(round+1) || st.MappedRegions != 1 {
			t.Fatalf("round %d: stats = %+v, want %d shared transfers and one region mapped", round, st, round+1)
		}
		waitStats(t, p, ProducerStats{Completed: 1})
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// memfds counts this process's descriptors of, and mappings of, regions.
func memfds(t *testing.T) (fds, maps int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "/memfd:omnipd-kv") {
			fds++
		}
	}
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return fds, strings.Count(string(b), "/memfd:omnipd-kv")
}

// TestSharedMemoryReleased: the consumer's mappings go with Close, the
// region's descriptor and mapping with its own Close; nothing is left.
func TestSharedMemoryReleased(t *testing.T) {
	checkGoroutines(t)
	fds0, maps0 := memfds(t)
	const n, bb = 2, 4096
	ps := newSharedSlabStore(t, bb, 2*n)
	p, err := NewProducer(Config{EngineID: testEngine, Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}, ps)
	if err != nil {
		t.Fatal(err)
	}
	cs := newSlabStore(bb, n)
	c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}, cs)
	for i := range 3 {
		src := ps.allocate(t, n)
		if err := p.Export("k", src, 20); err != nil {
			t.Fatal(err)
		}
		dst := cs.allocate(t, n)
		if _, err := c.Pull(testCtx(t), p.Addr().String(), testEngine, "k", dst); err != nil {
			t.Fatal(err)
		}
		cs.Free(dst)
		waitStats(t, p, ProducerStats{Completed: uint64(i + 1)})
	}
	if fds, maps := memfds(t); fds != fds0+1 || maps != maps0+2 {
		t.Errorf("during transfers: %d region descriptors, %d mappings; want %d and %d (the region, and one mapping a side)", fds, maps, fds0+1, maps0+2)
	}
	c.Close()
	if st := c.Stats(); st.MappedRegions != 0 {
		t.Errorf("consumer maps %d regions after Close", st.MappedRegions)
	}
	if _, maps := memfds(t); maps != maps0+1 {
		t.Errorf("after the consumer's Close: %d mappings, want %d (the producer's)", maps, maps0+1)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ps.shm.Close(); err != nil {
		t.Fatal(err)
	}
	if fds, maps := memfds(t); fds != fds0 || maps != maps0 {
		t.Errorf("after Close: %d region descriptors, %d mappings; want %d and %d", fds, maps, fds0, maps0)
	}
}
