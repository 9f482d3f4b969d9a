package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

func bytesAsIDs(s string) []int {
	ids := make([]int, len(s))
	for i := range len(s) {
		ids[i] = int(s[i])
	}
	return ids
}

func TestDefaultEncodesBytes(t *testing.T) {
	tok := Default()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	tests := []string{
		"", "a", "hello world", "Hello, my dog is cute", "I'M don't", "  \n\t\r\n  x  ",
		"é中🙂", "naïve café 日本語", "e\u0301", "👩‍👩‍👧", "\u00a0\u3000\u2028",
		"<|im_start|>user\nhi<|im_end|>", "<|endoftext|>",
		string(all), "\xff\xfe\x00\x80", "\xe4\xb8", "a\xc0\xafb", "\xed\xa0\x80",
	}
	for b := range 256 {
		tests = append(tests, string([]byte{byte(b)}))
	}
	for _, s := range tests {
		ids := tok.Encode(s)
		if want := bytesAsIDs(s); !slices.Equal(ids, want) {
			t.Errorf("Encode(%q) = %v, want the bytes %v", s, ids, want)
		}
		got := tok.Decode(ids)
		if !utf8.ValidString(got) {
			t.Errorf("Decode(Encode(%q)) = %q is not valid UTF-8", s, got)
		}
		if utf8.ValidString(s) && got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
	}
}

func TestDefaultShape(t *testing.T) {
	tok := Default()
	if got := tok.VocabSize(); got != 269 {
		t.Errorf("VocabSize = %d, want 269", got)
	}
	if got := tok.EOSTokenIDs(); !slices.Equal(got, []int{258, 256}) {
		t.Errorf("EOSTokenIDs = %v, want [258 256]", got)
	}
	for content, want := range map[string]int{EndOfText: 256, IMStart: 257, IMEnd: 258, "a": 'a', "Ġ": ' ', "Ċ": '\n',
		AudioStart: 259, VideoPad: 265, TTSPad: 266, TTSBos: 267, TTSEos: 268} {
		if id, ok := tok.TokenID(content); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", content, id, ok, want)
		}
	}
	if _, ok := tok.TokenID(" "); ok {
		t.Error(`TokenID(" ") found a token; vocab entries are spelled byte-level ("Ġ")`)
	}
	for id, want := range map[int]bool{256: true, 257: true, 258: true, 0: false, 'a': false, 259: true, 265: true, 266: true, 268: true, 269: false, -1: false} {
		if got := tok.IsSpecial(id); got != want {
			t.Errorf("IsSpecial(%d) = %v, want %v", id, got, want)
		}
	}
	if Default() != tok {
		t.Error("Default() returned a different value on the second call")
	}
}

// TokenName spells an id as the vocabulary does, whatever kind of token it
// is, and knows no name for an id that is no token.
func TestTokenName(t *testing.T) {
	hb := mustParse(t, handBuilt(false))
	for _, c := range []struct {
		tok  *Tokenizer
		id   int
		want string
		ok   bool
	}{
		{Default(), 'a', "a", true},
		{Default(), ' ', "Ġ", true},
		{Default(), 258, IMEnd, true},
		{Default(), 261, AudioPad, true},
		{Default(), 266, TTSPad, true},
		{Default(), 269, "", false},
		{Default(), -1, "", false},
		{hb, 94, "Ġ", true},
		{hb, 111, EndOfText, true},
		{hb, 114, "<think>", true},
	} {
		if got, ok := c.tok.TokenName(c.id); got != c.want || ok != c.ok {
			t.Errorf("TokenName(%d) = %q, %v; want %q, %v", c.id, got, ok, c.want, c.ok)
		}
	}
}

func TestDefaultSpecials(t *testing.T) {
	tok := Default()
	text := "<|im_start|>user\nhi<|im_end|><|endoftext|>"
	if got, want := tok.Encode(text), bytesAsIDs(text); !slices.Equal(got, want) {
		t.Errorf("Encode treated special strings as specials: %v", got)
	}
	want := append(append([]int{257}, bytesAsIDs("user\nhi")...), 258, 256)
	got := tok.EncodeWithSpecials(text)
	if !slices.Equal(got, want) {
		t.Errorf("EncodeWithSpecials = %v, want %v", got, want)
	}
	if d := tok.Decode(got); d != text {
		t.Errorf("Decode = %q, want %q", d, text)
	}
}

