package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
)

// workerArgs is the command line of every process serve (pid) started.
func workerArgs(t *testing.T, pid int) [][]string {
	t.Helper()
	var all [][]string
	for _, kid := range childrenOf(t, pid) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", kid))
		if err != nil {
			continue
		}
		all = append(all, strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"))
	}
	return all
}

// flagValue is the value given to flag in args, or "".
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// post sends body to url and returns the status and answer.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// omnipd serve DIR serves a Hugging Face-format checkpoint on reference
// Thinker workers that load it, under the directory's name, as vllm serve
// serves its --model: the workers get --model DIR and the name, the API
// answers to it, and vLLM's /v1/models, /version and /tokenize answer.
func TestServeACheckpointDirectory(t *testing.T) {
	if testing.Short() || runtime.GOOS != "linux" {
		t.Skip("builds and runs the binary; reads /proc")
	}
	dir := t.TempDir()
	if err := model.Default().Save(dir, "float32"); err != nil {
		t.Fatal(err)
	}
	if err := tokenizer.Default().Save(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, buildBinary(t), "--port", "0", dir)
	url := p.url(t)
	thinkers := 0
	for _, args := range workerArgs(t, p.cmd.Process.Pid) {
		if !slices.Contains(args, "worker") {
			continue
		}
		if flagValue(args, "--stage") != "" {
			t.Errorf("serve DIR started a %s worker: %q; want the Thinker alone", flagValue(args, "--stage"), args)
			continue
		}
		thinkers++
		if flagValue(args, "--model") != dir || flagValue(args, "--served-model-name") != dir {
			t.Errorf("a Thinker worker runs %q: want --model %s and --served-model-name %s", args, dir, dir)
		}
	}
	if thinkers != 2 {
		t.Errorf("%d Thinker workers, want a prefill and a decode:\n%s", thinkers, p.out.String())
	}

	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != dir || models.Data[0].MaxModelLen != model.Default().Config.MaxPositionEmbeddings {
		t.Errorf("/v1/models: %+v (%v), want %s with the model's max_model_len %d", models, err, dir, model.Default().Config.MaxPositionEmbeddings)
	}
	chat := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Hello!"}],"max_tokens":4}`, dir)
	if status, body := post(t, url+"/v1/chat/completions", chat); status != http.StatusOK || !strings.Contains(body, `"chatcmpl-`) {
		t.Errorf("chat with model %s: %d %s", dir, status, body)
	}
	tokenize := fmt.Sprintf(`{"model":%q,"prompt":"Hello!"}`, dir)
	if status, body := post(t, url+"/tokenize", tokenize); status != http.StatusOK || !strings.Contains(body, `"count":`) || !strings.Contains(body, `"tokens":[`) {
		t.Errorf("/tokenize: %d %s", status, body)
	}
	resp, err = http.Get(url + "/version")
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Version string }
	err = json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if err != nil || v.Version == "" {
		t.Errorf("/version: %+v %v", v, err)
	}
}

// wav is a 16-bit PCM WAV file of a 440 Hz tone.
func wav(seconds, rate, channels int) []byte {
	frames := seconds * rate
	var b bytes.Buffer
	b.WriteString("RIFF")
	binary.Write(&b, binary.LittleEndian, uint32(36+frames*channels*2))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(channels), uint32(rate), uint32(rate * channels * 2), uint16(channels * 2), uint16(16)} {
		binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	binary.Write(&b, binary.LittleEndian, uint32(frames*channels*2))
	sample := make([]byte, 2)
	for i := range frames {
		binary.LittleEndian.PutUint16(sample, uint16(int16(8000*math.Sin(2*math.Pi*440*float64(i)/float64(rate)))))
		for range channels {
			b.Write(sample)
		}
	}
	return b.Bytes()
}

// A clip just under --media-max-item-mb's 25 MiB arrives inline — its
// base64 is 33 MB, more than twice what the body cap once allowed — and is
// served through the prefill and the decode, whose own caps serve sets to
// hold any leg it sends them.
func TestServeTakesAClipAtTheMediaItemLimit(t *testing.T) {
	if testing.Short() || runtime.GOOS != "linux" {
		t.Skip("builds and runs the binary; reads /proc")
	}
	clip := wav(130, 48000, 2) // 25.0 MB: 130 s of 48 kHz stereo
	if len(clip) > 25<<20 {
		t.Fatalf("the clip is %d bytes, over the 25 MiB item limit", len(clip))
	}
	p := startServe(t, buildBinary(t), "--port", "0")
	url := p.url(t)
	body, err := json.Marshal(map[string]any{
		"messages": []map[string]any{{"role": "user", "content": []map[string]any{
			{"type": "input_audio", "input_audio": map[string]any{"data": base64.StdEncoding.EncodeToString(clip), "format": "wav"}},
			{"type": "text", "text": "What is said?"},
		}}},
		"max_tokens": 1, "modalities": []string{"text"},
	})
	if err != nil {
		t.Fatal(err)
	}
	status, answer := post(t, url+"/v1/chat/completions", string(body))
	if status != http.StatusOK || !strings.Contains(answer, `"prompt_tokens"`) {
		t.Errorf("a %d-byte clip inline (%d-byte body): %d %.300s", len(clip), len(body), status, answer)
	}
	for _, args := range workerArgs(t, p.cmd.Process.Pid) {
		if !slices.Contains(args, "worker") || flagValue(args, "--stage") != "" {
			continue
		}
		mb, err := strconv.Atoi(flagValue(args, "--max-request-body-size-mb"))
		if err != nil || int64(mb)<<20 < 3*int64(len(body)) {
			t.Errorf("a Thinker worker runs %q: want --max-request-body-size-mb with room for three times the body", args)
		}
	}
}
