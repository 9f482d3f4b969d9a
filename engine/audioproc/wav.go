package audioproc

import (
	"encoding/binary"
	"fmt"
	"math"
)

// WAVE format tags (the fmt chunk's wFormatTag).
const (
	wavTagPCM        = 0x0001
	wavTagIEEEFloat  = 0x0003
	wavTagExtensible = 0xFFFE
)

// ksdataformatSubtypeTail is bytes 2–15 of the KSDATAFORMAT_SUBTYPE_PCM and
// _IEEE_FLOAT GUIDs; bytes 0–1 carry the format tag.
const ksdataformatSubtypeTail = "\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"

// dataSizeUnknown is the data chunk size streaming writers leave when they
// cannot seek back: the samples run to the end of the file.
const dataSizeUnknown = 0xFFFFFFFF

type wavFormat struct {
	float      bool
	channels   int
	sampleRate int
	blockAlign int
	bytesPer   int // container bytes per sample
}

// decodeWAV reads a RIFF/WAVE file: PCM 8/16/24/32-bit integer and 32/64-bit
// float, plain or WAVE_FORMAT_EXTENSIBLE, any rate in range and up to
// MaxChannels channels. Chunk sizes are checked against the bytes present
// before they are used; the sample buffer is allocated only after the
// limits have passed.
func decodeWAV(data []byte, limits Limits) (Audio, error) {
	if len(data) < 12 || string(data[8:12]) != "WAVE" {
		return Audio{}, fmt.Errorf("audioproc: wav: no RIFF/WAVE header: %w", ErrCorrupt)
	}
	switch string(data[:4]) {
	case "RIFF":
	case "RIFX", "RF64":
		return Audio{}, fmt.Errorf("audioproc: wav: %q container: %w", data[:4], ErrUnsupportedFormat)
	default:
		return Audio{}, fmt.Errorf("audioproc: wav: no RIFF/WAVE header: %w", ErrCorrupt)
	}
	var (
		format  *wavFormat
		payload []byte
	)
	rest := data[12:]
	for payload == nil {
		if len(rest) < 8 {
			if format == nil {
				return Audio{}, fmt.Errorf("audioproc: wav: no fmt chunk: %w", ErrCorrupt)
			}
			return Audio{}, fmt.Errorf("audioproc: wav: no data chunk: %w", ErrCorrupt)
		}
		id := string(rest[:4])
		size := binary.LittleEndian.Uint32(rest[4:8])
		body := rest[8:]
		switch {
		case id == "data" && size == dataSizeUnknown && len(body) > 0:
			// A streamed file: the data runs to the end of the input.
			payload = body
		case uint64(size) > uint64(len(body)):
			return Audio{}, fmt.Errorf("audioproc: wav: %q chunk declares %d bytes, %d left: %w", id, size, len(body), ErrCorrupt)
		case id == "data":
			payload = body[:size]
		case id == "fmt ":
			f, err := parseWAVFormat(body[:size])
			if err != nil {
				return Audio{}, err
			}
			format = f
		}
		if payload != nil {
			break
		}
		// Chunks are word-aligned: an odd size is followed by a pad byte,
		// which a truncated final chunk may lack.
		skip := uint64(size) + uint64(size&1)
		if skip > uint64(len(body)) {
			skip = uint64(len(body))
		}
		rest = body[skip:]
	}
	if format == nil {
		return Audio{}, fmt.Errorf("audioproc: wav: data chunk before any fmt chunk: %w", ErrCorrupt)
	}
	frames := int64(len(payload) / format.blockAlign) // a trailing partial frame is dropped, as libsndfile does
	if err := limits.check(frames, format.channels, format.sampleRate); err != nil {
		return Audio{}, fmt.Errorf("audioproc: wav: %w", err)
	}
	samples := make([]float32, int(frames)*format.channels)
	if err := format.convert(samples, payload); err != nil {
		return Audio{}, err
	}
	return Audio{SampleRate: format.sampleRate, Channels: format.channels, Samples: samples}, nil
}