// handBuilt is a small tokenizer.json written out by hand. Ids 0..93 are the
// printable ASCII bytes '!'..'~' (id = byte-33); then Ġ (space), Ċ (newline),
// Ã and © (the two bytes of "é"); then merged tokens (ĊĊ is "\n\n"); then
// added tokens. Tab
// and most non-ASCII bytes are deliberately missing from the vocab.
func handBuilt(pairMerges bool) string {
	var vocab []string
	for b := byte('!'); b <= '~'; b++ {
		k, _ := json.Marshal(string(rune(b)))
		vocab = append(vocab, fmt.Sprintf("%s: %d", k, int(b)-33))
	}
	for i, tok := range []string{"Ġ", "Ċ", "Ã", "©", "ll", "he", "hell", "hello", "Ġh", "Ġhello", "bc", "ab", "cd", "abc", "aa", "Ã©", "ĊĊ"} {
		vocab = append(vocab, fmt.Sprintf("%q: %d", tok, 94+i))
	}
	merges := []string{"l l", "h e", "he ll", "hell o", "Ġ h", "Ġ hello", "b c", "a b", "c d", "a bc", "a a", "Ã ©", "Ċ Ċ"}
	var ms []string
	for _, m := range merges {
		if pairMerges {
			a, b, _ := strings.Cut(m, " ")
			ms = append(ms, fmt.Sprintf("[%q, %q]", a, b))
		} else {
			ms = append(ms, fmt.Sprintf("%q", m))
		}
	}
	return `{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 111, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 112, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 113, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 114, "content": "<think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false},
    {"id": 115, "content": "<|im_end|>!", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}
  ],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
  ]},
  "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
  "model": {
    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "", "end_of_word_suffix": "",
    "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
    "vocab": {` + strings.Join(vocab, ", ") + `},
    "merges": [` + strings.Join(ms, ", ") + `]
  }
}`
}

// asc returns the hand-built ids of plain ASCII text that no merge touches.
func asc(s string) []int {
	ids := make([]int, len(s))
	for i := range len(s) {
		ids[i] = int(s[i]) - 33
	}
	return ids
}

func cat(parts ...[]int) []int { return slices.Concat(parts...) }

