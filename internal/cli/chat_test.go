package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/audio"
)

func TestChatPrintsTextAndWritesAudio(t *testing.T) {
	wav := audio.EncodeWAV(make([]float32, audio.SamplesPerFrame))
	var asked map[string]any
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&asked)
		_ = json.NewEncoder(w).Encode(map[string]any{"choices": []any{
			map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "hello there"}},
			map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": nil, "audio": map[string]any{"data": base64.StdEncoding.EncodeToString(wav)}}},
		}})
	}))
	defer hs.Close()
	out := filepath.Join(t.TempDir(), "out.wav")
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), []string{"chat", "--url", hs.URL, "--audio", out, "Hi!"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if strings.TrimSpace(stdout.String()) != "hello there" {
		t.Errorf("printed %q", stdout.String())
	}
	got, err := os.ReadFile(out)
	if err != nil || !bytes.Equal(got, wav) {
		t.Errorf("wrote %d bytes, %v", len(got), err)
	}
	if m, _ := asked["modalities"].([]any); len(m) != 2 {
		t.Errorf("asked for modalities %v", asked["modalities"])
	}
}

// The reference model's text is random tokens: escape sequences, bells,
// bidirectional overrides. chat prints them as visible escapes, never as
// bytes a terminal would act on; newlines, tabs and ordinary text (any
// script) pass unchanged. So does an error body the server sends.
func TestChatPrintsTextSafely(t *testing.T) {
	content := "hi\x1b[2J\x07 ok\tü 你好\u202eevil\u0085\r\nnext\x7f"
	status := http.StatusOK
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		if status != http.StatusOK {
			_, _ = w.Write([]byte("bad\x1b]0;owned\x07"))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"choices": []any{
			map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": content}},
		}})
	}))
	defer hs.Close()
	var stdout, stderr bytes.Buffer
	if code := Run(context.Background(), []string{"chat", "--url", hs.URL, "Hi!"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if want := `hi\x1b[2J\a ok` + "\tü 你好" + `\u202eevil\u0085\r` + "\nnext" + `\x7f` + "\n"; stdout.String() != want {
		t.Errorf("printed %q\nwant    %q", stdout.String(), want)
	}
	status = http.StatusBadGateway
	stdout.Reset()
	stderr.Reset()
	_ = Run(context.Background(), []string{"chat", "--url", hs.URL, "Hi!"}, &stdout, &stderr)
	if strings.ContainsAny(stderr.String(), "\x1b\x07") || !strings.Contains(stderr.String(), `bad\x1b]0;owned\a`) {
		t.Errorf("error printed as %q", stderr.String())
	}
}
