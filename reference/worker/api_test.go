package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/reference/engine"
)

func do(t *testing.T, method, url, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+testSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// Bad input gets a 4xx with OpenAI's error body naming the problem; none
// reaches the engine or crashes the worker.
func TestBadRequests(t *testing.T) {
	w := newTestWorker(t, kvConfig("kv_both", "both-0", HandshakePull))
	for _, c := range []struct {
		name, path, body string
		status           int
		param            string
	}{
		{"invalid JSON", "/v1/completions", `{"prompt": "x",`, 400, ""},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404, "model"},
		{"negative max_tokens", "/v1/completions", `{"prompt":"x","max_tokens":-1}`, 400, "max_tokens"},
		{"n > 1", "/v1/completions", `{"prompt":"x","n":2}`, 400, "n"},
		{"batch of prompts", "/v1/completions", `{"prompt":["a","b"]}`, 400, "prompt"},
		{"token outside the vocabulary", "/v1/completions", `{"prompt":[100000]}`, 400, ""},
		{"temperature below 0", "/v1/completions", `{"prompt":"x","temperature":-1}`, 400, "temperature"},
		{"empty messages", "/v1/chat/completions", `{"messages":[]}`, 400, "messages"},
		{"image that is no URL", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].image_url.url"},
		{"unknown content type", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"hologram","hologram":{}}]}]}`, 400, "messages[0].content[0].type"},
		{"decode without remote_engine_id", "/v1/completions", `{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true}}`, 400, "kv_transfer_params"},
		{"remote_block_ids of the wrong type", "/v1/completions", `{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p","remote_request_id":"r","remote_host":"127.0.0.1","remote_port":1,"remote_block_ids":"7"}}`, 400, "kv_transfer_params"},
		{"both remote flags", "/v1/completions", `{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":true}}`, 400, "kv_transfer_params"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, _, body := do(t, "POST", w.url+c.path, c.body)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
				t.Fatalf("not an OpenAI error body: %s", body)
			}
			if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
				t.Errorf("param %v, want %q: %s", e.Error.Param, c.param, body)
			}
		})
	}
	if u := w.eng.Cache().Used(); u != 0 {
		t.Errorf("%d KV blocks used after rejected requests", u)
	}
	if status, _, _ := do(t, "GET", w.url+"/health", ""); status != 200 {
		t.Errorf("health %d after bad requests", status)
	}
}

func TestChatStreamingFormat(t *testing.T) {
	w := newTestWorker(t, "")
	req, _ := http.NewRequest("POST", w.url+"/v1/chat/completions", strings.NewReader(
		`{"messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`))
	req.Header.Set("X-Request-Id", "abc")
	req.Header.Set("Authorization", "Bearer "+testSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	var chunks []map[string]any
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected line %q", line)
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, m)
	}
	if !done || len(chunks) < 3 {
		t.Fatalf("stream ended without [DONE] or too short: %d chunks", len(chunks))
	}
	first := chunks[0]["choices"].([]any)[0].(map[string]any)
	if first["delta"].(map[string]any)["role"] != "assistant" {
		t.Errorf("first chunk has no role: %v", first)
	}
	finishes := 0
	for _, c := range chunks {
		if c["id"] != "chatcmpl-abc" || c["object"] != "chat.completion.chunk" {
			t.Errorf("chunk id/object: %v %v", c["id"], c["object"])
		}
		for _, ch := range c["choices"].([]any) {
			if ch.(map[string]any)["finish_reason"] != nil {
				finishes++
			}
		}
	}
	last := chunks[len(chunks)-1]
	usage, _ := last["usage"].(map[string]any)
	if finishes != 1 || usage == nil || usage["completion_tokens"].(float64) != 5 {
		t.Errorf("want one finish_reason and a final usage chunk with 5 completion tokens; finishes %d, last %v", finishes, last)
	}
}

// The KV side channel refuses a decode worker that does not know the
// deployment secret — one with a wrong secret, and one with none, which
// sends no proof and checks nothing itself, so the prefill's own check is
// all that stands between it and the KV. The prefill's blocks stay leased,
// then expire.
func TestSideChannelRequiresSecret(t *testing.T) {
	for _, intruderSecret := range []string{"not-the-secret", ""} {
		t.Run(fmt.Sprintf("secret %q", intruderSecret), func(t *testing.T) {
			prefill := newTestWorker(t, kvConfig("kv_producer", "prefill-0", HandshakePull))
			eng := runTestEngine(t, engine.Config{})
			cfg, _ := ParseKVTransferConfig(kvConfig("kv_consumer", "decode-0", HandshakePull))
			srv, err := New(Config{Engine: eng, KV: cfg, Secret: intruderSecret, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			intruder := &testWorker{Server: srv, eng: eng}
			// The intruder's own HTTP API lets the test in: only its KV
			// credential is at stake here.
			intruder.url = newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Header.Set("Authorization", "Bearer "+intruderSecret)
				srv.ServeHTTP(w, r)
			}))

			_, err = prefillDecode(context.Background(), prefill, intruder, "r1", body([]int{1, 2, 3, 4, 5}, 4, 0, 0), false)
			if err == nil || !strings.Contains(err.Error(), "authentication") {
				t.Fatalf("decode with secret %q: %v, want an authentication failure", intruderSecret, err)
			}
			if leased, _ := prefill.KVStats(); leased == 0 {
				t.Error("the refused transfer's blocks were freed or handed over")
			}
			if eng.Stats().PromptTokensImported != 0 {
				t.Error("the intruder imported KV")
			}
			used := blocksHeldAtRest(prefill)
			if _, expired := prefill.KVStats(); expired != 1 || used != 0 {
				t.Errorf("the unclaimed lease should expire and free its blocks: expired %d, used %d", expired, used)
			}
		})
	}
}
