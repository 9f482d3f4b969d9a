package visionproc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"image"
	"image/jpeg"
)

// The video container is AVI (RIFF) carrying Motion-JPEG video and optional
// PCM audio. It is the one common container whose video the standard
// library can decode without cgo: every frame is a self-contained JPEG that
// image/jpeg reads, and the container is a flat chunk list with explicit
// sizes. ffmpeg makes one from anything:
//
//	ffmpeg -i in.mp4 -c:v mjpeg -q:v 3 -c:a pcm_s16le out.avi
//
// Layout read here: RIFF 'AVI ' { LIST 'hdrl' { 'avih', LIST 'strl' { 'strh',
// 'strf', ... }... }, LIST 'movi' { '##dc' | '##db' | '##wb' | LIST 'rec ' {...}
// | 'ix##' | 'JUNK' ... }, 'idx1'? }, then optional OpenDML RIFF 'AVIX' {
// LIST 'movi' }. Frames are taken from movi in file order, so idx1 and the
// OpenDML indexes are not needed. Every size field is checked against the
// bytes that actually remain before it is used.

// ContainerLimits bound what ParseAVI accepts; each is checked before the
// corresponding allocation. The zero value refuses everything; start from
// DefaultContainerLimits, whose values are this package's own choice.
type ContainerLimits struct {
	// MaxBytes caps the whole file.
	MaxBytes int
	// MaxFrames caps the video chunk count (the index kept per frame).
	MaxFrames int
	// MaxFrameBytes caps one encoded frame.
	MaxFrameBytes int
	// MaxWidth and MaxHeight cap the declared and the decoded frame size.
	MaxWidth, MaxHeight int
	// MaxAudioBytes caps the concatenated PCM track.
	MaxAudioBytes int
	// IgnoreAudio skips the audio stream, so a non-PCM track is not an error.
	IgnoreAudio bool
}

// DefaultContainerLimits allow an hour of 30 fps video up to 8K frames.
func DefaultContainerLimits() ContainerLimits {
	return ContainerLimits{
		MaxBytes:      512 << 20,
		MaxFrames:     108000,
		MaxFrameBytes: 16 << 20,
		MaxWidth:      7680,
		MaxHeight:     4320,
		MaxAudioBytes: 256 << 20,
	}
}

// PCMAudio is an AVI's audio track as stored: interleaved little-endian
// samples (unsigned for 8-bit, signed otherwise; IEEE float when Float).
// Decoding and resampling to the audio encoder's 16 kHz is not done here.
type PCMAudio struct {
	Data          []byte
	SampleRate    int
	Channels      int
	BitsPerSample int
	Float         bool
}

// Duration is the track length in seconds.
func (a *PCMAudio) Duration() float64 {
	frame := a.Channels * a.BitsPerSample / 8
	if frame == 0 || a.SampleRate == 0 {
		return 0
	}
	return float64(len(a.Data)/frame) / float64(a.SampleRate)
}

// AVI is a parsed Motion-JPEG AVI. Frames stay encoded inside the original
// byte slice until DecodeFrame is called, so only sampled frames cost a
// decode.
type AVI struct {
	// FPS is the video stream's rate, dwRate / dwScale.
	FPS float64
	// FrameCount is the number of video chunks in movi.
	FrameCount int
	// Width and Height are the size declared by the stream format.
	Width, Height int
	// Audio is the first audio stream, nil when there is none (or it was
	// ignored).
	Audio *PCMAudio

	frames [][]byte // encoded frames, sub-slices of the input
	limits ContainerLimits
}

// Duration is FrameCount / FPS seconds.
func (a *AVI) Duration() float64 { return float64(a.FrameCount) / a.FPS }

// fourCC helpers.
type fourCC [4]byte

func (f fourCC) String() string { return fmt.Sprintf("%q", string(f[:])) }

