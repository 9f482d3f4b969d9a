package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// raw builds a file from a literal header, for malformed-input tests.
func raw(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func mustTensor(t testing.TB, name string, dt DType, shape []int, v []float32) Tensor {
	t.Helper()
	x, err := FromFloat32s(name, dt, shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestEncodeParseRoundTrip(t *testing.T) {
	vals := []float32{0, 1, -2.5, 3.25, 1e-3, -65504}
	tensors := []Tensor{
		mustTensor(t, "b.f32", F32, []int{2, 3}, vals),
		mustTensor(t, "a.bf16", BF16, []int{3, 2}, vals),
		mustTensor(t, "c.f16", F16, []int{6}, vals),
		mustTensor(t, "scalar", F32, nil, []float32{7}),
		mustTensor(t, "empty", F16, []int{0, 4}, nil),
		{Name: "ids", DType: I64, Shape: []int{2}, Data: make([]byte, 16)},
	}
	var buf bytes.Buffer
	if err := Encode(&buf, tensors, map[string]string{"format": "pt", "note": "x"}); err != nil {
		t.Fatal(err)
	}
	if hl := binary.LittleEndian.Uint64(buf.Bytes()); hl%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", hl)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" || f.Metadata["note"] != "x" {
		t.Errorf("metadata = %v", f.Metadata)
	}
	want := []string{"b.f32", "a.bf16", "c.f16", "scalar", "empty", "ids"}
	if got := f.Names(); !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want file order %v", got, want)
	}
	for _, in := range tensors {
		out, ok := f.Tensor(in.Name)
		if !ok {
			t.Fatalf("tensor %q missing", in.Name)
		}
		if out.DType != in.DType || !slices.Equal(out.Shape, nonNil(in.Shape)) || !bytes.Equal(out.Data, in.Data) {
			t.Errorf("tensor %q: got %s %v %d bytes, want %s %v %d bytes", in.Name, out.DType, out.Shape, len(out.Data), in.DType, in.Shape, len(in.Data))
		}
	}
	got, err := mustGet(t, f, "b.f32").Float32s()
	if err != nil || !slices.Equal(got, vals) {
		t.Errorf("F32 values = %v, %v; want %v", got, err, vals)
	}
	got, _ = mustGet(t, f, "a.bf16").Float32s()
	for i, v := range vals {
		if want := BFloat16ToFloat32(Float32ToBFloat16(v)); got[i] != want {
			t.Errorf("BF16[%d] = %v, want %v", i, got[i], want)
		}
	}
	got, _ = mustGet(t, f, "c.f16").Float32s()
	for i, v := range vals {
		if want := Float16ToFloat32(Float32ToFloat16(v)); got[i] != want {
			t.Errorf("F16[%d] = %v, want %v", i, got[i], want)
		}
	}
	if got, _ := mustGet(t, f, "scalar").Float32s(); !slices.Equal(got, []float32{7}) {
		t.Errorf("scalar = %v", got)
	}
	if got, err := mustGet(t, f, "empty").Float32s(); err != nil || len(got) != 0 {
		t.Errorf("empty = %v, %v", got, err)
	}
	_, err = mustGet(t, f, "ids").Float32s()
	if err == nil || !strings.Contains(err.Error(), "I64") || !strings.Contains(err.Error(), `"ids"`) {
		t.Errorf("Float32s of I64: err = %v, want one naming the tensor and dtype", err)
	}
}

func nonNil(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func mustGet(t *testing.T, f *File, name string) *Tensor {
	t.Helper()
	x, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("tensor %q missing", name)
	}
	return x
}

func TestWriteRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "model.safetensors")
	in := mustTensor(t, "w", F32, []int{2, 2}, []float32{1, 2, 3, 4})
	if err := Write(path, []Tensor{in}); err != nil {
		t.Fatal(err)
	}
	f, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Len() != 1 || f.Metadata["format"] != "pt" {
		t.Errorf("got %d tensors, metadata %v", f.Len(), f.Metadata)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file (no temporary left)", len(entries))
	}
	if _, err := Read(filepath.Join(t.TempDir(), "absent.safetensors")); err == nil {
		t.Error("Read of a missing file succeeded")
	}
}

