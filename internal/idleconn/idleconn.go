// Package idleconn tells whether an idle TCP connection can still carry a
// request, without a goroutine sitting in a read on it: one non-blocking
// read on the socket shows whether the peer has closed or reset it, or sent
// something nobody asked for. Whatever that read consumes, the connection
// is unusable afterwards, so reading rather than peeking loses nothing.
package idleconn

import "errors"

// ErrStrayBytes is Check's answer for a connection that holds bytes while
// idle (a server's 408 before it closes, say).
var ErrStrayBytes = errors.New("bytes arrived on an idle connection")
