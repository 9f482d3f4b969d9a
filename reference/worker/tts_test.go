package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
)

// The TTS names of the reference vocabulary, spelled as Qwen3-Omni's
// tokenizer spells them (tts_pad_token_id, tts_bos_token_id and
// tts_eos_token_id in its config).
var ttsNames = [3]string{"<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"}

// A stash carries the word embeddings of the vocabulary's own TTS pad, bos
// and eos tokens, whether it is kept whole or grows (async chunk), and
// whether the checkpoint's config names their ids or only the tokenizer
// spells them.
func TestStashCarriesTheTTSTokens(t *testing.T) {
	var want [3][]float32
	for i, name := range ttsNames {
		id, ok := testTokenizer.TokenID(name)
		if !ok || !testTokenizer.IsSpecial(id) {
			t.Fatalf("the reference vocabulary has no special token %s", name)
		}
		want[i] = testModel.Embedding(id)
	}
	unnamed := *model.Default()
	unnamed.Config.TTSTokenIDs = nil
	for name, m := range map[string]*model.Model{"config": testModel, "tokenizer": &unnamed} {
		url := newWorkerOf(t, m, testTokenizer)
		for _, stream := range []bool{false, true} {
			b := body([]int{'h', 'i'}, 3, 0, 0)
			key := name + "/batch"
			if stream {
				key = name + "/stream"
			}
			b["omnipd_conditioning"] = map[string]any{"key": key, "layer": 2, "stream": stream}
			if _, status, err := post(context.Background(), url, key, b); err != nil || status != 200 {
				t.Fatalf("%s: status %d, %v", key, status, err)
			}
			var st *stageapi.Conditioning
			var err error
			if stream {
				st, _, err = stageconn.FetchFrom(context.Background(), nil, url, key, testSecret, 0)
			} else {
				st, err = stageconn.Fetch(context.Background(), nil, url, key, testSecret)
			}
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if got := [3][]float32{st.TTSPad, st.TTSBos, st.TTSEos}; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: the stash's TTS embeddings are not those of %v", key, ttsNames)
			}
		}
	}
}

// A TTS id that stands for another token — a multimodal marker, a chat
// marker, text, or another of the three — is refused at start-up, whether
// it was configured or came from the checkpoint's config.
func TestTTSTokenIDOfAnotherMeaningIsRefused(t *testing.T) {
	eng := runTestEngine(t, engine.Config{})
	id := func(name string) int {
		n, ok := testTokenizer.TokenID(name)
		if !ok {
			t.Fatalf("no token %s", name)
		}
		return n
	}
	pad, bos, eos := id(ttsNames[0]), id(ttsNames[1]), id(ttsNames[2])
	for _, c := range []struct {
		name string
		ids  [3]int
		want string
	}{
		{"audio placeholder", [3]int{id("<|audio_pad|>"), bos, eos}, "<|audio_pad|>"},
		{"vision marker", [3]int{pad, id("<|vision_end|>"), eos}, "<|vision_end|>"},
		{"end of turn", [3]int{pad, bos, id("<|im_end|>")}, "<|im_end|>"},
		{"a text token", [3]int{'a', bos, eos}, "text"},
		{"the roles swapped", [3]int{bos, pad, eos}, "<tts_text_bos>"},
		{"outside the vocabulary", [3]int{pad, bos, testModel.Config.VocabSize}, "outside the vocabulary"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(Config{Engine: eng, TTSTokenIDs: c.ids, Logger: slog.New(slog.DiscardHandler)})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New with TTS ids %v: %v; want an error naming %s", c.ids, err, c.want)
			}
		})
	}

	// The checkpoint's config (tts_pad_token_id, …) is where the ids come
	// from when none are configured.
	m := *model.Default()
	m.Config.TTSTokenIDs = []int{id("<|image_pad|>"), bos, eos}
	_, err := New(Config{Engine: runEngineOf(t, &m), Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "<|image_pad|>") || !strings.Contains(err.Error(), "tts_pad_token_id") {
		t.Fatalf("New with a checkpoint whose tts_pad_token_id is <|image_pad|>: %v", err)
	}
}

