//go:build unix

package kvtransfer

import (
	"net"
	"syscall"
)

// peerClosed reports whether the peer has closed c, or c has failed, by
// one non-blocking read: for a notification stream, which carries nothing
// from the producer, any byte or end of file means it is gone, and a write
// would only vanish into a connection already reset.
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, err := syscall.Read(int(fd), b[:])
		closed = n > 0 || err == nil || (err != syscall.EAGAIN && err != syscall.EWOULDBLOCK && err != syscall.EINTR)
		return true // never wait for the socket to become readable
	})
	return closed || err != nil
}
