package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// naiveMerge is the textbook BPE loop (scan for the lowest-rank pair, merge
// its leftmost occurrence, repeat), quadratic but obviously right; the heap
// implementation must agree with it.
func naiveMerge(t *Tokenizer, ids []int32) []int32 {
	ids = slices.Clone(ids)
	for {
		best, bm := -1, merge{}
		for i := 0; i+1 < len(ids); i++ {
			if m, ok := t.ranks[pairKey(ids[i], ids[i+1])]; ok && (best < 0 || m.rank < bm.rank) {
				best, bm = i, m
			}
		}
		if best < 0 {
			return ids
		}
		ids[best] = bm.id
		ids = slices.Delete(ids, best+1, best+2)
	}
}

func TestMergeAllMatchesNaive(t *testing.T) {
	hb := mustParse(t, handBuilt(false))
	for _, word := range []string{"hello", " hello", "abcd", "aaaaa", "abcabcd", "aabcc", "hellohello", "caféé"} {
		checkMerge(t, hb, word)
	}
}

func checkMerge(t *testing.T, tok *Tokenizer, word string) {
	t.Helper()
	var ids []int32
	for i := range len(word) {
		if id := tok.byteIDs[word[i]]; id >= 0 {
			ids = append(ids, id)
		}
	}
	if len(ids) < 2 {
		return
	}
	want := naiveMerge(tok, ids)
	got := tok.mergeAll(slices.Clone(ids))
	if !slices.Equal(got, want) {
		t.Fatalf("mergeAll(%q) = %v, naive merge gives %v", word, got, want)
	}
}

func FuzzEncodeDecode(f *testing.F) {
	for _, s := range corpus {
		f.Add(s)
	}
	f.Add("I'M don't 'ſa \t\tx\r\n\r\n 123 e\u0301 🙂🙂abc <|im_start|><think>")
	f.Add("\xff\xfe\xe4\xb8 \xed\xa0\x80")
	hb := mustParse(f, handBuilt(false))
	f.Fuzz(func(t *testing.T, s string) {
		// The splitter covers the input with non-empty pieces.
		var pieces []string
		splitQwen2(s, func(p string) {
			if p == "" {
				t.Fatalf("empty piece splitting %q", s)
			}
			pieces = append(pieces, p)
		})
		if strings.Join(pieces, "") != s {
			t.Fatalf("pieces %q do not join to %q", pieces, s)
		}

		// Default: bytes in, bytes out.
		def := Default()
		ids := def.Encode(s)
		if !slices.Equal(ids, bytesAsIDs(s)) {
			t.Fatalf("Default().Encode(%q) = %v, want its bytes", s, ids)
		}
		out := def.Decode(ids)
		if !utf8.ValidString(out) {
			t.Fatalf("Decode gave invalid UTF-8 %q", out)
		}
		if utf8.ValidString(s) && out != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, out)
		}
		if sp := def.EncodeWithSpecials(s); def.Decode(sp) != out {
			t.Fatalf("EncodeWithSpecials(%q) decodes to %q, Encode to %q", s, def.Decode(sp), out)
		}

		// Hand-built: any ids, valid output, heap merge == naive merge.
		for _, ids := range [][]int{hb.Encode(s), hb.EncodeWithSpecials(s)} {
			for _, id := range ids {
				if id < 0 || id >= hb.VocabSize() {
					t.Fatalf("Encode(%q) produced id %d", s, id)
				}
			}
			if out := hb.Decode(ids); !utf8.ValidString(out) {
				t.Fatalf("Decode gave invalid UTF-8 %q", out)
			}
			checkStream(t, hb, ids)
		}
		for _, p := range pieces {
			checkMerge(t, hb, p)
		}
	})
}
