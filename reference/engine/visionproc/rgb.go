package visionproc

import (
	"fmt"
	"image"
	"image/color"
)

// Frame is an 8-bit RGB picture stored channel-planar (the processor's
// channels-first layout): Pix[c·Height·Width + y·Width + x] for channel c of
// R, G, B.
type Frame struct {
	Width, Height int
	Pix           []uint8
}

// plane returns channel c of f.
func (f Frame) plane(c int) []uint8 {
	n := f.Width * f.Height
	return f.Pix[c*n : (c+1)*n]
}

// newFrame allocates a zero frame.
func newFrame(width, height int) Frame {
	return Frame{Width: width, Height: height, Pix: make([]uint8, Channels*width*height)}
}

// ToRGB converts a decoded image to planar RGB the way PIL's convert("RGB")
// does for the modes Go's decoders produce: greyscale is replicated into the
// three channels, palettes are looked up, and alpha is dropped (the stored
// colour is kept) — or, with AlphaOnWhite, composited onto white as
// qwen-vl-utils does. Premultiplied colours (image.RGBA) are un-premultiplied
// first so that both modes see the stored colour. 16-bit samples keep their
// high byte.
func ToRGB(img image.Image, alpha AlphaMode) (Frame, error) {
	if img == nil {
		return Frame{}, fmt.Errorf("%w: %w", ErrInvalidArgument, errNilImage)
	}
	if alpha != AlphaDrop && alpha != AlphaOnWhite {
		return Frame{}, fmt.Errorf("%w: alpha mode %d", ErrInvalidArgument, alpha)
	}
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	if w <= 0 || h <= 0 {
		return Frame{}, fmt.Errorf("%w: empty image %d×%d", ErrInvalidArgument, w, h)
	}
	f := newFrame(w, h)
	r, g, bl := f.plane(0), f.plane(1), f.plane(2)
	put := func(i int, cr, cg, cb, ca uint8) {
		if alpha == AlphaOnWhite && ca != 0xFF {
			cr, cg, cb = overWhite(cr, ca), overWhite(cg, ca), overWhite(cb, ca)
		}
		r[i], g[i], bl[i] = cr, cg, cb
	}
	switch m := img.(type) {
	case *image.YCbCr:
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				yi := m.YOffset(b.Min.X+x, b.Min.Y+y)
				ci := m.COffset(b.Min.X+x, b.Min.Y+y)
				cr, cg, cb := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
				put(y*w+x, cr, cg, cb, 0xFF)
			}
		}
	case *image.Gray:
		for y := 0; y < h; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := 0; x < w; x++ {
				v := row[x]
				put(y*w+x, v, v, v, 0xFF)
			}
		}
	case *image.NRGBA:
		for y := 0; y < h; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := 0; x < w; x++ {
				p := row[4*x : 4*x+4]
				put(y*w+x, p[0], p[1], p[2], p[3])
			}
		}
	case *image.Paletted:
		// Precompute the palette once; PIL's P→RGB is a table lookup too.
		var pal [256][4]uint8
		for i, c := range m.Palette {
			n := color.NRGBAModel.Convert(c).(color.NRGBA)
			pal[i] = [4]uint8{n.R, n.G, n.B, n.A}
		}
		for y := 0; y < h; y++ {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := 0; x < w; x++ {
				p := pal[row[x]]
				put(y*w+x, p[0], p[1], p[2], p[3])
			}
		}
	default:
		// RGBA (premultiplied), 16-bit, CMYK and anything else: Go's NRGBA
		// model un-premultiplies and keeps the high byte.
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				n := color.NRGBAModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA)
				put(y*w+x, n.R, n.G, n.B, n.A)
			}
		}
	}
	return f, nil
}

// overWhite blends one 8-bit channel over white with alpha a using integer
// arithmetic: (c·a + 255·(255−a)) / 255, rounded to nearest.
func overWhite(c, a uint8) uint8 {
	v := uint32(c)*uint32(a) + 255*(255-uint32(a))
	return uint8((v + 127) / 255)
}
