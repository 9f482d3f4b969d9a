package bench

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

const shareGPTSample = `[
  {"id": "a", "conversations": [
    {"from": "human", "value": "What is prefill/decode disaggregation?"},
    {"from": "gpt", "value": "Running the prompt and the generation on different workers, so each can be sized and batched for its own work."},
    {"from": "human", "value": "Thanks"},
    {"from": "gpt", "value": "You are welcome."}]},
  {"id": "no-answer", "conversations": [{"from": "human", "value": "Hello?"}]},
  {"id": "answer-first", "conversations": [
    {"from": "gpt", "value": "I speak first."},
    {"from": "human", "value": "Then answer me"},
    {"from": "gpt", "value": "Done"}]},
  {"id": "empty", "conversations": []},
  {"id": "blank", "conversations": [{"from": "human", "value": "   "}, {"from": "gpt", "value": "x"}]},
  {"id": "user-assistant", "conversations": [{"from": "user", "value": "Short"}, {"from": "assistant", "value": "` + "0123456789012345678901234567890123456789" + `"}], "extra": {"ignored": true}}
]`

func TestLoadShareGPT(t *testing.T) {
	ds, err := LoadShareGPT(strings.NewReader(shareGPTSample), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ds.Len() != 3 {
		t.Fatalf("%d usable conversations; want 3 (a, answer-first, user-assistant)", ds.Len())
	}
	got := map[string]Prompt{}
	for i := range ds.Len() {
		p := ds.Prompt(i)
		got[p.Text] = p
	}
	a, ok := got["What is prefill/decode disaggregation?"]
	if !ok {
		t.Fatalf("prompts %v", got)
	}
	// 111 bytes of answer at about four bytes a token.
	if a.MaxTokens != 28 || a.InputTokens != 10 {
		t.Errorf("first conversation: %+v; want 28 output tokens (the first answer only), 10 input", a)
	}
	if p, ok := got["Then answer me"]; !ok || p.MaxTokens != 1 {
		t.Errorf("the human turn after an opening gpt turn is the prompt: %+v", got)
	}
	if p := got["Short"]; p.MaxTokens != 10 {
		t.Errorf("user/assistant roles: %+v", p)
	}
	if !reflect.DeepEqual(ds.Prompt(ds.Len()), ds.Prompt(0)) {
		t.Error("prompts do not cycle past the end")
	}

	capped, err := LoadShareGPT(strings.NewReader(shareGPTSample), 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range capped.Len() {
		if p := capped.Prompt(i); p.MaxTokens > 5 || p.MaxTokens < 1 {
			t.Errorf("--output-len 5: %+v", p)
		}
	}

	order := func(seed uint64) []string {
		ds, _ := LoadShareGPT(strings.NewReader(shareGPTSample), 0, seed)
		var texts []string
		for i := range ds.Len() {
			texts = append(texts, ds.Prompt(i).Text)
		}
		return texts
	}
	if !slices.Equal(order(3), order(3)) {
		t.Error("the same seed shuffles differently")
	}
}

func TestLoadShareGPTErrors(t *testing.T) {
	for in, want := range map[string]string{
		`{"conversations": []}`:                                "JSON array",
		`[{"conversations": [{"from":"human","value":"hi"}]}]`: "no conversation",
		`[{"conversations": 5}]`:                               "entry 0",
		`[{"conversations": []}`:                               "after 0 entries",
		``:                                                     "sharegpt",
	} {
		if _, err := LoadShareGPT(strings.NewReader(in), 0, 0); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v; want one mentioning %q", in, err, want)
		}
	}
}

func TestRandomDataset(t *testing.T) {
	r := Random{InputLen: 50, OutputLen: 16, Seed: 9}
	p := r.Prompt(3)
	if n := len(strings.Fields(p.Text)); n != 50 || p.InputTokens != 50 || p.MaxTokens != 16 {
		t.Errorf("%d words, %+v", n, p)
	}
	if !reflect.DeepEqual(r.Prompt(3), p) {
		t.Error("the same seed and index give another prompt")
	}
	if r.Prompt(4).Text == p.Text || (Random{InputLen: 50, OutputLen: 16, Seed: 10}).Prompt(3).Text == p.Text {
		t.Error("another index or seed gives the same prompt")
	}
	if EstimateTokens("") != 0 || EstimateTokens("a") != 1 || EstimateTokens("abcdefgh") != 2 {
		t.Error("EstimateTokens")
	}
}
