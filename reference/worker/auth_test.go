package worker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/stageconn"
	"github.com/omnipd/omnipd/stageapi"
)

// credentials a caller without the deployment secret might present.
var badCredentials = map[string]string{
	"none":         "",
	"wrong secret": "Bearer not-" + testSecret,
	"other scheme": "Basic " + testSecret,
	"empty bearer": "Bearer ",
	"secret only":  testSecret,
}

func call(t *testing.T, method, url, auth, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// wantUnauthorized checks a refusal: 401, the header that names the scheme,
// OpenAI's invalid_api_key body, and no echo of what was sent.
func wantUnauthorized(t *testing.T, what, auth string, status int, hdr http.Header, body string) {
	t.Helper()
	var e struct {
		Error struct{ Type, Code string } `json:"error"`
	}
	if status != http.StatusUnauthorized || hdr.Get("WWW-Authenticate") != "Bearer" ||
		json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != "invalid_api_key" || e.Error.Type != "invalid_request_error" {
		t.Errorf("%s: %d WWW-Authenticate %q %s; want 401 invalid_api_key", what, status, hdr.Get("WWW-Authenticate"), body)
	}
	if strings.Contains(body, testSecret) {
		t.Errorf("%s: the refusal echoes the credential: %s", what, body)
	}
}

// Every endpoint of a Thinker worker with a secret, but /health and
// /metrics, refuses a caller without it before anything happens: no engine
// work, no KV exported, no stash read or dropped. With the secret the same
// calls go through.
func TestThinkerWorkerRequiresSecret(t *testing.T) {
	w := newTestWorker(t, kvConfig("kv_both", "both-0", HandshakePull))
	// A stash to attack, kept by an authorized request.
	kept := body([]int{1, 2, 3, 4}, 2, 0, 0)
	kept["omnipd_conditioning"] = map[string]any{"key": "victim", "layer": 2}
	if _, _, err := post(context.Background(), w.url, "setup", kept); err != nil {
		t.Fatal(err)
	}
	before := w.eng.Stats()

	endpoints := []struct{ method, path, body string }{
		{"POST", "/v1/completions", `{"prompt":[1,2,3],"max_tokens":2,"kv_transfer_params":{"do_remote_decode":true},"omnipd_conditioning":{"key":"k2","layer":2}}`},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`},
		{"POST", "/tokenize", `{"prompt":"hi"}`},
		{"POST", "/detokenize", `{"tokens":[104,105]}`},
		{"GET", "/v1/models", ""},
		{"GET", stageapi.ConditioningPath + "victim", ""},
		{"DELETE", stageapi.ConditioningPath + "victim", ""},
	}
	for _, ep := range endpoints {
		for name, auth := range badCredentials {
			status, hdr, b := call(t, ep.method, w.url+ep.path, auth, ep.body)
			wantUnauthorized(t, ep.method+" "+ep.path+" with "+name, auth, status, hdr, b)
		}
	}
	if after := w.eng.Stats(); after.PromptTokensComputed != before.PromptTokensComputed || after.GenerationTokens != before.GenerationTokens {
		t.Errorf("refused requests reached the engine: %+v, before %+v", after, before)
	}
	if leased, _ := w.KVStats(); leased != 0 {
		t.Errorf("a refused request exported %d KV blocks", leased)
	}
	if n := w.Stashes(); n != 1 {
		t.Errorf("%d stashes after refused reads and drops, want the 1 kept", n)
	}
	for _, path := range []string{"/health", "/metrics"} {
		if status, _, b := call(t, "GET", w.url+path, "", ""); status != 200 {
			t.Errorf("%s without the secret: %d %s; it stays open for probes", path, status, b)
		}
	}

	// The deployment itself gets through, the scheme in any case.
	for _, ep := range endpoints[:5] {
		if status, _, b := call(t, ep.method, w.url+ep.path, "bearer "+testSecret, ep.body); status != 200 {
			t.Errorf("%s %s with the secret: %d %s", ep.method, ep.path, status, b)
		}
	}
	if _, err := stageconn.Fetch(context.Background(), nil, w.url, "victim", testSecret); err != nil {
		t.Errorf("the kept stash, fetched with the secret: %v", err)
	}
}

// The Talker and Code2Wav stages refuse callers without the secret; a
// refused Talker call fetches no conditioning.
func TestAudioStagesRequireSecret(t *testing.T) {
	var fetches atomic.Int32
	thinker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		http.NotFound(w, r)
	}))
	defer thinker.Close()
	quiet := slog.New(slog.DiscardHandler)
	tk := httptest.NewServer(NewTalker(talker.Default(), talker.DefaultSegmenter(), testSecret, quiet))
	defer tk.Close()
	c2w := httptest.NewServer(NewCode2Wav(code2wav.Default(), testSecret, quiet))
	defer c2w.Close()

	talk, _ := json.Marshal(stageapi.TalkerRequest{Conditioning: []stageapi.ConditioningHandle{{URL: thinker.URL, Key: "k"}}})
	frames := make([][]int, 2)
	for i := range frames {
		frames[i] = make([]int, 16)
	}
	vocode, _ := json.Marshal(stageapi.Code2WavRequest{Codes: stageapi.FramesToWire(frames), NumFrames: len(frames)})
	for name, auth := range badCredentials {
		status, hdr, b := call(t, "POST", tk.URL+stageapi.TalkerPath, auth, string(talk))
		wantUnauthorized(t, "talker with "+name, auth, status, hdr, b)
		status, hdr, b = call(t, "POST", c2w.URL+stageapi.Code2WavPath, auth, string(vocode))
		wantUnauthorized(t, "code2wav with "+name, auth, status, hdr, b)
	}
	if n := fetches.Load(); n != 0 {
		t.Errorf("refused Talker calls fetched conditioning %d times", n)
	}
	for _, url := range []string{tk.URL, c2w.URL} {
		if status, _, _ := call(t, "GET", url+"/health", "", ""); status != 200 {
			t.Errorf("%s/health without the secret: %d", url, status)
		}
	}

	// With the secret: the Talker goes for its conditioning (the fake
	// Thinker has none: 404) and Code2Wav decodes.
	if status, _, b := call(t, "POST", tk.URL+stageapi.TalkerPath, "Bearer "+testSecret, string(talk)); status != http.StatusNotFound || fetches.Load() != 1 {
		t.Errorf("talker with the secret: %d %s, %d fetches", status, b, fetches.Load())
	}
	status, _, b := call(t, "POST", c2w.URL+stageapi.Code2WavPath, "Bearer "+testSecret, string(vocode))
	var out stageapi.Code2WavResponse
	if status != 200 || json.Unmarshal([]byte(b), &out) != nil || out.NumSamples == 0 {
		t.Errorf("code2wav with the secret: %d %.200s", status, b)
	}
}
