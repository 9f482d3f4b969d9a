package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func buildBinary(t *testing.T, buildFlags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "omnipd")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	build := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", bin, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runBinary runs bin with args and returns its exit code and output.
func runBinary(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return code, stdout.String(), stderr.String()
}

// A release build stamps its version the way the release notes say to;
// --version, -v and version print it, and plan tags the orchestrator's
// image with it.
func TestVersionOfAStampedBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t, "-ldflags", "-X github.com/omnipd/omnipd/internal/buildinfo.stamped=v9.8.7")
	var lines []string
	for _, args := range [][]string{{"--version"}, {"-v"}, {"version"}} {
		code, out, errOut := runBinary(t, bin, args...)
		if code != 0 || !strings.HasPrefix(out, "omnipd v9.8.7") || strings.Count(out, "\n") != 1 {
			t.Errorf("omnipd %s: exit %d, stdout %q, stderr %q; want one line opening with the stamped version", args[0], code, out, errOut)
		}
		lines = append(lines, out)
	}
	if lines[0] != lines[1] || lines[1] != lines[2] {
		t.Errorf("--version, -v and version disagree: %q", lines)
	}
	code, out, errOut := runBinary(t, bin, "plan", "--target", "kubernetes", "--pd", "--connector", "NixlConnector",
		"../../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe_thinking.yaml")
	if code != 0 || !strings.Contains(out, ":v9.8.7\n") {
		t.Errorf("omnipd plan: exit %d, the orchestrator image is not the stamped version's:\n%s\n%s", code, out, errOut)
	}
}

// TestServeAsTheREADMESays runs the README's main command — omnipd serve
// on the embedded default — sends it a chat request, stops it with SIGTERM,
// and checks that its workers went with it.
func TestServeAsTheREADMESays(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	cmd := exec.Command(bin, "serve")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
	}()

	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://127.0.0.1:8000/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("omnipd serve not healthy within 60s:\n%s", out.String())
		}
		select {
		case err := <-exited:
			t.Fatalf("omnipd serve exited: %v\n%s", err, out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	resp, err := http.Post("http://127.0.0.1:8000/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":8}`)) // text and audio, the omni default
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var c struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != 200 || len(c.Choices) != 2 {
		t.Fatalf("chat request: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Omnipd-Pd-Path") != "disaggregated" || c.Usage.PromptTokensDetails.CachedTokens != c.Usage.PromptTokens-1 {
		t.Errorf("the default should serve through prefill and decode: path %q, usage %+v", resp.Header.Get("X-Omnipd-Pd-Path"), c.Usage)
	}

	workers := regexp.MustCompile(`ready at (http://\S+)`).FindAllStringSubmatch(out.String(), -1)
	if len(workers) != 4 {
		t.Errorf("expected prefill, decode, Talker and Code2Wav workers in the progress lines:\n%s", out.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("omnipd serve exited with %v after SIGTERM:\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("omnipd serve did not stop within 30s of SIGTERM")
	}
	for _, w := range workers {
		if resp, err := http.Get(w[1] + "/health"); err == nil {
			resp.Body.Close()
			t.Errorf("worker %s still answers after omnipd stopped", w[1])
		}
	}
}

// TestBinary builds the real binary and runs the config commands the way a
// user does.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	run := func(args ...string) (int, string, string) { return runBinary(t, bin, args...) }

	code, out, errOut := run("expand")
	if code != 0 || !strings.Contains(out, "is_prefill_only: true") || !strings.Contains(out, "is_decode_only: true") {
		t.Errorf("omnipd expand: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	fixture := "../../deploy/testdata/fixtures/vllm-omni/legacy_qwen3_omni_moe_pd_separation.yaml"
	code, out, errOut = run("validate", fixture)
	if code != 0 || !strings.Contains(out, "MooncakeConnector") || !strings.Contains(errOut, "legacy stage_args") {
		t.Errorf("omnipd validate legacy PD: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("stages:\n  - stage_id: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run("validate", bad)
	if code != 1 || out != "" || !strings.Contains(errOut, bad+":2:15: stages[0].stage_id: ") {
		t.Errorf("omnipd validate bad config: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// SIGTERM with requests in flight: omnipd stops accepting, lets them finish
// (up to --drain-timeout), then stops its workers and exits cleanly.
func TestShutdownDrainsInFlightRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	cmd := exec.Command(bin, "serve", "--port", "0", "--drain-timeout", "30s")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()
	addr := regexp.MustCompile(`on (http://\S+)`)
	var url string
	for deadline := time.Now().Add(60 * time.Second); url == ""; time.Sleep(50 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", out.String())
		}
	}
	results := make(chan string, 8)
	started := make(chan struct{}, 8)
	for i := range 8 {
		go func() {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
				fmt.Sprintf(`{"messages":[{"role":"user","content":"story %d"}],"max_tokens":300,"ignore_eos":true,"stream":true,"modalities":["text"]}`, i)))
			if err != nil {
				started <- struct{}{}
				results <- "error: " + err.Error()
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			_, _ = br.ReadString('\n')
			started <- struct{}{}
			rest, err := io.ReadAll(br)
			switch {
			case err != nil:
				results <- "error: " + err.Error()
			case !strings.Contains(string(rest), "data: [DONE]"):
				results <- "truncated"
			default:
				results <- "ok"
			}
		}()
	}
	for range 8 {
		<-started
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		select {
		case r := <-results:
			if r != "ok" {
				t.Errorf("in-flight request: %s", r)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("an in-flight request hung during shutdown")
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("omnipd exited with %v:\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("omnipd did not exit after draining")
	}
	if resp, err := http.Get(url + "/health"); err == nil {
		resp.Body.Close()
		t.Error("omnipd still answers after shutdown")
	}
	for _, m := range regexp.MustCompile(`ready at (http://\S+)`).FindAllStringSubmatch(out.String(), -1) {
		if resp, err := http.Get(m[1] + "/health"); err == nil {
			resp.Body.Close()
			t.Errorf("worker %s outlived omnipd", m[1])
		}
	}
}

// Even when omnipd itself is killed with SIGKILL, its workers go with it.
func TestNoOrphansWhenKilled(t *testing.T) {
	if testing.Short() || runtime.GOOS != "linux" {
		t.Skip("builds and runs the binary; relies on Linux's parent-death signal")
	}
	bin := buildBinary(t)
	cmd := exec.Command(bin, "serve", "--port", "0")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := regexp.MustCompile(`omnipd serving`)
	for deadline := time.Now().Add(60 * time.Second); !ready.MatchString(out.String()); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", out.String())
		}
	}
	workers := regexp.MustCompile(`ready at (http://\S+)`).FindAllStringSubmatch(out.String(), -1)
	if len(workers) == 0 {
		t.Fatal("no workers started")
	}
	_ = cmd.Process.Kill()
	<-exited
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range workers {
		for {
			resp, err := http.Get(w[1] + "/health")
			if err != nil {
				break
			}
			resp.Body.Close()
			if time.Now().After(deadline) {
				t.Fatalf("worker %s outlived a killed omnipd", w[1])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
