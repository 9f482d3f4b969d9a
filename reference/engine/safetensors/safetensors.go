// Package safetensors reads and writes the safetensors checkpoint format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header mapping tensor names to dtype, shape and byte
// range, then the tensors' bytes.
//
// It owns the format, not any model: checkpoints are untrusted input, so
// Parse validates every offset, size and shape and returns an error, never
// panics, on malformed files. Float tensors (F32, BF16, F16) convert exactly
// to float32; other standard dtypes are carried as raw bytes so a checkpoint
// holding, say, an integer buffer still parses, and converting them fails
// with an error naming the dtype.
package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// MaxHeaderSize bounds the JSON header, as the reference implementation
// does: a larger header is corrupt or hostile, and decoding it would cost
// more than any real checkpoint needs.
const MaxHeaderSize = 100 << 20

// metadataKey is the header entry holding free-form string metadata.
const metadataKey = "__metadata__"

// DType is a tensor element type as spelled in the header.
type DType string

// Element types. F32, BF16 and F16 convert to float32; the others are
// recognised so their files parse.
const (
	F32     DType = "F32"
	BF16    DType = "BF16"
	F16     DType = "F16"
	F64     DType = "F64"
	I64     DType = "I64"
	I32     DType = "I32"
	I16     DType = "I16"
	I8      DType = "I8"
	U64     DType = "U64"
	U32     DType = "U32"
	U16     DType = "U16"
	U8      DType = "U8"
	Bool    DType = "BOOL"
	F8E4M3  DType = "F8_E4M3"
	F8E5M2  DType = "F8_E5M2"
	F8E8M0  DType = "F8_E8M0"
	Complex DType = "C64"
)

var dtypeSizes = map[DType]int{
	F32: 4, BF16: 2, F16: 2, F64: 8,
	I64: 8, I32: 4, I16: 2, I8: 1,
	U64: 8, U32: 4, U16: 2, U8: 1,
	Bool: 1, F8E4M3: 1, F8E5M2: 1, F8E8M0: 1, Complex: 8,
}

// Size is the number of bytes per element, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeSizes[d] }

// IsFloat reports whether Float32s can convert tensors of this dtype.
func (d DType) IsFloat() bool { return d == F32 || d == BF16 || d == F16 }

// Tensor is one named tensor. Data is little-endian, row-major.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// NumElements is the product of the shape (1 for a scalar).
func (t *Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Float32s converts the tensor to float32. The conversion is exact for
// every supported dtype, since float32 holds every F16 and BF16 value.
func (t *Tensor) Float32s() ([]float32, error) {
	size := t.DType.Size()
	if !t.DType.IsFloat() {
		return nil, fmt.Errorf("safetensors: tensor %q has dtype %s; only F32, BF16 and F16 convert to float32", t.Name, t.DType)
	}
	n := t.NumElements()
	if len(t.Data) != n*size {
		return nil, fmt.Errorf("safetensors: tensor %q: %d bytes of data for %d elements of %s", t.Name, len(t.Data), n, t.DType)
	}
	out := make([]float32, n)
	d := t.Data
	switch t.DType {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
		}
	case BF16:
		for i := range out {
			out[i] = BFloat16ToFloat32(binary.LittleEndian.Uint16(d[2*i:]))
		}
	case F16:
		for i := range out {
			out[i] = Float16ToFloat32(binary.LittleEndian.Uint16(d[2*i:]))
		}
	}
	return out, nil
}

// File is a parsed safetensors file.
type File struct {
	// Metadata is the optional "__metadata__" map (nil when absent).
	Metadata map[string]string

	tensors map[string]*Tensor
	names   []string // in order of data offset, so iteration follows the file
}

// Names lists the tensors in the order their data appears in the file.
func (f *File) Names() []string { return slices.Clone(f.names) }

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// Len is the number of tensors.
func (f *File) Len() int { return len(f.names) }