func mustParse(t testing.TB, data string) *Tokenizer {
	t.Helper()
	tok, err := Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

const (
	idSpace, idNewline, idA3, idA9                = 94, 95, 96, 97
	idHello, idSpaceHello, idAbc, idAA, idE, idNN = 101, 103, 107, 108, 109, 110
	idEOT, idStart, idEnd, idThink, idEndX        = 111, 112, 113, 114, 115
)

func TestHandBuiltEncode(t *testing.T) {
	tests := []struct {
		in       string
		specials bool
		want     []int
		why      string
	}{
		{"hello", false, []int{idHello}, "l l, h e, he ll, hell o"},
		{" hello", false, []int{idSpaceHello}, `"h e" (rank 1) beats "Ġ h" (rank 4), so Ġ+hello merges last`},
		{"hello hello", false, []int{idHello, idSpaceHello}, "two pre-tokens"},
		{"abcd", false, cat([]int{idAbc}, asc("d")), `"b c" first; stale "a b" and "c d" are skipped; then "a bc"`},
		{"aaa", false, cat([]int{idAA}, asc("a")), "equal ranks merge leftmost first"},
		{"aaaa", false, []int{idAA, idAA}, "leftmost first, then the next pair"},
		{"café", false, cat(asc("caf"), []int{idE}), "é is Ã © merged"},
		{"cafe\u0301", false, cat(asc("caf"), []int{idE}), "NFC composes e + U+0301 first"},
		{"hi!\n", false, cat(asc("hi!"), []int{idNewline}), `"hi", "!\n"`},
		{"a\n\nb", false, cat(asc("a"), []int{idNN}, asc("b")), "a newline run is one pre-token"},
		{"x\tz", false, asc("xz"), "tab is not in the vocab: dropped, as HF does without unk"},
		{"<|im_start|>hello<|im_end|>", true, []int{idStart, idHello, idEnd}, "specials recognised"},
		{"<|im_start|>hello", false, cat(asc("<|im_start|>"), []int{idHello}), "specials are text in Encode"},
		{"<think>x", false, cat([]int{idThink}, asc("x")), "non-special added tokens are recognised by Encode"},
		{"<|im_end|>!", false, []int{idEndX}, "leftmost-longest: the non-special <|im_end|>! wins"},
		{"<|im_end|>!", true, []int{idEndX}, "longest wins over the special"},
		{"<|im_end|>?", false, asc("<|im_end|>?"), "the special match is skipped and stays text"},
		{"<|im_end|>?", true, cat([]int{idEnd}, asc("?")), ""},
		{"<|im_<|im_end|>", true, cat(asc("<|im_"), []int{idEnd}), "a partial marker is text"},
		{"", true, nil, ""},
	}
	for _, pairs := range []bool{false, true} {
		tok := mustParse(t, handBuilt(pairs))
		for _, tt := range tests {
			got := tok.Encode(tt.in)
			if tt.specials {
				got = tok.EncodeWithSpecials(tt.in)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("pairs=%v specials=%v %q = %v, want %v (%s)", pairs, tt.specials, tt.in, got, tt.want, tt.why)
			}
		}
	}
}

func TestHandBuiltDecodeAndLookup(t *testing.T) {
	tok := mustParse(t, handBuilt(false))
	decodes := []struct {
		ids  []int
		want string
	}{
		{[]int{idHello, idSpaceHello}, "hello hello"},
		{[]int{idEOT}, "<|endoftext|>"},
		{[]int{idStart, idHello, idEnd}, "<|im_start|>hello<|im_end|>"},
		{[]int{idA3, idA9}, "é"},
		{[]int{idA3}, "\uFFFD"},
		{[]int{idA3, idHello}, "\uFFFDhello"},
		{[]int{9999}, "\uFFFD"},
		{[]int{-1, idHello}, "\uFFFDhello"},
		{nil, ""},
	}
	for _, tt := range decodes {
		if got := tok.Decode(tt.ids); got != tt.want {
			t.Errorf("Decode(%v) = %q, want %q", tt.ids, got, tt.want)
		}
	}
	lookups := map[string]int{"Ġhello": idSpaceHello, "<think>": idThink, "<|im_end|>": idEnd, "Ã©": idE}
	for content, want := range lookups {
		if id, ok := tok.TokenID(content); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", content, id, ok, want)
		}
	}
	if _, ok := tok.TokenID(" hello"); ok {
		t.Error(`TokenID(" hello") should not find the byte-level token "Ġhello"`)
	}
	if got := tok.EOSTokenIDs(); !slices.Equal(got, []int{idEnd, idEOT}) {
		t.Errorf("EOSTokenIDs = %v", got)
	}
	if got := tok.VocabSize(); got != 116 {
		t.Errorf("VocabSize = %d, want 115", got)
	}
	if !tok.IsSpecial(idEnd) || tok.IsSpecial(idThink) || tok.IsSpecial(idHello) {
		t.Error("IsSpecial: want true only for special added tokens")
	}
}

func TestUnknownBytes(t *testing.T) {
	// "中" is E4 B8 AD; none of its byte-level spellings is in the vocab.
	tests := []struct {
		unk  string
		fuse bool
		want []int
	}{
		{`null`, false, asc("x")},
		{`"~"`, false, cat(asc("x"), asc("~~~"))},
		{`"~"`, true, cat(asc("x"), asc("~"))},
	}
	for _, tt := range tests {
		data := strings.Replace(handBuilt(false), `"unk_token": null`, `"unk_token": `+tt.unk, 1)
		data = strings.Replace(data, `"fuse_unk": false`, fmt.Sprintf(`"fuse_unk": %v`, tt.fuse), 1)
		tok := mustParse(t, data)
		if got := tok.Encode("x中"); !slices.Equal(got, tt.want) {
			t.Errorf("unk %s fuse %v: Encode = %v, want %v", tt.unk, tt.fuse, got, tt.want)
		}
		roundTrip(t, tok, "unk "+tt.unk)
	}
}

