// Package audio owns omnipd's audio wire formats and the assembly of codec
// frames into decodable chunks. It is pure: it converts values to bytes and
// back and never does IO, so the server, the orchestrator and the Code2Wav
// worker all agree on one definition of a sample and of a chunk.
//
// Audio is what Qwen3-Omni's Code2Wav produces: 24 kHz mono, 1920 samples per
// codec frame (12.5 frames per second, 80 ms each).
package audio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

const (
	// SampleRate is the output rate of Code2Wav, in samples per second.
	SampleRate = 24000
	// SamplesPerFrame is the number of samples one codec frame decodes to.
	SamplesPerFrame = 1920
)

// formats lists the encodings Encode accepts, in the order Formats reports them.
var formats = []string{"wav", "pcm"}

// Formats returns the audio formats Encode supports. The result is a fresh
// slice the caller may keep.
func Formats() []string { return append([]string(nil), formats...) }

// Encode encodes samples in the named format ("wav" or "pcm"). Any other name
// is an error that lists the supported formats, so an API can pass it on to
// the client unchanged.
func Encode(format string, samples []float32) ([]byte, error) {
	switch format {
	case "wav":
		return EncodeWAV(samples), nil
	case "pcm":
		return EncodePCM(samples), nil
	}
	return nil, fmt.Errorf("audio: unsupported format %q; supported formats: %s", format, strings.Join(formats, ", "))
}

// Sample16 converts one float sample to signed 16-bit PCM.
//
// The rule, which every encoder here uses so that WAV and PCM carry the same
// integers: NaN becomes 0; the value is clamped to [-1, 1]; it is multiplied
// by 32767 (so the range is symmetric, ±32767, and -32768 never occurs); the
// product is rounded to the nearest integer with halves rounded away from zero
// (math.Round), computed in float64 so no float32 rounding intervenes.
func Sample16(v float32) int16 {
	f := float64(v)
	switch {
	case math.IsNaN(f):
		return 0
	case f > 1:
		f = 1
	case f < -1:
		f = -1
	}
	return int16(math.Round(f * 32767))
}

// EncodePCM returns samples as raw signed 16-bit little-endian PCM (s16le),
// converted with Sample16.
func EncodePCM(samples []float32) []byte {
	b := make([]byte, 2*len(samples))
	putPCM(b, samples)
	return b
}

func putPCM(b []byte, samples []float32) {
	for i, v := range samples {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(Sample16(v)))
	}
}

// wavHeaderSize is the size of the canonical header EncodeWAV writes: the
// RIFF descriptor (12), the fmt chunk (8+16) and the data chunk header (8).
const wavHeaderSize = 44

// EncodeWAV returns samples as a complete WAV file: a 44-byte RIFF/WAVE
// header (PCM format 1, mono, SampleRate Hz, 16 bits) followed by the
// samples converted with Sample16.
func EncodeWAV(samples []float32) []byte {
	dataSize := 2 * len(samples)
	b := make([]byte, wavHeaderSize+dataSize)
	le := binary.LittleEndian
	copy(b[0:], "RIFF")
	le.PutUint32(b[4:], uint32(wavHeaderSize-8+dataSize))
	copy(b[8:], "WAVE")
	copy(b[12:], "fmt ")
	le.PutUint32(b[16:], 16)                // fmt chunk size
	le.PutUint16(b[20:], 1)                 // PCM
	le.PutUint16(b[22:], 1)                 // mono
	le.PutUint32(b[24:], SampleRate)        // sample rate
	le.PutUint32(b[28:], SampleRate*1*16/8) // byte rate
	le.PutUint16(b[32:], 1*16/8)            // block align
	le.PutUint16(b[34:], 16)                // bits per sample
	copy(b[36:], "data")
	le.PutUint32(b[40:], uint32(dataSize))
	putPCM(b[wavHeaderSize:], samples)
	return b
}

// ErrMalformedWAV is wrapped by every error DecodeWAV returns.
var ErrMalformedWAV = errors.New("audio: malformed WAV")

// DecodeWAV parses a 16-bit PCM WAV file and returns its samples
// (interleaved when there are several channels), sample rate and channel
// count. It is strict, because it exists to check what encoders produce: the
// RIFF size must match the input length exactly, a 16-byte PCM fmt chunk must
// precede the data chunk, chunk sizes must fit, and the data must be whole
// frames. Other chunks (LIST and the like) are skipped.
func DecodeWAV(b []byte) (samples []int16, sampleRate, channels int, err error) {
	bad := func(format string, args ...any) ([]int16, int, int, error) {
		return nil, 0, 0, fmt.Errorf("%w: "+format, append([]any{ErrMalformedWAV}, args...)...)
	}
	le := binary.LittleEndian
	if len(b) < 12 {
		return bad("%d bytes; too short for a RIFF header", len(b))
	}
	if string(b[0:4]) != "RIFF" || string(b[8:12]) != "WAVE" {
		return bad("not RIFF/WAVE")
	}
	if n := le.Uint32(b[4:]); uint64(n) != uint64(len(b)-8) {
		return bad("RIFF size %d; want %d", n, len(b)-8)
	}
	var haveFmt bool
	var blockAlign int
	for off := 12; off < len(b); {
		if len(b)-off < 8 {
			return bad("truncated chunk header at offset %d", off)
		}
		id, size := string(b[off:off+4]), uint64(le.Uint32(b[off+4:]))
		body := off + 8
		if size > uint64(len(b)-body) {
			return bad("chunk %q at offset %d: size %d exceeds the %d bytes left", id, off, size, len(b)-body)
		}
		data := b[body : body+int(size)]
		switch id {
		case "fmt ":
			if haveFmt {
				return bad("second fmt chunk")
			}
			if size != 16 {
				return bad("fmt chunk size %d; want 16", size)
			}
			format, ch := le.Uint16(data[0:]), int(le.Uint16(data[2:]))
			rate, byteRate := int(le.Uint32(data[4:])), int(le.Uint32(data[8:]))
			align, bits := int(le.Uint16(data[12:])), le.Uint16(data[14:])
			switch {
			case format != 1:
				return bad("format %d; want 1 (PCM)", format)
			case bits != 16:
				return bad("%d bits per sample; want 16", bits)
			case ch < 1:
				return bad("%d channels", ch)
			case rate < 1:
				return bad("sample rate %d", rate)
			case align != 2*ch:
				return bad("block align %d; want %d", align, 2*ch)
			case byteRate != rate*align:
				return bad("byte rate %d; want %d", byteRate, rate*align)
			}
			haveFmt, sampleRate, channels, blockAlign = true, rate, ch, align
		case "data":
			if !haveFmt {
				return bad("data chunk before fmt chunk")
			}
			if int(size)%blockAlign != 0 {
				return bad("data size %d is not a multiple of block align %d", size, blockAlign)
			}
			if body+int(size) != len(b) {
				// Trailing chunks after data are legal RIFF but nothing
				// omnipd writes has them; refusing keeps the check strict.
				return bad("%d bytes after the data chunk", len(b)-body-int(size))
			}
			samples = make([]int16, size/2)
			for i := range samples {
				samples[i] = int16(le.Uint16(data[2*i:]))
			}
			return samples, sampleRate, channels, nil
		}
		// Chunks are padded to an even size.
		off = body + int(size) + int(size%2)
	}
	return bad("no data chunk")
}
