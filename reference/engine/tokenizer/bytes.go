package tokenizer

import "unicode/utf8"

// GPT-2's byte <-> unicode mapping. Byte-level vocabularies spell every byte as
// a printable character so that vocab files are valid text: printable Latin-1
// bytes stand for themselves and the other 68 bytes (controls, space, 0x7F-0xA0,
// 0xAD) take U+0100.. in byte order, which is why a space is written "Ġ"
// (U+0120) and a newline "Ċ" (U+010A).
var byteToRune, runeToByte = byteLevelTables()

// runeLimit bounds the runes the mapping uses (U+0000..U+0143).
const runeLimit = 256 + 68

func byteLevelTables() (b2r [256]rune, r2b [runeLimit]int16) {
	for i := range r2b {
		r2b[i] = -1
	}
	n := 0
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		b2r[b] = r
		r2b[r] = int16(b)
	}
	return b2r, r2b
}

// tokenBytes returns the bytes a byte-level vocab token stands for. A token with
// a character outside the mapping stands for its own UTF-8 bytes, as in Hugging
// Face's ByteLevel decoder.
func tokenBytes(tok string) string {
	buf := make([]byte, 0, len(tok))
	for _, r := range tok {
		if r < 0 || r >= runeLimit || runeToByte[r] < 0 {
			return tok
		}
		buf = append(buf, byte(runeToByte[r]))
	}
	return string(buf)
}

// byteLevel spells raw bytes in the byte-level alphabet.
func byteLevel(s string) string {
	buf := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		buf = utf8.AppendRune(buf, byteToRune[s[i]])
	}
	return string(buf)
}

// utf8Need returns how many bytes a sequence starting with lead has, and the
// range its second byte must fall in (the first continuation is narrower after
// E0, ED, F0 and F4, which is how overlong forms and surrogates are excluded).
// need is 0 for bytes that cannot start a sequence.
func utf8Need(lead byte) (need int, lo, hi byte) {
	switch {
	case lead < 0x80:
		return 1, 0, 0
	case lead < 0xC2:
		return 0, 0, 0
	case lead < 0xE0:
		return 2, 0x80, 0xBF
	case lead == 0xE0:
		return 3, 0xA0, 0xBF
	case lead == 0xED:
		return 3, 0x80, 0x9F
	case lead < 0xF0:
		return 3, 0x80, 0xBF
	case lead == 0xF0:
		return 4, 0x90, 0xBF
	case lead < 0xF4:
		return 4, 0x80, 0xBF
	case lead == 0xF4:
		return 4, 0x80, 0x8F
	}
	return 0, 0, 0
}

// validPrefix returns the length of the longest prefix of b (at most one
// character) that is a valid start of a UTF-8 sequence, and whether that prefix
// is a whole character.
func validPrefix(b []byte) (n int, complete bool) {
	need, lo, hi := utf8Need(b[0])
	if need == 0 {
		return 0, false
	}
	n = 1
	for n < need && n < len(b) {
		c := b[n]
		if n == 1 && (c < lo || c > hi) || n > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
		n++
	}
	return n, n == need
}

// appendValidUTF8 appends src to dst with each maximal invalid subpart replaced
// by U+FFFD. That is the Unicode-recommended practice and exactly what Rust's
// String::from_utf8_lossy (so Hugging Face's decoder) does; Go's
// strings.ToValidUTF8 collapses whole runs instead, which would count
// differently.
func appendValidUTF8(dst, src []byte) []byte {
	for i := 0; i < len(src); {
		n, complete := validPrefix(src[i:])
		switch {
		case complete:
			dst = append(dst, src[i:i+n]...)
			i += n
		case n == 0: // a byte that cannot start a character
			dst = append(dst, replacement...)
			i++
		default: // a truncated character: one replacement for the whole prefix
			dst = append(dst, replacement...)
			i += n
		}
	}
	return dst
}

// pendingTail returns how many bytes at the end of b form an incomplete but so
// far valid character, which later bytes may still complete. Only a lead byte
// (>= 0xC2) can begin such a tail, and a lead byte always begins a fresh
// character whatever precedes it, so the tail can be judged on its own.
func pendingTail(b []byte) int {
	for k := 1; k <= 3 && k <= len(b); k++ {
		c := b[len(b)-k]
		if c >= 0x80 && c < 0xC0 {
			continue // continuation byte: the lead is further back
		}
		n, complete := validPrefix(b[len(b)-k:])
		if n == k && !complete {
			return k
		}
		return 0
	}
	return 0
}
