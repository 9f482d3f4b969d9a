package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
)

// Fitting prompts to a token count without the model's tokenizer.
//
// vllm bench serve's random dataset makes a prompt of exactly input_len
// tokens with the model's tokenizer (vllm/benchmarks/datasets.py at
// 0056b87fc1fd, RandomDataset: random token ids, decoded, re-encoded and cut
// to length, less the special tokens the tokenizer adds itself), and sends
// it as the user message's content on the chat endpoint, the template on
// top (vllm/benchmarks/lib/endpoint_request_func.py at 02cfb534df56,
// async_request_openai_chat_completions). omnipd bench has no
// tokenizer of the served model, so it asks the server: MeasureFit sends a
// few one-token requests and reads their usage.prompt_tokens to learn what
// each piece of the random text costs and what the endpoint adds around a
// prompt's text. Both add up: byte-level BPE tokenizers (Qwen's, GPT's,
// Llama 3's) split text into words with their leading space before merging,
// so a text of such words costs the sum of what each costs alone.

// fitPunctuation are the pieces that make up the last tokens of a prompt
// when no word fits the remainder; most tokenizers spell each as one token.
var fitPunctuation = []string{".", ","}

// fitConcurrency bounds the measuring requests in flight at once.
const fitConcurrency = 8

// PromptFit is what the server's tokenizer makes of the random datasets'
// text, as MeasureFit measured it.
type PromptFit struct {
	// Added is how many tokens the endpoint adds to every prompt's text: on
	// the chat endpoint the chat template's (turn markers, role, the
	// assistant's header, a default system prompt); on completions the
	// special tokens the tokenizer adds (a BOS; none for Qwen).
	Added int `json:"added_tokens"`
	// AddedInInputLen says Added counts toward the input length, as on
	// completions, where vLLM's random dataset takes the tokenizer's special
	// tokens off input_len; on the chat endpoint it comes on top, as the
	// template does of vLLM's input_len tokens of message text.
	AddedInInputLen bool `json:"added_in_input_len"`
	// Probes is the number of one-token requests the measure took.
	Probes int `json:"probes"`
	// costs are the tokens of each piece: words, then fitPunctuation.
	costs []int
}

// fitPiece is the text of piece k: a word with its leading space, or a
// punctuation mark.
func fitPiece(k int) string {
	if k < len(words) {
		return " " + words[k]
	}
	return fitPunctuation[k-len(words)]
}

