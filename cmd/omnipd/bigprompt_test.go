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
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// bigPromptBytes is the prompt of each big request: just under the
// worker's default 16 MiB body limit, so the body is read and decoded and
// the refusal comes from the context check, not the size check.
const bigPromptBytes = 15 << 20

// bigPromptPeakRSS bounds the worker's peak resident memory while it refuses
// eight such prompts at once: three copies of each body (the bytes read, as
// io.ReadAll grows them, and the decoded string) plus the idle process.
// The body itself is admitted (it is under the body limit), but nothing
// proportional to its tokens is: tokenizing it whole took ~400 MB a request,
// 2.3 to 4.2 GB for eight.
const bigPromptPeakRSS = 8*3*bigPromptBytes + 24<<20

// TestBigPromptsAreRefusedCheaply sends eight concurrent 15 MiB prompts to a
// real omnipd worker process: each is refused with vLLM's 400 for a prompt
// longer than the context, the worker's peak RSS (VmHWM) stays under
// bigPromptPeakRSS, and a small request is still served afterwards.
func TestBigPromptsAreRefusedCheaply(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/PID/status")
	}
	bin := buildBinary(t)
	cmd := exec.Command(bin, "worker", "--port", "0")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	addr := regexp.MustCompile(`worker listening"? addr=(\S+)`)
	var url string
	for deadline := time.Now().Add(60 * time.Second); url == ""; time.Sleep(50 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			url = "http://" + m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker did not start:\n%s", out.String())
		}
	}
	idle := procStatus(t, cmd.Process.Pid)

	bodies := map[string]func(text string) []byte{
		"/v1/chat/completions": func(text string) []byte {
			b, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": text}}, "max_tokens": 4})
			return b
		},
		"/v1/completions": func(text string) []byte {
			b, _ := json.Marshal(map[string]any{"prompt": text, "max_tokens": 4})
			return b
		},
	}
	// Two shapes of text: words (many short pre-tokens) and one run of
	// letters (a single pre-token as long as the prompt).
	texts := []string{strings.Repeat("lorem ipsum ", bigPromptBytes/12), strings.Repeat("a", bigPromptBytes)}
	client := &http.Client{Timeout: 5 * time.Minute}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for i := range 8 {
		path := "/v1/chat/completions"
		if i%2 == 1 {
			path = "/v1/completions"
		}
		body := bodies[path](texts[i/2%2])
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(url+path, "application/json", bytes.NewReader(body))
			if err != nil {
				errs <- fmt.Sprintf("%s: %v", path, err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			var e struct {
				Error struct{ Message, Code string } `json:"error"`
			}
			if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || e.Error.Code != "context_length_exceeded" ||
				!strings.HasPrefix(e.Error.Message, "This model's maximum context length is ") {
				errs <- fmt.Sprintf("%s: %d %.300s; want 400 context_length_exceeded with vLLM's message", path, resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	peak := procStatus(t, cmd.Process.Pid)
	t.Logf("worker RSS idle %d MiB; peak (VmHWM) with eight 15 MiB prompts %d MiB; right after %d MiB",
		idle["VmRSS"]>>20, peak["VmHWM"]>>20, peak["VmRSS"]>>20)
	if peak["VmHWM"] > bigPromptPeakRSS {
		t.Errorf("peak RSS %d MiB while refusing eight 15 MiB prompts; want at most %d MiB", peak["VmHWM"]>>20, bigPromptPeakRSS>>20)
	}

	resp, err := client.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"hello"}],"max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a small request after the big ones: %d %s", resp.StatusCode, b)
	}
}

// procStatus reads the memory lines of /proc/PID/status, in bytes.
func procStatus(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasPrefix(k, "Vm") {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 2 && fields[1] == "kB" {
			n, _ := strconv.ParseInt(fields[0], 10, 64)
			m[k] = n << 10
		}
	}
	return m
}
