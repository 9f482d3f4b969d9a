package visionproc

import (
	"bytes"
	"testing"
)

// rowFrame builds a frame whose three channels all hold the same rows.
func rowFrame(w, h int, rows ...[]uint8) Frame {
	f := newFrame(w, h)
	for c := 0; c < Channels; c++ {
		p := f.plane(c)
		for y, r := range rows {
			copy(p[y*w:(y+1)*w], r)
		}
	}
	return f
}

// The expected samples are worked by hand from the antialiased Keys cubic
// (a = −0.5) with centres at (o + 0.5)·scale and support 2·max(scale, 1):
//
// 4 → 2 (scale 2, kernel argument (x − centre + 0.5)/2): output 0 reads
// x = 0..3 at arguments −0.25, 0.25, 0.75, 1.25 with weights 0.8671875,
// 0.8671875, 0.2265625, −0.0703125 (sum 1.890625), so [0 0 255 255] gives
// 255·(0.2265625 − 0.0703125)/1.890625 = 21.07 → 21 and, mirrored,
// 255·1.734375/1.890625 = 233.9 → 234.
//
// 2 → 4 (scale 0.5, support 2): output 0 at centre 0.25 reads x = 0, 1 with
// weights 0.8671875, −0.0703125 → 255·(−0.0703125/0.796875) < 0 → 0; output
// 1 at 0.75: 0.8671875, 0.2265625 → 255·0.2265625/1.09375 = 52.8 → 53; the
// other two mirror these: 202 and 255 (clamped from 277.5).
func TestResizeBicubicHandWorked(t *testing.T) {
	tests := []struct {
		name string
		in   []uint8
		outW int
		want []uint8
	}{
		{"shrink 4 to 2", []uint8{0, 0, 255, 255}, 2, []uint8{21, 234}},
		{"grow 2 to 4", []uint8{0, 255}, 4, []uint8{0, 53, 202, 255}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Horizontal pass on a 1-row frame.
			got, err := ResizeBicubic(rowFrame(len(tc.in), 1, tc.in), tc.outW, 1)
			if err != nil {
				t.Fatal(err)
			}
			for c := 0; c < Channels; c++ {
				if !bytes.Equal(got.plane(c), tc.want) {
					t.Fatalf("horizontal channel %d = %v, want %v", c, got.plane(c), tc.want)
				}
			}
			// The same profile down a column exercises the vertical pass.
			col := make([][]uint8, len(tc.in))
			for y, v := range tc.in {
				col[y] = []uint8{v}
			}
			got, err = ResizeBicubic(rowFrame(1, len(tc.in), col...), 1, tc.outW)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.plane(0), tc.want) {
				t.Fatalf("vertical = %v, want %v", got.plane(0), tc.want)
			}
		})
	}
}

func TestResizeBicubicProperties(t *testing.T) {
	src := newFrame(37, 23)
	for i := range src.Pix {
		src.Pix[i] = uint8(i*131 + i/7)
	}
	t.Run("same size is a copy", func(t *testing.T) {
		got, err := ResizeBicubic(src, 37, 23)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Pix, src.Pix) {
			t.Fatal("resizing to the same size changed pixels")
		}
	})
	t.Run("constant stays constant", func(t *testing.T) {
		// Weights are normalized to sum to one, so a flat image stays flat
		// at every scale (the fixed-point rounding is far below half a level).
		flat := newFrame(37, 23)
		for i := range flat.Pix {
			flat.Pix[i] = 173
		}
		for _, size := range [][2]int{{5, 3}, {64, 64}, {37, 96}, {200, 11}} {
			got, err := ResizeBicubic(flat, size[0], size[1])
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range got.Pix {
				if v != 173 {
					t.Fatalf("%v: sample %d = %d, want 173", size, i, v)
				}
			}
		}
	})
	t.Run("deterministic", func(t *testing.T) {
		a, err := ResizeBicubic(src, 64, 96)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ResizeBicubic(src, 64, 96)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Pix, b.Pix) {
			t.Fatal("two resizes differ")
		}
	})
	t.Run("bad sizes", func(t *testing.T) {
		if _, err := ResizeBicubic(src, 0, 5); err == nil {
			t.Fatal("zero width accepted")
		}
		if _, err := ResizeBicubic(Frame{Width: 2, Height: 2}, 4, 4); err == nil {
			t.Fatal("frame without samples accepted")
		}
	})
}
