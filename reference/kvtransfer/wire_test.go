package kvtransfer

import (
	"bytes"
	"net"
	"testing"
)

// A frame read through the buffer may bring in the bytes after it; the
// blocks still get every byte, in order, whether what was buffered ends
// inside a block or covers several whole ones.
func TestFrameConnBlocksAfterFrame(t *testing.T) {
	for _, bb := range []int{7, 3000, 3 * frameBufLen} {
		a, b := net.Pipe()
		const blocks = 5
		want := make([]byte, blocks*bb)
		for i := range want {
			want[i] = byte(i*7 + i/251)
		}
		go func() {
			defer a.Close()
			hdr := make([]byte, headerLen)
			putHeader(hdr, frameData, 0)
			_, _ = a.Write(append(hdr, want...)) // one write, as a writev
		}()
		fc := newFrameConn(b)
		if typ, _, err := readFrame(fc); err != nil || typ != frameData {
			t.Fatalf("block size %d: frame %d, %v", bb, typ, err)
		}
		got := make([][]byte, blocks)
		for i := range got {
			got[i] = make([]byte, bb)
		}
		n, err := fc.readBuffers(got)
		if err != nil || n != len(want) {
			t.Fatalf("block size %d: read %d bytes, %v; want %d", bb, n, err, len(want))
		}
		if !bytes.Equal(bytes.Join(got, nil), want) {
			t.Errorf("block size %d: the blocks differ from what was sent", bb)
		}
		b.Close()
	}
}
