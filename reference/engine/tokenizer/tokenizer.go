// Package tokenizer owns the reference engine's text <-> token-id mapping: a
// byte-level BPE tokenizer that reads the Hugging Face tokenizer.json files Qwen
// ships (Qwen2, Qwen2.5, Qwen3, Qwen3-Omni) and reproduces the ids of the
// Hugging Face "tokenizers" pipeline for them, so that the reference engine and
// vLLM see the same prompt; and a built-in byte tokenizer (Default) so that the
// engine runs and is tested with no files at all.
//
// What it reproduces, and why each piece exists:
//
//   - Added tokens are split out first (leftmost-longest match, as the Rust
//     library's Aho-Corasick does). Encode leaves special tokens as plain text,
//     the way HF does with split_special_tokens=True, so that user text can never
//     forge a control token such as <|im_end|>; EncodeWithSpecials recognises them.
//     Non-special added tokens (Qwen3's <think>, <tool_call>) are recognised by
//     both, because HF always recognises them.
//   - NFC normalisation of the text between added tokens, when the file asks.
//   - Qwen2's split regex, implemented as a hand-written scanner because Go's
//     regexp has no look-ahead (see pretokenize.go).
//   - GPT-2's byte <-> unicode mapping, so every byte sequence is encodable.
//   - Rank-ordered BPE merges within each pre-token, with a bounded cache.
//
// Decoding concatenates token bytes and replaces invalid UTF-8 with U+FFFD per
// maximal invalid subpart (what Rust's String::from_utf8_lossy does), so the
// output is always valid UTF-8; StreamDecoder does the same incrementally.
//
// A Tokenizer is safe for concurrent use: after construction its only mutable
// state is a word cache behind a lock.
package tokenizer

