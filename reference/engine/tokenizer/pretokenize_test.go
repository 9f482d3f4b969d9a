package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

func splitPieces(s string) []string {
	pieces := []string{}
	splitQwen2(s, func(p string) { pieces = append(pieces, p) })
	return pieces
}

// TestSplitQwen2 pins the scanner against splits derived by hand from the
// regex (leftmost alternative wins, quantifiers greedy with backtracking); the
// "why" column names the alternative that decides. All but the long-s and
// invalid-byte rows were also checked against transformers.js running the real
// Qwen3 tokenizer.json, whose JavaScript regex has the look-ahead.
func TestSplitQwen2(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		why  string
	}{
		{"", []string{}, "nothing to split"},
		{"Hello, world!", []string{"Hello", ",", " world", "!"}, "letters; other run; space leads letters"},
		{"I'M don't THEY'RE we'Ve", []string{"I", "'M", " don", "'t", " THEY", "'RE", " we", "'Ve"}, "contractions in any case"},
		{"'Ll 'd", []string{"'Ll", " '", "d"}, "' after a space: space+other run beats contraction"},
		{"'S's", []string{"'S", "'s"}, "two contractions"},
		{"''s", []string{"''", "s"}, "other run is greedy and swallows both apostrophes"},
		{"'sam", []string{"'s", "am"}, "contraction wins over ' leading letters"},
		{"'x", []string{"'x"}, "not a contraction: ' leads the letters"},
		{"A'B", []string{"A", "'B"}, "'B is not a contraction"},
		{"'ſa", []string{"'ſ", "a"}, "case-insensitive 's' also matches U+017F long s"},
		{"abc123 4567", []string{"abc", "1", "2", "3", " ", "4", "5", "6", "7"}, "one digit per piece; a space before a digit stands alone"},
		{"1 2", []string{"1", " ", "2"}, "lone space before a non-space"},
		{"x²½Ⅳ", []string{"x", "²", "½", "Ⅳ"}, "No and Nl are numbers too"},
		{"a  1", []string{"a", " ", " ", "1"}, `\s+(?!\S) takes all but the last space, which then stands alone`},
		{"hi  there", []string{"hi", " ", " there"}, "the last space leads the word"},
		{"    def", []string{"   ", " def"}, "indentation"},
		{"  !", []string{" ", " !"}, "the last space leads the punctuation"},
		{"trailing   ", []string{"trailing", "   "}, "whitespace at the end matches whole"},
		{"   ", []string{"   "}, "only spaces"},
		{" ", []string{" "}, "one space"},
		{"  \n  abc", []string{"  \n", " ", " abc"}, `\s*[\r\n]+ stops after the last newline`},
		{"a \n b", []string{"a", " \n", " b"}, "space-newline, then space leads the word"},
		{"x\n\n\ny", []string{"x", "\n\n\n", "y"}, "newline run"},
		{"\n abc", []string{"\n", " abc"}, "newline does not lead letters"},
		{"a\nb", []string{"a", "\n", "b"}, "CR and LF are excluded from the letter lead"},
		{"\rx", []string{"\r", "x"}, "CR and LF are excluded from the letter lead"},
		{"\r\n\r\nfoo", []string{"\r\n\r\n", "foo"}, "CRLF run"},
		{"a\r\nb", []string{"a", "\r\n", "b"}, "CRLF"},
		{"a \n", []string{"a", " \n"}, "trailing space-newline"},
		{"a\n\n\n", []string{"a", "\n\n\n"}, "trailing newlines"},
		{"\n\u00a0x", []string{"\n", "\u00a0x"}, "NBSP is not CR/LF, so it may lead letters"},
		{"\tx", []string{"\tx"}, "a tab leads letters"},
		{"\t\tx", []string{"\t", "\tx"}, "all but the last tab"},
		{"a\u00a0b", []string{"a", "\u00a0b"}, "NBSP leads letters"},
		{"a\u2028b", []string{"a", "\u2028b"}, "U+2028 is whitespace but not CR/LF"},
		{"\u3000漢", []string{"\u3000漢"}, "ideographic space leads letters"},
		{"café 中文 naïve", []string{"café", " 中文", " naïve"}, "é, 中, ï are letters"},
		{"日本語のテキストです。", []string{"日本語のテキストです", "。"}, "kana and kanji are all letters"},
		{"e\u0301x", []string{"e", "\u0301x"}, "a combining mark is not a letter; it leads the next letters"},
		{"🙂abc", []string{"🙂abc"}, "an emoji may lead letters"},
		{"🙂🙂abc", []string{"🙂🙂", "abc"}, "two emoji are an other run"},
		{"a 🙂", []string{"a", " 🙂"}, "space + other run"},
		{"!!!abc", []string{"!!!", "abc"}, "other run is greedy; it does not give back the last ! to the letters"},
		{"...\n\n\nfoo", []string{"...\n\n\n", "foo"}, "other run takes trailing newlines"},
		{"don't!!\n", []string{"don", "'t", "!!\n"}, "contraction then punctuation with newline"},
		{"a.\r\n\r\nb", []string{"a", ".\r\n\r\n", "b"}, "punctuation takes CRLFs"},
		{"x = f(a, b) -> {y: [1,2]};", []string{"x", " =", " f", "(a", ",", " b", ")", " ->", " {", "y", ":", " [", "1", ",", "2", "]};"}, "code"},
		{"a\xffb", []string{"a", "\xffb"}, "an invalid byte is an other character"},
		{"\xff\xfe!", []string{"\xff\xfe!"}, "invalid bytes join an other run"},
		{"\xe4\xb8", []string{"\xe4\xb8"}, "a truncated character is two invalid bytes"},
	}
	for _, tt := range tests {
		got := splitPieces(tt.in)
		if !slices.Equal(got, tt.want) {
			t.Errorf("split(%q) = %q, want %q (%s)", tt.in, got, tt.want, tt.why)
		}
	}
}

// TestSplitQwen2Long checks that long runs split linearly and correctly; a
// scanner that rescanned runs at every position would crawl here.
func TestSplitQwen2Long(t *testing.T) {
	const n = 200_000
	tests := []struct {
		in   string
		want []string
	}{
		{strings.Repeat(" ", n) + "x", []string{strings.Repeat(" ", n-1), " x"}},
		{strings.Repeat("\n ", n/2) + "x", []string{strings.Repeat("\n ", n/2-1) + "\n", " x"}},
		{strings.Repeat("ab", n), []string{strings.Repeat("ab", n)}},
		{strings.Repeat("!?", n) + "\n", []string{strings.Repeat("!?", n) + "\n"}},
	}
	for _, tt := range tests {
		if got := splitPieces(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("split of a %d-byte run: got %d pieces, want %d", len(tt.in), len(got), len(tt.want))
		}
	}
	if got := splitPieces(strings.Repeat("9", 1000)); len(got) != 1000 {
		t.Errorf("1000 digits: got %d pieces", len(got))
	}
}