// Read reads and parses a safetensors file.
func Read(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// headerEntry is one tensor's header record. Pointers tell a missing field
// from a zero one.
type headerEntry struct {
	DType       *string `json:"dtype"`
	Shape       *[]int  `json:"shape"`
	DataOffsets *[]int  `json:"data_offsets"`
}

// Parse parses a safetensors file held in b. The tensors' Data alias b.
func Parse(b []byte) (*File, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("safetensors: file is %d bytes, shorter than the 8-byte header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors: header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("safetensors: header length %d exceeds the %d bytes after it", n, len(b)-8)
	}
	header := b[8 : 8+n]
	data := b[8+n:]

	// The decoder below would also accept a top-level array or string.
	if trimmed := bytes.TrimLeft(header, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, errors.New("safetensors: header is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(header))
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	f := &File{tensors: map[string]*Tensor{}}
	seen := map[string]bool{}
	begins := map[string]int{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("safetensors: header: %w", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("safetensors: header: unexpected %v", tok)
		}
		if seen[name] {
			return nil, fmt.Errorf("safetensors: header: duplicate entry %q", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("safetensors: header entry %q: %w", name, err)
		}
		if name == metadataKey {
			if err := strictUnmarshal(raw, &f.Metadata); err != nil {
				return nil, fmt.Errorf("safetensors: header: %s must map strings to strings: %w", metadataKey, err)
			}
			continue
		}
		t, begin, err := parseEntry(name, raw, data)
		if err != nil {
			return nil, err
		}
		f.tensors[name] = t
		begins[name] = begin
		f.names = append(f.names, name)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("safetensors: header: trailing data after the JSON object")
	}
	if err := checkOverlap(f, begins); err != nil {
		return nil, err
	}
	return f, nil
}

func strictUnmarshal(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// parseEntry returns the tensor and where its data begins.
func parseEntry(name string, raw json.RawMessage, data []byte) (*Tensor, int, error) {
	var e headerEntry
	if err := strictUnmarshal(raw, &e); err != nil {
		return nil, 0, fmt.Errorf("safetensors: tensor %q: %w", name, err)
	}
	switch {
	case e.DType == nil:
		return nil, 0, fmt.Errorf("safetensors: tensor %q: missing dtype", name)
	case e.Shape == nil:
		return nil, 0, fmt.Errorf("safetensors: tensor %q: missing shape", name)
	case e.DataOffsets == nil:
		return nil, 0, fmt.Errorf("safetensors: tensor %q: missing data_offsets", name)
	}
	dt := DType(*e.DType)
	size := dt.Size()
	if size == 0 {
		return nil, 0, fmt.Errorf("safetensors: tensor %q: unknown dtype %q", name, *e.DType)
	}
	shape := *e.Shape
	if shape == nil {
		shape = []int{} // a scalar, spelled "shape": [] or null
	}
	numel, err := elements(shape)
	if err != nil {
		return nil, 0, fmt.Errorf("safetensors: tensor %q: %w", name, err)
	}
	offs := *e.DataOffsets
	if len(offs) != 2 {
		return nil, 0, fmt.Errorf("safetensors: tensor %q: data_offsets has %d values, want 2", name, len(offs))
	}
	begin, end := offs[0], offs[1]
	if begin < 0 || end < begin || end > len(data) {
		return nil, 0, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] outside the %d data bytes", name, begin, end, len(data))
	}
	if numel > math.MaxInt/size || end-begin != numel*size {
		return nil, 0, fmt.Errorf("safetensors: tensor %q: %d bytes for shape %v of %s, want %d×%d", name, end-begin, shape, dt, numel, size)
	}
	return &Tensor{Name: name, DType: dt, Shape: shape, Data: data[begin:end:end]}, begin, nil
}

// elements is the product of shape, refusing negative dimensions and
// overflow.
func elements(shape []int) (int, error) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if d != 0 && n > math.MaxInt/d {
			return 0, fmt.Errorf("shape %v overflows", shape)
		}
		n *= d
	}
	return n, nil
}

// checkOverlap refuses tensors sharing bytes, which would let a write to
// one silently change another, and orders f.names by offset.
func checkOverlap(f *File, begins map[string]int) error {
	slices.SortStableFunc(f.names, func(a, b string) int { return begins[a] - begins[b] })
	prevEnd, prev := 0, ""
	for _, name := range f.names {
		n := len(f.tensors[name].Data)
		if n == 0 {
			continue
		}
		if begins[name] < prevEnd {
			return fmt.Errorf("safetensors: tensors %q and %q overlap", prev, name)
		}
		prevEnd, prev = begins[name]+n, name
	}
	return nil
}

// Encode writes tensors, in the given order, and optional metadata in the
// safetensors format. The header is padded with spaces to a multiple of 8
// bytes so that tensor data is aligned when the file is memory-mapped.
func Encode(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	var h bytes.Buffer
	h.WriteByte('{')
	if metadata != nil {
		m, err := json.Marshal(metadata)
		if err != nil {
			return fmt.Errorf("safetensors: metadata: %w", err)
		}
		h.WriteString(`"` + metadataKey + `":`)
		h.Write(m)
	}
	seen := map[string]bool{}
	offset := 0
	for i, t := range tensors {
		if t.Name == metadataKey {
			return fmt.Errorf("safetensors: %q is reserved and cannot name a tensor", metadataKey)
		}
		if seen[t.Name] {
			return fmt.Errorf("safetensors: duplicate tensor %q", t.Name)
		}
		seen[t.Name] = true
		size := t.DType.Size()
		if size == 0 {
			return fmt.Errorf("safetensors: tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		numel, err := elements(t.Shape)
		if err != nil {
			return fmt.Errorf("safetensors: tensor %q: %w", t.Name, err)
		}
		if numel > math.MaxInt/size || len(t.Data) != numel*size {
			return fmt.Errorf("safetensors: tensor %q: %d bytes for shape %v of %s", t.Name, len(t.Data), t.Shape, t.DType)
		}
		if i > 0 || metadata != nil {
			h.WriteByte(',')
		}
		name, _ := json.Marshal(t.Name)
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		sh, _ := json.Marshal(shape)
		fmt.Fprintf(&h, `%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, name, t.DType, sh, offset, offset+len(t.Data))
		offset += len(t.Data)
	}
	h.WriteByte('}')
	for h.Len()%8 != 0 {
		h.WriteByte(' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(h.Len()))
	if _, err := w.Write(n[:]); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if _, err := w.Write(h.Bytes()); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return fmt.Errorf("safetensors: %w", err)
		}
	}
	return nil
}

// Write writes tensors to path with the metadata {"format": "pt"}, which
// Hugging Face loaders expect of PyTorch checkpoints. The file appears
// whole or not at all: it is written beside path and renamed over it.
func Write(path string, tensors []Tensor) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := Encode(bw, tensors, map[string]string{"format": "pt"}); err != nil {
		tmp.Close()
		return err
	}
	err = bw.Flush()
	if err == nil {
		err = tmp.Chmod(0o644) // CreateTemp's 0600 is wrong for a checkpoint
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// FromFloat32s makes a tensor of dtype F32, BF16 or F16 from values,
// rounding to nearest even where the dtype is narrower.
func FromFloat32s(name string, dtype DType, shape []int, values []float32) (Tensor, error) {
	numel, err := elements(shape)
	if err != nil {
		return Tensor{}, fmt.Errorf("safetensors: tensor %q: %w", name, err)
	}
	if numel != len(values) {
		return Tensor{}, fmt.Errorf("safetensors: tensor %q: %d values for shape %v", name, len(values), shape)
	}
	data, err := EncodeFloat32s(dtype, values)
	if err != nil {
		return Tensor{}, fmt.Errorf("safetensors: tensor %q: %w", name, err)
	}
	return Tensor{Name: name, DType: dtype, Shape: slices.Clone(shape), Data: data}, nil
}

// EncodeFloat32s encodes values as little-endian F32, BF16 or F16 bytes,
// rounding to nearest even where the dtype is narrower.
func EncodeFloat32s(dtype DType, values []float32) ([]byte, error) {
	switch dtype {
	case F32:
		b := make([]byte, 4*len(values))
		for i, v := range values {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b, nil
	case BF16:
		b := make([]byte, 2*len(values))
		for i, v := range values {
			binary.LittleEndian.PutUint16(b[2*i:], Float32ToBFloat16(v))
		}
		return b, nil
	case F16:
		b := make([]byte, 2*len(values))
		for i, v := range values {
			binary.LittleEndian.PutUint16(b[2*i:], Float32ToFloat16(v))
		}
		return b, nil
	}
	return nil, fmt.Errorf("cannot encode float32 values as %s; want F32, BF16 or F16", dtype)
}
