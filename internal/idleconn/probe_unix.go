//go:build unix

package idleconn

import (
	"io"
	"net"
	"syscall"
)

// Probe checks one connection. Its zero value is ready to use; it keeps
// what the checks need, so that checking the same connection again
// allocates nothing.
type Probe struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool
	buf [1]byte
	err error
}

// Check reports whether c, idle, can carry a request: nil when there is
// nothing to read on it; io.EOF when the peer closed it; ErrStrayBytes when
// it holds bytes; the socket's error when it failed. A connection that
// gives no access to its socket passes: its write or read will fail instead.
// c must be the connection the Probe checked before, if any.
func (p *Probe) Check(c net.Conn) error {
	if p.fn == nil {
		sc, ok := c.(syscall.Conn)
		if !ok {
			return nil
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return err
		}
		p.raw = raw
		p.fn = p.read
	}
	if err := p.raw.Read(p.fn); err != nil {
		return err
	}
	return p.err
}

// read is the RawConn callback. Returning true stops RawConn.Read from
// waiting for the socket to become readable.
func (p *Probe) read(fd uintptr) bool {
	n, err := syscall.Read(int(fd), p.buf[:])
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		p.err = nil // nothing to read: alive and quiet
	case err != nil:
		p.err = err
	case n == 0:
		p.err = io.EOF
	default:
		p.err = ErrStrayBytes
	}
	return true
}
