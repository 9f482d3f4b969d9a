package kvtransfer

import (
	"fmt"
	"unsafe"
)

// Float32Cache is the part of the engine's paged cache (*kvcache.Cache) the
// data path needs. It is declared here, not imported, so that kvtransfer
// depends on nothing of ours and the engine can import it.
type Float32Cache interface {
	Block(id int) []float32
	Free(ids []int)
	NumBlocks() int
}

// CacheStore adapts a float32 paged cache, such as *kvcache.Cache, to a
// BlockStore whose blocks are byte views of the same memory, so blocks go to
// and from the socket without a copy or an encoding step.
func CacheStore(c Float32Cache) BlockStore {
	return &cacheStore{c: c, blockBytes: 4 * len(c.Block(0))}
}

type cacheStore struct {
	c          Float32Cache
	blockBytes int
}

var (
	_ BlockStore   = (*cacheStore)(nil)
	_ blockCounter = (*cacheStore)(nil)
)

func (s *cacheStore) BlockBytes() int { return s.blockBytes }
func (s *cacheStore) Free(ids []int)  { s.c.Free(ids) }
func (s *cacheStore) NumBlocks() int  { return s.c.NumBlocks() }

func (s *cacheStore) Block(id int) []byte {
	f := s.c.Block(id)
	if 4*len(f) != s.blockBytes {
		panic(fmt.Sprintf("kvtransfer: block %d is %d bytes, want %d", id, 4*len(f), s.blockBytes))
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// SharedCacheStore is CacheStore for a cache whose memory is m (see
// (*kvcache.Cache).MoveTo): a producer with it offers consumers on its host
// the region instead of streaming the bytes. m must outlive the producer.
func SharedCacheStore(c Float32Cache, m *SharedMemory) BlockStore {
	return &sharedCacheStore{cacheStore: cacheStore{c: c, blockBytes: 4 * len(c.Block(0))}, m: m}
}

type sharedCacheStore struct {
	cacheStore
	m *SharedMemory
}

var _ sharedStore = (*sharedCacheStore)(nil)

func (s *sharedCacheStore) SharedMemory() *SharedMemory { return s.m }
