package audioproc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	mp3 "github.com/hajimehoshi/go-mp3"
)

// mpegHeader is the part of an MPEG audio frame header this package reads.
type mpegHeader struct {
	layer          int // 1, 2 or 3
	lsf            bool
	bitrateKbps    int // 0 for free format
	sampleRate     int
	mono           bool
	frameBytes     int // Layer III only; 0 otherwise or for free format
	samplesPerSide int // samples per channel per frame (Layer III)
}

// parseMPEGHeader decodes the 4-byte frame header at b[0:4] (ISO/IEC
// 11172-3 and 13818-3): 11-bit sync, version, layer, bitrate and
// sampling-frequency indices, padding, channel mode. ok is false for
// anything that is not a valid header.
func parseMPEGHeader(b []byte) (mpegHeader, bool) {
	if len(b) < 4 || b[0] != 0xFF || b[1]&0xE0 != 0xE0 {
		return mpegHeader{}, false
	}
	version := (b[1] >> 3) & 3 // 0: MPEG-2.5, 1: reserved, 2: MPEG-2, 3: MPEG-1
	layerBits := (b[1] >> 1) & 3
	bitrateIndex := int(b[2] >> 4)
	rateIndex := int((b[2] >> 2) & 3)
	if version == 1 || layerBits == 0 || bitrateIndex == 15 || rateIndex == 3 || b[3]&3 == 2 {
		return mpegHeader{}, false
	}
	h := mpegHeader{layer: 4 - int(layerBits), lsf: version != 3, mono: b[3]>>6 == 3}
	rates := [3][3]int{
		{11025, 12000, 8000},  // MPEG-2.5
		{22050, 24000, 16000}, // MPEG-2
		{44100, 48000, 32000}, // MPEG-1
	}
	switch version {
	case 0:
		h.sampleRate = rates[0][rateIndex]
	case 2:
		h.sampleRate = rates[1][rateIndex]
	default:
		h.sampleRate = rates[2][rateIndex]
	}
	if h.layer != 3 {
		return h, true
	}
	mpeg1Kbps := [15]int{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320}
	lsfKbps := [15]int{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160}
	padding := int((b[2] >> 1) & 1)
	if h.lsf {
		h.bitrateKbps = lsfKbps[bitrateIndex]
		h.samplesPerSide = 576
		h.frameBytes = 72*h.bitrateKbps*1000/h.sampleRate + padding
	} else {
		h.bitrateKbps = mpeg1Kbps[bitrateIndex]
		h.samplesPerSide = 1152
		h.frameBytes = 144*h.bitrateKbps*1000/h.sampleRate + padding
	}
	if h.bitrateKbps == 0 {
		h.frameBytes = 0
	}
	return h, true
}

// stripTags removes ID3v2 tags at the start and an ID3v1 tag at the end.
// The decoder would skip the former itself, but it allocates whatever size
// the tag header claims (up to 256 MiB) before reading it, so tags are
// checked against the bytes present here first.
func stripTags(data []byte) ([]byte, error) {
	for len(data) >= 10 && string(data[:3]) == "ID3" {
		sizeBytes := data[6:10]
		for _, c := range sizeBytes {
			if c&0x80 != 0 {
				return nil, badAudio(ErrCorrupt, "not a valid MP3 file: the size in its ID3v2 tag is malformed")
			}
		}
		size := int(sizeBytes[0])<<21 | int(sizeBytes[1])<<14 | int(sizeBytes[2])<<7 | int(sizeBytes[3])
		total := 10 + size
		if data[5]&0x10 != 0 { // footer present
			total += 10
		}
		if total > len(data) {
			return nil, badAudio(ErrCorrupt, "not a valid MP3 file: its ID3v2 tag declares %d bytes but the file has %d (is it cut short?)", total, len(data))
		}
		data = data[total:]
	}
	if len(data) >= 128 && string(data[len(data)-128:len(data)-125]) == "TAG" {
		data = data[:len(data)-128]
	}
	return data, nil
}

