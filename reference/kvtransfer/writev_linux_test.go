package kvtransfer

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// processWrites is how many write system calls (write, writev, send…) this
// process has made, from /proc/self/io.
func processWrites(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no write accounting here: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no syscw in /proc/self/io")
	return 0
}

// A stream's blocks leave in a writev per batch, not a write per block: the
// producer reads its connection through a buffer, and net.Buffers finds
// writev only on the socket under that wrapper.
func TestStreamWritesBlocksTogether(t *testing.T) {
	r := newRig(t, rigOpts{})
	const n = 64
	r.export(t, "req-1", n, 1)
	dst := r.cs.allocate(t, n)
	before := processWrites(t)
	if _, err := r.c.Pull(testCtx(t), r.addr, testEngine, "req-1", dst); err != nil {
		t.Fatal(err)
	}
	waitStats(t, r.p, ProducerStats{Completed: 1})
	// Hello, request, the data (a writev or a few, as the socket takes
	// it), ack, done: a handful of writes for both sides together.
	if writes := processWrites(t) - before; writes > n/4 {
		t.Errorf("a pull of %d blocks took %d write system calls", n, writes)
	}
	checkPattern(t, r.cs, dst, 1)
	r.cs.Free(dst)
}
