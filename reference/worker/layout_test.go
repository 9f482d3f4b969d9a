package worker

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/mmproc"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
)

// The placeholders of a multimodal prompt are omnipd's own layout of media
// the processors took. An error laying them out is the server's: a 500 that
// tells the client nothing of the cause, which the log keeps with the
// request id. An error that already names the client's part is answered as
// it is, its param and message unchanged.
func TestPlaceholderLayoutErrors(t *testing.T) {
	eng := runTestEngine(t, engine.Config{})
	const part = "messages[0].content[1]"
	clients := partError(openai.MediaItem{Path: part, PartType: "input_audio"}, inputProblem("the audio has more placeholders than this model takes"))
	cases := []struct {
		name          string
		fail          error
		status        int
		typ, param    string
		message, logs string
	}{
		{"omnipd's own layout", fmt.Errorf("expanding the prompt: audio start at token 7 is not followed by one audio pad and the audio end: %w", mmproc.ErrMalformedPrompt),
			http.StatusInternalServerError, "server_error", "", "", "audio start at token 7"},
		{"the client's part", clients,
			http.StatusBadRequest, "invalid_request_error", part, part + ".input_audio: the audio has more placeholders than this model takes", "more placeholders"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logs := &lockedLog{}
			srv, err := New(Config{Engine: eng, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			srv.media.layout = func([]int, []mmproc.Item, mmproc.Options) (mmproc.Prepared, error) { return mmproc.Prepared{}, c.fail }
			hs := httptest.NewServer(srv)
			t.Cleanup(func() { hs.Close(); srv.Close() })

			id := fmt.Sprintf("layout-%d", i)
			body := `{"messages":[{"role":"user","content":[{"type":"text","text":"hear"},` +
				fmt.Sprintf(`{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}}`, b64(wavBytes(0.2))) + `]}],"max_tokens":2}`
			status, raw := postWithID(t, hs.URL+"/v1/chat/completions", id, body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if status != c.status || json.Unmarshal(raw, &e) != nil || e.Error.Type != c.typ {
				t.Fatalf("%d %s; want %d %s", status, raw, c.status, c.typ)
			}
			if got := ""; e.Error.Param != nil {
				got = *e.Error.Param
				if got != c.param {
					t.Errorf("param %q, want %q", got, c.param)
				}
			} else if c.param != "" {
				t.Errorf("no param, want %q", c.param)
			}
			switch {
			case c.message != "" && e.Error.Message != c.message:
				t.Errorf("message %q, want %q", e.Error.Message, c.message)
			case c.message == "" && (strings.Contains(e.Error.Message, "token 7") || internalWords.MatchString(e.Error.Message) || e.Error.Message == ""):
				t.Errorf("message %q tells the client the server's business", e.Error.Message)
			}
			if logged := logs.about(id); !strings.Contains(logged.Err, c.logs) {
				t.Errorf("the log does not keep the cause %q: %+v", c.logs, logged)
			}
			if st := eng.Stats(); st.PromptTokensComputed != 0 {
				t.Errorf("a refused prompt reached the engine: %+v", st)
			}
		})
	}
}

// The claim that no text can spell a placeholder holds only when the
// tokenizer's markers are special tokens, which Encode never matches in
// text: a tokenizer whose marker is an ordinary added token, which text
// does spell, is refused at start, naming it.
func TestMarkersThatTextCanSpellAreRefused(t *testing.T) {
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
	for _, a := range file["added_tokens"].([]any) {
		if a := a.(map[string]any); a["content"] == tokenizer.AudioPad {
			a["special"] = false
		}
	}
	raw, _ = json.Marshal(file)
	tok, err := tokenizer.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if ids := tok.Encode("a" + tokenizer.AudioPad); len(ids) != 2 {
		t.Fatalf("text does not spell the ordinary %s: %v", tokenizer.AudioPad, ids)
	}
	eng := runEngineWith(t, testModel, tok)
	srv, err := New(Config{Engine: eng, Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		srv.Close()
		t.Fatalf("a tokenizer whose %s text can spell was taken", tokenizer.AudioPad)
	}
	if !strings.Contains(err.Error(), tokenizer.AudioPad) {
		t.Errorf("%v does not name %s", err, tokenizer.AudioPad)
	}
}
