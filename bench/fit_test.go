package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
)

// A tokenizer model of a fake server: how many tokens it makes of a text.
type countTokens func(text string) int

// byteTokens is the reference engine's built-in tokenizer: a token a byte.
func byteTokens(text string) int { return len(text) }

// wordTokens is a BPE vocabulary that has every common word, with its
// leading space, and every punctuation mark as one token.
func wordTokens(text string) int {
	n := len(strings.FieldsFunc(text, func(r rune) bool { return !unicode.IsLetter(r) }))
	for _, r := range text {
		if unicode.IsPunct(r) {
			n++
		}
	}
	return n
}

// tokenCountingServer answers one-token streams whose usage.prompt_tokens
// is count of the prompt (completions) or of the one message's content
// plus template tokens (chat), and records every prompt's count.
func tokenCountingServer(t *testing.T, count countTokens, bos, template int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt   *string `json:"prompt"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n := 0
		switch {
		case req.Prompt != nil:
			n = bos + count(*req.Prompt)
		case len(req.Messages) == 1:
			n = template + count(req.Messages[0].Content)
		default:
			http.Error(w, "want a prompt or one message", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"text\":\"a\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":1}}\n\n", n)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// MeasureFit learns the server's counts, and the fitted random dataset
// then makes every prompt exactly --input-len tokens as the server counts
// them: on completions special tokens included, as vLLM takes them off
// input_len; on chat the template's on top. It holds for a byte tokenizer,
// whose words cost their length, and a word-level one, for lengths from 1.
func TestFittedPromptsAreTheTokensAsked(t *testing.T) {
	for _, tok := range []struct {
		name  string
		count countTokens
	}{{"bytes", byteTokens}, {"words", wordTokens}} {
		for _, ep := range []struct {
			endpoint      string
			bos, template int
		}{{EndpointCompletions, 1, 0}, {EndpointCompletions, 0, 0}, {EndpointChat, 0, 9}} {
			t.Run(fmt.Sprintf("%s/%s/bos%d", tok.name, ep.endpoint, ep.bos), func(t *testing.T) {
				srv := tokenCountingServer(t, tok.count, ep.bos, ep.template)
				fit, err := MeasureFit(t.Context(), Config{Target: Target{BaseURL: srv.URL, Endpoint: ep.endpoint}})
				if err != nil {
					t.Fatal(err)
				}
				added := ep.bos + ep.template
				if fit.Added != added || fit.AddedInInputLen != (ep.endpoint == EndpointCompletions) || fit.Probes != len(words)+len(fitPunctuation)+1 {
					t.Fatalf("fit %+v; want %d tokens added", fit, added)
				}
				for _, inputLen := range []int{2, 3, 7, 16, 64, 301} {
					ds, err := Random{InputLen: inputLen, OutputLen: 4, Seed: 3}.Fit(fit)
					if err != nil {
						t.Fatal(err)
					}
					want := inputLen
					if ep.endpoint == EndpointChat {
						want += ep.template
					}
					for i := range 5 {
						p := ds.Prompt(i)
						sent := ep.template + tok.count(p.Text)
						if ep.endpoint == EndpointCompletions {
							sent = ep.bos + tok.count(p.Text)
						}
						if sent != want || p.InputTokens != want || p.MaxTokens != 4 {
							t.Errorf("--input-len %d, prompt %d: %d tokens sent, %d estimated; want %d: %q", inputLen, i, sent, p.InputTokens, want, p.Text)
						}
					}
					if inputLen >= 16 && ds.Prompt(1).Text == ds.Prompt(2).Text {
						t.Errorf("--input-len %d: two requests share a prompt", inputLen)
					}
				}
			})
		}
	}
}

// A server whose counts do not add up (the same for every text) or that
// reports no usage leaves the prompts unfitted, with the reason.
func TestMeasureFitRefusesCountsThatDoNotAddUp(t *testing.T) {
	constant := tokenCountingServer(t, func(string) int { return 3 }, 0, 0)
	if _, err := MeasureFit(t.Context(), Config{Target: Target{BaseURL: constant.URL}}); err == nil || !strings.Contains(err.Error(), "do not add up") {
		t.Errorf("constant counts: %v", err)
	}
	f := newFakeServer(t) // usage.prompt_tokens is always 7
	if _, err := MeasureFit(t.Context(), Config{Target: Target{BaseURL: f.URL, Endpoint: EndpointCompletions}}); err == nil || !strings.Contains(err.Error(), "do not add up") {
		t.Errorf("the fake server: %v", err)
	}
	// --input-len 1 leaves no room for text beside a BOS on completions.
	srv := tokenCountingServer(t, byteTokens, 1, 0)
	fit, err := MeasureFit(t.Context(), Config{Target: Target{BaseURL: srv.URL, Endpoint: EndpointCompletions}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (Random{InputLen: 1, OutputLen: 1}).Fit(fit); err == nil || !strings.Contains(err.Error(), "--input-len 1 is too small") {
		t.Errorf("--input-len 1 with a BOS: %v", err)
	}
}

// Where the pieces cannot make the count asked for (every piece costs
// several tokens), the text is the nearest count below it they can make.
func TestFitTextFallsShortWhenThePiecesCannot(t *testing.T) {
	f := &PromptFit{costs: make([]int, len(words)+len(fitPunctuation))}
	for k := range f.costs {
		f.costs[k] = 4
	}
	ft := fitText(f, 10)
	if ft.tokens != 8 {
		t.Fatalf("planned %d tokens; want 8", ft.tokens)
	}
	if got := ft.text(rand.New(rand.NewPCG(1, 2))); strings.Count(got, " ")+strings.Count(got, ".")+strings.Count(got, ",") != 2 {
		t.Errorf("text %q is not two pieces", got)
	}
}
