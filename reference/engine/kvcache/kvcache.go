// Package kvcache owns the reference engine's paged KV cache: a fixed pool of
// blocks, each holding the keys and values of BlockSize consecutive token
// positions for every layer, handed out to sequences and accounted for.
//
// A block is one contiguous []float32 laid out layer by layer, keys then
// values, [BlockSize][KVHeads][HeadDim] each, so that a block moves between
// processes as one slab of bytes, with no per-element encoding.
package kvcache

import (
	"errors"
	"fmt"
	"sync"
)

// ErrOutOfBlocks is returned when the pool has too few free blocks.
var ErrOutOfBlocks = errors.New("kvcache: out of free blocks")

// DefaultBlockSize is the number of token positions per block.
const DefaultBlockSize = 16

// Shape is the geometry of the cache.
type Shape struct {
	Layers    int
	KVHeads   int
	HeadDim   int
	BlockSize int
}

// BlockFloats is the number of float32 values in one block.
func (s Shape) BlockFloats() int { return s.Layers * 2 * s.BlockSize * s.KVHeads * s.HeadDim }

// BlockBytes is the size of one block in bytes.
func (s Shape) BlockBytes() int { return 4 * s.BlockFloats() }

// BlocksFor is the number of blocks n token positions need.
func (s Shape) BlocksFor(n int) int { return (n + s.BlockSize - 1) / s.BlockSize }

// Cache is a pool of KV blocks. Allocation and release are safe for
// concurrent use; the contents of a block belong to whoever holds it.
type Cache struct {
	shape Shape
	data  []float32

	mu   sync.Mutex
	free []int // stack of free block ids
	used []bool
}

// New makes a cache of numBlocks blocks.
func New(shape Shape, numBlocks int) (*Cache, error) {
	if shape.Layers < 1 || shape.KVHeads < 1 || shape.HeadDim < 1 || shape.BlockSize < 1 || numBlocks < 1 {
		return nil, fmt.Errorf("kvcache: invalid shape %+v with %d blocks", shape, numBlocks)
	}
	c := &Cache{
		shape: shape,
		data:  make([]float32, shape.BlockFloats()*numBlocks),
		free:  make([]int, numBlocks),
		used:  make([]bool, numBlocks),
	}
	// Hand out low ids first: block tables read naturally in tests and logs.
	for i := range numBlocks {
		c.free[i] = numBlocks - 1 - i
	}
	return c, nil
}

// MoveTo moves the cache's memory to data, which must hold at least
// NumBlocks blocks (memory another process can map, say), or to fresh memory
// of its own when data is nil. It is allowed only while no block is
// allocated: then no block holds anything worth keeping and nobody holds a
// view of one, so nothing is copied, and since every later Allocate takes
// the same lock, the holder of any block allocated afterwards sees the new
// memory. The caller keeps data valid for as long as the cache uses it,
// which is until the next MoveTo or, if none, while the cache is reachable.
func (c *Cache) MoveTo(data []float32) error {
	n := c.shape.BlockFloats() * len(c.used)
	if data != nil && len(data) < n {
		return fmt.Errorf("kvcache: move to %d floats of memory, the cache needs %d", len(data), n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.free) != len(c.used) {
		return fmt.Errorf("kvcache: move the memory of a cache with %d blocks in use", len(c.used)-len(c.free))
	}
	if data == nil {
		data = make([]float32, n)
	}
	c.data = data[:n:n]
	return nil
}

// Shape returns the cache's geometry.
func (c *Cache) Shape() Shape { return c.shape }

// NumBlocks is the size of the pool.
func (c *Cache) NumBlocks() int { return len(c.used) }

// Allocate takes n free blocks, or none and ErrOutOfBlocks.
func (c *Cache) Allocate(n int) ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n > len(c.free) {
		return nil, fmt.Errorf("%w: want %d, have %d of %d", ErrOutOfBlocks, n, len(c.free), len(c.used))
	}
	ids := make([]int, n)
	for i := range ids {
		id := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		c.used[id] = true
		ids[i] = id
	}
	return ids, nil
}

// Free returns blocks to the pool. Freeing a block that is not allocated
// panics: it means two owners, which would corrupt another sequence's cache.
func (c *Cache) Free(ids []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if id < 0 || id >= len(c.used) || !c.used[id] {
			panic(fmt.Sprintf("kvcache: free of block %d that is not allocated", id))
		}
		c.used[id] = false
		c.free = append(c.free, id)
	}
}

// Used is the number of allocated blocks.
func (c *Cache) Used() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.used) - len(c.free)
}

// FreeBlocks is the number of blocks available.
func (c *Cache) FreeBlocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.free)
}

// Usage is the fraction of blocks in use, 0 to 1.
func (c *Cache) Usage() float64 {
	return float64(c.Used()) / float64(c.NumBlocks())
}

// Block returns the whole of block id, for moving it between processes.
func (c *Cache) Block(id int) []float32 {
	n := c.shape.BlockFloats()
	return c.data[id*n : (id+1)*n : (id+1)*n]
}

// offset is where the keys of (layer, slot) start within a block; values
// follow BlockSize*KVHeads*HeadDim later.
func (c *Cache) offset(layer, slot int) int {
	row := c.shape.KVHeads * c.shape.HeadDim
	return layer*2*c.shape.BlockSize*row + slot*row
}

// K returns the keys of one token position: [KVHeads*HeadDim].
func (c *Cache) K(block, layer, slot int) []float32 {
	row := c.shape.KVHeads * c.shape.HeadDim
	off := c.offset(layer, slot)
	b := c.Block(block)
	return b[off : off+row : off+row]
}

// V returns the values of one token position: [KVHeads*HeadDim].
func (c *Cache) V(block, layer, slot int) []float32 {
	row := c.shape.KVHeads * c.shape.HeadDim
	off := c.offset(layer, slot) + c.shape.BlockSize*row
	b := c.Block(block)
	return b[off : off+row : off+row]
}

// Position maps a token position of a sequence to its block and slot.
func (c *Cache) Position(table []int, pos int) (block, slot int) {
	return table[pos/c.shape.BlockSize], pos % c.shape.BlockSize
}
