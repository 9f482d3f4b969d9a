package bench

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"hash/adler32"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"strings"
)

// MediaPart is one media content part of a chat request, ready to splice
// into the body. Its JSON is held in pieces, most of them shared by every
// request that draws the same bucket, so a part costs a small head and tail
// per request and the body one copy of the bulk.
type MediaPart struct {
	// Kind is audio, image or video.
	Kind string
	// Bytes is the size of the media file (WAV, PNG) before base64.
	Bytes int
	// pieces are the part's JSON object, in order.
	pieces [][]byte
}

// JSON returns the part's JSON object, joined (a copy; Body splices the
// pieces without joining them).
func (m MediaPart) JSON() []byte { return bytes.Join(m.pieces, nil) }

// jsonLen is the length of the part's JSON.
func (m MediaPart) jsonLen() int {
	n := 0
	for _, p := range m.pieces {
		n += len(p)
	}
	return n
}

// mediaTemplate makes the parts of one bucket. The file is fixed but for
// its first bytes (and, for PNG, its last), which each request draws anew,
// so no two requests send the same media: a server's multimodal caches,
// keyed by the content, then see distinct items, as they do under vLLM's
// random-mm, which draws every item afresh.
type mediaTemplate interface {
	part(rng *rand.Rand) MediaPart
}

var b64 = base64.StdEncoding

// --- audio -----------------------------------------------------------------

// wavTemplate is a 16-bit PCM WAV clip: a mix of two tones and noise, not
// silence, from the dataset's seed.
type wavTemplate struct {
	kind           string
	prefix, suffix []byte // the part's JSON around the base64 payload
	header         []byte // RIFF header through the data chunk's size
	headLen        int    // bytes of the file drawn per request, header included
	rest           []byte // base64 of the file from the head on
	size           int
}

var _ mediaTemplate = (*wavTemplate)(nil)

// newWAVTemplate synthesizes seconds of audio at rate Hz over channels.
func newWAVTemplate(seconds, channels, rate int, part string, rng *rand.Rand) *wavTemplate {
	frames := seconds * rate
	header := pcmWAVHeader(frames, channels, rate)
	data := make([]byte, len(header)+2*frames*channels)
	copy(data, header)
	// Two tones a channel, with their own frequencies and phases, and noise:
	// about -9 dBFS peak, so the clip is heard and never clips.
	type tone struct{ f, phase float64 }
	tones := make([][2]tone, channels)
	for c := range tones {
		for k := range 2 {
			tones[c][k] = tone{200 + 1800*rng.Float64(), 2 * math.Pi * rng.Float64()}
		}
	}
	pcm := data[len(header):]
	for n := range frames {
		t := float64(n) / float64(rate)
		for c := range channels {
			v := 0.2*math.Sin(2*math.Pi*tones[c][0].f*t+tones[c][0].phase) +
				0.12*math.Sin(2*math.Pi*tones[c][1].f*t+tones[c][1].phase) +
				0.05*(2*rng.Float64()-1)
			binary.LittleEndian.PutUint16(pcm[2*(n*channels+c):], uint16(int16(math.Round(v*32767))))
		}
	}
	// The head: the header and at least 24 samples, ending on a multiple of
	// three bytes so the rest's base64 is computed once.
	head := len(header) + 48
	head += (3 - head%3) % 3
	head = min(head, len(data)) // a clip shorter than the head varies whole
	w := &wavTemplate{
		kind: ModalityAudio, header: header, size: len(data), headLen: head,
		rest: []byte(b64.EncodeToString(data[head:])),
	}
	if part == AudioPartAudioURL {
		w.prefix = []byte(`{"type":"audio_url","audio_url":{"url":"data:audio/wav;base64,`)
		w.suffix = []byte(`"}}`)
	} else {
		w.prefix = []byte(`{"type":"input_audio","input_audio":{"data":"`)
		w.suffix = []byte(`","format":"wav"}}`)
	}
	return w
}

