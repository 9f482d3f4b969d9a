package kvtransfer

import (
	"io"
	"net"
)

// maxIOV bounds the buffers of one vectored read (Linux's IOV_MAX).
const maxIOV = 1024

// readEach fills bufs in order with one io.ReadFull each: the portable
// path, and the one for connections that are not sockets (net.Pipe in
// tests). It returns the bytes read before an error.
func readEach(conn net.Conn, bufs [][]byte) (int, error) {
	got := 0
	for _, b := range bufs {
		n, err := io.ReadFull(conn, b)
		got += n
		if err != nil {
			if err == io.EOF && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return got, err
		}
	}
	return got, nil
}