func TestEncodeErrors(t *testing.T) {
	ok := mustTensor(t, "x", F32, []int{1}, []float32{1})
	for _, tc := range []struct {
		name    string
		tensors []Tensor
		want    string
	}{
		{"duplicate", []Tensor{ok, ok}, `duplicate tensor "x"`},
		{"reserved", []Tensor{{Name: "__metadata__", DType: F32, Shape: []int{0}}}, "reserved"},
		{"dtype", []Tensor{{Name: "y", DType: "Q4", Shape: []int{1}, Data: []byte{1}}}, `unknown dtype "Q4"`},
		{"size", []Tensor{{Name: "y", DType: F32, Shape: []int{2}, Data: make([]byte, 4)}}, `"y": 4 bytes for shape [2]`},
		{"negative", []Tensor{{Name: "y", DType: F32, Shape: []int{-1}}}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Encode(&bytes.Buffer{}, tc.tensors, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := FromFloat32s("z", I32, []int{1}, []float32{1}); err == nil || !strings.Contains(err.Error(), "I32") {
		t.Errorf("FromFloat32s(I32) err = %v", err)
	}
	if _, err := FromFloat32s("z", F32, []int{3}, []float32{1}); err == nil {
		t.Error("FromFloat32s with too few values succeeded")
	}
}

func TestParseErrors(t *testing.T) {
	d8 := make([]byte, 8)
	huge := binary.LittleEndian.AppendUint64(nil, MaxHeaderSize+1)
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "shorter than"},
		{"header too long for file", binary.LittleEndian.AppendUint64(nil, 100), "exceeds the 0 bytes"},
		{"header over limit", append(huge, "{}"...), "limit"},
		{"not json", raw("nope", nil), "not a JSON object"},
		{"array", raw("[]", nil), "not a JSON object"},
		{"empty header", raw("", nil), "not a JSON object"},
		{"truncated json", raw(`{"a":`, nil), "header"},
		{"trailing", raw(`{}{}`, nil), "trailing"},
		{"duplicate", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, d8), `duplicate entry "a"`},
		{"unknown dtype", raw(`{"a":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}}`, d8), `unknown dtype "Q4_K"`},
		{"missing dtype", raw(`{"a":{"shape":[1],"data_offsets":[0,4]}}`, d8), "missing dtype"},
		{"missing shape", raw(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, d8), "missing shape"},
		{"missing offsets", raw(`{"a":{"dtype":"F32","shape":[1]}}`, d8), "missing data_offsets"},
		{"extra field", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, d8), "unknown field"},
		{"three offsets", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, d8), "has 3 values"},
		{"offset past end", raw(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, d8), "outside the 8 data bytes"},
		{"reversed offsets", raw(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, d8), "outside"},
		{"negative offset", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, d8), "outside"},
		{"size mismatch", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}}`, d8), "8 bytes for shape [1] of F32"},
		{"negative dim", raw(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, d8), "negative dimension"},
		{"overflow", raw(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, d8), "overflows"},
		{"float dim", raw(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, d8), `"a"`},
		{"overlap", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[2],"data_offsets":[2,6]}}`, d8), `"a" and "b" overlap`},
		{"bad metadata", raw(`{"__metadata__":{"n":1}}`, nil), "__metadata__"},
		{"entry not object", raw(`{"a":3}`, nil), `"a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse(tc.in)
			if err == nil {
				t.Fatalf("Parse succeeded with %d tensors, want an error containing %q", f.Len(), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	d8 := make([]byte, 8)
	for _, tc := range []struct {
		name string
		in   []byte
		n    int
	}{
		{"empty", raw(`{}`, nil), 0},
		{"padded header", raw(`{}      `, nil), 0},
		{"gap and trailing bytes", raw(`{"a":{"dtype":"F16","shape":[1],"data_offsets":[2,4]}}`, d8), 1},
		{"out of order", raw(`{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, d8), 2},
		{"zero-size tensors share an offset", raw(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"c":{"dtype":"F32","shape":[2,0],"data_offsets":[4,4]}}`, d8), 3},
		{"metadata only", raw(`{"__metadata__":{"format":"pt"}}`, nil), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if f.Len() != tc.n {
				t.Errorf("%d tensors, want %d", f.Len(), tc.n)
			}
		})
	}
	f, _ := Parse(raw(`{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, d8))
	if got := f.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Names() = %v, want data order [a b]", got)
	}
}

// halfValue is the value of a half from the definition, in float64.
func halfValue(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, mant := int(h>>10)&0x1f, float64(h&0x3ff)
	switch exp {
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	case 0:
		return sign * math.Ldexp(mant, -24)
	}
	return sign * math.Ldexp(1024+mant, exp-25)
}

func TestFloat16ToFloat32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got, want := Float16ToFloat32(h), halfValue(h)
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("%#04x: got %v, want NaN", h, got)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != (h&0x8000 != 0) {
			t.Fatalf("%#04x: got %v, want %v", h, got, want)
		}
		if back := Float32ToFloat16(got); back != h {
			t.Fatalf("%#04x: round trip gave %#04x", h, back)
		}
	}
}

// nearestHalf is round-to-nearest-even by search over all finite halves.
func nearestHalf(x float32, pos []float64) uint16 {
	if math.IsNaN(float64(x)) {
		return 0x7e00
	}
	var sign uint16
	a := float64(x)
	if math.Signbit(a) {
		sign, a = 0x8000, -a
	}
	// 65520 is halfway between the largest half, 65504, and the next
	// power-of-two step; from there on IEEE rounds to infinity.
	if a >= 65520 {
		return sign | 0x7c00
	}
	i, _ := slices.BinarySearch(pos, a) // pos[i-1] < a <= pos[i]
	if i == len(pos) {
		return sign | 0x7bff // above 65504, below the tie point
	}
	if pos[i] == a {
		return sign | uint16(i)
	}
	lo, hi := i-1, i
	dl, dh := a-pos[lo], pos[hi]-a
	switch {
	case dl < dh:
		return sign | uint16(lo)
	case dh < dl:
		return sign | uint16(hi)
	case lo%2 == 0:
		return sign | uint16(lo)
	}
	return sign | uint16(hi)
}