func TestIgnoreMerges(t *testing.T) {
	// Llama-3-style files: a pre-token that is itself in the vocab is used
	// whole even when no merges lead to it.
	data := strings.Replace(handBuilt(false), `"vocab": {`, `"vocab": {"xyz": 200, `, 1)
	for _, ignore := range []bool{false, true} {
		d := strings.Replace(data, `"ignore_merges": false`, fmt.Sprintf(`"ignore_merges": %v`, ignore), 1)
		tok := mustParse(t, d)
		want := asc("xyz")
		if ignore {
			want = []int{200}
		}
		if got := tok.Encode("xyz"); !slices.Equal(got, want) {
			t.Errorf("ignore_merges=%v: Encode(xyz) = %v, want %v", ignore, got, want)
		}
		roundTrip(t, tok, fmt.Sprintf("ignore_merges=%v", ignore))
	}
}

func TestLongWord(t *testing.T) {
	// Merging is O(n log n) per word; a quadratic implementation would take
	// minutes here. The result also pins leftmost-first merging at scale.
	tok := mustParse(t, handBuilt(false))
	const n = 200_000
	got := tok.Encode(strings.Repeat("a", n+1))
	if len(got) != n/2+1 || got[0] != idAA || got[n/2-1] != idAA || got[n/2] != asc("a")[0] {
		t.Fatalf("Encode(a×%d): %d ids, first %v last %v", n+1, len(got), got[:2], got[len(got)-2:])
	}
}

func TestChatTemplate(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "\nhello <|im_end|>"},
	}
	rendered := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n\nhello <|im_end|><|im_end|>\n<|im_start|>assistant\n"

	tok := Default()
	want := cat([]int{257}, bytesAsIDs("system\nBe brief."), []int{258}, bytesAsIDs("\n"),
		[]int{257}, bytesAsIDs("user\n\nhello <|im_end|>"), []int{258}, bytesAsIDs("\n"),
		[]int{257}, bytesAsIDs("assistant\n"))
	got := tok.ApplyChatTemplate(msgs, true)
	if !slices.Equal(got, want) {
		t.Errorf("default: ApplyChatTemplate = %v, want %v", got, want)
	}
	if d := tok.Decode(got); d != rendered {
		t.Errorf("default: decoded template = %q, want %q", d, rendered)
	}
	noPrompt := tok.ApplyChatTemplate(msgs, false)
	if !slices.Equal(noPrompt, want[:len(want)-len("assistant\n")-1]) {
		t.Errorf("default: without generation prompt = %v", noPrompt)
	}

	hb := mustParse(t, handBuilt(false))
	// Role, newline and content are one span, as when HF tokenizes the rendered
	// string: "user\n\nhello" has the pre-token "\n\n" (merged to ĊĊ), where
	// encoding "user\n" and "\nhello" apart would give two Ċ.
	want = cat([]int{idStart}, asc("user"), []int{idNN, idHello}, []int{idEnd}, []int{idNewline},
		[]int{idStart}, asc("assistant"), []int{idNewline})
	got = hb.ApplyChatTemplate([]Message{{Role: "user", Content: "\nhello"}}, true)
	if !slices.Equal(got, want) {
		t.Errorf("hand-built: ApplyChatTemplate = %v, want %v", got, want)
	}

	// Without marker tokens the markers are plain text.
	plain := strings.NewReplacer(`"<|im_start|>"`, `"<|a|>"`, `"<|im_end|>"`, `"<|b|>"`).Replace(handBuilt(false))
	pt := mustParse(t, plain)
	got = pt.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, false)
	if d := pt.Decode(got); d != "<|im_start|>user\nhi<|im_end|>\n" || slices.Contains(got, idStart) {
		t.Errorf("no markers: %v decodes to %q", got, d)
	}
}

// roundTrip saves tok, loads it back and checks that nothing changed: the
// tables, the file bytes on a second save, and encodings of a corpus.
func roundTrip(t *testing.T, tok *Tokenizer, name string) *Tokenizer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := tok.Save(path); err != nil {
		t.Fatalf("%s: Save: %v", name, err)
	}
	back, err := Load(path)
	if err != nil {
		t.Fatalf("%s: Load of saved file: %v", name, err)
	}
	if err := sameTables(tok, back); err != nil {
		t.Errorf("%s: after Save/Load: %v", name, err)
	}
	if a, b := tok.marshal(), back.marshal(); string(a) != string(b) {
		t.Errorf("%s: second save differs from the first", name)
	}
	for _, s := range corpus {
		if a, b := tok.EncodeWithSpecials(s), back.EncodeWithSpecials(s); !slices.Equal(a, b) {
			t.Errorf("%s: %q encodes to %v before and %v after Save/Load", name, s, a, b)
		}
		if a, b := tok.Encode(s), back.Encode(s); !slices.Equal(a, b) {
			t.Errorf("%s: %q encodes to %v before and %v after Save/Load", name, s, a, b)
		}
	}
	return back
}

