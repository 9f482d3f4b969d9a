package kvcache

import (
	"errors"
	"slices"
	"sync"
	"testing"
)

func testShape() Shape { return Shape{Layers: 2, KVHeads: 2, HeadDim: 4, BlockSize: 4} }

func TestAllocateFreeAccounting(t *testing.T) {
	c, err := New(testShape(), 8)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Allocate(3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, []int{0, 1, 2}) {
		t.Errorf("first allocation = %v, want the lowest ids", a)
	}
	b, _ := c.Allocate(5)
	if c.Used() != 8 || c.FreeBlocks() != 0 || c.Usage() != 1 {
		t.Errorf("full pool: used %d free %d usage %v", c.Used(), c.FreeBlocks(), c.Usage())
	}
	if _, err := c.Allocate(1); !errors.Is(err, ErrOutOfBlocks) {
		t.Errorf("allocating from a full pool: %v, want ErrOutOfBlocks", err)
	}
	c.Free(a)
	c.Free(b)
	if c.Used() != 0 {
		t.Errorf("after freeing everything, used = %d", c.Used())
	}
}

func TestDoubleFreePanics(t *testing.T) {
	c, _ := New(testShape(), 2)
	ids, _ := c.Allocate(1)
	c.Free(ids)
	defer func() {
		if recover() == nil {
			t.Error("freeing a free block must panic: two owners would corrupt the cache")
		}
	}()
	c.Free(ids)
}

func TestLayoutIsDisjoint(t *testing.T) {
	s := testShape()
	c, _ := New(s, 3)
	// Writing a distinct value at every (block, layer, slot, k/v) must land
	// in a distinct float, covering every float of every block exactly once.
	seen := map[*float32]bool{}
	for b := range 3 {
		for l := range s.Layers {
			for slot := range s.BlockSize {
				for _, row := range [][]float32{c.K(b, l, slot), c.V(b, l, slot)} {
					if len(row) != s.KVHeads*s.HeadDim {
						t.Fatalf("row length %d", len(row))
					}
					for i := range row {
						if seen[&row[i]] {
							t.Fatalf("block %d layer %d slot %d overlaps another row", b, l, slot)
						}
						seen[&row[i]] = true
					}
				}
			}
		}
	}
	if len(seen) != 3*s.BlockFloats() {
		t.Errorf("rows cover %d floats, the pool has %d", len(seen), 3*s.BlockFloats())
	}
	if got := len(c.Block(1)); got != s.BlockFloats() || s.BlockBytes() != 4*got {
		t.Errorf("block is %d floats, want %d", got, s.BlockFloats())
	}
}

func TestPositionAndBlocksFor(t *testing.T) {
	s := testShape()
	c, _ := New(s, 4)
	table := []int{3, 1, 2}
	for pos, want := range [][2]int{{3, 0}, {3, 3}, {1, 0}, {2, 1}} {
		p := []int{0, 3, 4, 9}[pos]
		b, slot := c.Position(table, p)
		if b != want[0] || slot != want[1] {
			t.Errorf("position %d -> (%d,%d), want %v", p, b, slot, want)
		}
	}
	for n, want := range map[int]int{0: 0, 1: 1, 4: 1, 5: 2, 16: 4} {
		if got := s.BlocksFor(n); got != want {
			t.Errorf("BlocksFor(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestConcurrentAllocation(t *testing.T) {
	c, _ := New(testShape(), 64)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				ids, err := c.Allocate(3)
				if err != nil {
					continue
				}
				c.Free(ids)
			}
		})
	}
	wg.Wait()
	if c.Used() != 0 {
		t.Errorf("used = %d after balanced allocate/free", c.Used())
	}
}

func TestInvalidShape(t *testing.T) {
	if _, err := New(Shape{}, 1); err == nil {
		t.Error("zero shape accepted")
	}
}

// TestMoveTo: an idle cache moves to caller memory (block views then point
// into it) and back to memory of its own; a cache with blocks in use, or
// memory too small, is refused and left where it was.
func TestMoveTo(t *testing.T) {
	shape := testShape()
	c, _ := New(shape, 4)
	if err := c.MoveTo(make([]float32, 4*shape.BlockFloats()-1)); err == nil {
		t.Error("move to memory one float short accepted")
	}
	mem := make([]float32, 4*shape.BlockFloats()+7) // room to spare is fine
	if err := c.MoveTo(mem); err != nil {
		t.Fatal(err)
	}
	ids, _ := c.Allocate(2)
	c.K(ids[1], 1, 2)[3] = 42
	if &c.Block(ids[1])[0] != &mem[ids[1]*shape.BlockFloats()] {
		t.Fatal("block view is not in the memory the cache moved to")
	}
	if slices.Index(mem, 42) < 0 {
		t.Fatal("a write through K did not land in the caller's memory")
	}
	if err := c.MoveTo(nil); err == nil {
		t.Error("move with blocks in use accepted")
	}
	if &c.Block(ids[1])[0] != &mem[ids[1]*shape.BlockFloats()] {
		t.Fatal("a refused move changed the memory")
	}
	c.Free(ids)
	if err := c.MoveTo(nil); err != nil {
		t.Fatal(err)
	}
	ids, _ = c.Allocate(4)
	for _, id := range ids {
		c.Block(id)[0] = -1
	}
	if slices.Index(mem, -1) >= 0 {
		t.Fatal("the cache still writes into the memory it moved away from")
	}
}