// MeasureFit learns from the server what the random datasets' pieces of
// text cost in its tokenizer and what cfg.Target's endpoint adds around a
// prompt, from the usage.prompt_tokens of one-token requests: the first
// word alone and twice (its cost, and so what the endpoint adds), every
// other word alone, and the first word with each punctuation mark. The
// requests share no more than one word with a measured prompt, so they warm
// no prefix cache for the run. An error says why the server's counts cannot
// be used (a request failed, no usage was reported, the counts do not add
// up).
func MeasureFit(ctx context.Context, cfg Config) (*PromptFit, error) {
	t := cfg.Target
	t.Audio, t.IgnoreEOS = false, false
	if err := t.Validate(); err != nil {
		return nil, err
	}
	client := cfg.Client
	if client == nil {
		client = NewHTTPClient(fitConcurrency)
	}
	first := fitPiece(0)
	texts := []string{first, first + first}
	for k := 1; k < len(words)+len(fitPunctuation); k++ {
		if k < len(words) {
			texts = append(texts, fitPiece(k))
		} else {
			texts = append(texts, first+fitPiece(k))
		}
	}
	runID := cfg.RunID
	if runID == "" {
		runID = newRunID()
	}
	counts := make([]int, len(texts))
	errs := make([]error, len(texts))
	slots := make(chan struct{}, fitConcurrency)
	var wg sync.WaitGroup
	for i, text := range texts {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			rec := Record{RequestID: fmt.Sprintf("%s-fit-%d", runID, i)}
			send(ctx, client, t, Prompt{Text: text, MaxTokens: 1}, &rec, cfg.Timeout)
			switch {
			case !rec.Success:
				errs[i] = fmt.Errorf("a request of %q failed: %s", text, rec.Error)
			case !rec.PromptTokensReported:
				errs[i] = errors.New("the server reports no usage.prompt_tokens")
			default:
				counts[i] = rec.PromptTokens
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return fitFromCounts(texts, counts, t.Endpoint == EndpointCompletions)
}

// fitFromCounts solves MeasureFit's counts (in its order of texts) for the
// pieces' costs and the tokens the endpoint adds.
func fitFromCounts(texts []string, counts []int, completions bool) (*PromptFit, error) {
	one, two := counts[0], counts[1]
	f := &PromptFit{Added: 2*one - two, AddedInInputLen: completions, Probes: len(counts), costs: make([]int, len(words)+len(fitPunctuation))}
	f.costs[0] = two - one
	for k := 1; k < len(f.costs); k++ {
		if k < len(words) {
			f.costs[k] = counts[k+1] - f.Added
		} else {
			f.costs[k] = counts[k+1] - one
		}
	}
	if f.Added < 0 || f.costs[0] < 1 {
		return nil, fmt.Errorf("the server's token counts do not add up: %q counts %d prompt tokens, %q %d", texts[0], one, texts[1], two)
	}
	for k := 1; k < len(f.costs); k++ {
		if f.costs[k] < 1 {
			return nil, fmt.Errorf("the server's token counts do not add up: %q counts %d prompt tokens, %q %d", texts[k+1], counts[k+1], texts[0], one)
		}
	}
	return f, nil
}

// fittedText makes prompt texts of one token count from a PromptFit.
type fittedText struct {
	fit *PromptFit
	// tokens is the count every text has: the one asked for, or when the
	// pieces cannot make it (a tokenizer whose every piece is several
	// tokens), the nearest below it that they can.
	tokens int
	// reach[n] says n tokens can be made of the pieces.
	reach []bool
}

// fitText plans texts of textTokens tokens.
func fitText(f *PromptFit, textTokens int) *fittedText {
	reach := make([]bool, textTokens+1)
	reach[0] = true
	for n := 1; n <= textTokens; n++ {
		for _, c := range f.costs {
			if c <= n && reach[n-c] {
				reach[n] = true
				break
			}
		}
	}
	ft := &fittedText{fit: f, reach: reach, tokens: textTokens}
	for ft.tokens > 1 && !reach[ft.tokens] {
		ft.tokens--
	}
	if !reach[ft.tokens] {
		// Not even the shortest piece fits: take it, one token or a few
		// over.
		ft.tokens = f.costs[0]
		for _, c := range f.costs {
			ft.tokens = min(ft.tokens, c)
		}
		ft.reach = make([]bool, ft.tokens+1)
		ft.reach[0], ft.reach[ft.tokens] = true, true
	}
	return ft
}

// text draws a text of ft.tokens tokens: random words, each the first
// from a random place in the list that leaves a remainder the pieces can
// still make; punctuation only when no word does.
func (ft *fittedText) text(rng *rand.Rand) string {
	var b strings.Builder
	costs := ft.fit.costs
	fits := func(k, rem int) bool { return costs[k] <= rem && ft.reach[rem-costs[k]] }
	for rem := ft.tokens; rem > 0; {
		k := -1
		start := rng.IntN(len(words))
		for j := range len(words) {
			if w := (start + j) % len(words); fits(w, rem) {
				k = w
				break
			}
		}
		for p := len(words); k < 0 && p < len(costs); p++ {
			if fits(p, rem) {
				k = p
			}
		}
		if k < 0 {
			break // unreachable: reach[rem] holds
		}
		b.WriteString(fitPiece(k))
		rem -= costs[k]
	}
	return b.String()
}
