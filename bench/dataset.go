package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"unicode/utf8"
)

// Prompt is one request's input and the answer length asked for.
type Prompt struct {
	Text string
	// InputTokens estimates the prompt's length in tokens; the server's
	// usage.prompt_tokens replaces it when reported.
	InputTokens int
	// MaxTokens is the request's max_tokens.
	MaxTokens int
	// Media are content parts sent after the text, in one user message
	// (the random-mm dataset); chat requests only.
	Media []MediaPart
}

// MediaBytes is the size of the prompt's media files.
func (p Prompt) MediaBytes() int {
	n := 0
	for _, m := range p.Media {
		n += m.Bytes
	}
	return n
}

// Dataset hands out the prompt of the i-th request. The same seed gives the
// same prompts whatever order requests are sent in.
type Dataset interface {
	Prompt(i int) Prompt
}

// EstimateTokens guesses a text's length in tokens without the model's
// tokenizer: about four bytes of English per token, at least one for any
// non-empty text.
func EstimateTokens(s string) int {
	if s == "" {
		return 0
	}
	return max(1, (len(s)+3)/4)
}

// Random is the random dataset: prompts of common English words drawn
// afresh for every request, so no two share a prefix by design. Fitted to
// the server's token counts (Fit), a prompt is InputLen tokens as the server
// counts them, as vllm bench serve's random dataset makes it with the
// model's tokenizer: its text alone on the chat endpoint, where the chat
// template comes on top, and text and special tokens together on
// completions. Unfitted, it is InputLen words, about one token each in a
// byte-level BPE vocabulary such as Qwen's.
type Random struct {
	InputLen, OutputLen int
	Seed                uint64
	fitted              *fittedText
}

var _ Dataset = Random{}

// Fit is the dataset with its prompts fitted to f. It refuses an InputLen
// that leaves no room for text beside the tokens the endpoint adds.
func (r Random) Fit(f *PromptFit) (Dataset, error) { return r.fit(f) }

func (r Random) fit(f *PromptFit) (Random, error) {
	text := r.InputLen
	if f.AddedInInputLen {
		text -= f.Added
	}
	if text < 1 {
		return r, fmt.Errorf("--input-len %d is too small: the server adds %d tokens to every prompt, so a prompt needs at least %d", r.InputLen, f.Added, f.Added+1)
	}
	r.fitted = fitText(f, text)
	return r, nil
}

// Prompt draws request i's words from a generator seeded by (Seed, i).
func (r Random) Prompt(i int) Prompt {
	rng := rand.New(rand.NewPCG(r.Seed, uint64(i)))
	if r.fitted != nil {
		return Prompt{Text: r.fitted.text(rng), InputTokens: r.fitted.fit.Added + r.fitted.tokens, MaxTokens: r.OutputLen}
	}
	var b strings.Builder
	for w := range r.InputLen {
		if w > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return Prompt{Text: b.String(), InputTokens: r.InputLen, MaxTokens: r.OutputLen}
}

// words are short, common English words: each is one token with its leading
// space in byte-level BPE vocabularies such as Qwen's. They are few because
// fitting prompts to the server's tokenizer measures each (MeasureFit); 48
// still make two prompts' first 16 tokens alike once in 48^16.
var words = uniqueWords(`the of and to in is was for on that with as by at from his it an were are which
be this had not but first one their its new after who they have her she two been other when there all
time may years more most`)

func uniqueWords(s string) []string {
	var out []string
	seen := map[string]bool{}
	for _, w := range strings.Fields(s) {
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

// ShareGPT is a sample of a ShareGPT conversation dump: each entry's first
// human turn is a prompt and the answer after it sets the output length.
type ShareGPT struct {
	entries []Prompt
}

var _ Dataset = (*ShareGPT)(nil)

// Len is the number of usable conversations.
func (s *ShareGPT) Len() int { return len(s.entries) }

// Prompt is entry i of the shuffled sample, cycling when i runs past it.
func (s *ShareGPT) Prompt(i int) Prompt { return s.entries[i%len(s.entries)] }

// LoadShareGPT reads a ShareGPT JSON array ([{"conversations":[{"from":
// "human","value":...},{"from":"gpt","value":...}]}, ...]) one entry at a
// time, so multi-gigabyte dumps need not fit in memory twice. The prompt is
// the first human (or user) turn; the output length is the estimated token
// count of the answer that follows it, capped at maxOutput when that is
// positive. Entries without such a pair are skipped. The entries are
// shuffled with seed.
func LoadShareGPT(r io.Reader, maxOutput int, seed uint64) (*ShareGPT, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("sharegpt: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, errors.New("sharegpt: want a JSON array of conversations")
	}
	s := &ShareGPT{}
	for n := 0; dec.More(); n++ {
		var entry struct {
			Conversations []struct {
				From  string `json:"from"`
				Value string `json:"value"`
			} `json:"conversations"`
		}
		if err := dec.Decode(&entry); err != nil {
			return nil, fmt.Errorf("sharegpt: entry %d: %w", n, err)
		}
		prompt, answer := "", ""
		for _, turn := range entry.Conversations {
			switch strings.ToLower(turn.From) {
			case "human", "user":
				if prompt == "" {
					prompt = turn.Value
				}
			case "gpt", "assistant", "chatgpt":
				if prompt != "" && answer == "" {
					answer = turn.Value
				}
			}
		}
		if strings.TrimSpace(prompt) == "" || strings.TrimSpace(answer) == "" || !utf8.ValidString(prompt) {
			continue
		}
		out := EstimateTokens(answer)
		if maxOutput > 0 {
			out = min(out, maxOutput)
		}
		s.entries = append(s.entries, Prompt{Text: prompt, InputTokens: EstimateTokens(prompt), MaxTokens: out})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("sharegpt: after %d entries: %w", len(s.entries), err)
	}
	if len(s.entries) == 0 {
		return nil, errors.New("sharegpt: no conversation has a human turn followed by an answer")
	}
	rng := rand.New(rand.NewPCG(seed, 0x5ec0))
	rng.Shuffle(len(s.entries), func(i, j int) { s.entries[i], s.entries[j] = s.entries[j], s.entries[i] })
	return s, nil
}