// firstFrame finds the first MPEG audio frame: a valid header whose
// successor header (when the data reaches that far) is valid too, which
// rules out most sync-like bytes in junk.
func firstFrame(data []byte) (mpegHeader, int, bool) {
	for i := 0; i+4 <= len(data); i++ {
		h, ok := parseMPEGHeader(data[i:])
		if !ok {
			continue
		}
		if h.layer != 3 || h.frameBytes == 0 {
			return h, i, true // let the caller reject it as unsupported
		}
		next := i + h.frameBytes
		if next+4 > len(data) {
			return h, i, true
		}
		if _, ok := parseMPEGHeader(data[next:]); ok {
			return h, i, true
		}
	}
	return mpegHeader{}, 0, false
}

// decodeMP3 decodes MPEG-1/2/2.5 Layer III with github.com/hajimehoshi/go-mp3
// (pure Go). The decoder emits 16-bit stereo; mono streams keep one of the
// two identical channels. Encoder delay and padding are not trimmed.
func decodeMP3(data []byte, limits Limits) (audio Audio, err error) {
	data, err = stripTags(data)
	if err != nil {
		return Audio{}, err
	}
	h, start, ok := firstFrame(data)
	if !ok {
		return Audio{}, badAudio(ErrCorrupt, "not an MP3 file: no MPEG audio frame found")
	}
	if h.layer != 3 {
		return Audio{}, badAudio(ErrUnsupportedFormat, "MPEG layer %d audio is not supported; send MP3 (layer III) or WAV", h.layer)
	}
	if h.bitrateKbps == 0 {
		return Audio{}, badAudio(ErrUnsupportedFormat, "free-format MP3 is not supported; send MP3 of a standard bitrate or WAV")
	}
	if err := checkShape(h.sampleRate, 1); err != nil {
		return Audio{}, err
	}
	channels := 2
	if h.mono {
		channels = 1
	}
	// The decoder is third-party code run on untrusted bytes: a panic in it
	// is a corrupt file, not a crash of the server.
	defer func() {
		if r := recover(); r != nil {
			audio, err = Audio{}, badAudioCause(ErrCorrupt, fmt.Errorf("mp3 decoder panicked: %v", r), "not a valid MP3 file: it does not decode")
		}
	}()
	dec, err := mp3.NewDecoder(bytes.NewReader(data[start:]))
	if err != nil {
		return Audio{}, badAudioCause(ErrCorrupt, err, "not a valid MP3 file: it does not decode")
	}
	if dec.SampleRate() != h.sampleRate {
		return Audio{}, badAudio(ErrCorrupt, "not a valid MP3 file: its frames disagree on the sample rate (%d Hz and %d Hz)", h.sampleRate, dec.SampleRate())
	}
	// Length is the decoded size in bytes (4 per stereo frame), known from
	// the frame headers before any audio is decoded.
	const bytesPerFrame = 4
	total := dec.Length()
	if total < 0 {
		return Audio{}, badAudio(ErrCorrupt, "not a valid MP3 file: its length cannot be determined")
	}
	frames := total / bytesPerFrame
	if err := limits.check(frames, channels, h.sampleRate); err != nil {
		return Audio{}, err
	}
	samples := make([]float32, 0, int(frames)*channels)
	buf := make([]byte, 64<<10)
	var carry int // bytes of an incomplete stereo frame kept at buf's start
	for read := int64(0); read < frames*bytesPerFrame; {
		n, rerr := dec.Read(buf[carry:])
		n += carry
		whole := n - n%bytesPerFrame
		if remaining := frames*bytesPerFrame - read; int64(whole) > remaining {
			whole = int(remaining)
		}
		for i := 0; i < whole; i += bytesPerFrame {
			left := float32(int16(binary.LittleEndian.Uint16(buf[i:]))) / 32768
			samples = append(samples, left)
			if channels == 2 {
				samples = append(samples, float32(int16(binary.LittleEndian.Uint16(buf[i+2:])))/32768)
			}
		}
		read += int64(whole)
		carry = copy(buf, buf[whole:n])
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return Audio{}, badAudioCause(ErrCorrupt, rerr, "not a valid MP3 file: it does not decode")
		}
	}
	return Audio{SampleRate: h.sampleRate, Channels: channels, Samples: samples}, nil
}
