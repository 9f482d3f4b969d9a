package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// omnipd worker --simulate serves the Thinker API as a latency model: the
// startup line names the profile, and a request gets max_tokens of
// printable text.
func TestWorkerSimulate(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	ctx, cancel := context.WithCancel(context.Background())
	logs := &lockedBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"worker", "--port", "0", "--simulate", "h100-qwen3-omni-30b-a3b"}, io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the worker did not stop")
		}
	})
	addr := regexp.MustCompile(`"worker listening" addr=(\S+)`)
	var url string
	for deadline := time.Now().Add(10 * time.Second); url == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addr.FindStringSubmatch(logs.String()); m != nil {
			url = "http://" + m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("worker exited %d:\n%s", code, logs.String())
		default:
		}
	}
	if url == "" {
		t.Fatalf("worker did not start:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "simulate=h100-qwen3-omni-30b-a3b") {
		t.Errorf("the startup log does not name the profile:\n%s", logs.String())
	}
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Hello","max_tokens":7}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct {
		Choices []struct{ Text string } `json:"choices"`
		Usage   struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != 200 {
		t.Fatalf("HTTP %d: %v", resp.StatusCode, err)
	}
	if c.Usage.CompletionTokens != 7 || len(c.Choices[0].Text) != 7 {
		t.Errorf("%d tokens, text %q; want 7 printable characters", c.Usage.CompletionTokens, c.Choices[0].Text)
	}
}

// A profile that does not load stops the worker, and serve, before they
// serve anything, with the reason and its position.
func TestSimulateProfileErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("decode:\n  base: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"worker", "--port", "0", "--simulate", "h200-nope"}, "zero"},
		{[]string{"worker", "--port", "0", "--simulate", bad}, bad + ":2:9: decode.base:"},
		{[]string{"serve", "--port", "0", "--simulate", bad}, bad + ":2:9: decode.base:"},
	} {
		code, _, errOut := run(t, c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want a failure mentioning %q", c.args, code, errOut, c.want)
		}
	}
}

// serve hands its workers a built-in name as it is and a profile file as
// an absolute path, so that a worker started elsewhere finds it.
func TestSimulateWorkerArg(t *testing.T) {
	if got, err := simulateWorkerArg("zero"); err != nil || got != "zero" {
		t.Errorf("built-in: %q, %v", got, err)
	}
	if got, err := simulateWorkerArg(""); err != nil || got != "" {
		t.Errorf("none: %q, %v", got, err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("mine.yaml", []byte("decode: {base: 1ms}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := simulateWorkerArg("mine.yaml")
	if err != nil || !filepath.IsAbs(got) || filepath.Base(got) != "mine.yaml" {
		t.Errorf("file: %q, %v", got, err)
	}
}
