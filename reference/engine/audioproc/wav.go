package audioproc

import (
	"encoding/binary"
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
		return Audio{}, badAudio(ErrCorrupt, "not a WAV file: no RIFF/WAVE header")
	}
	switch string(data[:4]) {
	case "RIFF":
	case "RIFX", "RF64":
		return Audio{}, badAudio(ErrUnsupportedFormat, "%s WAV files are not supported; send a RIFF WAV file", data[:4])
	default:
		return Audio{}, badAudio(ErrCorrupt, "not a WAV file: no RIFF/WAVE header")
	}
	var (
		format  *wavFormat
		payload []byte
	)
	rest := data[12:]
	for payload == nil {
		if len(rest) < 8 {
			if format == nil {
				return Audio{}, badAudio(ErrCorrupt, "not a valid WAV file: it has no fmt chunk")
			}
			return Audio{}, badAudio(ErrCorrupt, "not a valid WAV file: it has no data chunk")
		}
		id := string(rest[:4])
		size := binary.LittleEndian.Uint32(rest[4:8])
		body := rest[8:]
		switch {
		case id == "data" && size == dataSizeUnknown && len(body) > 0:
			// A streamed file: the data runs to the end of the input.
			payload = body
		case uint64(size) > uint64(len(body)):
			return Audio{}, badAudio(ErrCorrupt, "not a valid WAV file: its %q chunk declares %d bytes but %d follow (is the file cut short?)", id, size, len(body))
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
		return Audio{}, badAudio(ErrCorrupt, "not a valid WAV file: its data chunk comes before the fmt chunk")
	}
	frames := int64(len(payload) / format.blockAlign) // a trailing partial frame is dropped, as libsndfile does
	if err := limits.check(frames, format.channels, format.sampleRate); err != nil {
		return Audio{}, err
	}
	samples := make([]float32, int(frames)*format.channels)
	if err := format.convert(samples, payload); err != nil {
		return Audio{}, err
	}
	return Audio{SampleRate: format.sampleRate, Channels: format.channels, Samples: samples}, nil
}

func parseWAVFormat(b []byte) (*wavFormat, error) {
	if len(b) < 16 {
		return nil, badAudio(ErrCorrupt, "not a valid WAV file: its fmt chunk is %d bytes; it needs at least 16", len(b))
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
			return nil, badAudio(ErrCorrupt, "not a valid WAV file: its WAVE_FORMAT_EXTENSIBLE fmt chunk is too short")
		}
		if string(b[26:40]) != ksdataformatSubtypeTail {
			return nil, badAudio(ErrUnsupportedFormat, "WAV files of this WAVE_FORMAT_EXTENSIBLE sub-format are not supported; send PCM or float WAV")
		}
		tag = binary.LittleEndian.Uint16(b[24:26])
	}
	if f.channels == 0 || f.sampleRate == 0 || bits == 0 {
		return nil, badAudio(ErrCorrupt, "not a valid WAV file: its fmt chunk declares %d channels, %d Hz, %d bits", f.channels, f.sampleRate, bits)
	}
	if err := checkShape(f.sampleRate, f.channels); err != nil {
		return nil, err
	}
	// Samples narrower than their container (12-bit in 16) are stored
	// left-justified, so reading the whole container is right.
	f.bytesPer = (bits + 7) / 8
	switch tag {
	case wavTagPCM:
		if f.bytesPer > 4 {
			return nil, badAudio(ErrUnsupportedFormat, "%d-bit integer PCM WAV is not supported; send 8-, 16-, 24- or 32-bit PCM or 32- or 64-bit float", bits)
		}
	case wavTagIEEEFloat:
		if bits != 32 && bits != 64 {
			return nil, badAudio(ErrUnsupportedFormat, "%d-bit float WAV is not supported; send 32- or 64-bit float or integer PCM", bits)
		}
		f.float = true
	default:
		return nil, badAudio(ErrUnsupportedFormat, "WAV files encoded with format tag %#04x (compressed or unknown) are not supported; send PCM or float WAV (ffmpeg -c:a pcm_s16le)", tag)
	}
	if f.blockAlign != f.channels*f.bytesPer {
		return nil, badAudio(ErrCorrupt, "not a valid WAV file: its block align is %d, but %d channels of %d bytes need %d",
			f.blockAlign, f.channels, f.bytesPer, f.channels*f.bytesPer)
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
				return badAudio(ErrCorrupt, "not a valid WAV file: sample %d is %v, not a number", i, out[i])
			}
		}
	}
	return nil
}