var corpus = []string{
	"", "hello hello", " hello", "abcd aaa", "café cafe\u0301", "I'M don't",
	"<|im_start|>user\nhello<|im_end|>\n", "<think>x</think>", "<|im_end|>!",
	"  \n\t x 123 ½", "🙂🙂abc", "中文", "\xff\xfe", "x中",
}

// sameTables compares everything a Tokenizer is made of except its cache, and
// names the first part that differs.
func sameTables(a, b *Tokenizer) error {
	type tables struct {
		Vocab        map[string]int
		VocabTokens  []string
		IDBytes      []string
		Kinds        []tokenKind
		ByteIDs      [256]int32
		Merges       [][2]int32
		Ranks        map[uint64]merge
		Added        []addedToken
		AddedBy      map[string]int
		NFC          bool
		Unk          int32
		FuseUnk      bool
		IgnoreMerges bool
	}
	of := func(t *Tokenizer) reflect.Value {
		return reflect.ValueOf(tables{t.vocab, t.vocabTokens, t.idBytes, t.kinds, t.byteIDs, t.merges, t.ranks, t.added, t.addedBy, t.nfc, t.unk, t.fuseUnk, t.ignoreMerges})
	}
	va, vb := of(a), of(b)
	for i := range va.NumField() {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return fmt.Errorf("%s differs", va.Type().Field(i).Name)
		}
	}
	return nil
}