var (
	ccRIFF = fourCC{'R', 'I', 'F', 'F'}
	ccLIST = fourCC{'L', 'I', 'S', 'T'}
	ccAVI  = fourCC{'A', 'V', 'I', ' '}
	ccAVIX = fourCC{'A', 'V', 'I', 'X'}
	ccHdrl = fourCC{'h', 'd', 'r', 'l'}
	ccMovi = fourCC{'m', 'o', 'v', 'i'}
	ccStrl = fourCC{'s', 't', 'r', 'l'}
	ccStrh = fourCC{'s', 't', 'r', 'h'}
	ccStrf = fourCC{'s', 't', 'r', 'f'}
	ccRec  = fourCC{'r', 'e', 'c', ' '}
	ccVids = fourCC{'v', 'i', 'd', 's'}
	ccAuds = fourCC{'a', 'u', 'd', 's'}
)

// mjpegFourCCs are the compression codes under which AVI writers store
// baseline JPEG frames.
var mjpegFourCCs = map[fourCC]bool{
	{'M', 'J', 'P', 'G'}: true, {'m', 'j', 'p', 'g'}: true,
	{'J', 'P', 'E', 'G'}: true, {'j', 'p', 'e', 'g'}: true,
}

// Audio format tags of WAVEFORMATEX.
const (
	wavePCM        = 0x0001
	waveIEEEFloat  = 0x0003
	waveExtensible = 0xFFFE
)

// maxStreams bounds the strl lists considered (stream numbers are two hex
// digits).
const maxStreams = 256

// maxRecDepth bounds LIST 'rec ' nesting inside movi.
const maxRecDepth = 2

// chunk is one RIFF chunk: its id and its body inside the file.
type chunk struct {
	id   fourCC
	body []byte
}

// chunkReader walks the chunks of one RIFF body.
type chunkReader struct {
	buf []byte
	off int
	// where names the enclosing list for error messages.
	where string
}

// next returns the next chunk, or ok=false at the end of the body.
func (r *chunkReader) next() (c chunk, ok bool, err error) {
	rest := len(r.buf) - r.off
	if rest == 0 {
		return chunk{}, false, nil
	}
	if rest < 8 {
		return chunk{}, false, badAVI("%d stray bytes at the end of %s", rest, r.where)
	}
	copy(c.id[:], r.buf[r.off:r.off+4])
	size := uint64(binary.LittleEndian.Uint32(r.buf[r.off+4 : r.off+8]))
	if size > uint64(rest-8) {
		return chunk{}, false, badAVI("its %v chunk in %s declares %d bytes but %d follow (is the file cut short?)",
			c.id, r.where, size, rest-8)
	}
	start := r.off + 8
	c.body = r.buf[start : start+int(size)]
	// Chunks are padded to even sizes; a missing final pad byte is tolerated.
	r.off = min(start+int(size)+int(size&1), len(r.buf))
	return c, true, nil
}

// listType splits a LIST or RIFF body into its form type and contents.
func listType(c chunk) (fourCC, []byte, error) {
	var t fourCC
	if len(c.body) < 4 {
		return t, nil, badAVI("its %v list of %d bytes has no type", c.id, len(c.body))
	}
	copy(t[:], c.body[:4])
	return t, c.body[4:], nil
}

// stream is what ParseAVI keeps of one strl.
type stream struct {
	kind       fourCC
	handler    fourCC
	scale      uint32
	rate       uint32
	format     []byte
	compressed fourCC
}

// ParseAVI reads the container structure of a Motion-JPEG AVI without
// decoding any frame. Other containers (MP4/MOV, WebM/MKV, ...) are refused
// with ErrUnsupportedContainer naming what was found; an AVI with another
// video codec or non-PCM audio with ErrUnsupportedCodec.
func ParseAVI(data []byte, limits ContainerLimits) (*AVI, error) {
	if len(data) > limits.MaxBytes {
		return nil, badInput(ErrTooLarge, "the video is %d bytes, over the limit of %d", len(data), limits.MaxBytes)
	}
	if kind := SniffContainer(data); kind != ContainerAVI {
		if kind == "" {
			return nil, badInput(ErrUnsupportedContainer, "not a video of a supported container; send %s", supportedContainers)
		}
		return nil, badInput(ErrUnsupportedContainer, "the data is %s, not a supported video container; send %s", kind, supportedContainers)
	}
	p := aviParser{limits: limits, videoStream: -1, audioStream: -1}
	top := chunkReader{buf: data, where: "the file"}
	for first := true; ; first = false {
		c, ok, err := top.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if c.id != ccRIFF {
			continue // trailing JUNK and the like
		}
		form, body, err := listType(c)
		if err != nil {
			return nil, err
		}
		switch {
		case first && form == ccAVI:
			err = p.parseMain(body)
		case !first && form == ccAVIX:
			err = p.parseExtension(body)
		default:
			err = badAVI("it has a RIFF form %v", form)
		}
		if err != nil {
			return nil, err
		}
	}
	return p.finish()
}