func (w *wavTemplate) part(rng *rand.Rand) MediaPart {
	head := make([]byte, w.headLen)
	copy(head, w.header)
	// Noise at half scale; an odd last byte is the low byte of a sample
	// whose high byte is the template's.
	for i := len(w.header); i < len(head); i += 2 {
		v := uint16(int16(rng.IntN(1<<15) - 1<<14))
		head[i] = byte(v)
		if i+1 < len(head) {
			head[i+1] = byte(v >> 8)
		}
	}
	return MediaPart{Kind: w.kind, Bytes: w.size, pieces: [][]byte{w.prefix, []byte(b64.EncodeToString(head)), w.rest, w.suffix}}
}

// pcmWAVHeader is a canonical RIFF/WAVE header for 16-bit PCM: the plain PCM
// format for one or two channels, WAVE_FORMAT_EXTENSIBLE (with the usual
// speaker mask) for more, as the format requires.
func pcmWAVHeader(frames, channels, rate int) []byte {
	le := binary.LittleEndian
	dataSize := uint32(2 * frames * channels)
	fmtSize := 16
	if channels > 2 {
		fmtSize = 40
	}
	h := make([]byte, 0, 20+fmtSize+8)
	h = append(h, "RIFF"...)
	h = le.AppendUint32(h, uint32(4+8+fmtSize+8)+dataSize)
	h = append(h, "WAVEfmt "...)
	h = le.AppendUint32(h, uint32(fmtSize))
	tag := uint16(1)
	if channels > 2 {
		tag = 0xFFFE
	}
	h = le.AppendUint16(h, tag)
	h = le.AppendUint16(h, uint16(channels))
	h = le.AppendUint32(h, uint32(rate))
	h = le.AppendUint32(h, uint32(rate*channels*2))
	h = le.AppendUint16(h, uint16(channels*2))
	h = le.AppendUint16(h, 16)
	if channels > 2 {
		h = le.AppendUint16(h, 22) // cbSize
		h = le.AppendUint16(h, 16) // valid bits
		// Front left, right, center, LFE, back left, right, side left, right.
		h = le.AppendUint32(h, uint32(1<<channels-1))
		h = le.AppendUint16(h, 1) // KSDATAFORMAT_SUBTYPE_PCM
		h = append(h, "\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"...)
	}
	h = append(h, "data"...)
	h = le.AppendUint32(h, dataSize)
	return h
}

// --- images ----------------------------------------------------------------

// pngTemplate is an 8-bit RGB PNG of independent uniform pixels, as vLLM's
// generate_synthetic_image draws them (worst-case compression, which
// stresses the transport as vLLM means it to). Each request redraws the
// first row. The file is laid out so that only its start and end depend on
// that row:
//
//	signature, IHDR, tEXt (pads the start to a multiple of 3 bytes), IDAT
//	{zlib header, stored deflate block of row 0}, IDAT {deflate stream of
//	rows 1.., compressed once, final}, IDAT {Adler-32 of all rows}, IEND
//
// The second IDAT is a fresh deflate stream, so it refers to nothing
// before it and any first row may precede it; the checksum over all rows
// combines row 0's with the rest's, known in advance.
type pngTemplate struct {
	width, height int
	prefix        []byte // signature and IHDR
	rest          []byte // base64 of the middle IDAT, to a multiple of 3 bytes
	leftover      []byte // its last 0–2 bytes, encoded with the tail
	restAdler     uint32 // Adler-32 of rows 1..
	restLen       int    // their length, filter bytes included
	size          int
}

var _ mediaTemplate = (*pngTemplate)(nil)

var (
	pngSignature = []byte("\x89PNG\r\n\x1a\n")
	imagePrefix  = []byte(`{"type":"image_url","image_url":{"url":"data:image/png;base64,`)
	imageSuffix  = []byte(`"}}`)
)

