package visionproc

import (
	"image"
	"image/color"
	"testing"
)

// Expected colours follow PIL's convert("RGB"): grey replicated, palette
// looked up, alpha dropped keeping the stored colour; AlphaOnWhite is
// (c·a + 255·(255 − a))/255 rounded.
func TestToRGB(t *testing.T) {
	gray := image.NewGray(image.Rect(0, 0, 1, 1))
	gray.Pix[0] = 77

	nrgba := image.NewNRGBA(image.Rect(0, 0, 1, 1))
	nrgba.Pix[0], nrgba.Pix[1], nrgba.Pix[2], nrgba.Pix[3] = 200, 100, 0, 128

	// Premultiplied: stored colour (200, 100, 0) at alpha 255 is itself.
	rgba := image.NewRGBA(image.Rect(0, 0, 1, 1))
	rgba.Pix[0], rgba.Pix[1], rgba.Pix[2], rgba.Pix[3] = 200, 100, 0, 255

	pal := image.NewPaletted(image.Rect(0, 0, 1, 1), color.Palette{color.NRGBA{1, 2, 3, 255}, color.NRGBA{90, 60, 30, 0}})
	pal.Pix[0] = 1

	ycc := image.NewYCbCr(image.Rect(0, 0, 1, 1), image.YCbCrSubsampleRatio444)
	ycc.Y[0], ycc.Cb[0], ycc.Cr[0] = 128, 128, 128 // neutral grey

	// An image whose bounds do not start at the origin.
	offset := image.NewGray(image.Rect(5, 7, 6, 8))
	offset.Pix[0] = 9

	tests := []struct {
		name  string
		img   image.Image
		alpha AlphaMode
		want  [3]uint8
	}{
		{"gray replicated", gray, AlphaDrop, [3]uint8{77, 77, 77}},
		{"alpha dropped", nrgba, AlphaDrop, [3]uint8{200, 100, 0}},
		// 200·128 + 255·127 = 57985 → /255 = 227.4 → 227; 100: 45185/255 = 177.2 → 177;
		// 0: 32385/255 = 127.
		{"alpha on white", nrgba, AlphaOnWhite, [3]uint8{227, 177, 127}},
		{"premultiplied opaque", rgba, AlphaDrop, [3]uint8{200, 100, 0}},
		{"palette keeps stored colour", pal, AlphaDrop, [3]uint8{90, 60, 30}},
		{"palette transparent on white", pal, AlphaOnWhite, [3]uint8{255, 255, 255}},
		{"ycbcr neutral", ycc, AlphaDrop, [3]uint8{128, 128, 128}},
		{"offset bounds", offset, AlphaDrop, [3]uint8{9, 9, 9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ToRGB(tc.img, tc.alpha)
			if err != nil {
				t.Fatal(err)
			}
			got := [3]uint8{f.Pix[0], f.Pix[1], f.Pix[2]}
			if f.Width != 1 || f.Height != 1 || got != tc.want {
				t.Fatalf("ToRGB = %v (%d×%d), want %v", got, f.Width, f.Height, tc.want)
			}
		})
	}
	if _, err := ToRGB(nil, AlphaDrop); err == nil {
		t.Fatal("nil image accepted")
	}
}