// aviParser accumulates the state of ParseAVI.
type aviParser struct {
	limits      ContainerLimits
	streams     []stream
	videoStream int
	audioStream int
	sawMovi     bool
	frames      [][]byte
	// pcm grows chunk by chunk (bounded by MaxAudioBytes), so a file of many
	// tiny audio chunks costs no per-chunk bookkeeping.
	pcm         []byte
	audioFormat *PCMAudio
}

// parseMain reads the RIFF 'AVI ' body: hdrl must come before movi.
func (p *aviParser) parseMain(body []byte) error {
	r := chunkReader{buf: body, where: "RIFF AVI"}
	sawHdrl := false
	for {
		c, ok, err := r.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if c.id != ccLIST {
			continue // idx1, JUNK, ...
		}
		t, content, err := listType(c)
		if err != nil {
			return err
		}
		switch t {
		case ccHdrl:
			if sawHdrl {
				return badAVI("it has two hdrl lists")
			}
			sawHdrl = true
			if err := p.parseHeader(content); err != nil {
				return err
			}
		case ccMovi:
			if !sawHdrl {
				return badAVI("its movi list comes before the hdrl list")
			}
			if err := p.parseMovi(content, 0); err != nil {
				return err
			}
			p.sawMovi = true
		}
	}
	if !sawHdrl {
		return badAVI("it has no hdrl list")
	}
	return nil
}

// parseExtension reads an OpenDML RIFF 'AVIX' body (files past 1 GB).
func (p *aviParser) parseExtension(body []byte) error {
	if p.videoStream < 0 {
		return badAVI("an AVIX list comes before the main header")
	}
	r := chunkReader{buf: body, where: "RIFF AVIX"}
	for {
		c, ok, err := r.next()
		if err != nil || !ok {
			return err
		}
		if c.id != ccLIST {
			continue
		}
		t, content, err := listType(c)
		if err != nil {
			return err
		}
		if t == ccMovi {
			if err := p.parseMovi(content, 0); err != nil {
				return err
			}
		}
	}
}

// parseHeader reads hdrl: the stream lists, picking the first video and the
// first audio stream.
func (p *aviParser) parseHeader(body []byte) error {
	r := chunkReader{buf: body, where: "hdrl"}
	for {
		c, ok, err := r.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if c.id != ccLIST {
			continue // avih: everything needed is in the stream headers
		}
		t, content, err := listType(c)
		if err != nil {
			return err
		}
		if t != ccStrl {
			continue
		}
		if len(p.streams) == maxStreams {
			return badAVI("it has more than %d streams", maxStreams)
		}
		s, err := parseStreamList(content)
		if err != nil {
			return fmt.Errorf("stream %d: %w", len(p.streams), err)
		}
		idx := len(p.streams)
		p.streams = append(p.streams, s)
		switch {
		case s.kind == ccVids && p.videoStream < 0:
			if err := p.acceptVideo(s, idx); err != nil {
				return err
			}
		case s.kind == ccAuds && p.audioStream < 0 && !p.limits.IgnoreAudio:
			format, err := parseWaveFormat(s.format)
			if err != nil {
				return fmt.Errorf("audio stream %d: %w", idx, err)
			}
			p.audioStream, p.audioFormat = idx, format
		}
	}
	if p.videoStream < 0 {
		return badInput(ErrUnsupportedCodec, "the AVI file has no video stream; send %s", supportedContainers)
	}
	return nil
}

