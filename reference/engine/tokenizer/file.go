package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ErrUnsupported marks a tokenizer.json that is well formed but asks for
// something this package does not implement (another model type, another
// pre-tokenizer, lstrip on an added token, ...). Loading fails rather than
// producing ids that differ from the reference library.
var ErrUnsupported = errors.New("unsupported tokenizer.json")

// maxTokenID bounds ids in a file: ids index dense tables, so a corrupt or
// hostile id of 2^40 must be an error, not an allocation. Real vocabularies
// are below 2^18.
const maxTokenID = 1 << 24

// Load reads a Hugging Face tokenizer.json. See Parse for what is supported.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse reads the contents of a tokenizer.json as Qwen ships it: model.type
// "BPE" with vocab and merges (as "a b" strings or ["a","b"] pairs), added
// tokens, normalizer NFC or none, pre_tokenizer Split with Qwen2's regex
// followed by ByteLevel without its own regex, and ByteLevel (or no) decoder
// and post-processor. Anything else is an error wrapping ErrUnsupported, so a
// file is never silently tokenized differently from the reference library.
// Unknown fields are ignored, as the reference library does. Added tokens are
// matched in the raw text whatever their "normalized" flag says (Qwen's are all
// false; with NFC the flag matters only next to combining marks).
func Parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: decoding tokenizer.json: %w", err)
	}
	spec, err := f.spec()
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := build(spec)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

