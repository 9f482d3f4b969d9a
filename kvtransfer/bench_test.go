package kvtransfer

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
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

// BenchmarkPull moves a whole prefill's KV through the real data path per
// op: Export, dial, handshake, stream, ack, free.
func BenchmarkPull(b *testing.B) {
	for _, tokens := range benchTokens {
		b.Run("tokens="+strconv.Itoa(tokens), func(b *testing.B) {
			n := tokens / benchBlockTokens
			// One slab per side for the whole sub-benchmark (b.Loop runs
			// this body once): 768 MiB each at 8192 tokens.
			ps, cs := newSlabStore(benchBlockBytes, n), newSlabStore(benchBlockBytes, n)
			cs.descending = true
			src := ps.allocate(b, n)
			fill(ps, src, 42)
			ps.Free(src)
			// Fault the destination in up front, as a long-running engine's
			// pool would be, so the first op does not pay for page faults.
			warm := cs.allocate(b, n)
			fill(cs, warm, 7)
			cs.Free(warm)

			p, err := NewProducer(Config{EngineID: "prefill-0", Shape: benchShape}, ps)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			c := NewConsumer(Config{Shape: benchShape}, cs)
			addr := p.Addr().String()

			b.SetBytes(int64(n * benchBlockBytes))
			b.ReportAllocs()
			i := 0
			var dst []int
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
			// Blocks are not zeroed on free, so the last transfer is still
			// there to check.
			for i := range dst {
				if !bytes.Equal(cs.Block(dst[i]), ps.Block(src[i])) {
					b.Fatalf("block %d differs", i)
				}
			}
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
// ways.
func BenchmarkPullSmall(b *testing.B) {
	const n, bb = 11, 16 << 10
	for _, secret := range []string{"", "s3cret"} {
		name := "secret=off"
		if secret != "" {
			name = "secret=on"
		}
		b.Run(name, func(b *testing.B) {
			ps, cs := newSlabStore(bb, 4*n), newSlabStore(bb, 4*n)
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
			for b.Loop() {
				key := "small-" + strconv.Itoa(i)
				i++
				src := ps.allocate(b, n)
				if err := p.Export(key, src, n*16); err != nil {
					b.Fatal(err)
				}
				dst := cs.allocate(b, n)
				if _, err := c.Pull(b.Context(), addr, "prefill-0", key, dst); err != nil {
					b.Fatal(err)
				}
				cs.Free(dst)
			}
		})
	}
}
