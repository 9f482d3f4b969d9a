package stageapi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Conditioning is one request's conditioning as one Thinker worker computed
// it: what a stash at ConditioningPath{key} holds, and what its OCND body
// carries (see EncodeConditioning).
type Conditioning struct {
	// Embed and Hidden have one row per computed position.
	Embed, Hidden [][]float32
	// TTSPad, TTSBos, TTSEos are the word embeddings of the TTS special tokens.
	TTSPad, TTSBos, TTSEos []float32
	// TokenIDs are the tokens the rows belong to; PromptTokenIDs the prompt.
	TokenIDs, PromptTokenIDs []int
}

// The wire form: magic "OCND", version 1, then little-endian uint32 counts
// (rows, width, hidden width, tts width, tokens, prompt tokens), then the
// float32 rows and int32 ids, little-endian, with no per-element framing.
var conditioningMagic = [4]byte{'O', 'C', 'N', 'D'}

const conditioningVersion = 1

// MaxConditioningElements bounds the float32 and int32 elements a decoder
// accepts (about 1 GiB of float32), and so what a reader of a body need
// take in.
const MaxConditioningElements = 1 << 28

// EncodeConditioning writes c as the OCND body of a conditioning stash.
func EncodeConditioning(c *Conditioning) ([]byte, error) {
	width, hwidth := rowWidth(c.Embed), rowWidth(c.Hidden)
	if len(c.Embed) != len(c.Hidden) {
		return nil, fmt.Errorf("%d embed rows but %d hidden rows", len(c.Embed), len(c.Hidden))
	}
	tts := len(c.TTSPad)
	if len(c.TTSBos) != tts || len(c.TTSEos) != tts {
		return nil, errors.New("the three TTS embeddings differ in width")
	}
	var b bytes.Buffer
	b.Write(conditioningMagic[:])
	b.WriteByte(conditioningVersion)
	for _, n := range []int{len(c.Embed), width, hwidth, tts, len(c.TokenIDs), len(c.PromptTokenIDs)} {
		_ = binary.Write(&b, binary.LittleEndian, uint32(n))
	}
	for _, rows := range [][][]float32{c.Embed, c.Hidden} {
		for _, r := range rows {
			if len(r) != rowWidth(rows) {
				return nil, errors.New("rows of different widths")
			}
			_ = binary.Write(&b, binary.LittleEndian, r)
		}
	}
	for _, v := range [][]float32{c.TTSPad, c.TTSBos, c.TTSEos} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	for _, ids := range [][]int{c.TokenIDs, c.PromptTokenIDs} {
		for _, id := range ids {
			_ = binary.Write(&b, binary.LittleEndian, int32(id))
		}
	}
	return b.Bytes(), nil
}

func rowWidth(rows [][]float32) int {
	if len(rows) == 0 {
		return 0
	}
	return len(rows[0])
}

// DecodeConditioning reads an OCND body, refusing anything inconsistent: a
// length that does not match the header, NaN in the rows.
func DecodeConditioning(data []byte) (*Conditioning, error) {
	r := bytes.NewReader(data)
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil || [4]byte(head[:4]) != conditioningMagic || head[4] != conditioningVersion {
		return nil, errors.New("not a conditioning stash")
	}
	var counts [6]uint32
	if err := binary.Read(r, binary.LittleEndian, &counts); err != nil {
		return nil, fmt.Errorf("truncated header: %w", err)
	}
	rows, width, hwidth, tts, ntok, nprompt := int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]), int(counts[4]), int(counts[5])
	total := uint64(rows)*uint64(width) + uint64(rows)*uint64(hwidth) + 3*uint64(tts) + uint64(ntok) + uint64(nprompt)
	if total > MaxConditioningElements || uint64(r.Len()) != 4*total {
		return nil, fmt.Errorf("stash of %d bytes does not match its header", len(data))
	}
	c := &Conditioning{}
	readRows := func(w int) [][]float32 {
		out := make([][]float32, rows)
		for i := range out {
			out[i] = make([]float32, w)
			_ = binary.Read(r, binary.LittleEndian, out[i])
		}
		return out
	}
	c.Embed, c.Hidden = readRows(width), readRows(hwidth)
	for _, dst := range []*[]float32{&c.TTSPad, &c.TTSBos, &c.TTSEos} {
		*dst = make([]float32, tts)
		_ = binary.Read(r, binary.LittleEndian, *dst)
	}
	readIDs := func(n int) []int {
		raw := make([]int32, n)
		_ = binary.Read(r, binary.LittleEndian, raw)
		out := make([]int, n)
		for i, v := range raw {
			out[i] = int(v)
		}
		return out
	}
	c.TokenIDs, c.PromptTokenIDs = readIDs(ntok), readIDs(nprompt)
	for _, rs := range [][][]float32{c.Embed, c.Hidden} {
		for _, row := range rs {
			for _, v := range row {
				if math.IsNaN(float64(v)) {
					return nil, errors.New("NaN in the conditioning rows")
				}
			}
		}
	}
	return c, nil
}

// MergeConditioning joins the conditioning a prefill and a decode worker
// computed for one disaggregated request into what a colocated Thinker
// would have computed: the prefill's rows for the prompt's P positions,
// then the decode's rows after its first — which recomputes the prompt's
// last position, a duplicate of the prefill's row P-1 (vllm-omni's merge
// keeps that duplicate; it must go). The TTS embeddings come from the
// decode, falling back to the prefill's; the token ids from the decode.
func MergeConditioning(prefill, decode *Conditioning) (*Conditioning, error) {
	p := len(prefill.PromptTokenIDs)
	if p == 0 {
		return nil, fmt.Errorf("the prefill stash has no prompt")
	}
	if len(prefill.Embed) < p || len(prefill.Hidden) < p {
		return nil, fmt.Errorf("the prefill stash has %d rows for a %d-token prompt", len(prefill.Embed), p)
	}
	if len(decode.Embed) == 0 || len(decode.Embed) != len(decode.Hidden) {
		return nil, fmt.Errorf("the decode stash has %d embed and %d hidden rows; want at least the recomputed last prompt position", len(decode.Embed), len(decode.Hidden))
	}
	out := &Conditioning{
		Embed:          append(append([][]float32(nil), prefill.Embed[:p]...), decode.Embed[1:]...),
		Hidden:         append(append([][]float32(nil), prefill.Hidden[:p]...), decode.Hidden[1:]...),
		TTSPad:         pick(decode.TTSPad, prefill.TTSPad),
		TTSBos:         pick(decode.TTSBos, prefill.TTSBos),
		TTSEos:         pick(decode.TTSEos, prefill.TTSEos),
		TokenIDs:       decode.TokenIDs,
		PromptTokenIDs: prefill.PromptTokenIDs,
	}
	if len(out.TokenIDs) == 0 {
		out.TokenIDs = prefill.TokenIDs
	}
	return out, nil
}

func pick(first, fallback []float32) []float32 {
	if len(first) > 0 {
		return first
	}
	return fallback
}
