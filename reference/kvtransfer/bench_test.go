package kvtransfer

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// Qwen3-Omni Thinker KV geometry: 48 layers x 4 KV heads x 128 head_dim,
// keys and values, bf16: 96 KiB per token; 16-token blocks are 1.5 MiB.
const (
	benchBytesPerToken = 48 * 4 * 128 * 2 * 2
	benchBlockTokens   = 16
	benchBlockBytes    = benchBytesPerToken * benchBlockTokens
	benchShape         = "qwen3-omni thinker: layers=48 kv_heads=4 head_dim=128 bf16 block=16"
)

var benchTokens = []int{1024, 8192}

// slabStoreFor is a producer's slab for tr: in shared memory or not.
func slabStoreFor(tb testing.TB, tr transport, blockBytes, numBlocks int) *slabStore {
	if tr.shared {
		return newSharedSlabStore(tb, blockBytes, numBlocks)
	}
	return newSlabStore(blockBytes, numBlocks)
}

// checkBenchPath fails the benchmark if its transfers did not take tr.
func checkBenchPath(b *testing.B, c *Consumer, tr transport) {
	if st := c.Stats(); tr.shared && st.StreamedTransfers != 0 || !tr.shared && st.SharedTransfers != 0 {
		b.Fatalf("consumer stats %+v: transfers took the other path", st)
	}
}

// reportCPU reports the process's CPU time per op since start, both
// sides of the transfer together: what moving the blocks costs, apart from
// how long it takes.
func reportCPU(b *testing.B, start time.Duration) {
	if start > 0 {
		b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkPull moves a whole prefill's KV through the real data path per
// op: Export, dial, handshake, stream (tcp) or copy out of the producer's
// shared memory (shm), ack, free.
func BenchmarkPull(b *testing.B) { forEachTransport(b, benchmarkPull) }

func benchmarkPull(b *testing.B, tr transport) {
	for _, tokens := range benchTokens {
		b.Run("tokens="+strconv.Itoa(tokens), func(b *testing.B) {
			n := tokens / benchBlockTokens
			// One slab per side for the whole sub-benchmark (b.Loop runs
			// this body once): 768 MiB each at 8192 tokens, and room on the
			// producer's for a second transfer's blocks, as the producer
			// frees the last one's only when it reads the ack, which may be
			// after the next op has begun.
			ps, cs := slabStoreFor(b, tr, benchBlockBytes, 2*n), newSlabStore(benchBlockBytes, n)
			cs.descending = true
			all := ps.allocate(b, 2*n)
			fill(ps, all, 42)

			p, err := NewProducer(Config{EngineID: "prefill-0", Shape: benchShape}, ps)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			c := NewConsumer(Config{Shape: benchShape}, cs)
			defer c.Close()
			addr := p.Addr().String()
			// Fault everything in up front, as a long-running engine's
			// pools would be, so that no op pays for a first touch: a pull
			// out of each half of the producer's slab (an op may find either
			// half free) also maps every page of a shared region into the
			// consumer, and writes every page of the destination.
			for j, half := range [][]int{all[:n], all[n:]} {
				key := "warm-" + strconv.Itoa(j)
				if err := p.Export(key, half, tokens); err != nil {
					b.Fatal(err)
				}
				dst := cs.allocate(b, n)
				if _, err := c.Pull(b.Context(), addr, "prefill-0", key, dst); err != nil {
					b.Fatal(err)
				}
				cs.Free(dst)
			}
			for deadline := time.Now().Add(10 * time.Second); p.Stats().Completed < 2; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatal("the producer never freed the warm-up pulls' blocks")
				}
			}
			var src []int

			b.SetBytes(int64(n * benchBlockBytes))
			b.ReportAllocs()
			i := 0
			var dst []int
			cpu := processCPU()
			for b.Loop() {
				key := "bench-" + strconv.Itoa(i)
				i++
				src = ps.allocate(b, n)
				if err := p.Export(key, src, tokens); err != nil {
					b.Fatal(err)
				}
				dst = cs.allocate(b, n)
				if _, err := c.Pull(b.Context(), addr, "prefill-0", key, dst); err != nil {
					b.Fatal(err)
				}
				cs.Free(dst)
			}
			b.StopTimer()
			reportCPU(b, cpu)
			// Blocks are not zeroed on free, so the last transfer is still
			// there to check.
			for i := range dst {
				if !bytes.Equal(cs.Block(dst[i]), ps.Block(src[i])) {
					b.Fatalf("block %d differs", i)
				}
			}
			checkBenchPath(b, c, tr)
		})
	}
}

