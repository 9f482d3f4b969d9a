package tokenizer

// Bounded encoding: a server that will refuse any prompt longer than its
// context only needs to know a prompt's ids when there are at most that
// many, and otherwise that there are more. EncodeUpTo and
// ApplyChatTemplateUpTo stop as soon as the answer is "more", so their work
// and memory are proportional to the limit, not to the text: this is what
// vLLM does too, tokenizing with truncation at max_input_tokens + 1 and
// refusing text longer than max_input_tokens * max_chars_per_token before
// tokenizing at all (vllm/renderers/params.py, TokenizeParams
// get_encode_kwargs and _text_len_check, at vLLM commit 1aa021e8).
//
// Two lower bounds on a token count make the early stop cheap:
//
//   - a pre-token of n bytes, k of which have a byte token, yields at least
//     ceil(k / maxTokenBytes) tokens: every token but unk stands for at most
//     maxTokenBytes of those bytes;
//   - a text of n bytes yields at least ceil(n / (maxTokenBytes * s)) tokens,
//     where s bounds how much NFC normalisation can shrink text (1 without a
//     normaliser) — valid only when every byte has a token, so that no byte
//     is dropped or fused into one unk.

// nfcMaxShrink bounds how many bytes of input NFC can compose into one byte
// of output. The worst cases are three: a Hangul L+V+T jamo sequence (9
// bytes) composing into one syllable (3 bytes); Latin and Greek bases with
// stacked marks shrink by less. 4 leaves a margin.
const nfcMaxShrink = 4

// bound is a token limit for one encoding; nil means none. Once exceeded,
// atLeast is a lower bound on the full count (> limit) and encoding stops.
type bound struct {
	limit   int
	over    bool
	atLeast int
}

// exceeded reports whether dst plus at least more tokens to come is over
// the limit, recording it.
func (b *bound) exceeded(dst []int, more int) bool {
	if b == nil {
		return false
	}
	if n := len(dst) + more; !b.over && n > b.limit {
		b.over, b.atLeast = true, max(n, b.limit+1)
	}
	return b.over
}

// result is what the UpTo functions return: the ids and their count when
// they fit, else no ids and a lower bound on the count.
func (b *bound) result(ids []int) ([]int, int) {
	if b.over {
		return nil, b.atLeast
	}
	return ids, len(ids)
}

// EncodeUpTo is Encode for at most limit tokens: when text has at most
// limit tokens it returns them and their count; otherwise it returns no ids
// and a count n > limit that the full encoding reaches at least, having
// done work proportional to limit rather than to text.
func (t *Tokenizer) EncodeUpTo(text string, limit int) (ids []int, n int) {
	b := &bound{limit: max(limit, 0)}
	return b.result(t.encode(nil, text, false, b))
}

// ApplyChatTemplateUpTo is ApplyChatTemplate for at most limit tokens, as
// EncodeUpTo is Encode's.
func (t *Tokenizer) ApplyChatTemplateUpTo(msgs []Message, addGenerationPrompt bool, limit int) (ids []int, n int) {
	b := &bound{limit: max(limit, 0)}
	return b.result(t.applyChatTemplate(msgs, addGenerationPrompt, b))
}

// textMinTokens is a lower bound on the tokens of any text of n bytes.
func (t *Tokenizer) textMinTokens(n int) int {
	if !t.everyByte || t.maxTokenBytes == 0 {
		return 0
	}
	per := t.maxTokenBytes
	if t.nfc {
		per *= nfcMaxShrink
	}
	return (n + per - 1) / per
}

// wordMinTokens is a lower bound on the tokens of one pre-token.
func (t *Tokenizer) wordMinTokens(word string) int {
	if t.maxTokenBytes == 0 {
		return 0
	}
	known := len(word)
	if !t.everyByte {
		known = 0
		for i := 0; i < len(word); i++ {
			if t.byteIDs[word[i]] >= 0 {
				known++
			}
		}
	}
	return (known + t.maxTokenBytes - 1) / t.maxTokenBytes
}

// encodeSpan measures what bounds need: the longest text a token of Encode
// can stand for, and whether every byte has its own token.
func encodeSpan(t *Tokenizer) (maxBytes int, everyByte bool) {
	for id, k := range t.kinds {
		if k == kindModel || k == kindAdded {
			maxBytes = max(maxBytes, len(t.idBytes[id]))
		}
	}
	// A model token re-listed as a special added token keeps its vocab
	// spelling, which BPE can still produce from plain text.
	for tok := range t.vocab {
		maxBytes = max(maxBytes, len(tokenBytes(tok)))
	}
	everyByte = true
	for _, id := range t.byteIDs {
		everyByte = everyByte && id >= 0
	}
	return maxBytes, everyByte
}
