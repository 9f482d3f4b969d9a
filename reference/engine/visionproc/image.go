package visionproc

import (
	"bytes"
	"errors"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
)

// Image format names DecodeImage reports.
const (
	FormatPNG  = "png"
	FormatJPEG = "jpeg"
	FormatGIF  = "gif"
)

// supportedImageFormats is named in every ErrUnsupportedFormat message.
const supportedImageFormats = "PNG, JPEG or GIF"

// imageFormatNames are the names a message gives the formats SniffImage
// reports.
var imageFormatNames = map[string]string{
	FormatPNG: "PNG", FormatJPEG: "JPEG", FormatGIF: "GIF",
	"webp": "WebP", "bmp": "BMP", "tiff": "TIFF", "heif": "HEIF", "avif": "AVIF",
}

// ImageLimits bound what DecodeImage accepts. They are checked from the
// header before any pixel buffer is allocated, so a small file that declares
// a huge canvas (a decompression bomb) is refused cheaply. The zero value
// refuses everything; start from DefaultImageLimits.
type ImageLimits struct {
	// MaxBytes caps the encoded size.
	MaxBytes int
	// MaxWidth and MaxHeight cap each declared dimension.
	MaxWidth  int
	MaxHeight int
	// MaxPixels caps width × height.
	MaxPixels int64
}

// DefaultImageLimits are this package's own choice (not an upstream value):
// generous for photos and screenshots, far below what would exhaust memory.
func DefaultImageLimits() ImageLimits {
	return ImageLimits{
		MaxBytes:  32 << 20,
		MaxWidth:  16384,
		MaxHeight: 16384,
		MaxPixels: 50_000_000,
	}
}

// check reports whether the size an image of format (a name from
// imageFormatNames) declares is within the limits.
func (l ImageLimits) check(format string, width, height int) error {
	if width <= 0 || height <= 0 {
		return badInput(ErrCorruptImage, "not a valid %s image: it declares a size of %d×%d", format, width, height)
	}
	if width > l.MaxWidth || height > l.MaxHeight || int64(width)*int64(height) > l.MaxPixels {
		return badInput(ErrTooLarge, "the %s image is %d×%d, over the limit of %d×%d and %d pixels",
			format, width, height, l.MaxWidth, l.MaxHeight, l.MaxPixels)
	}
	return nil
}

// SniffImage names the image format of data from its magic bytes: one of the
// Format constants, or a descriptive name of a format this package does not
// decode, or "" when nothing matches.
func SniffImage(data []byte) string {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return FormatPNG
	case bytes.HasPrefix(data, []byte{0xFF, 0xD8, 0xFF}):
		return FormatJPEG
	case bytes.HasPrefix(data, []byte("GIF87a")), bytes.HasPrefix(data, []byte("GIF89a")):
		return FormatGIF
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		return "webp"
	case bytes.HasPrefix(data, []byte("BM")):
		return "bmp"
	case bytes.HasPrefix(data, []byte("II*\x00")), bytes.HasPrefix(data, []byte("MM\x00*")):
		return "tiff"
	case len(data) >= 12 && string(data[4:8]) == "ftyp":
		switch string(data[8:12]) {
		case "heic", "heix", "hevc", "heim", "heis", "mif1", "msf1":
			return "heif"
		case "avif", "avis":
			return "avif"
		}
	}
	return ""
}

// DecodeImage decodes a PNG, JPEG or GIF (first frame) after checking the
// declared size against limits. It returns the image and its format name.
// WebP and other formats are refused with ErrUnsupportedFormat.
func DecodeImage(data []byte, limits ImageLimits) (image.Image, string, error) {
	if len(data) > limits.MaxBytes {
		return nil, "", badInput(ErrTooLarge, "the image is %d bytes, over the limit of %d", len(data), limits.MaxBytes)
	}
	format := SniffImage(data)
	var decodeConfig func([]byte) (image.Config, error)
	var decode func([]byte) (image.Image, error)
	switch format {
	case FormatPNG:
		decodeConfig = func(b []byte) (image.Config, error) { return png.DecodeConfig(bytes.NewReader(b)) }
		decode = func(b []byte) (image.Image, error) { return png.Decode(bytes.NewReader(b)) }
	case FormatJPEG:
		decodeConfig = func(b []byte) (image.Config, error) { return jpeg.DecodeConfig(bytes.NewReader(b)) }
		decode = func(b []byte) (image.Image, error) { return jpeg.Decode(bytes.NewReader(b)) }
	case FormatGIF:
		decodeConfig = func(b []byte) (image.Config, error) { return gif.DecodeConfig(bytes.NewReader(b)) }
		decode = func(b []byte) (image.Image, error) { return gif.Decode(bytes.NewReader(b)) }
	case "":
		return nil, "", badInput(ErrUnsupportedFormat, "not an image of a supported format; send %s", supportedImageFormats)
	default:
		return nil, "", badInput(ErrUnsupportedFormat, "%s images are not supported; send %s", imageFormatNames[format], supportedImageFormats)
	}
	name := imageFormatNames[format]
	cfg, err := decodeConfig(data)
	if err != nil {
		return nil, "", badInputCause(ErrCorruptImage, err, "not a valid %s image%s", name, cutShort(err))
	}
	if err := limits.check(name, cfg.Width, cfg.Height); err != nil {
		return nil, "", err
	}
	img, err := decode(data)
	if err != nil {
		return nil, "", badInputCause(ErrCorruptImage, err, "not a valid %s image%s", name, cutShort(err))
	}
	if b := img.Bounds(); b.Dx() <= 0 || b.Dy() <= 0 {
		return nil, "", badInput(ErrCorruptImage, "not a valid %s image: it is empty", name)
	}
	return img, format, nil
}

// errNilImage guards the exported functions that take an image.Image.
var errNilImage = errors.New("nil image")