// BenchmarkRawTCP is the ceiling: the same bytes over one plain loopback TCP
// connection, written in one Write and read in one ReadFull.
func BenchmarkRawTCP(b *testing.B) {
	for _, tokens := range benchTokens {
		b.Run("tokens="+strconv.Itoa(tokens), func(b *testing.B) {
			size := tokens / benchBlockTokens * benchBlockBytes
			src, dst := make([]byte, size), make([]byte, size)
			pattern(src, 42)
			pattern(dst, 7) // fault it in, as BenchmarkPull does

			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					close(accepted)
					return
				}
				accepted <- conn
			}()
			w, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			r, ok := <-accepted
			if !ok {
				b.Fatal("accept failed")
			}
			defer r.Close()

			b.SetBytes(int64(size))
			b.ReportAllocs()
			errc := make(chan error, 1)
			for b.Loop() {
				go func() {
					_, err := w.Write(src)
					errc <- err
				}()
				if _, err := io.ReadFull(r, dst); err != nil {
					b.Fatal(err)
				}
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if !bytes.Equal(src, dst) {
				b.Fatal(fmt.Errorf("raw copy differs"))
			}
		})
	}
}

// BenchmarkPullSmall is the PD path's common case on the reference model: a
// prompt of about 170 tokens, 11 blocks of 16 KiB. What matters here is not
// bandwidth but the fixed cost of a transfer (connection, handshake, round
// trips), so it reports latency per transfer; secret=on adds the HMACs both
// ways. Pulls follow each other back to back, so a frame a pull leaves
// unread (the DONE) is waited for by the next one.
func BenchmarkPullSmall(b *testing.B) {
	forEachTransport(b, func(b *testing.B, tr transport) { benchmarkPullSmall(b, tr, 0) })
	b.Run("ticket", func(b *testing.B) { benchmarkPullSmall(b, ticketTransport(b), 0) })
}

// ticketTransport is shared memory, copied on the producer's tickets after
// the first pull has mapped the region: only the benchmarks take it, as the
// tests of tickets are their own.
func ticketTransport(b *testing.B) transport {
	if runtime.GOOS != "linux" {
		b.Skip("shared memory is Linux-only")
	}
	return transport{name: "ticket", shared: true, ticket: true}
}

// BenchmarkPullSmallIdle is BenchmarkPullSmall at one client: the data path
// idles for a millisecond between pulls (the timer stopped), as it does
// between a decode's pulls, so whatever a pull leaves to the producer after
// its ack has happened before the next one starts, both sides are asleep
// when it does, and ns/op is a pull's latency on the decode's critical path.
func BenchmarkPullSmallIdle(b *testing.B) {
	forEachTransport(b, func(b *testing.B, tr transport) { benchmarkPullSmall(b, tr, time.Millisecond) })
	b.Run("ticket", func(b *testing.B) { benchmarkPullSmall(b, ticketTransport(b), time.Millisecond) })
}

func benchmarkPullSmall(b *testing.B, tr transport, idle time.Duration) {
	const n, bb = 11, 16 << 10
	for _, secret := range []string{"", "s3cret"} {
		name := "secret=off"
		if secret != "" {
			name = "secret=on"
		}
		b.Run(name, func(b *testing.B) {
			// A copy on a ticket frees the producer's blocks when its
			// notification arrives, some pulls later.
			ps, cs := slabStoreFor(b, tr, bb, 64*n), newSlabStore(bb, 4*n)
			p, err := NewProducer(Config{EngineID: "prefill-0", Shape: "small", Secret: secret}, ps)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			c := NewConsumer(Config{Shape: "small", Secret: secret}, cs)
			defer c.Close()
			addr := p.Addr().String()
			b.SetBytes(n * bb)
			b.ReportAllocs()
			i := 0
			cpu := processCPU()
			for b.Loop() {
				key := "small-" + strconv.Itoa(i)
				i++
				if idle > 0 {
					b.StopTimer()
					time.Sleep(idle)
				}
				for ps.inUse() > 32*n {
					time.Sleep(10 * time.Microsecond) // bounded: the notifications are on their way
				}
				src := ps.allocate(b, n)
				if err := p.Export(key, src, n*16); err != nil {
					b.Fatal(err)
				}
				dst := cs.allocate(b, n)
				if idle > 0 {
					b.StartTimer()
				}
				ticket := ""
				if tr.ticket {
					ticket = p.Ticket(key)
				}
				if _, err := c.PullWithTicket(b.Context(), addr, "prefill-0", key, ticket, dst); err != nil {
					b.Fatal(err)
				}
				cs.Free(dst)
			}
			reportCPU(b, cpu)
			checkBenchPath(b, c, tr)
			if st := c.Stats(); tr.ticket && st.TicketTransfers+1 != st.SharedTransfers {
				b.Fatalf("consumer stats %+v: transfers after the first did not take the ticket", st)
			}
		})
	}
}
