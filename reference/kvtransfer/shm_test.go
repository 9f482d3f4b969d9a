//go:build linux

package kvtransfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"testing"
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
// the pattern of seed and returns their bytes and places (offset and
// generation), as a producer would send them.
func sharedBlocks(m *SharedMemory, n, bb int, seed uint64) ([][]byte, []sharedBlock) {
	var blocks [][]byte
	var places []sharedBlock
	for i := range n {
		b := m.Bytes()[i*bb : (i+1)*bb]
		pattern(b, seed<<20+uint64(i))
		off, _ := m.offset(b)
		blocks, places = append(blocks, b), append(places, sharedBlock{offset: off, generation: m.generation(off, bb).Load()})
	}
	return blocks, places
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
	// Regions whose header a consumer must not trust: another layout, and
	// a generation table that overruns the file.
	oldLayout := newRegion(t, n*bb)
	copy(oldLayout.mem, "OKVTSHM1")
	badTable := newRegion(t, n*bb)
	binary.BigEndian.PutUint64(badTable.mem[sharedEntriesOff:], uint64(len(badTable.mem)))
	badData := newRegion(t, n*bb)
	binary.BigEndian.PutUint64(badData.mem[sharedDataOff:], uint64(len(badData.mem))+1)

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
		{name: "another layout", advert: oldLayout.advert()},
		{name: "table past the end", advert: badTable.advert()},
		{name: "blocks past the end", advert: badData.advert()},
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
	at := func(off uint64) sharedBlock { return sharedBlock{offset: off} }
	tests := []struct {
		name    string
		advert  *sharedAdvert
		offsets []sharedBlock
	}{
		{name: "past the end", advert: region.advert(), offsets: []sharedBlock{good[0], at(size)}},
		{name: "straddling the end", advert: region.advert(), offsets: []sharedBlock{good[0], at(size - bb + 1)}},
		{name: "in the header", advert: region.advert(), offsets: []sharedBlock{at(0), good[1]}},
		{name: "in the generation table", advert: region.advert(), offsets: []sharedBlock{good[0], at(sharedHeaderLen)}},
		{name: "wrapping around", advert: region.advert(), offsets: []sharedBlock{good[0], at(math.MaxUint64 - bb + 2)}},
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
		// Blocks smaller than a generation counter's share of the region
		// could share one.
		{name: "blocks too small", store: func(t *testing.T) *slabStore { return newSharedSlabStore(t, sharedMinBlock/2, 2*n) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := tt.store(t)
			bb := ps.bb
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
	conn, h := dialRaw(t, r.addr)
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

// TestSharedMemoryStaleGeneration: a block whose counter no longer reads
// what the producer sent was freed since, so the copy is void: the pull
// fails as an unknown transfer and acks nothing.
func TestSharedMemoryStaleGeneration(t *testing.T) {
	checkGoroutines(t)
	const n, bb = 3, 4096
	region := newRegion(t, n*bb)
	_, places := sharedBlocks(region, n, bb, 25)
	region.generation(places[1].offset, bb).Add(1) // freed after the lease was checked out
	acked := make(chan bool, 1)
	f := newFakeProducer(t, region.advert(), func(conn net.Conn, req requestMsg) error {
		if _, err := conn.Write(sharedFrames(n, bb, 30, places)); err != nil {
			return err
		}
		typ, _, err := readFrame(conn)
		acked <- err == nil && typ == frameAck
		return nil
	})
	cs := newSlabStore(bb, n)
	c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}, cs)
	defer c.Close()
	dst := cs.allocate(t, n)
	_, err := c.Pull(testCtx(t), f.addr(), testEngine, "k", dst)
	if !errors.Is(err, ErrUnknownTransfer) {
		t.Fatalf("err = %v, want ErrUnknownTransfer", err)
	}
	t.Log(err)
	if <-acked {
		t.Error("the consumer acked a void copy")
	}
	if st := c.Stats(); st.SharedTransfers != 0 || st.StreamedTransfers != 0 {
		t.Errorf("stats = %+v, want no completed transfer", st)
	}
	if n := c.IdleConns(); n != 0 {
		t.Errorf("%d idle connections after a failed pull, want 0", n)
	}
}

// TestSharedMemoryFreedDuringCopy: whichever way the producer frees a lease
// while a consumer is between its copy and its check — Release aborting the
// stream, Close, or expiry after the stream failed — the consumer reports
// the transfer as unknown rather than keep blocks that may have been
// rewritten meanwhile (here they are).
func TestSharedMemoryFreedDuringCopy(t *testing.T) {
	checkGoroutines(t)
	const n = 4
	// dropStream fails the producer's side of every stream, as an IO
	// timeout would.
	dropStream := func(r *rig) {
		r.p.mu.Lock()
		for c := range r.p.conns {
			c.Close()
		}
		r.p.mu.Unlock()
	}
	tests := []struct {
		name string
		free func(t *testing.T, r *rig)
		want ProducerStats
	}{
		{name: "release", free: func(t *testing.T, r *rig) {
			if !r.p.Release("k") {
				t.Error("Release = false")
			}
		}, want: ProducerStats{Released: 1}},
		{name: "close", free: func(t *testing.T, r *rig) {
			if err := r.p.Close(); err != nil {
				t.Error(err)
			}
		}, want: ProducerStats{Released: 1}},
		{name: "expiry after a failed stream", free: func(t *testing.T, r *rig) {
			dropStream(r)
			waitFor(t, "the stream to fail", func() bool { return r.p.Stats().Streaming == 0 })
			r.clock.Advance(testLease)
			r.p.ExpireNow()
		}, want: ProducerStats{Expired: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, rigOpts{shared: true})
			r.export(t, "k", n, 26)
			copied := false
			r.c.afterSharedCopy = func() {
				copied = true
				tt.free(t, r)
				waitFor(t, "the producer to free the lease", func() bool { return r.ps.inUse() == 0 })
				// The engine takes the blocks back and writes over them.
				reused := r.ps.allocate(t, n)
				fill(r.ps, reused, 99)
				r.ps.Free(reused)
			}
			dst := r.cs.allocate(t, n)
			defer r.cs.Free(dst)
			_, err := r.c.Pull(testCtx(t), r.addr, testEngine, "k", dst)
			if !copied {
				t.Fatalf("the pull never reached its check: %v", err)
			}
			if !errors.Is(err, ErrUnknownTransfer) {
				t.Fatalf("err = %v, want ErrUnknownTransfer", err)
			}
			t.Log(err)
			if st := r.c.Stats(); st.SharedTransfers != 0 {
				t.Errorf("stats = %+v, want no completed transfer", st)
			}
			if n := r.c.IdleConns(); n != 0 {
				t.Errorf("%d idle connections after a failed pull, want 0", n)
			}
			wantStats(t, r.p, tt.want)
		})
	}
}

// TestSharedMemoryPullDoesNotWaitForDone: a pull out of shared memory is
// complete once its ack is sent, as over TCP: a producer that holds back
// its DONE does not hold back the pull, and the next pull on the pooled
// connection reads that DONE first.
func TestSharedMemoryPullDoesNotWaitForDone(t *testing.T) {
	checkGoroutines(t)
	const n, bb = 2, 4096
	region := newRegion(t, 2*n*bb)
	_, all := sharedBlocks(region, 2*n, bb, 27)
	first, second := all[:n], all[n:]
	sendDone := make(chan struct{})
	later := make(chan requestMsg, 1)
	f := newFakeProducer(t, region.advert(), func(conn net.Conn, req requestMsg) error {
		for i, places := range [][]sharedBlock{first, second} {
			if !req.SharedMemory {
				return errors.New("the request does not ask for shared memory")
			}
			if _, err := conn.Write(sharedFrames(n, bb, 20+i, places)); err != nil {
				return err
			}
			if typ, _, err := readFrame(conn); err != nil || typ != frameAck {
				return fmt.Errorf("want an ack: type %d, %v", typ, err)
			}
			if i == 1 {
				return writeFrame(conn, frameDone, nil)
			}
			// The DONE, and the next hello with it, only once the test
			// has seen the first pull return.
			<-sendDone
			b, _ := appendJSONFrame(doneFrame, frameHello, helloMsg{Nonce: make([]byte, nonceLen), SharedMemory: region.advert()})
			if _, err := conn.Write(b); err != nil {
				return err
			}
			if err := readJSON(conn, frameRequest, &req); err != nil {
				return err
			}
			later <- req
		}
		return nil
	})
	cs := newSlabStore(bb, 2*n)
	c := NewConsumer(Config{Shape: testShape, IOTimeout: testIOTimeout, Logger: testLogger(t)}, cs)
	defer c.Close()

	dst := cs.allocate(t, n)
	got, err := c.Pull(testCtx(t), f.addr(), testEngine, "a", dst)
	close(sendDone)
	if err != nil {
		t.Fatalf("first pull: %v", err)
	}
	if got != 20 {
		t.Errorf("first pull: numTokens = %d, want 20", got)
	}
	checkPattern(t, cs, dst, 27)
	if n := c.IdleConns(); n != 1 {
		t.Fatalf("%d idle connections after the first pull, want 1", n)
	}

	dst2 := cs.allocate(t, n)
	if got, err = c.Pull(testCtx(t), f.addr(), testEngine, "b", dst2); err != nil {
		t.Fatalf("second pull: %v", err)
	}
	if got != 21 {
		t.Errorf("second pull: numTokens = %d, want 21", got)
	}
	want := make([]byte, bb)
	for i, id := range dst2 {
		pattern(want, 27<<20+uint64(n+i))
		if !bytes.Equal(cs.Block(id), want) {
			t.Fatalf("second pull: block %d differs", i)
		}
	}
	if req := <-later; req.Key != "b" {
		t.Errorf("second request on the kept connection is for %q, want b", req.Key)
	}
	if len(f.requests) != 1 {
		t.Errorf("the fake producer saw %d connections, want 1", len(f.requests))
	}
	if st := c.Stats(); st.SharedTransfers != 2 {
		t.Errorf("stats = %+v, want two shared transfers", st)
	}
}

// TestSharedLayout: the generation table has a counter for every block of
// at least sharedMinBlock bytes, blocks that do not overlap never share one,
// and the block area starts page-aligned after the table.
func TestSharedLayout(t *testing.T) {
	for _, size := range []int{1, sharedMinBlock, 4096, 64 << 20, 64<<20 + 3} {
		l, total, ok := newSharedLayout(size)
		if !ok {
			t.Fatalf("size %d: no layout", size)
		}
		if l.data%sharedPage != 0 || l.table != sharedHeaderLen || l.table+8*l.entries > l.data || total != int(l.data)+size {
			t.Fatalf("size %d: layout %+v, total %d", size, l, total)
		}
		for _, bb := range []int{sharedMinBlock, sharedMinBlock + 8, 4096} {
			if bb > size {
				continue
			}
			seen := map[uint64]bool{}
			for off := l.data; off+uint64(bb) <= uint64(total); off += uint64(bb) {
				pos, ok := l.slot(total, off, bb)
				if !ok || seen[pos] {
					t.Fatalf("size %d, blocks of %d: block at %d has counter %d (ok %v), seen before: %v", size, bb, off, pos, ok, seen[pos])
				}
				seen[pos] = true
			}
		}
	}
	if _, _, ok := newSharedLayout(maxInt); ok {
		t.Error("a layout for a region of maxInt bytes")
	}
}
