//go:build !linux

package kvtransfer

import "net"

// readBuffers fills bufs in order from conn and returns the bytes read
// before an error.
func readBuffers(conn net.Conn, bufs [][]byte) (int, error) { return readEach(conn, bufs) }
