package kvtransfer

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// slabStore is an in-memory BlockStore: one byte slab cut into blocks, with
// used-block accounting that panics on a double free, as kvcache does.
type slabStore struct {
	bb         int
	slab       []byte
	descending bool          // hand out high ids first, so a consumer's ids differ from a producer's
	shm        *SharedMemory // the slab's memory, when it is shared

	mu      sync.Mutex
	used    []bool
	onBlock func(id int) // test hook, set before use; called on every Block
}

var (
	_ BlockStore   = (*slabStore)(nil)
	_ blockCounter = (*slabStore)(nil)
	_ sharedStore  = (*slabStore)(nil)
)

func newSlabStore(blockBytes, numBlocks int) *slabStore {
	return &slabStore{bb: blockBytes, slab: make([]byte, blockBytes*numBlocks), used: make([]bool, numBlocks)}
}

// newSharedSlabStore is a slabStore whose slab is a SharedMemory region,
// closed when the test ends.
func newSharedSlabStore(tb testing.TB, blockBytes, numBlocks int) *slabStore {
	tb.Helper()
	m, err := NewSharedMemory(blockBytes * numBlocks)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Error(err)
		}
	})
	return &slabStore{bb: blockBytes, slab: m.Bytes(), shm: m, used: make([]bool, numBlocks)}
}

func (s *slabStore) SharedMemory() *SharedMemory { return s.shm }
func (s *slabStore) BlockBytes() int             { return s.bb }
func (s *slabStore) NumBlocks() int              { return len(s.used) }

func (s *slabStore) Block(id int) []byte {
	if s.onBlock != nil {
		s.onBlock(id)
	}
	return s.slab[id*s.bb : (id+1)*s.bb : (id+1)*s.bb]
}

func (s *slabStore) Free(ids []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if !s.used[id] {
			panic(fmt.Sprintf("slabStore: free of block %d that is not allocated", id))
		}
		s.used[id] = false
	}
}

func (s *slabStore) allocate(tb testing.TB, n int) []int {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int, 0, n)
	for i := range s.used {
		id := i
		if s.descending {
			id = len(s.used) - 1 - i
		}
		if len(ids) == n {
			break
		}
		if !s.used[id] {
			s.used[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) < n {
		tb.Fatalf("slabStore: out of blocks: want %d", n)
	}
	return ids
}

func (s *slabStore) inUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, u := range s.used {
		if u {
			n++
		}
	}
	return n
}

// pattern fills b with bytes determined by seed, cheaply (xorshift, a word
// at a time: the race detector makes byte loops over many MiB slow).
func pattern(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 | 1
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if len(b)-i >= 8 {
			binary.LittleEndian.PutUint64(b[i:], x)
			continue
		}
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
}

// fill writes a distinct pattern into each of ids, derived from seed.
func fill(s *slabStore, ids []int, seed uint64) {
	for i, id := range ids {
		pattern(s.Block(id), seed<<20+uint64(i))
	}
}

// checkPattern compares dst blocks in s with the pattern fill(seed) wrote.
func checkPattern(t *testing.T, s *slabStore, dst []int, seed uint64) {
	t.Helper()
	want := make([]byte, s.bb)
	for i, id := range dst {
		pattern(want, seed<<20+uint64(i))
		if !bytes.Equal(s.Block(id), want) {
			t.Fatalf("block %d (dst id %d) differs from what was exported", i, id)
		}
	}
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// waitFor polls cond for up to five seconds: for effects another goroutine
// makes after a call returns (a producer noticing a dropped connection).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// checkGoroutines fails the test if goroutines it started outlive it. Call it
// first, so its cleanup runs after every other cleanup (Producer.Close).
func checkGoroutines(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		if n := waitGoroutines(base); n > base {
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines, want at most %d:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
	})
}