type fileJSON struct {
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type addedJSON struct {
	ID         *int   `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   json.RawMessage   `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

// componentJSON covers the fields of the normalizer, pre-tokenizer, decoder and
// post-processor objects that matter here.
type componentJSON struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        *patternJSON      `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
}

type patternJSON struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

// buildSpec is the resolved content of a tokenizer, whatever its source.
type buildSpec struct {
	vocab        map[string]int
	merges       [][2]string
	added        []addedToken
	nfc          bool
	unk          int // -1: none
	fuseUnk      bool
	ignoreMerges bool
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, args...)...)
}

func (f *fileJSON) spec() (buildSpec, error) {
	var s buildSpec
	if !isNull(f.Truncation) {
		return s, unsupported("truncation must be null")
	}
	if !isNull(f.Padding) {
		return s, unsupported("padding must be null")
	}
	var err error
	if s.nfc, err = parseNormalizer(f.Normalizer); err != nil {
		return s, err
	}
	if err := checkPreTokenizer(f.PreTokenizer); err != nil {
		return s, err
	}
	if err := checkByteLevelOrNull("decoder", f.Decoder); err != nil {
		return s, err
	}
	if err := checkByteLevelOrNull("post_processor", f.PostProcessor); err != nil {
		return s, err
	}
	for i, a := range f.AddedTokens {
		if a.ID == nil {
			return s, fmt.Errorf("added_tokens[%d]: missing id", i)
		}
		if a.SingleWord || a.LStrip || a.RStrip {
			return s, unsupported("added_tokens[%d] %q: single_word, lstrip and rstrip must be false", i, a.Content)
		}
		s.added = append(s.added, addedToken{id: *a.ID, content: a.Content, special: a.Special, normalized: a.Normalized})
	}
	if err := s.parseModel(f.Model); err != nil {
		return s, err
	}
	return s, nil
}

func parseNormalizer(raw json.RawMessage) (nfc bool, err error) {
	if isNull(raw) {
		return false, nil
	}
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return false, fmt.Errorf("normalizer: %w", err)
	}
	switch c.Type {
	case "NFC":
		return true, nil
	case "Sequence":
		// A Sequence of NFCs is NFC: normalising twice changes nothing.
		for i, n := range c.Normalizers {
			var inner componentJSON
			if err := json.Unmarshal(n, &inner); err != nil {
				return false, fmt.Errorf("normalizer.normalizers[%d]: %w", i, err)
			}
			if inner.Type != "NFC" {
				return false, unsupported("normalizer.normalizers[%d].type %q; want NFC", i, inner.Type)
			}
		}
		return len(c.Normalizers) > 0, nil
	}
	return false, unsupported("normalizer.type %q; want NFC or none", c.Type)
}

func checkPreTokenizer(raw json.RawMessage) error {
	const want = "want Sequence[Split(Qwen2 regex, Isolated), ByteLevel(use_regex=false)]"
	if isNull(raw) {
		return unsupported("pre_tokenizer is missing; %s", want)
	}
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	if c.Type != "Sequence" || len(c.Pretokenizers) != 2 {
		return unsupported("pre_tokenizer.type %q with %d pretokenizers; %s", c.Type, len(c.Pretokenizers), want)
	}
	var split, bl componentJSON
	if err := json.Unmarshal(c.Pretokenizers[0], &split); err != nil {
		return fmt.Errorf("pre_tokenizer.pretokenizers[0]: %w", err)
	}
	if err := json.Unmarshal(c.Pretokenizers[1], &bl); err != nil {
		return fmt.Errorf("pre_tokenizer.pretokenizers[1]: %w", err)
	}
	switch {
	case split.Type != "Split":
		return unsupported("pre_tokenizer.pretokenizers[0].type %q; %s", split.Type, want)
	case split.Pattern == nil || split.Pattern.Regex == nil:
		return unsupported("pre_tokenizer.pretokenizers[0].pattern is not a Regex; %s", want)
	case *split.Pattern.Regex != qwen2Pattern:
		return unsupported("pre_tokenizer.pretokenizers[0].pattern.Regex %q is not Qwen2's pattern", *split.Pattern.Regex)
	case split.Behavior != "Isolated" || split.Invert:
		return unsupported("pre_tokenizer.pretokenizers[0]: behavior %q invert %v; want Isolated, false", split.Behavior, split.Invert)
	case bl.Type != "ByteLevel":
		return unsupported("pre_tokenizer.pretokenizers[1].type %q; %s", bl.Type, want)
	case bl.AddPrefixSpace:
		return unsupported("pre_tokenizer.pretokenizers[1].add_prefix_space must be false")
	case bl.UseRegex == nil || *bl.UseRegex:
		// Absent means true in HF: GPT-2's regex would split the pieces again.
		return unsupported("pre_tokenizer.pretokenizers[1].use_regex must be false")
	}
	return nil
}

func checkByteLevelOrNull(field string, raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	if c.Type != "ByteLevel" {
		return unsupported("%s.type %q; want ByteLevel or null", field, c.Type)
	}
	return nil
}

func (s *buildSpec) parseModel(raw json.RawMessage) error {
	if isNull(raw) {
		return fmt.Errorf("model is missing")
	}
	var m modelJSON
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	// Old files omit the type; HF then recognises BPE by its merges.
	if m.Type != "BPE" && !(m.Type == "" && m.Merges != nil) {
		return unsupported("model.type %q; only BPE is supported", m.Type)
	}
	switch {
	case m.Dropout != nil && *m.Dropout != 0:
		return unsupported("model.dropout %v: BPE dropout is random; want null", *m.Dropout)
	case m.ByteFallback:
		return unsupported("model.byte_fallback must be false for a byte-level BPE")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return unsupported("model.continuing_subword_prefix %q; want empty", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return unsupported("model.end_of_word_suffix %q; want empty", *m.EndOfWordSuffix)
	}
	if isNull(m.Vocab) {
		return fmt.Errorf("model.vocab is missing")
	}
	if err := json.Unmarshal(m.Vocab, &s.vocab); err != nil {
		return fmt.Errorf("model.vocab: want an object of token -> id: %w", err)
	}
	s.fuseUnk, s.ignoreMerges = m.FuseUnk, m.IgnoreMerges
	s.unk = -1
	if m.UnkToken != nil {
		id, ok := s.vocab[*m.UnkToken]
		if !ok {
			return fmt.Errorf("model.unk_token %q is not in the vocab", *m.UnkToken)
		}
		s.unk = id
	}
	for i, rawMerge := range m.Merges {
		var pair [2]string
		if trimmed := bytes.TrimSpace(rawMerge); len(trimmed) > 0 && trimmed[0] == '"' {
			// Legacy "a b" form; HF skips a "#version" header line and counts
			// ranks without it.
			var line string
			if err := json.Unmarshal(trimmed, &line); err != nil {
				return fmt.Errorf("model.merges[%d]: %w", i, err)
			}
			if strings.HasPrefix(line, "#version") {
				continue
			}
			parts := strings.Split(line, " ")
			if len(parts) != 2 {
				return fmt.Errorf("model.merges[%d] %q: want two tokens separated by one space", i, line)
			}
			pair = [2]string{parts[0], parts[1]}
		} else {
			var parts []string
			if err := json.Unmarshal(rawMerge, &parts); err != nil || len(parts) != 2 {
				return fmt.Errorf("model.merges[%d]: want \"a b\" or [\"a\", \"b\"], got %s", i, truncate(rawMerge))
			}
			pair = [2]string{parts[0], parts[1]}
		}
		s.merges = append(s.merges, pair)
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 60 {
		return string(b[:60]) + "..."
	}
	return string(b)
}

// build validates a spec and derives the tables encoding and decoding use.
func build(s buildSpec) (*Tokenizer, error) {
	maxID := -1
	for tok, id := range s.vocab {
		if tok == "" {
			return nil, fmt.Errorf("model.vocab: empty token")
		}
		if id < 0 || id >= maxTokenID {
			return nil, fmt.Errorf("model.vocab[%q]: id %d out of range [0, %d)", tok, id, maxTokenID)
		}
		maxID = max(maxID, id)
	}
	for i, a := range s.added {
		if a.content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: empty content", i)
		}
		if a.id < 0 || a.id >= maxTokenID {
			return nil, fmt.Errorf("added_tokens[%d] %q: id %d out of range [0, %d)", i, a.content, a.id, maxTokenID)
		}
		maxID = max(maxID, a.id)
	}

	t := &Tokenizer{
		vocab:        s.vocab,
		vocabTokens:  make([]string, maxID+1),
		idBytes:      make([]string, maxID+1),
		kinds:        make([]tokenKind, maxID+1),
		ranks:        make(map[uint64]merge, len(s.merges)),
		added:        slices.Clone(s.added),
		addedBy:      make(map[string]int, len(s.added)),
		nfc:          s.nfc,
		unk:          int32(s.unk),
		fuseUnk:      s.fuseUnk,
		ignoreMerges: s.ignoreMerges,
	}
	if t.vocab == nil {
		t.vocab = map[string]int{}
	}
	for tok, id := range t.vocab {
		if prev := t.vocabTokens[id]; prev != "" {
			a, b := min(prev, tok), max(prev, tok) // deterministic message
			return nil, fmt.Errorf("model.vocab: id %d is used by both %q and %q", id, a, b)
		}
		t.vocabTokens[id] = tok
		t.idBytes[id] = tokenBytes(tok)
		t.kinds[id] = kindModel
	}
	for i, a := range t.added {
		if j, dup := t.addedBy[a.content]; dup {
			return nil, fmt.Errorf("added_tokens[%d] %q: duplicate of added_tokens[%d]", i, a.content, j)
		}
		switch t.kinds[a.id] {
		case kindAdded, kindSpecial:
			return nil, fmt.Errorf("added_tokens[%d] %q: id %d is already taken by another added token", i, a.content, a.id)
		case kindModel:
			// Files may list a vocab token again as an added token (GPT-2's
			// <|endoftext|>); a different token on the same id is an error.
			if t.vocabTokens[a.id] != a.content {
				return nil, fmt.Errorf("added_tokens[%d] %q: id %d belongs to vocab token %q", i, a.content, a.id, t.vocabTokens[a.id])
			}
		}
		t.addedBy[a.content] = i
		t.idBytes[a.id] = a.content
		t.kinds[a.id] = kindAdded
		if a.special {
			t.kinds[a.id] = kindSpecial
		}
	}
	for b := range 256 {
		t.byteIDs[b] = -1
		if id, ok := t.vocab[string(byteToRune[b])]; ok {
			t.byteIDs[b] = int32(id)
		}
	}
	for i, m := range s.merges {
		a, okA := t.vocab[m[0]]
		b, okB := t.vocab[m[1]]
		c, okC := t.vocab[m[0]+m[1]]
		if !okA || !okB || !okC {
			return nil, fmt.Errorf("model.merges[%d] [%q, %q]: %q, %q and their concatenation must all be in the vocab", i, m[0], m[1], m[0], m[1])
		}
		t.merges = append(t.merges, [2]int32{int32(a), int32(b)})
		// A repeated pair keeps its last rank, as HF's map insertion does.
		t.ranks[pairKey(int32(a), int32(b))] = merge{rank: int32(i), id: int32(c)}
	}
	t.matcher = newAddedMatcher(t.added)
	t.maxTokenBytes, t.everyByte = encodeSpan(t)
	return t, nil
}

// Save writes the tokenizer as a tokenizer.json that Load (and Hugging Face)
// reads back to the same tokenizer. The file is written to a temporary name
// and renamed, so a reader never sees half a file.
func (t *Tokenizer) Save(path string) error {
	data := t.marshal()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tokenizer-*.json")
	if err != nil {
		return fmt.Errorf("tokenizer: save: %w", err)
	}
	_, werr := tmp.Write(data)
	merr := tmp.Chmod(0o644) // CreateTemp makes 0600; this is not a secret
	cerr := tmp.Close()
	if err := errors.Join(werr, merr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("tokenizer: save: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("tokenizer: save: %w", err)
	}
	return nil
}

// marshal renders the tokenizer.json in the layout the reference library
// writes: vocab in id order, merges as pairs (which, unlike "a b" strings,
// survive tokens containing spaces).
func (t *Tokenizer) marshal() []byte {
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	// Structs rather than maps keep "type" first, as HF writes it.
	type byteLevelJSON struct {
		Type           string `json:"type"`
		AddPrefixSpace bool   `json:"add_prefix_space"`
		TrimOffsets    bool   `json:"trim_offsets"`
		UseRegex       bool   `json:"use_regex"`
	}
	type splitJSON struct {
		Type    string `json:"type"`
		Pattern struct {
			Regex string `json:"Regex"`
		} `json:"pattern"`
		Behavior string `json:"behavior"`
		Invert   bool   `json:"invert"`
	}
	type sequenceJSON struct {
		Type          string `json:"type"`
		Pretokenizers []any  `json:"pretokenizers"`
	}
	byteLevelComponent := byteLevelJSON{Type: "ByteLevel"}
	split := splitJSON{Type: "Split", Behavior: "Isolated"}
	split.Pattern.Regex = qwen2Pattern
	pre := sequenceJSON{Type: "Sequence", Pretokenizers: []any{split, byteLevelComponent}}
	added := make([]addedJSON, len(t.added))
	for i, a := range t.added {
		added[i] = addedJSON{ID: &a.id, Content: a.content, Normalized: a.normalized, Special: a.special}
	}
	var normalizer any
	if t.nfc {
		normalizer = map[string]string{"type": "NFC"}
	}
	var unk any
	if t.unk >= 0 {
		unk = t.vocabTokens[t.unk]
	}

	w("{\n")
	w("  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n")
	w("  \"added_tokens\": %s,\n", jsonIndent(added, "  "))
	w("  \"normalizer\": %s,\n", jsonIndent(normalizer, "  "))
	w("  \"pre_tokenizer\": %s,\n", jsonIndent(pre, "  "))
	w("  \"post_processor\": %s,\n", jsonIndent(byteLevelComponent, "  "))
	w("  \"decoder\": %s,\n", jsonIndent(byteLevelComponent, "  "))
	w("  \"model\": {\n")
	w("    \"type\": \"BPE\",\n    \"dropout\": null,\n")
	w("    \"unk_token\": %s,\n", jsonIndent(unk, ""))
	w("    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n")
	w("    \"fuse_unk\": %v,\n    \"byte_fallback\": false,\n    \"ignore_merges\": %v,\n", t.fuseUnk, t.ignoreMerges)
	w("    \"vocab\": {")
	sep := "\n"
	for id, tok := range t.vocabTokens {
		if tok == "" {
			continue
		}
		w("%s      %s: %d", sep, jsonString(tok), id)
		sep = ",\n"
	}
	w("\n    },\n")
	w("    \"merges\": [")
	sep = "\n"
	for _, m := range t.merges {
		w("%s      [%s, %s]", sep, jsonString(t.vocabTokens[m[0]]), jsonString(t.vocabTokens[m[1]]))
		sep = ",\n"
	}
	if len(t.merges) > 0 {
		w("\n    ")
	}
	w("]\n  }\n}\n")
	return b.Bytes()
}

// jsonString quotes s as a JSON string, escaping only what JSON requires; it
// is the hot path of marshal (every vocab entry and merge). Vocab tokens are
// valid UTF-8: they come from JSON or from the byte-level alphabet.
func jsonString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = fmt.Appendf(b, `\u%04x`, c)
		default:
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}

// jsonIndent encodes v without HTML escaping ("<|im_end|>" stays readable).
// Everything passed here is plain data, so encoding cannot fail.
func jsonIndent(v any, prefix string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent(prefix, "  ")
	if err := enc.Encode(v); err != nil {
		panic("tokenizer: encoding JSON: " + err.Error())
	}
	return strings.TrimSuffix(b.String(), "\n")
}
