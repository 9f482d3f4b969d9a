package audioproc

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"time"
)

// Audio is decoded audio at its native sample rate.
type Audio struct {
	// SampleRate in Hz, within MinSampleRate–MaxSampleRate.
	SampleRate int
	// Channels is at least 1 and at most MaxChannels.
	Channels int
	// Samples holds Frames()·Channels values, interleaved (frame-major),
	// nominally in [-1, 1]: integer PCM is scaled by 1/2^(bits-1), and
	// 8-bit PCM is unsigned with 128 as zero, as libsndfile reads them.
	Samples []float32
}

// Frames is the number of samples per channel.
func (a Audio) Frames() int {
	if a.Channels <= 0 {
		return 0
	}
	return len(a.Samples) / a.Channels
}

// Duration is the length of the audio.
func (a Audio) Duration() time.Duration {
	if a.SampleRate <= 0 {
		return 0
	}
	frames := int64(a.Frames())
	rate := int64(a.SampleRate)
	return time.Duration(frames/rate)*time.Second + time.Duration(frames%rate)*time.Second/time.Duration(rate)
}

// MaxChannels bounds the channel count of any input.
const MaxChannels = 64

// Default limits, used for a Limits field left zero.
const (
	DefaultMaxDuration = 10 * time.Minute
	// DefaultMaxSamples is 32 Mi samples (128 MiB of float32), enough for
	// ten minutes of 48 kHz stereo.
	DefaultMaxSamples = 32 << 20
)

// Limits bound what Decode and DecodePCM16LE will produce, so a hostile
// file cannot make them allocate without bound. Both are checked against
// the sizes a header declares before any sample buffer is allocated.
type Limits struct {
	// MaxDuration caps the audio's length; zero means DefaultMaxDuration.
	MaxDuration time.Duration
	// MaxSamples caps the decoded samples summed over channels; zero means
	// DefaultMaxSamples.
	MaxSamples int
}

func (l Limits) withDefaults() Limits {
	if l.MaxDuration <= 0 {
		l.MaxDuration = DefaultMaxDuration
	}
	if l.MaxSamples <= 0 {
		l.MaxSamples = DefaultMaxSamples
	}
	return l
}

// check reports ErrLimitExceeded when frames of channels at rate break the
// limits. frames may be as large as a 32-bit header field allows.
func (l Limits) check(frames int64, channels, rate int) error {
	l = l.withDefaults()
	if frames*int64(channels) > int64(l.MaxSamples) {
		return badAudio(ErrLimitExceeded, "the audio has %d samples (%d channels), over the limit of %d",
			frames*int64(channels), channels, l.MaxSamples)
	}
	secs := int64(l.MaxDuration / time.Second)
	nanos := int64(l.MaxDuration % time.Second)
	maxFrames := secs*int64(rate) + nanos*int64(rate)/int64(time.Second)
	if frames > maxFrames {
		length, limit := secondsOver(float64(frames)/float64(rate), l.MaxDuration.Seconds())
		return badAudio(ErrLimitExceeded, "the audio lasts %s, over the limit of %s", length, limit)
	}
	return nil
}

// Format names an audio container this package recognises.
type Format string

const (
	FormatUnknown Format = ""
	FormatWAV     Format = "wav"
	FormatMP3     Format = "mp3"
)

// ParseFormat maps a declared format — an OpenAI input_audio format ("wav",
// "mp3") or a MIME type ("audio/wav", "audio/x-wav", "audio/wave",
// "audio/mpeg", "audio/mp3"), case-insensitive — to a Format. Anything else
// is ErrUnsupportedFormat.
func ParseFormat(name string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "wav", "wave", "audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave":
		return FormatWAV, nil
	case "mp3", "audio/mpeg", "audio/mp3", "audio/mpeg3", "audio/x-mpeg-3":
		return FormatMP3, nil
	}
	return FormatUnknown, badAudio(ErrUnsupportedFormat, "audio format %q is not supported; send WAV or MP3", name)
}

