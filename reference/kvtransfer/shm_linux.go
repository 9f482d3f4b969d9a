package kvtransfer

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// newSharedMemory makes a memfd of size bytes, sealed so that its size can
// never change (a consumer's mapping can then never fault past its end), and
// maps it read/write.
func newSharedMemory(size int) (fd int, mem []byte, err error) {
	fd, err = unix.MemfdCreate("omnipd-kv", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, os.NewSyscallError("memfd_create", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return -1, nil, os.NewSyscallError("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return -1, nil, os.NewSyscallError("fcntl F_ADD_SEALS", err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return -1, nil, os.NewSyscallError("mmap", err)
	}
	return fd, mem, nil
}

func releaseSharedMemory(fd int, mem []byte) error {
	return errors.Join(os.NewSyscallError("munmap", unix.Munmap(mem)), os.NewSyscallError("close", unix.Close(fd)))
}

// mapSharedRegion maps, read-only, the region a producer advertised, through
// its descriptor in /proc: the kernel lets only the producer's own user (or
// a privileged one) open it. Anything but a sealed regular file of the
// advertised size whose header carries the advertised id is refused, so a
// consumer on another host, in another PID namespace or looking at a reused
// PID ends up on TCP rather than reading someone else's memory, and so does
// one whose header places the generation table or the blocks outside the
// file. It returns the mapping and the region's layout. The open is
// non-blocking so that a descriptor that turns out to be a FIFO cannot hang
// it.
func mapSharedRegion(adv *sharedAdvert) ([]byte, sharedLayout, error) {
	if adv.PID <= 0 || adv.FD < 0 || adv.Size < sharedHeaderLen || adv.Size > int64(maxInt) || len(adv.ID) != sharedIDLen {
		return nil, sharedLayout{}, fmt.Errorf("%w: malformed shared memory advert", ErrProtocol)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", adv.PID, adv.FD)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, sharedLayout{}, &os.PathError{Op: "open", Path: path, Err: err}
	}
	// The mapping outlives the descriptor.
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, sharedLayout{}, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != adv.Size {
		return nil, sharedLayout{}, fmt.Errorf("%s: want a regular file of %d bytes, found mode %o and %d bytes", path, adv.Size, st.Mode, st.Size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, sharedLayout{}, &os.PathError{Op: "fcntl F_GET_SEALS", Path: path, Err: err}
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, sharedLayout{}, fmt.Errorf("%s: not sealed against shrinking", path)
	}
	mem, err := unix.Mmap(fd, 0, int(adv.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, sharedLayout{}, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	lay, err := checkSharedHeader(mem, adv)
	if err != nil {
		unix.Munmap(mem)
		return nil, sharedLayout{}, fmt.Errorf("%s: %w", path, err)
	}
	return mem, lay, nil
}

func releasePeerMapping(mem []byte) { unix.Munmap(mem) }
