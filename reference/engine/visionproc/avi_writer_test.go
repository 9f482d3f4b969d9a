package visionproc

import (
	"bytes"
	"encoding/binary"
)

// aviSpec describes a small AVI for testAVI to write. It is a test-only
// writer: just enough RIFF to exercise the parser, with knobs for the
// layouts real writers produce.
type aviSpec struct {
	width, height int
	rate, scale   uint32
	compression   string // biCompression, "MJPG" normally
	frames        [][]byte
	// audio chunks interleaved after each frame (may be shorter than frames).
	audio      [][]byte
	audioTag   uint16 // 0 = no audio stream
	channels   int
	sampleRate int
	bits       int
	// useRec wraps each frame and its audio chunk in LIST 'rec '.
	useRec bool
	// junk adds a JUNK chunk inside hdrl and movi, as writers reserve space.
	junk bool
	// noIdx1 leaves out the legacy index.
	noIdx1 bool
}

// riffChunk appends id, size and body, padded to an even length.
func riffChunk(b *bytes.Buffer, id string, body []byte) {
	b.WriteString(id)
	_ = binary.Write(b, binary.LittleEndian, uint32(len(body)))
	b.Write(body)
	if len(body)%2 == 1 {
		b.WriteByte(0)
	}
}

// riffList appends a LIST (or RIFF when id is "RIFF") of the given type.
func riffList(b *bytes.Buffer, id, kind string, body []byte) {
	riffChunk(b, id, append([]byte(kind), body...))
}

func le16(v int) []byte { return binary.LittleEndian.AppendUint16(nil, uint16(v)) }
func le32(v int) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }

// testAVI writes spec as an AVI file.
func testAVI(s aviSpec) []byte {
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	zeros := func(n int) []byte { return make([]byte, n) }

	var hdrl bytes.Buffer
	streams := 1
	if s.audioTag != 0 {
		streams = 2
	}
	usPerFrame := int(uint64(1e6) * uint64(s.scale) / uint64(max(s.rate, 1)))
	riffChunk(&hdrl, "avih", cat(le32(usPerFrame), zeros(12), le32(len(s.frames)), zeros(4),
		le32(streams), zeros(4), le32(s.width), le32(s.height), zeros(16)))

	var vstrl bytes.Buffer
	riffChunk(&vstrl, "strh", cat([]byte("vids"), []byte(s.compression), zeros(12),
		le32(int(s.scale)), le32(int(s.rate)), zeros(4), le32(len(s.frames)), zeros(12),
		le16(0), le16(0), le16(s.width), le16(s.height)))
	riffChunk(&vstrl, "strf", cat(le32(40), le32(s.width), le32(s.height), le16(1), le16(24),
		[]byte(s.compression), le32(s.width*s.height*3), zeros(16)))
	if s.junk {
		riffChunk(&vstrl, "JUNK", zeros(13)) // odd size: padded
	}
	riffList(&hdrl, "LIST", "strl", vstrl.Bytes())

	if s.audioTag != 0 {
		var astrl bytes.Buffer
		block := s.channels * s.bits / 8
		riffChunk(&astrl, "strh", cat([]byte("auds"), zeros(4), zeros(12),
			le32(block), le32(s.sampleRate*block), zeros(24), le16(0), le16(0), le16(0), le16(0)))
		riffChunk(&astrl, "strf", cat(le16(int(s.audioTag)), le16(s.channels), le32(s.sampleRate),
			le32(s.sampleRate*block), le16(block), le16(s.bits), le16(0)))
		riffList(&hdrl, "LIST", "strl", astrl.Bytes())
	}

	var movi bytes.Buffer
	if s.junk {
		riffChunk(&movi, "JUNK", zeros(6))
	}
	var idx bytes.Buffer
	for i, f := range s.frames {
		var group bytes.Buffer
		riffChunk(&group, "00dc", f)
		if i < len(s.audio) {
			riffChunk(&group, "01wb", s.audio[i])
		}
		if s.useRec {
			riffList(&movi, "LIST", "rec ", group.Bytes())
		} else {
			movi.Write(group.Bytes())
		}
		idx.WriteString("00dc")
		idx.Write(cat(le32(0x10), le32(0), le32(len(f))))
	}

	var body bytes.Buffer
	riffList(&body, "LIST", "hdrl", hdrl.Bytes())
	riffList(&body, "LIST", "movi", movi.Bytes())
	if !s.noIdx1 {
		riffChunk(&body, "idx1", idx.Bytes())
	}
	var file bytes.Buffer
	riffList(&file, "RIFF", "AVI ", body.Bytes())
	return file.Bytes()
}