func TestSaveLoad(t *testing.T) {
	roundTrip(t, Default(), "default")
	for _, pairs := range []bool{false, true} {
		tok := mustParse(t, handBuilt(pairs))
		back := roundTrip(t, tok, fmt.Sprintf("hand-built pairs=%v", pairs))
		// The string and pair spellings of merges are the same tokenizer.
		if err := sameTables(back, roundTrip(t, mustParse(t, handBuilt(!pairs)), "other spelling")); err != nil {
			t.Errorf("merge spellings differ: %v", err)
		}
	}
	// Tokens that need JSON escapes, and one outside the byte-level alphabet
	// (it decodes to its own UTF-8), survive Save/Load.
	odd := strings.Replace(handBuilt(true), `"vocab": {`, `"vocab": {"\u0001\"\\x\u2028": 200, `, 1)
	back := roundTrip(t, mustParse(t, odd), "escapes")
	if got := back.Decode([]int{200}); got != "\x01\"\\x\u2028" {
		t.Errorf("odd token decodes to %q", got)
	}
	// Default has no normaliser; Save must not add one.
	back = roundTrip(t, Default(), "default")
	if got := back.Encode("e\u0301"); !slices.Equal(got, bytesAsIDs("e\u0301")) {
		t.Errorf("reloaded default normalised: %v", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	// A Tokenizer is shared by every request of a worker; its word cache is
	// the only mutable part. Run with -race.
	tok := mustParse(t, handBuilt(false))
	want := make([][]int, len(corpus))
	for i, s := range corpus {
		want[i] = tok.EncodeWithSpecials(s)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := (g + i) % len(corpus)
				if got := tok.EncodeWithSpecials(corpus[k]); !slices.Equal(got, want[k]) {
					t.Errorf("concurrent Encode(%q) = %v, want %v", corpus[k], got, want[k])
					return
				}
				tok.Decode(want[k])
			}
		})
	}
	wg.Wait()
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope.json")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestParseErrors(t *testing.T) {
	type doc = map[string]any
	tests := []struct {
		name        string
		edit        func(d doc)
		raw         string // used instead of edit when set
		unsupported bool
		mention     string
	}{
		{name: "not JSON", raw: "{", mention: "decoding"},
		{name: "no model", edit: func(d doc) { delete(d, "model") }, mention: "model is missing"},
		{name: "WordPiece", edit: func(d doc) { model(d)["type"] = "WordPiece" }, unsupported: true, mention: `"WordPiece"`},
		{name: "Unigram", edit: func(d doc) { model(d)["type"] = "Unigram"; model(d)["vocab"] = []any{[]any{"a", 0.0}} }, unsupported: true, mention: `"Unigram"`},
		{name: "no pre_tokenizer", edit: func(d doc) { d["pre_tokenizer"] = nil }, unsupported: true, mention: "pre_tokenizer"},
		{name: "GPT-2 pre_tokenizer", edit: func(d doc) {
			d["pre_tokenizer"] = doc{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
		}, unsupported: true, mention: `"ByteLevel"`},
		{name: "other regex", edit: func(d doc) { splitPre(d)["pattern"] = doc{"Regex": `\s+|\w+`} }, unsupported: true, mention: "not Qwen2's pattern"},
		{name: "string pattern", edit: func(d doc) { splitPre(d)["pattern"] = doc{"String": " "} }, unsupported: true, mention: "not a Regex"},
		{name: "behavior", edit: func(d doc) { splitPre(d)["behavior"] = "Removed" }, unsupported: true, mention: "Removed"},
		{name: "use_regex absent", edit: func(d doc) { delete(byteLevelPre(d), "use_regex") }, unsupported: true, mention: "use_regex"},
		{name: "add_prefix_space", edit: func(d doc) { byteLevelPre(d)["add_prefix_space"] = true }, unsupported: true, mention: "add_prefix_space"},
		{name: "NFKC", edit: func(d doc) { d["normalizer"] = doc{"type": "NFKC"} }, unsupported: true, mention: "NFKC"},
		{name: "sequence with lowercase", edit: func(d doc) { d["normalizer"] = doc{"type": "Sequence", "normalizers": []any{doc{"type": "Lowercase"}}} }, unsupported: true, mention: "Lowercase"},
		{name: "decoder", edit: func(d doc) { d["decoder"] = doc{"type": "WordPiece"} }, unsupported: true, mention: "decoder"},
		{name: "post_processor", edit: func(d doc) { d["post_processor"] = doc{"type": "TemplateProcessing"} }, unsupported: true, mention: "TemplateProcessing"},
		{name: "truncation", edit: func(d doc) { d["truncation"] = doc{"max_length": 5} }, unsupported: true, mention: "truncation"},
		{name: "padding", edit: func(d doc) { d["padding"] = doc{"length": 5} }, unsupported: true, mention: "padding"},
		{name: "lstrip", edit: func(d doc) { added(d, 0)["lstrip"] = true }, unsupported: true, mention: "lstrip"},
		{name: "dropout", edit: func(d doc) { model(d)["dropout"] = 0.1 }, unsupported: true, mention: "dropout"},
		{name: "byte_fallback", edit: func(d doc) { model(d)["byte_fallback"] = true }, unsupported: true, mention: "byte_fallback"},
		{name: "subword prefix", edit: func(d doc) { model(d)["continuing_subword_prefix"] = "##" }, unsupported: true, mention: "##"},
		{name: "merge of unknown tokens", edit: func(d doc) { appendMerge(d, "zz q") }, mention: `"zz"`},
		{name: "merge result not in vocab", edit: func(d doc) { appendMerge(d, []any{"x", "y"}) }, mention: `"x", "y"`},
		{name: "merge with one token", edit: func(d doc) { appendMerge(d, []any{"x"}) }, mention: "merges[13]"},
		{name: "merge string without space", edit: func(d doc) { appendMerge(d, "xy") }, mention: "merges[13]"},
		{name: "negative id", edit: func(d doc) { vocab(d)["neg"] = -1 }, mention: "out of range"},
		{name: "huge id", edit: func(d doc) { vocab(d)["big"] = 1 << 40 }, mention: "out of range"},
		{name: "duplicate id", edit: func(d doc) { vocab(d)["dup"] = 0 }, mention: "id 0 is used by both"},
		{name: "empty vocab token", edit: func(d doc) { vocab(d)[""] = 500 }, mention: "empty token"},
		{name: "vocab as list", edit: func(d doc) { model(d)["vocab"] = []any{"a"} }, mention: "model.vocab"},
		{name: "added id clash", edit: func(d doc) { added(d, 0)["id"] = 0 }, mention: `belongs to vocab token "!"`},
		{name: "added duplicate", edit: func(d doc) { added(d, 1)["content"] = "<|endoftext|>" }, mention: "duplicate"},
		{name: "added same id", edit: func(d doc) { added(d, 1)["id"] = 111 }, mention: "already taken"},
		{name: "added no id", edit: func(d doc) { delete(added(d, 0), "id") }, mention: "missing id"},
		{name: "added empty", edit: func(d doc) { added(d, 0)["content"] = "" }, mention: "empty content"},
		{name: "unk not in vocab", edit: func(d doc) { model(d)["unk_token"] = "<unk>" }, mention: "<unk>"},
	}
	for _, tt := range tests {
		data := []byte(tt.raw)
		if tt.raw == "" {
			var d doc
			if err := json.Unmarshal([]byte(handBuilt(true)), &d); err != nil {
				t.Fatal(err)
			}
			tt.edit(d)
			var err error
			if data, err = json.Marshal(d); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Parse(data)
		if err == nil {
			t.Errorf("%s: Parse succeeded", tt.name)
			continue
		}
		if got := errors.Is(err, ErrUnsupported); got != tt.unsupported {
			t.Errorf("%s: errors.Is(err, ErrUnsupported) = %v, want %v: %v", tt.name, got, tt.unsupported, err)
		}
		if !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("%s: error %q does not mention %q", tt.name, err, tt.mention)
		}
	}

	// Accepted variants of the same tokenizer.
	ok := []struct {
		name string
		edit func(d map[string]any)
	}{
		{"no type with merges", func(d map[string]any) { delete(model(d), "type") }},
		{"NFC in a sequence", func(d map[string]any) {
			d["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}}}
		}},
		{"null decoder and post_processor", func(d map[string]any) { d["decoder"], d["post_processor"] = nil, nil }},
		{"#version header", func(d map[string]any) {
			m := model(d)
			var ms []any
			for _, p := range m["merges"].([]any) {
				pair := p.([]any)
				ms = append(ms, pair[0].(string)+" "+pair[1].(string))
			}
			m["merges"] = append([]any{"#version: 0.2"}, ms...)
		}},
	}
	want := mustParse(t, handBuilt(true))
	for _, tt := range ok {
		var d map[string]any
		if err := json.Unmarshal([]byte(handBuilt(true)), &d); err != nil {
			t.Fatal(err)
		}
		tt.edit(d)
		data, _ := json.Marshal(d)
		tok, err := Parse(data)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if err := sameTables(tok, want); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func model(d map[string]any) map[string]any { return d["model"].(map[string]any) }
func vocab(d map[string]any) map[string]any { return model(d)["vocab"].(map[string]any) }
func added(d map[string]any, i int) map[string]any {
	return d["added_tokens"].([]any)[i].(map[string]any)
}
func splitPre(d map[string]any) map[string]any {
	return d["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)
}
func byteLevelPre(d map[string]any) map[string]any {
	return d["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[1].(map[string]any)
}
func appendMerge(d map[string]any, m any) {
	model(d)["merges"] = append(model(d)["merges"].([]any), m)
}

// A turn with media renders its parts in order: each run of text as the
// rendered string tokenizes it, each marker as its special id; a marker's
// text inside a text part stays plain text, so a user cannot forge one.
func TestChatTemplateParts(t *testing.T) {
	tok := Default()
	id := func(s string) int {
		v, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return v
	}
	got := tok.ApplyChatTemplate([]Message{{Role: "user", Parts: []Part{
		{Special: AudioStart}, {Special: AudioPad}, {Special: AudioEnd},
		{Text: "hi " + ImagePad},
	}}}, false)
	want := []int{id(IMStart)}
	want = append(want, tok.Encode("user\n")...)
	want = append(want, id(AudioStart), id(AudioPad), id(AudioEnd))
	want = append(want, tok.Encode("hi "+ImagePad)...)
	want = append(want, id(IMEnd))
	want = append(want, tok.Encode("\n")...)
	if !slices.Equal(got, want) {
		t.Errorf("parts render as %v; want %v", got, want)
	}
	if slices.Contains(got, id(ImagePad)) {
		t.Error("a marker spelled in a text part became its special id")
	}
}
