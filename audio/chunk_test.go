package audio

import (
	"fmt"
	"slices"
	"testing"
)

// frame returns a distinct 16-codebook frame for stream index i.
func frame(i int) []int {
	f := make([]int, 16)
	for c := range f {
		f[c] = (i*16 + c) % 2048
	}
	return f
}

// chunkAll pushes n frames through c and flushes, returning every chunk and
// the number of frames pushed when each was emitted (n+1 for the flush).
func chunkAll(c *Chunker, n int) (chunks []Chunk, at []int) {
	for i := range n {
		for _, ch := range c.Push(frame(i)) {
			chunks, at = append(chunks, ch), append(at, i+1)
		}
	}
	for _, ch := range c.Flush() {
		chunks, at = append(chunks, ch), append(at, n+1)
	}
	return chunks, at
}

// shape is a chunk summarised as Context+New frames at Start.
func shape(ch Chunk) string {
	return fmt.Sprintf("%d+%d@%d", ch.Context, len(ch.New()), ch.Start)
}

func TestChunkerDefaults(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want []string
	}{
		{0, nil},
		{1, []string{"0+1@0"}},
		{3, []string{"0+3@0"}},
		{4, []string{"0+4@0"}},
		{5, []string{"0+4@0", "4+1@4"}},
		{29, []string{"0+4@0", "4+25@4"}},
		{30, []string{"0+4@0", "4+25@4", "25+1@29"}},
		{54, []string{"0+4@0", "4+25@4", "25+25@29"}},
		{100, []string{"0+4@0", "4+25@4", "25+25@29", "25+25@54", "25+21@79"}},
	} {
		for _, c := range []*Chunker{{}, {Initial: 4, Size: 25, LeftContext: 25}} {
			chunks, at := chunkAll(c, tc.n)
			var got []string
			var news [][]int
			for i, ch := range chunks {
				got = append(got, shape(ch))
				// Context frames are the frames right before the new ones.
				for j, f := range ch.Frames {
					if want := frame(ch.Start - ch.Context + j); !slices.Equal(f, want) {
						t.Errorf("n=%d chunk %d frame %d = %v; want %v", tc.n, i, j, f, want)
					}
				}
				news = append(news, ch.New()...)
				// Chunks are emitted as soon as they are complete.
				if at[i] <= tc.n && at[i] != ch.Start+len(ch.New()) {
					t.Errorf("n=%d chunk %d emitted after %d frames; want %d", tc.n, i, at[i], ch.Start+len(ch.New()))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("%+v n=%d: chunks %v; want %v", *c, tc.n, got, tc.want)
			}
			if len(news) != tc.n {
				t.Fatalf("n=%d: %d new frames; want each frame once", tc.n, len(news))
			}
			for i, f := range news {
				if !slices.Equal(f, frame(i)) {
					t.Fatalf("n=%d: new frame %d = %v; want %v", tc.n, i, f, frame(i))
				}
			}
		}
	}
}

func TestChunkerSettings(t *testing.T) {
	for _, tc := range []struct {
		c    Chunker
		n    int
		want []string
	}{
		{Chunker{Initial: 1, Size: 2, LeftContext: 3}, 8, []string{"0+1@0", "1+2@1", "3+2@3", "3+2@5", "3+1@7"}},
		{Chunker{Initial: 2, Size: 3, LeftContext: -1}, 9, []string{"0+2@0", "0+3@2", "0+3@5", "0+1@8"}},
		{Chunker{Initial: 10, Size: 2, LeftContext: 1}, 13, []string{"0+10@0", "1+2@10", "1+1@12"}},
	} {
		c := tc.c
		chunks, _ := chunkAll(&c, tc.n)
		var got []string
		for _, ch := range chunks {
			got = append(got, shape(ch))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%+v n=%d: chunks %v; want %v", tc.c, tc.n, got, tc.want)
		}
	}
}

func TestChunkerFlushResets(t *testing.T) {
	var c Chunker
	chunkAll(&c, 7)
	chunks, _ := chunkAll(&c, 5)
	var got []string
	for _, ch := range chunks {
		got = append(got, shape(ch))
	}
	if want := []string{"0+4@0", "4+1@4"}; !slices.Equal(got, want) {
		t.Fatalf("second stream chunks %v; want %v", got, want)
	}
}

func TestChunkerCopiesFrames(t *testing.T) {
	c := Chunker{Initial: 1, Size: 1, LeftContext: 1}
	f := []int{1, 2, 3}
	c.Push(f)
	f[0] = 99
	chunks := c.Push([]int{4, 5, 6})
	if got := chunks[0].Frames[0]; got[0] != 1 {
		t.Fatalf("context frame %v changed with the caller's slice", got)
	}
}