func waitGoroutines(base int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base || time.Now().After(deadline) {
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMain checks, after every test, that the package left no goroutine
// behind (not when fuzzing: the fuzzing engine leaves its signal handler).
func TestMain(m *testing.M) {
	flag.Parse()
	fuzzing := flag.Lookup("test.fuzz").Value.String() != ""
	base := runtime.NumGoroutine()
	code := m.Run()
	if n := waitGoroutines(base); n > base && code == 0 && !fuzzing {
		buf := make([]byte, 1<<20)
		fmt.Fprintf(os.Stderr, "kvtransfer: %d goroutines after all tests, want at most %d:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		code = 1
	}
	os.Exit(code)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// fakeProducer speaks the producer's side of the protocol by hand, one
// request per connection, so tests can make it say what a real producer
// never would: a hello advertising a region of its choosing, and whatever
// answer answer writes. It records the requests it reads.
type fakeProducer struct {
	ln       net.Listener
	advert   *sharedAdvert
	answer   func(conn net.Conn, req requestMsg) error
	requests chan requestMsg
	wg       sync.WaitGroup
}

func newFakeProducer(t *testing.T, advert *sharedAdvert, answer func(net.Conn, requestMsg) error) *fakeProducer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProducer{ln: ln, advert: advert, answer: answer, requests: make(chan requestMsg, 16)}
	f.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(testIOTimeout))
				if err := f.serve(conn); err != nil {
					t.Logf("fake producer: %v", err)
				}
			})
		}
	})
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeProducer) addr() string { return f.ln.Addr().String() }

func (f *fakeProducer) serve(conn net.Conn) error {
	if err := writeJSON(conn, frameHello, helloMsg{Nonce: make([]byte, nonceLen), SharedMemory: f.advert}); err != nil {
		return err
	}
	var req requestMsg
	if err := readJSON(conn, frameRequest, &req); err != nil {
		return err
	}
	f.requests <- req
	return f.answer(conn, req)
}

// streamAnswer answers a pull the TCP way: accept, DATA and the blocks'
// bytes, then the done for the ack.
func streamAnswer(blocks [][]byte, numTokens int) func(net.Conn, requestMsg) error {
	return func(conn net.Conn, req requestMsg) error {
		b, _ := appendJSONFrame(nil, frameAccept, acceptMsg{})
		b = append(b, make([]byte, headerLen)...)
		putHeader(b[len(b)-headerLen:], frameData, dataHdrLen)
		b = append(b, dataHeader{blocks: uint32(len(blocks)), blockBytes: uint32(len(blocks[0])), numTokens: uint64(numTokens)}.bytes()...)
		for _, blk := range blocks {
			b = append(b, blk...)
		}
		return finishAnswer(conn, b)
	}
}

// sharedAnswer answers a pull with a DATA_SHM frame naming places, which
// it sends whether or not the request asked for shared memory.
func sharedAnswer(blocks, blockBytes, numTokens int, places []sharedBlock) func(net.Conn, requestMsg) error {
	return func(conn net.Conn, req requestMsg) error {
		return finishAnswer(conn, sharedFrames(blocks, blockBytes, numTokens, places))
	}
}

// sharedDataPayload is a DATA_SHM payload: the data header, then each
// block's offset and generation.
func sharedDataPayload(d dataHeader, blocks []sharedBlock) []byte {
	b := make([]byte, dataHdrLen, dataHdrLen+sharedBlockLen*len(blocks))
	copy(b, d.bytes())
	for _, blk := range blocks {
		b = appendSharedBlock(b, blk)
	}
	return b
}

// sharedFrames is an accept and a DATA_SHM frame naming places.
func sharedFrames(blocks, blockBytes, numTokens int, places []sharedBlock) []byte {
	b, _ := appendJSONFrame(nil, frameAccept, acceptMsg{})
	payload := sharedDataPayload(dataHeader{blocks: uint32(blocks), blockBytes: uint32(blockBytes), numTokens: uint64(numTokens)}, places)
	b = append(b, make([]byte, headerLen)...)
	putHeader(b[len(b)-headerLen:], frameDataShared, len(payload))
	return append(b, payload...)
}

// finishAnswer writes an answer, then answers an ack with a done; a
// consumer that refuses the answer hangs up instead, which is fine too.
func finishAnswer(conn net.Conn, answer []byte) error {
	if _, err := conn.Write(answer); err != nil {
		return err
	}
	typ, _, err := readFrame(conn)
	if err != nil || typ != frameAck {
		return nil
	}
	return writeFrame(conn, frameDone, nil)
}