// parseStreamList reads strh and strf of one strl.
func parseStreamList(body []byte) (stream, error) {
	var s stream
	r := chunkReader{buf: body, where: "strl"}
	sawHeader := false
	for {
		c, ok, err := r.next()
		if err != nil {
			return s, err
		}
		if !ok {
			break
		}
		switch c.id {
		case ccStrh:
			// AVISTREAMHEADER: fccType, fccHandler, dwFlags, wPriority,
			// wLanguage, dwInitialFrames, dwScale, dwRate, ...
			if len(c.body) < 28 {
				return s, badAVI("a stream header (strh) is %d bytes; it needs 28", len(c.body))
			}
			copy(s.kind[:], c.body[0:4])
			copy(s.handler[:], c.body[4:8])
			s.scale = binary.LittleEndian.Uint32(c.body[20:24])
			s.rate = binary.LittleEndian.Uint32(c.body[24:28])
			sawHeader = true
		case ccStrf:
			s.format = c.body
		}
	}
	if !sawHeader {
		return s, badAVI("a stream list has no stream header (strh)")
	}
	return s, nil
}

// maxFPS bounds dwRate/dwScale; anything above is a hostile or broken header.
const maxFPS = 1000

// acceptVideo validates the video stream: Motion-JPEG, sane rate and size.
func (p *aviParser) acceptVideo(s stream, idx int) error {
	// BITMAPINFOHEADER: biSize, biWidth, biHeight, biPlanes, biBitCount,
	// biCompression, ...
	if len(s.format) < 20 {
		return badAVI("its video format (strf) is %d bytes; it needs 20", len(s.format))
	}
	width := int64(int32(binary.LittleEndian.Uint32(s.format[4:8])))
	height := int64(int32(binary.LittleEndian.Uint32(s.format[8:12])))
	copy(s.compressed[:], s.format[16:20])
	if !mjpegFourCCs[s.compressed] && !mjpegFourCCs[s.handler] {
		return badInput(ErrUnsupportedCodec, "AVI video encoded as %v (handler %v) is not supported; send %s",
			s.compressed, s.handler, supportedContainers)
	}
	if height < 0 {
		height = -height // top-down bitmaps declare negative heights
	}
	if width <= 0 || height <= 0 {
		return badAVI("it declares a video size of %d×%d", width, height)
	}
	if width > int64(p.limits.MaxWidth) || height > int64(p.limits.MaxHeight) {
		return badInput(ErrTooLarge, "the video is %d×%d, over the limit of %d×%d", width, height, p.limits.MaxWidth, p.limits.MaxHeight)
	}
	if s.scale == 0 || s.rate == 0 {
		return badAVI("it declares a frame rate of %d/%d", s.rate, s.scale)
	}
	if fps := float64(s.rate) / float64(s.scale); fps > maxFPS {
		return badAVI("it declares a frame rate of %.1f, above %d", fps, maxFPS)
	}
	p.videoStream = idx
	return nil
}

// ksdataformatSubtypeTail is the fixed tail of the KSDATAFORMAT_SUBTYPE GUIDs
// of WAVE_FORMAT_EXTENSIBLE; the first two bytes carry the format tag.
var ksdataformatSubtypeTail = []byte{0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71}

// parseWaveFormat reads WAVEFORMATEX (or WAVE_FORMAT_EXTENSIBLE) and accepts
// integer or float PCM only.
func parseWaveFormat(b []byte) (*PCMAudio, error) {
	// wFormatTag, nChannels, nSamplesPerSec, nAvgBytesPerSec, nBlockAlign,
	// wBitsPerSample[, cbSize, extension]
	if len(b) < 16 {
		return nil, badAVI("its audio format (strf) is %d bytes; it needs 16", len(b))
	}
	tag := binary.LittleEndian.Uint16(b[0:2])
	if tag == waveExtensible {
		if len(b) < 40 || !bytes.Equal(b[26:40], ksdataformatSubtypeTail) {
			return nil, badAVI("its audio format is a malformed WAVE_FORMAT_EXTENSIBLE")
		}
		tag = binary.LittleEndian.Uint16(b[24:26])
	}
	if tag != wavePCM && tag != waveIEEEFloat {
		return nil, badInput(ErrUnsupportedCodec, "AVI audio with format tag 0x%04x is not supported; send PCM audio (ffmpeg -c:a pcm_s16le)", tag)
	}
	a := &PCMAudio{
		Channels:      int(binary.LittleEndian.Uint16(b[2:4])),
		SampleRate:    int(binary.LittleEndian.Uint32(b[4:8])),
		BitsPerSample: int(binary.LittleEndian.Uint16(b[14:16])),
		Float:         tag == waveIEEEFloat,
	}
	blockAlign := int(binary.LittleEndian.Uint16(b[12:14]))
	validBits := a.BitsPerSample == 8 || a.BitsPerSample == 16 || a.BitsPerSample == 24 || a.BitsPerSample == 32
	if a.Float {
		validBits = a.BitsPerSample == 32 || a.BitsPerSample == 64
	}
	switch {
	case a.Channels < 1 || a.Channels > 8:
		return nil, badAVI("its audio declares %d channels", a.Channels)
	case a.SampleRate < 1 || a.SampleRate > 768000:
		return nil, badAVI("its audio declares a sample rate of %d Hz", a.SampleRate)
	case !validBits:
		return nil, badInput(ErrUnsupportedCodec, "%d-bit AVI audio is not supported; send 16-bit PCM audio (ffmpeg -c:a pcm_s16le)", a.BitsPerSample)
	case blockAlign != a.Channels*a.BitsPerSample/8:
		return nil, badAVI("its audio block align is %d for %d channels of %d bits",
			blockAlign, a.Channels, a.BitsPerSample)
	}
	return a, nil
}

