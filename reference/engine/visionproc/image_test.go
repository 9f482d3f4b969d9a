package visionproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/color/palette"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"
)

func encodePNG(t *testing.T, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t *testing.T, img image.Image, quality int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: quality}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeGIF(t *testing.T, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := gif.Encode(&b, img, &gif.Options{NumColors: 256, Quantizer: nil}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// opaqueRGBA is an opaque test picture with distinct colours per pixel.
func opaqueRGBA(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.SetRGBA(x, y, color.RGBA{uint8(x * 8), uint8(y * 8), uint8(255 - x*4), 255})
		}
	}
	return img
}

// withPNGSize rewrites the IHDR width and height of a PNG (and its CRC), so a
// tiny file declares a huge canvas.
func withPNGSize(t *testing.T, data []byte, w, h uint32) []byte {
	t.Helper()
	out := append([]byte(nil), data...)
	// Signature (8), IHDR length (4), "IHDR" (4), width, height, ...
	if string(out[12:16]) != "IHDR" {
		t.Fatal("no IHDR")
	}
	binary.BigEndian.PutUint32(out[16:20], w)
	binary.BigEndian.PutUint32(out[20:24], h)
	binary.BigEndian.PutUint32(out[29:33], crc32.ChecksumIEEE(out[12:29]))
	return out
}

func TestDecodeImageFormats(t *testing.T) {
	src := opaqueRGBA(20, 12)
	paletted := image.NewPaletted(src.Bounds(), palette.Plan9)
	for y := 0; y < 12; y++ {
		for x := 0; x < 20; x++ {
			paletted.SetColorIndex(x, y, uint8(x*12+y))
		}
	}
	tests := []struct {
		name   string
		data   []byte
		format string
		// exact reports whether the decoded pixels must equal the source.
		exact bool
		want  image.Image
	}{
		{"png", encodePNG(t, src), FormatPNG, true, src},
		{"jpeg", encodeJPEG(t, src, 95), FormatJPEG, false, src},
		{"gif", encodeGIF(t, paletted), FormatGIF, true, paletted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img, format, err := DecodeImage(tc.data, DefaultImageLimits())
			if err != nil {
				t.Fatal(err)
			}
			if format != tc.format || img.Bounds().Dx() != 20 || img.Bounds().Dy() != 12 {
				t.Fatalf("format %q size %v", format, img.Bounds())
			}
			got, err := ToRGB(img, AlphaDrop)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ToRGB(tc.want, AlphaDrop)
			if err != nil {
				t.Fatal(err)
			}
			var worst int
			for i := range want.Pix {
				worst = max(worst, absDiff(got.Pix[i], want.Pix[i]))
			}
			if tc.exact && worst != 0 || !tc.exact && worst > 24 {
				t.Fatalf("largest sample difference %d", worst)
			}
		})
	}
}

func absDiff(a, b uint8) int {
	if a > b {
		return int(a - b)
	}
	return int(b - a)
}

func TestDecodeImageRefusals(t *testing.T) {
	small := encodePNG(t, opaqueRGBA(4, 4))
	limits := DefaultImageLimits()
	tests := []struct {
		name    string
		data    []byte
		limits  ImageLimits
		want    error
		mention string
	}{
		// 100000×100000 declared in 80-odd bytes: refused from the header.
		{"decompression bomb", withPNGSize(t, small, 100000, 100000), limits, ErrTooLarge, "100000×100000"},
		{"over max pixels", withPNGSize(t, small, 10000, 10000), limits, ErrTooLarge, "10000×10000"},
		{"over max bytes", small, ImageLimits{MaxBytes: 10, MaxWidth: 100, MaxHeight: 100, MaxPixels: 1e4}, ErrTooLarge, "bytes"},
		{"zero width header", withPNGSize(t, small, 0, 4), limits, ErrCorruptImage, "PNG"},
		{"truncated png", small[:len(small)-20], limits, ErrCorruptImage, "PNG"},
		{"truncated jpeg", encodeJPEG(t, opaqueRGBA(16, 16), 90)[:40], limits, ErrCorruptImage, "JPEG"},
		{"webp", append([]byte("RIFF\x10\x00\x00\x00WEBPVP8 "), make([]byte, 8)...), limits, ErrUnsupportedFormat, "WebP"},
		{"bmp", []byte("BM\x00\x00\x00\x00\x00\x00\x00\x00"), limits, ErrUnsupportedFormat, "BMP"},
		{"heic", []byte("\x00\x00\x00\x18ftypheic\x00\x00\x00\x00"), limits, ErrUnsupportedFormat, "HEIF"},
		{"garbage", []byte("hello, world"), limits, ErrUnsupportedFormat, "PNG, JPEG or GIF"},
		{"empty", nil, limits, ErrUnsupportedFormat, "PNG, JPEG or GIF"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodeImage(tc.data, tc.limits)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

func TestProcessImageBytes(t *testing.T) {
	p, format, err := ProcessImageBytes(encodePNG(t, gradientImage(70, 50)), DefaultImageLimits(), DefaultImageConfig())
	if err != nil {
		t.Fatal(err)
	}
	// PNG is lossless, so this must be exactly the pinned in-memory result.
	want, err := ProcessImage(gradientImage(70, 50), DefaultImageConfig())
	if err != nil {
		t.Fatal(err)
	}
	if format != FormatPNG || hashValues(p.Values) != hashValues(want.Values) {
		t.Fatalf("format %q, or PNG round trip changed the patches", format)
	}
}