import (
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Token contents that the engine and the chat format rely on.
const (
	EndOfText = "<|endoftext|>"
	IMStart   = "<|im_start|>"
	IMEnd     = "<|im_end|>"
)

// Qwen3-Omni's multimodal markers and placeholders, as its chat template
// renders a media part (docs/multimodal/processor.md): an audio as
// AudioStart AudioPad AudioEnd, an image as VisionStart ImagePad VisionEnd,
// a video as VisionStart VideoPad VisionEnd; the processor then repeats each
// pad to the item's token count.
const (
	AudioStart  = "<|audio_start|>"
	AudioEnd    = "<|audio_end|>"
	AudioPad    = "<|audio_pad|>"
	VisionStart = "<|vision_start|>"
	VisionEnd   = "<|vision_end|>"
	ImagePad    = "<|image_pad|>"
	VideoPad    = "<|video_pad|>"
)

// Qwen3-Omni's TTS special tokens. The Thinker does not read or write them
// in a conversation: their word embeddings are what it hands the Talker as
// the text side of the speech stream — tts_pad while there is no text,
// tts_bos before the reply, tts_eos after it. Qwen3-Omni's config names
// them tts_pad_token_id 151671, tts_bos_token_id 151672 and
// tts_eos_token_id 151673 (transformers' Qwen3OmniMoeConfig); its
// tokenizer spells them as below (vllm-omni's qwen3_omni.py).
const (
	TTSPad = "<tts_pad>"
	TTSBos = "<tts_text_bos>"
	TTSEos = "<tts_text_eod>"
)

// Tokenizer is a byte-level BPE tokenizer. Build one with Default, Parse or Load.
type Tokenizer struct {
	// vocab maps a model token, in its byte-level spelling ("Ġthe"), to its id.
	vocab map[string]int
	// vocabTokens is the inverse of vocab (id -> byte-level spelling, "" if the
	// id is not a model token); Save needs the spelling, not the bytes.
	vocabTokens []string
	// idBytes holds what each id decodes to; kinds says whether an id exists at
	// all (a token may legitimately decode to nothing) and what it is.
	idBytes []string
	kinds   []tokenKind

	// byteIDs is the id of the single-byte token for each byte, -1 if the vocab
	// lacks it (such bytes are dropped or become unk, as in HF).
	byteIDs [256]int32
	// merges keeps the file's order for Save; ranks is the lookup used while
	// encoding: pair of ids -> (rank, merged id).
	merges [][2]int32
	ranks  map[uint64]merge

	added   []addedToken
	addedBy map[string]int // content -> index into added
	matcher addedMatcher

	nfc          bool
	unk          int32 // -1 when the model has no unk token
	fuseUnk      bool
	ignoreMerges bool

	// maxTokenBytes is the longest text one token of Encode can stand for
	// (model tokens and non-special added tokens); everyByte says every
	// byte has its own token, so that no byte is dropped or fused into unk.
	// Together they give a lower bound on a text's token count from its
	// length alone (see bound.go).
	maxTokenBytes int
	everyByte     bool

	cache wordCache
}

type merge struct{ rank, id int32 }

type tokenKind uint8

const (
	kindNone    tokenKind = iota // a gap in the id space
	kindModel                    // a BPE vocab entry
	kindAdded                    // a non-special added token
	kindSpecial                  // a special added token
)

type addedToken struct {
	id         int
	content    string
	special    bool
	normalized bool // kept for Save; matching is always on the raw text
}

// Message is one turn of a conversation.
type Message struct {
	Role    string
	Content string
	// Parts, when not nil, is the content instead of Content: text and
	// special tokens in order, as a turn with media parts renders.
	Parts []Part
}

// Part is a piece of a turn's content: text, encoded as plain text, or one
// special token by its content (such as AudioPad), which becomes its id.
type Part struct {
	Text    string
	Special string
}

var defaultTokenizer = sync.OnceValue(func() *Tokenizer {
	vocab := make(map[string]int, 256)
	for b := range 256 {
		vocab[string(byteToRune[b])] = b
	}
	t, err := build(buildSpec{
		vocab: vocab,
		added: []addedToken{
			{id: 256, content: EndOfText, special: true},
			{id: 257, content: IMStart, special: true},
			{id: 258, content: IMEnd, special: true},
			{id: 259, content: AudioStart, special: true},
			{id: 260, content: AudioEnd, special: true},
			{id: 261, content: AudioPad, special: true},
			{id: 262, content: VisionStart, special: true},
			{id: 263, content: VisionEnd, special: true},
			{id: 264, content: ImagePad, special: true},
			{id: 265, content: VideoPad, special: true},
			{id: 266, content: TTSPad, special: true},
			{id: 267, content: TTSBos, special: true},
			{id: 268, content: TTSEos, special: true},
		},
		unk: -1,
	})
	if err != nil {
		panic("tokenizer: building the default tokenizer: " + err.Error())
	}
	return t
})

// Default returns the built-in tokenizer that needs no files: ids 0..255 are the
// bytes 0..255, 256 is <|endoftext|>, 257 <|im_start|>, 258 <|im_end|>, then
// the multimodal markers 259..265 (AudioStart, AudioEnd, AudioPad,
// VisionStart, VisionEnd, ImagePad, VideoPad) and the TTS tokens 266..268
// (TTSPad, TTSBos, TTSEos), all special; there are no merges, so every byte
// is its own token. No normaliser runs, which keeps Decode(Encode(s)) == s
// for every valid UTF-8 string (and Encode(s) == the bytes of s for any
// string).
// The same value is returned on every call; it is immutable.
func Default() *Tokenizer { return defaultTokenizer() }

// VocabSize is one more than the largest id, counting model and added tokens.
// Ids below it that belong to no token (gaps) decode to U+FFFD.
func (t *Tokenizer) VocabSize() int { return len(t.idBytes) }

// Encode tokenizes plain text. Special-token strings in the text are encoded as
// ordinary text so that untrusted input cannot inject control tokens;
// non-special added tokens are still recognised, as Hugging Face does.
func (t *Tokenizer) Encode(text string) []int { return t.encode(nil, text, false, nil) }

// EncodeWithSpecials tokenizes text in which added special tokens (such as
// <|im_start|>) are recognised and become their ids.
func (t *Tokenizer) EncodeWithSpecials(text string) []int { return t.encode(nil, text, true, nil) }

// encode appends the ids of text to dst. With a bound b, it stops as soon
// as dst is known to exceed b.limit (see bound.go).
func (t *Tokenizer) encode(dst []int, text string, specials bool, b *bound) []int {
	if b.exceeded(dst, t.textMinTokens(len(text))) {
		return dst
	}
	start := 0 // start of the pending run of ordinary text
	for pos := 0; pos < len(text); {
		at, idx := t.matcher.find(text, pos)
		if idx < 0 {
			break
		}
		tok := &t.added[idx]
		end := at + len(tok.content)
		if tok.special && !specials {
			// Like HF with split_special_tokens: the match is dropped and its
			// text joins the surrounding ordinary text; the search resumes after
			// it, so nothing overlapping it is matched either.
			pos = end
			continue
		}
		dst = t.encodeOrdinary(dst, text[start:at], b)
		if b.exceeded(dst, 1) {
			return dst
		}
		dst = append(dst, tok.id)
		start, pos = end, end
	}
	return t.encodeOrdinary(dst, text[start:], b)
}

// encodeOrdinary encodes text that contains no added tokens to recognise.
func (t *Tokenizer) encodeOrdinary(dst []int, text string, b *bound) []int {
	if text == "" || b.exceeded(dst, t.textMinTokens(len(text))) {
		return dst
	}
	if t.nfc {
		text = norm.NFC.String(text)
	}
	splitQwen2Until(text, func(piece string) bool {
		// A pre-token that cannot fit is not merged at all: merging costs
		// tens of bytes per byte of the word.
		if b.exceeded(dst, t.wordMinTokens(piece)) {
			return false
		}
		dst = t.encodeWord(dst, piece)
		return !b.exceeded(dst, 0)
	})
	return dst
}

// TokenID returns the id of an added token by its content, or of a model token
// by its byte-level spelling (as in the file's vocab, e.g. "Ġthe" for " the"),
// like Hugging Face's token_to_id. Added tokens win when both exist.
func (t *Tokenizer) TokenID(content string) (int, bool) {
	if i, ok := t.addedBy[content]; ok {
		return t.added[i].id, true
	}
	id, ok := t.vocab[content]
	return id, ok
}

// EOSTokenIDs returns the ids that end generation: <|im_end|> (the end of a
// chat turn, what Qwen's instruct models emit) then <|endoftext|>, each only
// when the tokenizer has it.
func (t *Tokenizer) EOSTokenIDs() []int {
	var ids []int
	for _, c := range []string{IMEnd, EndOfText} {
		if id, ok := t.TokenID(c); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// ApplyChatTemplate renders messages in Qwen's ChatML format,
//
//	<|im_start|>{role}\n{content}<|im_end|>\n
//
// per message, then "<|im_start|>assistant\n" when addGenerationPrompt, and
// returns the token ids. The markers are the special ids; role and content are
// encoded as plain text, so a message cannot close its own turn. Each span
// between markers is encoded as one piece of text, as Hugging Face does when it
// tokenizes the rendered string, so ids match the real template for plain
// user/system turns. (Qwen3's full Jinja template adds tool and thinking
// handling on top of this; that belongs to the caller.) A tokenizer without the
// markers encodes their text instead.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) []int {
	return t.applyChatTemplate(msgs, addGenerationPrompt, nil)
}

func (t *Tokenizer) applyChatTemplate(msgs []Message, addGenerationPrompt bool, b *bound) []int {
	var ids []int
	for _, m := range msgs {
		ids = t.appendMarker(ids, IMStart, b)
		if b.exceeded(ids, t.textMinTokens(len(m.Role)+1+len(m.Content))) {
			// Refused before the turn's text is even put together.
			return ids
		}
		if m.Parts == nil {
			ids = t.encode(ids, m.Role+"\n"+m.Content, false, b)
		} else {
			ids = t.appendParts(ids, m.Role+"\n", m.Parts, b)
		}
		ids = t.appendMarker(ids, IMEnd, b)
		ids = t.encode(ids, "\n", false, b)
		if b.exceeded(ids, 0) {
			return ids
		}
	}
	if addGenerationPrompt {
		ids = t.appendMarker(ids, IMStart, b)
		ids = t.encode(ids, "assistant\n", false, b)
	}
	return ids
}

// appendParts encodes a turn's parts after head (the role line): each run
// of text between special tokens as one piece, as the rendered string is
// tokenized, and each special token as its id.
func (t *Tokenizer) appendParts(dst []int, head string, parts []Part, b *bound) []int {
	text := head
	for _, p := range parts {
		if p.Special == "" {
			text += p.Text
			continue
		}
		dst = t.encode(dst, text, false, b)
		text = ""
		dst = t.appendMarker(dst, p.Special, b)
		if b.exceeded(dst, 0) {
			return dst
		}
	}
	return t.encode(dst, text, false, b)
}

func (t *Tokenizer) appendMarker(dst []int, content string, b *bound) []int {
	if id, ok := t.TokenID(content); ok {
		return append(dst, id)
	}
	return t.encode(dst, content, false, b)
}

// Decode turns ids back into text. Special tokens decode to their content; ids
// that belong to no token decode to U+FFFD; byte sequences that are not valid
// UTF-8 become U+FFFD per maximal invalid subpart. The result is always valid
// UTF-8.
func (t *Tokenizer) Decode(ids []int) string {
	var buf []byte
	for _, id := range ids {
		buf = t.appendTokenBytes(buf, id)
	}
	if utf8.Valid(buf) {
		return string(buf)
	}
	return string(appendValidUTF8(nil, buf))
}

// replacement is U+FFFD as bytes; an unknown id contributes it to the byte
// stream, which keeps Decode and StreamDecoder in agreement.
const replacement = "\uFFFD"

func (t *Tokenizer) appendTokenBytes(dst []byte, id int) []byte {
	if id < 0 || id >= len(t.idBytes) || t.kinds[id] == kindNone {
		return append(dst, replacement...)
	}
	return append(dst, t.idBytes[id]...)
}

// TokenName returns how the vocabulary spells id: an added token's content
// (such as <|audio_pad|>), a model token's byte-level spelling (such as
// "Ġthe"), like Hugging Face's id_to_token; false for an id that is no
// token (a gap, or past the vocabulary).
func (t *Tokenizer) TokenName(id int) (string, bool) {
	switch {
	case id < 0 || id >= len(t.kinds):
		return "", false
	case t.kinds[id] == kindAdded || t.kinds[id] == kindSpecial:
		return t.idBytes[id], true
	case t.kinds[id] == kindModel:
		return t.vocabTokens[id], true
	}
	return "", false
}

// IsSpecial reports whether id is an added token marked special, the tokens a
// caller may want to hide from users or treat as control.
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.kinds) && t.kinds[id] == kindSpecial
}

// addedMatcher finds added tokens in text: leftmost start first and, among
// tokens starting there, the longest (Aho-Corasick LeftmostLongest in HF).
// Candidates are bucketed by first byte; the handful of added tokens Qwen has
// makes this cheaper than building an automaton.
type addedMatcher struct {
	byFirst [256][]int // indices into added, longest content first
	added   []addedToken
}

func newAddedMatcher(added []addedToken) addedMatcher {
	m := addedMatcher{added: added}
	for i, a := range added {
		b := a.content[0]
		m.byFirst[b] = append(m.byFirst[b], i)
	}
	for _, list := range m.byFirst {
		// Longest first, so the first prefix found is the longest match.
		slices.SortStableFunc(list, func(x, y int) int {
			return len(added[y].content) - len(added[x].content)
		})
	}
	return m
}

// find returns the start and index of the first added token at or after pos,
// or idx -1.
func (m *addedMatcher) find(text string, pos int) (at, idx int) {
	if len(m.added) == 0 {
		return 0, -1
	}
	for i := pos; i < len(text); i++ {
		for _, k := range m.byFirst[text[i]] {
			if strings.HasPrefix(text[i:], m.added[k].content) {
				return i, k
			}
		}
	}
	return 0, -1
}
