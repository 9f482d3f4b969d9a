package kvtransfer

import (
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// readBuffers fills bufs in order from conn and returns the bytes read
// before an error. On a socket it reads with readv(2) into every buffer at
// once, so a KV transfer's blocks cost a few system calls and wake-ups
// rather than one or more per block; it honours conn's read deadline.
func readBuffers(conn net.Conn, bufs [][]byte) (int, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return readEach(conn, bufs)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return readEach(conn, bufs)
	}
	iov := append([][]byte(nil), bufs...) // advanced as bytes arrive
	got := 0
	for len(iov) > 0 {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Readv(int(fd), iov)
				if rerr != unix.EINTR {
					break
				}
			}
			return rerr != unix.EAGAIN // false: wait until readable, then call again
		}); err != nil {
			return got, err // a deadline, or the connection closed under us
		}
		switch {
		case rerr != nil:
			return got, os.NewSyscallError("readv", rerr)
		case n == 0 && got == 0:
			return got, io.EOF
		case n == 0:
			return got, io.ErrUnexpectedEOF
		}
		got += n
		for n > 0 {
			if n < len(iov[0]) {
				iov[0] = iov[0][n:]
				break
			}
			n -= len(iov[0])
			iov = iov[1:]
		}
	}
	return got, nil
}