// parseMovi collects the video and audio chunks of a movi list (or of a
// LIST 'rec ' inside it).
func (p *aviParser) parseMovi(body []byte, depth int) error {
	r := chunkReader{buf: body, where: "movi"}
	for {
		c, ok, err := r.next()
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		if c.id == ccLIST {
			t, content, err := listType(c)
			if err != nil {
				return err
			}
			if t == ccRec {
				if depth >= maxRecDepth {
					return badAVI("its rec lists nest deeper than %d", maxRecDepth)
				}
				if err := p.parseMovi(content, depth+1); err != nil {
					return err
				}
			}
			continue
		}
		num, ok := streamNumber(c.id)
		if !ok {
			continue // ix##, JUNK, ...
		}
		kind := string(c.id[2:4])
		switch {
		case num == p.videoStream && (kind == "dc" || kind == "db"):
			if err := p.addFrame(c.body); err != nil {
				return err
			}
		case num == p.audioStream && kind == "wb":
			if len(c.body) > p.limits.MaxAudioBytes-len(p.pcm) {
				return badInput(ErrTooLarge, "the video's audio track is over the limit of %d bytes", p.limits.MaxAudioBytes)
			}
			p.pcm = append(p.pcm, c.body...)
		}
	}
}

// addFrame records one video chunk. An empty chunk repeats the previous
// frame (writers emit them for dropped frames).
func (p *aviParser) addFrame(body []byte) error {
	if len(p.frames) >= p.limits.MaxFrames {
		return badInput(ErrTooLarge, "the video has more frames than the limit of %d", p.limits.MaxFrames)
	}
	if len(body) > p.limits.MaxFrameBytes {
		return badInput(ErrTooLarge, "video frame %d is %d bytes, over the limit of %d", len(p.frames), len(body), p.limits.MaxFrameBytes)
	}
	if len(body) == 0 {
		if len(p.frames) == 0 {
			return badAVI("its first video frame is empty")
		}
		p.frames = append(p.frames, p.frames[len(p.frames)-1])
		return nil
	}
	p.frames = append(p.frames, body)
	return nil
}