func newPNGTemplate(width, height int, rng *rand.Rand) *pngTemplate {
	t := &pngTemplate{width: width, height: height}
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], uint32(width))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(height))
	ihdr[8], ihdr[9] = 8, 2 // 8-bit RGB; compression, filter, interlace 0
	t.prefix = appendChunk(append([]byte{}, pngSignature...), "IHDR", ihdr)

	row := 1 + 3*width
	rows := make([]byte, (height-1)*row)
	for r := range height - 1 {
		fillRow(rows[r*row:(r+1)*row], rng)
	}
	var z bytes.Buffer
	fw, _ := flate.NewWriter(&z, flate.BestSpeed)
	fw.Write(rows)
	fw.Close()
	t.restAdler, t.restLen = adler32.Checksum(rows), len(rows)
	mid := appendChunk(nil, "IDAT", z.Bytes())
	cut := len(mid) - len(mid)%3
	t.rest, t.leftover = []byte(b64.EncodeToString(mid[:cut])), mid[cut:]
	p := t.file(make([]byte, row))
	t.size = len(p.head) + len(mid) + len(p.tail)
	return t
}

func fillRow(row []byte, rng *rand.Rand) {
	row[0] = 0 // filter: none
	for i := 1; i < len(row); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8 && i+k < len(row); k++ {
			row[i+k] = byte(v >> (8 * k))
		}
	}
}

type pngEnds struct{ head, tail []byte }

// file is the start of the PNG (through row 0's IDAT, a multiple of three
// bytes) and its end (the checksum IDAT and IEND) for a first row.
func (t *pngTemplate) file(row0 []byte) pngEnds {
	var stored []byte
	stored = append(stored, 0x78, 0x01) // zlib: deflate, 32 KiB window, no dictionary
	for off := 0; off < len(row0); off += 0xFFFF {
		block := row0[off:min(off+0xFFFF, len(row0))]
		stored = append(stored, 0) // BFINAL 0, stored
		stored = binary.LittleEndian.AppendUint16(stored, uint16(len(block)))
		stored = binary.LittleEndian.AppendUint16(stored, ^uint16(len(block)))
		stored = append(stored, block...)
	}
	idat := appendChunk(nil, "IDAT", stored)
	// A tEXt chunk whose text pads the head to a multiple of three bytes.
	pad := (3 - (len(t.prefix)+12+len("Comment\x00omnipd")+len(idat))%3) % 3
	head := append([]byte{}, t.prefix...)
	head = appendChunk(head, "tEXt", []byte("Comment\x00omnipd"+strings.Repeat(" ", pad)))
	head = append(head, idat...)
	sum := adler32Combine(adler32.Checksum(row0), t.restAdler, t.restLen)
	tail := appendChunk(nil, "IDAT", binary.BigEndian.AppendUint32(nil, sum))
	tail = appendChunk(tail, "IEND", nil)
	return pngEnds{head, tail}
}

func (t *pngTemplate) part(rng *rand.Rand) MediaPart {
	row := make([]byte, 1+3*t.width)
	fillRow(row, rng)
	f := t.file(row)
	tail := append(append([]byte{}, t.leftover...), f.tail...)
	return MediaPart{Kind: ModalityImage, Bytes: t.size, pieces: [][]byte{
		imagePrefix, []byte(b64.EncodeToString(f.head)), t.rest, []byte(b64.EncodeToString(tail)), imageSuffix,
	}}
}

func appendChunk(dst []byte, typ string, data []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(data)))
	start := len(dst)
	dst = append(dst, typ...)
	dst = append(dst, data...)
	return binary.BigEndian.AppendUint32(dst, crc32.ChecksumIEEE(dst[start:]))
}

// adler32Combine is the Adler-32 of A‖B from those of A and B and B's
// length (zlib's adler32_combine).
func adler32Combine(a, b uint32, lenB int) uint32 {
	const mod = 65521
	rem := uint32(lenB % mod)
	sum1 := a & 0xffff
	sum2 := (rem * sum1) % mod
	sum1 += (b & 0xffff) + mod - 1
	sum2 += (a >> 16) + (b >> 16) + mod - rem
	if sum1 >= mod {
		sum1 -= mod
	}
	if sum1 >= mod {
		sum1 -= mod
	}
	if sum2 >= mod<<1 {
		sum2 -= mod << 1
	}
	if sum2 >= mod {
		sum2 -= mod
	}
	return sum1 | sum2<<16
}
