package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestDecodeInvalidUTF8 pins U+FFFD substitution per maximal invalid subpart,
// the Unicode Standard's recommended practice (its chapter 3 example is the
// last row) and what Rust's from_utf8_lossy and Python's "replace" do.
func TestDecodeInvalidUTF8(t *testing.T) {
	const r = "\uFFFD"
	tests := []struct{ in, want string }{
		{"\xff", r},
		{"\xc0\x80", r + r},                 // C0 never starts a character
		{"\xe0\x80\x80", r + r + r},         // overlong: E0 needs A0..BF next
		{"\xed\xa0\x80", r + r + r},         // surrogate: ED needs 80..9F next
		{"\xf4\x90\x80\x80", r + r + r + r}, // above U+10FFFF
		{"\xf5", r},
		{"\xe4\xb8", r}, // one truncated character is one replacement
		{"\xf0\x9f\x99", r},
		{"\xf0\x9f\x99A", r + "A"},
		{"a\xe4\xb8\xad", "a中"},
		{"\x61\xf1\x80\x80\xe1\x80\xc2\x62\x80\x63\x80\xbf\x64", "a" + r + r + r + "b" + r + "c" + r + r + "d"},
	}
	tok := Default()
	for _, tt := range tests {
		if got := tok.Decode(bytesAsIDs(tt.in)); got != tt.want {
			t.Errorf("Decode(% x) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// stream feeds ids one at a time and returns every piece, Flush included.
func stream(tok *Tokenizer, ids []int) []string {
	d := tok.NewStreamDecoder()
	var pieces []string
	for _, id := range ids {
		pieces = append(pieces, d.Add(id))
	}
	return append(pieces, d.Flush())
}

func TestStreamDecoder(t *testing.T) {
	const r = "\uFFFD"
	hb := mustParse(t, handBuilt(false))
	tests := []struct {
		name string
		tok  *Tokenizer
		ids  []int
		want []string // one per Add, then Flush
	}{
		{"multi-byte characters split into byte tokens", Default(), bytesAsIDs("é中🙂"),
			[]string{"", "é", "", "", "中", "", "", "", "🙂", ""}},
		{"ascii is emitted at once", Default(), bytesAsIDs("hi"), []string{"h", "i", ""}},
		{"truncated at the end: Flush replaces it", Default(), bytesAsIDs("\xe4\xb8"), []string{"", "", r}},
		{"broken by ASCII", Default(), bytesAsIDs("\xe4A"), []string{"", r + "A", ""}},
		{"broken by a lead byte", Default(), bytesAsIDs("\xe4\xe4\xb8\xad"), []string{"", r, "", "中", ""}},
		{"lone continuation bytes", Default(), bytesAsIDs("\x80\xbf"), []string{r, r, ""}},
		{"special token inside a character", Default(), []int{0xC3, 258, 0xA9}, []string{"", r + "<|im_end|>", r, ""}},
		{"unknown id inside a character", Default(), []int{0xF0, 9999, -5}, []string{"", r + r, r, ""}},
		{"merged tokens", hb, []int{idHello, idA3, idA9, idSpaceHello}, []string{"hello", "", "é", " hello", ""}},
		{"nothing", Default(), nil, []string{""}},
	}
	for _, tt := range tests {
		got := stream(tt.tok, tt.ids)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: pieces %q, want %q", tt.name, got, tt.want)
		}
		if joined, want := strings.Join(got, ""), tt.tok.Decode(tt.ids); joined != want {
			t.Errorf("%s: joined pieces %q != Decode %q", tt.name, joined, want)
		}
	}
}

func TestStreamDecoderReuse(t *testing.T) {
	d := Default().NewStreamDecoder()
	d.Add(0xE4)
	if got := d.Flush(); got != "\uFFFD" {
		t.Fatalf("Flush = %q", got)
	}
	if got := d.Add('x'); got != "x" {
		t.Errorf("after Flush, Add('x') = %q: state leaked", got)
	}
}

// checkStream asserts the StreamDecoder contract for one id sequence.
func checkStream(t *testing.T, tok *Tokenizer, ids []int) {
	t.Helper()
	pieces := stream(tok, ids)
	for i, p := range pieces {
		if !utf8.ValidString(p) {
			t.Fatalf("piece %d %q is not valid UTF-8 (ids %v)", i, p, ids)
		}
	}
	if joined, want := strings.Join(pieces, ""), tok.Decode(ids); joined != want {
		t.Fatalf("pieces join to %q, Decode gives %q (ids %v)", joined, want, ids)
	}
}

func FuzzStreamDecoder(f *testing.F) {
	f.Add([]byte("é中🙂"), false)
	f.Add([]byte("\xe4\xb8\x41\xf0\x9f\x99\x82\xff\x01\x02"), true)
	f.Add([]byte{0xC3, 0xFF, 0xA9}, false)
	hb := mustParse(f, handBuilt(false))
	f.Fuzz(func(t *testing.T, data []byte, handBuiltIDs bool) {
		tok, ids := Default(), make([]int, 0, len(data))
		if handBuiltIDs {
			// Map bytes onto the hand-built id space, gaps and out-of-range
			// ids included.
			tok = hb
			for _, b := range data {
				ids = append(ids, int(b)-4)
			}
		} else {
			// Mostly bytes; 0xFF stands for the specials and an unknown id.
			for i, b := range data {
				id := int(b)
				if b == 0xFF {
					id = 256 + i%15 // 256..268 special, 269 and 270 unknown
				}
				ids = append(ids, id)
			}
		}
		checkStream(t, tok, ids)
	})
}