func parseWAVFormat(b []byte) (*wavFormat, error) {
	if len(b) < 16 {
		return nil, fmt.Errorf("audioproc: wav: fmt chunk of %d bytes, need 16: %w", len(b), ErrCorrupt)
	}
	tag := binary.LittleEndian.Uint16(b[0:2])
	f := &wavFormat{
		channels:   int(binary.LittleEndian.Uint16(b[2:4])),
		sampleRate: int(binary.LittleEndian.Uint32(b[4:8])),
		blockAlign: int(binary.LittleEndian.Uint16(b[12:14])),
	}
	bits := int(binary.LittleEndian.Uint16(b[14:16]))
	if tag == wavTagExtensible {
		// cbSize(2) validBits(2) channelMask(4) subFormat GUID(16).
		if len(b) < 40 || binary.LittleEndian.Uint16(b[16:18]) < 22 {
			return nil, fmt.Errorf("audioproc: wav: WAVE_FORMAT_EXTENSIBLE fmt chunk too short: %w", ErrCorrupt)
		}
		if string(b[26:40]) != ksdataformatSubtypeTail {
			return nil, fmt.Errorf("audioproc: wav: extensible sub-format is not a KSDATAFORMAT_SUBTYPE: %w", ErrUnsupportedFormat)
		}
		tag = binary.LittleEndian.Uint16(b[24:26])
	}
	if f.channels == 0 || f.sampleRate == 0 || bits == 0 {
		return nil, fmt.Errorf("audioproc: wav: fmt declares %d channels, %d Hz, %d bits: %w", f.channels, f.sampleRate, bits, ErrCorrupt)
	}
	if err := checkShape(f.sampleRate, f.channels); err != nil {
		return nil, fmt.Errorf("audioproc: wav: %w", err)
	}
	// Samples narrower than their container (12-bit in 16) are stored
	// left-justified, so reading the whole container is right.
	f.bytesPer = (bits + 7) / 8
	switch tag {
	case wavTagPCM:
		if f.bytesPer > 4 {
			return nil, fmt.Errorf("audioproc: wav: %d-bit integer PCM: %w", bits, ErrUnsupportedFormat)
		}
	case wavTagIEEEFloat:
		if bits != 32 && bits != 64 {
			return nil, fmt.Errorf("audioproc: wav: %d-bit float: %w", bits, ErrUnsupportedFormat)
		}
		f.float = true
	default:
		return nil, fmt.Errorf("audioproc: wav: format tag %#04x (compressed or unknown encoding): %w", tag, ErrUnsupportedFormat)
	}
	if f.blockAlign != f.channels*f.bytesPer {
		return nil, fmt.Errorf("audioproc: wav: block align %d, want %d channels × %d bytes: %w",
			f.blockAlign, f.channels, f.bytesPer, ErrCorrupt)
	}
	return f, nil
}

// convert fills out from little-endian sample bytes, scaled as libsndfile's
// sf_read_float does: integers by 1/2^(bits-1) of their container (8-bit is
// unsigned, offset 128), floats as stored (float64 rounded to float32).
func (f *wavFormat) convert(out []float32, b []byte) error {
	n := f.bytesPer
	for i := range out {
		p := b[i*n : (i+1)*n]
		switch {
		case f.float && n == 4:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(p))
		case f.float:
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(p)))
		case n == 1:
			out[i] = float32(int(p[0])-128) / 128
		case n == 2:
			out[i] = float32(int16(binary.LittleEndian.Uint16(p))) / (1 << 15)
		case n == 3:
			v := int32(uint32(p[0])<<8|uint32(p[1])<<16|uint32(p[2])<<24) >> 8
			out[i] = float32(v) / (1 << 23)
		default:
			out[i] = float32(int32(binary.LittleEndian.Uint32(p))) / (1 << 31)
		}
		if f.float {
			v := float64(out[i])
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("audioproc: wav: sample %d is %v: %w", i, out[i], ErrCorrupt)
			}
		}
	}
	return nil
}
