//go:build unix

package stageclient

import (
	"errors"
	"io"
	"syscall"
)

var errStrayBytes = errors.New("bytes arrived on an idle connection")

// probeConn reports whether an idle connection can carry a request: the
// server has not closed it, reset it, or sent anything unasked (a 408
// before closing, say). It does one non-blocking read on the socket — the
// check net/http's per-connection reader goroutine makes by sitting in a
// read while the connection is idle. Whatever it reads, the connection is
// unusable after, so nothing is lost by reading rather than peeking.
func probeConn(pc *leanConn) bool {
	p := &pc.probe
	if p.fn == nil {
		sc, ok := pc.conn.(syscall.Conn)
		if !ok {
			return true // nothing to probe with; a dead one fails the write
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return false
		}
		p.raw = raw
		p.fn = p.read
	}
	if err := p.raw.Read(p.fn); err != nil {
		return false
	}
	return p.err == nil
}

// read is the probe's syscall.RawConn callback. Returning true stops
// RawConn.Read from waiting for the socket to become readable.
func (p *probeState) read(fd uintptr) bool {
	n, err := syscall.Read(int(fd), p.buf[:])
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		p.err = nil // nothing to read: alive and quiet
	case err != nil:
		p.err = err
	case n == 0:
		p.err = io.EOF
	default:
		p.err = errStrayBytes
	}
	return true
}