// Sniff recognises a container from its first bytes: "RIFF"/"RIFX"/"RF64"
// with "WAVE" is WAV; an ID3v2 tag or an MPEG audio frame header (11-bit
// sync, valid version, layer, bitrate and rate fields) is MP3. Anything
// else is FormatUnknown.
func Sniff(data []byte) Format {
	if len(data) >= 12 && string(data[8:12]) == "WAVE" {
		switch string(data[:4]) {
		case "RIFF", "RIFX", "RF64":
			return FormatWAV
		}
	}
	if len(data) >= 10 && string(data[:3]) == "ID3" {
		return FormatMP3
	}
	if _, ok := parseMPEGHeader(data); ok {
		return FormatMP3
	}
	return FormatUnknown
}

// Decode decodes a whole WAV or MP3 file held in data. format is the
// declared format (see ParseFormat); when the bytes are recognisably
// another format the result is ErrFormatMismatch, when they are not the
// declared format at all ErrCorrupt. Decoded audio keeps its native rate and
// channels; Mono16k prepares it for LogMel.
func Decode(data []byte, format string, limits Limits) (Audio, error) {
	declared, err := ParseFormat(format)
	if err != nil {
		return Audio{}, err
	}
	if sniffed := Sniff(data); sniffed != FormatUnknown && sniffed != declared {
		return Audio{}, badAudio(ErrFormatMismatch, "declared %s, but the data is %s", formatName(declared), formatName(sniffed))
	}
	switch declared {
	case FormatWAV:
		return decodeWAV(data, limits)
	default:
		return decodeMP3(data, limits)
	}
}

// DecodePCM16LE reads raw interleaved signed 16-bit little-endian PCM, the
// form a container's audio track arrives in. A trailing partial frame is
// ignored.
func DecodePCM16LE(data []byte, sampleRate, channels int, limits Limits) (Audio, error) {
	if err := checkShape(sampleRate, channels); err != nil {
		return Audio{}, err
	}
	frames := int64(len(data) / (2 * channels))
	if err := limits.check(frames, channels, sampleRate); err != nil {
		return Audio{}, err
	}
	samples := make([]float32, int(frames)*channels)
	for i := range samples {
		samples[i] = float32(int16(binary.LittleEndian.Uint16(data[2*i:]))) / 32768
	}
	return Audio{SampleRate: sampleRate, Channels: channels, Samples: samples}, nil
}

// formatName names a format as a sentence about the data does.
func formatName(f Format) string {
	switch f {
	case FormatWAV:
		return "WAV"
	case FormatMP3:
		return "MP3"
	}
	return "of an unknown format"
}

// seconds writes a length of time the way a person reads one: "9.5 s",
// "10 s".
func seconds(s float64) string { return secondsAt(s, 1) }

// secondsAt words s seconds rounded to digits decimals.
func secondsAt(s float64, digits int) string {
	scale := math.Pow(10, float64(digits))
	return strconv.FormatFloat(math.Round(s*scale)/scale, 'f', -1, 64) + " s"
}

// secondsOver words a length over a limit: at one decimal, or with as many
// more as it takes not to read as the limit itself (a clip one sample over
// 300 s lasts 300.0001 s, not 300 s).
func secondsOver(length, limit float64) (string, string) {
	lim := seconds(limit)
	for digits := 1; digits <= 9; digits++ {
		if l := secondsAt(length, digits); l != lim {
			return l, lim
		}
	}
	return strconv.FormatFloat(length, 'f', -1, 64) + " s", lim
}

func checkShape(sampleRate, channels int) error {
	if sampleRate < MinSampleRate || sampleRate > MaxSampleRate {
		return badAudio(ErrUnsupportedFormat, "audio at %d Hz is not supported; the sample rate must be within %d–%d Hz", sampleRate, MinSampleRate, MaxSampleRate)
	}
	if channels < 1 || channels > MaxChannels {
		return badAudio(ErrUnsupportedFormat, "audio of %d channels is not supported; send 1 to %d", channels, MaxChannels)
	}
	return nil
}