// newWorkerOf serves m and tok with the test secret; it returns the URL.
func newWorkerOf(t *testing.T, m *model.Model, tok *tokenizer.Tokenizer) string {
	t.Helper()
	srv, err := New(Config{Engine: runEngineWith(t, m, tok), Secret: testSecret, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); srv.Close() })
	return hs.URL
}

// runEngineOf starts an engine of m with the test tokenizer.
func runEngineOf(t *testing.T, m *model.Model) *engine.Engine {
	return runEngineWith(t, m, testTokenizer)
}

// runEngineWith starts an engine of m and tok that runs until the test and
// its cleanups are done.
func runEngineWith(t *testing.T, m *model.Model, tok *tokenizer.Tokenizer) *engine.Engine {
	t.Helper()
	eng, err := engine.New(m, tok, engine.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return eng
}

// A model that is no omni Thinker — neither its config nor its tokenizer
// knows TTS tokens — serves text and refuses, with a 400 naming the
// parameter, to keep conditioning for a Talker. A checkpoint that names
// its TTS ids in config.json has them used even when its tokenizer does not
// spell them (the rows are unused by text).
func TestTTSTokensOfATokenizerWithoutThem(t *testing.T) {
	tok := tokenizerWithout(t, ttsNames[:]...)
	start := func(m *model.Model) string { return newWorkerOf(t, m, tok) }

	textOnly := *model.Default()
	textOnly.Config.TTSTokenIDs = nil
	url := start(&textOnly)
	if _, status, err := post(context.Background(), url, "text", body([]int{'h', 'i'}, 2, 0, 0)); err != nil || status != 200 {
		t.Fatalf("a text request to a model without TTS tokens: status %d, %v", status, err)
	}
	status, _, answer := do(t, "POST", url+"/v1/completions", `{"prompt":"hi","max_tokens":2,"omnipd_conditioning":{"key":"k","layer":2}}`)
	if status != 400 || !strings.Contains(answer, `"param":"omnipd_conditioning"`) || !strings.Contains(answer, "TTS tokens") {
		t.Errorf("conditioning from a model without TTS tokens: %d %s", status, answer)
	}

	url = start(model.Default()) // its config.json names 266, 267, 268
	b := body([]int{'h', 'i'}, 2, 0, 0)
	b["omnipd_conditioning"] = map[string]any{"key": "k", "layer": 2}
	if _, status, err := post(context.Background(), url, "k", b); err != nil || status != 200 {
		t.Fatalf("status %d, %v", status, err)
	}
	st, err := stageconn.Fetch(context.Background(), nil, url, "k", testSecret)
	if err != nil {
		t.Fatal(err)
	}
	ids := testModel.Config.TTSTokenIDs
	want := [3][]float32{testModel.Embedding(ids[0]), testModel.Embedding(ids[1]), testModel.Embedding(ids[2])}
	if got := [3][]float32{st.TTSPad, st.TTSBos, st.TTSEos}; !reflect.DeepEqual(got, want) {
		t.Errorf("the stash's TTS embeddings are not those of the config's ids %v", ids)
	}
}

// tokenizerWithout is the test tokenizer without the added tokens named.
func tokenizerWithout(t *testing.T, names ...string) *tokenizer.Tokenizer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := testTokenizer.Save(path); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	added := file["added_tokens"].([]any)
	file["added_tokens"] = slices.DeleteFunc(added, func(a any) bool {
		return slices.Contains(names, a.(map[string]any)["content"].(string))
	})
	raw, _ = json.Marshal(file)
	tok, err := tokenizer.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if _, ok := tok.TokenID(name); ok {
			t.Fatalf("%s is still a token", name)
		}
	}
	return tok
}
