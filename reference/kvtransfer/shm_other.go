//go:build !linux

package kvtransfer

import (
	"errors"
	"fmt"
)

// Shared memory between processes is Linux-only here; elsewhere the data
// path always uses TCP.

func newSharedMemory(int) (int, []byte, error) {
	return -1, nil, fmt.Errorf("shared memory: %w", errors.ErrUnsupported)
}

func releaseSharedMemory(int, []byte) error { return nil }

func mapSharedRegion(*sharedAdvert) ([]byte, sharedLayout, error) {
	return nil, sharedLayout{}, fmt.Errorf("shared memory: %w", errors.ErrUnsupported)
}

func releasePeerMapping([]byte) {}