// streamNumber parses the two hex digits that open a movi chunk id.
func streamNumber(id fourCC) (int, bool) {
	hi, ok1 := hexDigit(id[0])
	lo, ok2 := hexDigit(id[1])
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(b byte) (int, bool) {
	switch {
	case b >= '0' && b <= '9':
		return int(b - '0'), true
	case b >= 'a' && b <= 'f':
		return int(b-'a') + 10, true
	case b >= 'A' && b <= 'F':
		return int(b-'A') + 10, true
	}
	return 0, false
}

// finish assembles the AVI once every RIFF has been read.
func (p *aviParser) finish() (*AVI, error) {
	if !p.sawMovi {
		return nil, badAVI("it has no movi list")
	}
	if len(p.frames) == 0 {
		return nil, badAVI("it has no video frames")
	}
	v := p.streams[p.videoStream]
	width := int(int32(binary.LittleEndian.Uint32(v.format[4:8])))
	height := int(int32(binary.LittleEndian.Uint32(v.format[8:12])))
	if height < 0 {
		height = -height // validated in acceptVideo
	}
	a := &AVI{
		FPS:        float64(v.rate) / float64(v.scale),
		FrameCount: len(p.frames),
		Width:      width,
		Height:     height,
		frames:     p.frames,
		limits:     p.limits,
	}
	if p.audioFormat != nil && len(p.pcm) > 0 {
		p.audioFormat.Data = p.pcm
		a.Audio = p.audioFormat
	}
	return a, nil
}

// FrameJPEG returns the encoded bytes of frame i (shared with the input).
func (a *AVI) FrameJPEG(i int) ([]byte, error) {
	if i < 0 || i >= len(a.frames) {
		return nil, fmt.Errorf("%w: frame %d of %d", ErrInvalidArgument, i, len(a.frames))
	}
	return a.frames[i], nil
}

// DecodeFrame decodes frame i after checking its JPEG header against the
// limits and the stream's declared size.
func (a *AVI) DecodeFrame(i int) (image.Image, error) {
	b, err := a.FrameJPEG(i)
	if err != nil {
		return nil, err
	}
	cfg, err := jpeg.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return nil, badInputCause(ErrCorruptContainer, err, "not a valid AVI file: video frame %d is not a valid JPEG image%s", i, cutShort(err))
	}
	if cfg.Width > a.limits.MaxWidth || cfg.Height > a.limits.MaxHeight {
		return nil, badInput(ErrTooLarge, "video frame %d is %d×%d, over the limit of %d×%d", i, cfg.Width, cfg.Height, a.limits.MaxWidth, a.limits.MaxHeight)
	}
	img, err := jpeg.Decode(bytes.NewReader(b))
	if err != nil {
		return nil, badInputCause(ErrCorruptContainer, err, "not a valid AVI file: video frame %d is not a valid JPEG image%s", i, cutShort(err))
	}
	return img, nil
}

// Container names SniffContainer reports.
const (
	ContainerAVI  = "avi"
	ContainerMP4  = "mp4/mov (ISO base media)"
	ContainerMOV  = "mov (QuickTime)"
	ContainerEBML = "webm/mkv (EBML)"
	ContainerOgg  = "ogg"
	ContainerFLV  = "flv"
	ContainerASF  = "asf/wmv"
	ContainerMPEG = "mpeg program stream"
	ContainerTS   = "mpeg transport stream"
	ContainerWAV  = "wav (audio only)"
	ContainerGIF  = "gif (decode it as an image)"
)

// supportedContainers is named in every ErrUnsupportedContainer message.
const supportedContainers = "AVI with Motion-JPEG video and optional PCM audio (ffmpeg -i in.mp4 -c:v mjpeg -c:a pcm_s16le out.avi)"

// SniffContainer names the container of data from its magic bytes: one of
// the Container constants, or "" when nothing matches.
func SniffContainer(data []byte) string {
	has := func(off int, magic string) bool {
		return len(data) >= off+len(magic) && string(data[off:off+len(magic)]) == magic
	}
	switch {
	case has(0, "RIFF") && has(8, "AVI "):
		return ContainerAVI
	case has(0, "RIFF") && has(8, "WAVE"):
		return ContainerWAV
	case has(4, "ftyp"):
		return ContainerMP4
	case has(4, "moov"), has(4, "mdat"), has(4, "wide"), has(4, "free"), has(4, "skip"):
		return ContainerMOV
	case has(0, "\x1A\x45\xDF\xA3"):
		return ContainerEBML
	case has(0, "OggS"):
		return ContainerOgg
	case has(0, "FLV"):
		return ContainerFLV
	case has(0, "\x30\x26\xB2\x75\x8E\x66\xCF\x11"):
		return ContainerASF
	case has(0, "\x00\x00\x01\xBA"):
		return ContainerMPEG
	case len(data) > 188 && data[0] == 0x47 && data[188] == 0x47:
		return ContainerTS
	case has(0, "GIF87a"), has(0, "GIF89a"):
		return ContainerGIF
	}
	return ""
}
