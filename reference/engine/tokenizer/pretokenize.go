package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// qwen2Pattern is the Split pre-tokenizer regex of Qwen2, Qwen2.5 and Qwen3
// tokenizer.json files. It is compared verbatim when loading a file; splitQwen2
// is its implementation.
const qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// splitQwen2 calls emit with the consecutive pieces of s that the Hugging Face
// Split pre-tokenizer (behavior Isolated) produces with qwen2Pattern. Go's
// regexp cannot express the look-ahead in `\s+(?!\S)`, so this scanner replays
// the backtracking matcher by hand: at each position it tries the alternatives
// in order and the first that matches wins, each taking what its greedy
// quantifiers would keep after backtracking:
//
//  1. (?i:'s|'t|'re|'ve|'m|'ll|'d): an ASCII apostrophe and a contraction in
//     any case; case-insensitive matching also lets U+017F (long s) match 's'.
//  2. [^\r\n\p{L}\p{N}]?\p{L}+: a run of letters, optionally led by one
//     character that is not CR, LF, a letter or a number (" word", "'word",
//     "\tword", "🙂word").
//  3. \p{N}: one number character; digits never group.
//  4. " ?[^\s\p{L}\p{N}]+[\r\n]*": an optional space, a run of characters
//     that are neither space, letter nor number, then any CRs and LFs.
//  5. \s*[\r\n]+: the whitespace run from here up to and including its last
//     CR or LF (\s* gives back characters until [\r\n]+ can match).
//  6. \s+(?!\S): the whole whitespace run if it ends the text; otherwise all
//     but its last character, which is left to lead the next word; fails for
//     a single whitespace character followed by a non-space,
//  7. \s+: ... which this then takes alone.
//
// Every character is a letter, number, whitespace or other, and each class has
// an alternative that always matches, so the pieces cover s without gaps.
// Bytes that are not valid UTF-8 (Go strings may hold any bytes; the Rust
// library never sees them) are treated as single "other" characters. \s is the
// Unicode White_Space property (as in Oniguruma and Rust's regex), \p{L} and
// \p{N} the letter and number categories of Go's Unicode tables.
func splitQwen2(s string, emit func(piece string)) {
	splitQwen2Until(s, func(piece string) bool { emit(piece); return true })
}

// splitQwen2Until is splitQwen2 that stops when emit returns false: the
// rest of s is never scanned.
func splitQwen2Until(s string, emit func(piece string) bool) {
	for i := 0; i < len(s); {
		n := matchQwen2(s, i)
		if !emit(s[i : i+n]) {
			return
		}
		i += n
	}
}

// matchQwen2 returns the length of the match starting at s[i] (always > 0).
func matchQwen2(s string, i int) int {
	c, size := decodeRune(s, i)

	// 1. Contractions.
	if c == '\'' {
		if n := contraction(s, i+1); n > 0 {
			return 1 + n
		}
	}

	// 2. Optional non-letter lead, then letters.
	if isLetter(c) {
		return size + letterRun(s, i+size)
	}
	if c != '\r' && c != '\n' && !isNumber(c) {
		if n := letterRun(s, i+size); n > 0 {
			return size + n
		}
	}

	// 3. A single number.
	if isNumber(c) {
		return size
	}

	// 4. Optional space, run of "other" characters, trailing CR/LF.
	j := i
	if c == ' ' {
		j++
	}
	if n := otherRun(s, j); n > 0 {
		j += n
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j - i
	}

	// Only whitespace is left: c is not a letter, a number, or "other"
	// (alternative 4 always matches those at c itself).
	end, lastNL, lastStart := i, -1, i
	for end < len(s) {
		r, n := decodeRune(s, end)
		if !isSpace(r) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = end + n
		}
		lastStart = end
		end += n
	}
	// 5. Up to and including the last CR/LF of the run.
	if lastNL >= 0 {
		return lastNL - i
	}
	// 6. The whole run at the end of the text, else all but its last character.
	if end == len(s) {
		return end - i
	}
	if lastStart > i {
		return lastStart - i
	}
	// 7. A lone whitespace character before a non-space.
	return end - i
}

// contraction returns the length of a contraction suffix (after the apostrophe)
// at s[i], or 0.
func contraction(s string, i int) int {
	if i >= len(s) {
		return 0
	}
	c, size := decodeRune(s, i)
	switch c {
	case 's', 'S', 'ſ', 't', 'T', 'm', 'M', 'd', 'D':
		return size
	}
	// Only ASCII letters fold to r, e, v and l, so byte tests suffice.
	if i+1 < len(s) {
		a, b := s[i]|0x20, s[i+1]|0x20 // lower-cases ASCII letters
		if isASCIILetter(s[i]) && isASCIILetter(s[i+1]) &&
			(a == 'r' && b == 'e' || a == 'v' && b == 'e' || a == 'l' && b == 'l') {
			return 2
		}
	}
	return 0
}

func isASCIILetter(b byte) bool { return 'a' <= b|0x20 && b|0x20 <= 'z' }

// letterRun returns the byte length of the run of letters at s[i:].
func letterRun(s string, i int) int {
	j := i
	for j < len(s) {
		r, n := decodeRune(s, j)
		if !isLetter(r) {
			break
		}
		j += n
	}
	return j - i
}

// otherRun returns the byte length of the run at s[i:] of characters that are
// not whitespace, letters or numbers.
func otherRun(s string, i int) int {
	j := i
	for j < len(s) {
		r, n := decodeRune(s, j)
		if isSpace(r) || isLetter(r) || isNumber(r) {
			break
		}
		j += n
	}
	return j - i
}

// decodeRune is utf8.DecodeRuneInString with an ASCII fast path; an invalid
// byte comes back as (utf8.RuneError, 1), which classifies as "other".
func decodeRune(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

// isSpace is the White_Space property, which unicode.IsSpace implements.
func isSpace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || '\t' <= r && r <= '\r'
	}
	return unicode.IsSpace(r)
}