func TestFloat32ToFloat16Rounding(t *testing.T) {
	pos := make([]float64, 0x7c00) // every finite non-negative half, index = bits
	for i := range pos {
		pos[i] = halfValue(uint16(i))
	}
	check := func(x float32) {
		t.Helper()
		got, want := Float32ToFloat16(x), nearestHalf(x, pos)
		if math.IsNaN(float64(x)) {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
				t.Fatalf("%v (%#08x): got %#04x, want a NaN", x, math.Float32bits(x), got)
			}
			return
		}
		if got != want {
			t.Fatalf("%v (%#08x): got %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
	// Every midpoint between neighbouring halves is a float32: the ties.
	for i := 0; i+1 < len(pos); i++ {
		mid := float32((pos[i] + pos[i+1]) / 2)
		for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9)} {
			check(x)
			check(-x)
		}
	}
	for _, x := range []float32{65504, 65519.99, 65520, 1e9, float32(math.Inf(1)), float32(math.NaN()), 1e-45, 2.98e-8, 2.9802322e-08} {
		check(x)
		check(-x)
	}
	// A stride through every float32 bit pattern.
	for b := uint64(0); b < 1<<32; b += 4093 {
		check(math.Float32frombits(uint32(b)))
	}
}

func TestBFloat16Rounding(t *testing.T) {
	check := func(x float32) {
		t.Helper()
		got := Float32ToBFloat16(x)
		if math.IsNaN(float64(x)) {
			if !math.IsNaN(float64(BFloat16ToFloat32(got))) {
				t.Fatalf("%#08x: NaN became %#04x", math.Float32bits(x), got)
			}
			return
		}
		// The two candidates are truncation and the next bfloat16 away from zero.
		b := math.Float32bits(x)
		lo := uint16(b >> 16)
		hi := lo + 1
		dl := math.Abs(float64(x) - float64(BFloat16ToFloat32(lo)))
		dh := math.Abs(float64(BFloat16ToFloat32(hi)) - float64(x))
		if hi&0x7fff == 0x7f80 {
			// Past the largest finite bfloat16 IEEE rounds as if the
			// exponent were unbounded: the next step is 2^128.
			dh = math.Abs(math.Ldexp(1, 128) - math.Abs(float64(x)))
		}
		want := lo
		if dh < dl || dh == dl && lo&1 == 1 {
			want = hi
		}
		if got != want {
			t.Fatalf("%v (%#08x): got %#04x, want %#04x", x, b, got, want)
		}
	}
	for b := uint64(0); b < 1<<32; b += 3001 {
		x := math.Float32frombits(uint32(b))
		if math.IsInf(float64(x), 0) {
			continue
		}
		check(x)
	}
	for _, b := range []uint32{0x3f808000, 0x3f818000, 0x3f808001, 0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0x00008000, 0x7fc00001, 0xff800001} {
		check(math.Float32frombits(b))
	}
	for i := range 1 << 16 {
		h := uint16(i)
		f := BFloat16ToFloat32(h)
		if !math.IsNaN(float64(f)) && Float32ToBFloat16(f) != h {
			t.Fatalf("%#04x: round trip gave %#04x", h, Float32ToBFloat16(f))
		}
	}
}

func FuzzParse(f *testing.F) {
	var buf bytes.Buffer
	_ = Encode(&buf, []Tensor{
		mustTensor(f, "a", F32, []int{2}, []float32{1, 2}),
		mustTensor(f, "b", BF16, []int{1, 2}, []float32{3, 4}),
		mustTensor(f, "c", F16, []int{}, []float32{5}),
		{Name: "d", DType: U8, Shape: []int{3}, Data: []byte{1, 2, 3}},
	}, map[string]string{"format": "pt"})
	f.Add(buf.Bytes())
	f.Add(raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[2],"data_offsets":[2,6]}}`, make([]byte, 8)))
	f.Add(raw(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, nil))
	f.Add([]byte{})
	f.Add(raw("{", nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse(b)
		if err != nil {
			return
		}
		var tensors []Tensor
		for _, name := range file.Names() {
			x, _ := file.Tensor(name)
			v, err := x.Float32s()
			if x.DType.IsFloat() && (err != nil || len(v) != x.NumElements()) {
				t.Fatalf("tensor %q: Float32s gave %d values, %v", name, len(v), err)
			}
			tensors = append(tensors, *x)
		}
		// What parsed must encode and parse back the same.
		var out bytes.Buffer
		if err := Encode(&out, tensors, file.Metadata); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := Parse(out.Bytes())
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if again.Len() != file.Len() {
			t.Fatalf("re-parse: %d tensors, want %d", again.Len(), file.Len())
		}
		for _, x := range tensors {
			y, ok := again.Tensor(x.Name)
			if !ok || y.DType != x.DType || !slices.Equal(y.Shape, x.Shape) || !bytes.Equal(y.Data, x.Data) {
				t.Fatalf("tensor %q changed in the round trip", x.Name)
			}
		}
	})
}
