package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// boundTokenizers are the shapes of vocabulary the bounds must hold for:
// the byte tokenizer, a BPE with merges and NFC whose bytes are not all in
// the vocab, and the same with a fused unk token.
func boundTokenizers(t *testing.T) map[string]*Tokenizer {
	fused := strings.Replace(handBuilt(false), `"unk_token": null`, `"unk_token": "~"`, 1)
	fused = strings.Replace(fused, `"fuse_unk": false`, `"fuse_unk": true`, 1)
	return map[string]*Tokenizer{
		"default":    Default(),
		"hand-built": mustParse(t, handBuilt(false)),
		"fused unk":  mustParse(t, fused),
	}
}

// randomText mixes what changes token counts: merges, added tokens, special
// markers (plain text in Encode), NFC-composable sequences, Hangul jamo,
// bytes missing from a vocabulary, invalid UTF-8 and long runs.
func randomText(r *rand.Rand) string {
	parts := []string{"hello", " hello", "abc", "aa", "\n\n", "  ", "\t", "é", "e\u0301", "\u1100\u1161\u11a8", "中",
		"<think>", "<|im_end|>!", "<|im_end|>", "<|endoftext|>", "x", "'s", "123", "\xff", "!!", " "}
	var sb strings.Builder
	for range r.IntN(40) {
		p := parts[r.IntN(len(parts))]
		if r.IntN(10) == 0 {
			p = strings.Repeat(p, 1+r.IntN(200))
		}
		sb.WriteString(p)
	}
	return sb.String()
}

// EncodeUpTo and ApplyChatTemplateUpTo agree with the unbounded calls: the
// same ids when they fit the limit, and otherwise a count over the limit
// that the full encoding does reach.
func TestEncodeUpToAgreesWithEncode(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for name, tok := range boundTokenizers(t) {
		for i := range 3000 {
			text := randomText(r)
			full := tok.Encode(text)
			limit := r.IntN(len(full) + 3)
			ids, n := tok.EncodeUpTo(text, limit)
			if err := checkBounded(full, ids, n, limit); err != nil {
				t.Fatalf("%s #%d: EncodeUpTo(%q, %d): %v", name, i, text, limit, err)
			}
			msgs := []Message{{Role: "system", Content: randomText(r)}, {Role: "user", Content: text}}
			chat := tok.ApplyChatTemplate(msgs, true)
			limit = r.IntN(len(chat) + 3)
			ids, n = tok.ApplyChatTemplateUpTo(msgs, true, limit)
			if err := checkBounded(chat, ids, n, limit); err != nil {
				t.Fatalf("%s #%d: ApplyChatTemplateUpTo(%q, %d): %v", name, i, msgs, limit, err)
			}
		}
	}
}

func checkBounded(full, ids []int, n, limit int) error {
	switch {
	case len(full) <= limit && (n != len(full) || !slices.Equal(ids, full)):
		return fmt.Errorf("got %d ids %v, want all %d: %v", n, ids, len(full), full)
	case len(full) > limit && (ids != nil || n <= limit || n > len(full)):
		return fmt.Errorf("got %d ids (count %d); want none and a count in (%d, %d]", len(ids), n, limit, len(full))
	}
	return nil
}

// A text far over the limit costs work and memory proportional to the
// limit: one long word, or many short ones, of 8 MiB each allocate less
// than 1 MiB to be refused at 1000 tokens. A chat turn's text is put
// together once (one copy) unless its length alone rules it out, which
// takes a vocabulary with a token for every byte.
func TestEncodeUpToStopsEarly(t *testing.T) {
	for name, tok := range boundTokenizers(t) {
		for _, text := range []string{strings.Repeat("a", 8<<20), strings.Repeat("hello ", 8<<20/6), strings.Repeat("中", 8<<20/3)} {
			if text[0] != 'a' && text[0] != 'h' && !tok.everyByte {
				continue // every byte of 中 is missing: it has no tokens at all
			}
			var n int
			per := allocated(func() { _, n = tok.EncodeUpTo(text, 1000) })
			if n <= 1000 {
				t.Errorf("%s %.10q: count %d, want over 1000", name, text, n)
			}
			if per > 1<<20 {
				t.Errorf("%s %.10q…: refusing an 8 MiB text at 1000 tokens allocated %d bytes", name, text, per)
			}
			msgs := []Message{{Role: "user", Content: text}}
			per = allocated(func() { _, n = tok.ApplyChatTemplateUpTo(msgs, true, 1000) })
			budget := int64(1 << 20)
			if !tok.everyByte {
				budget += int64(len(text))
			}
			if n <= 1000 || per > budget {
				t.Errorf("%s chat %.10q…: count %d, %d bytes allocated; want over 1000 in under %d", name, text, n, per, budget)
			}
		}
	}
}

// allocated is the number of bytes f allocates (no test here runs in
// parallel, so the process's total is f's).
func allocated(f func()) int64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return int64(after.TotalAlloc - before.TotalAlloc)
}
