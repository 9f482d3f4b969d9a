package server

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/stageclient"
)

// The endpoints vLLM serves beside the OpenAI API, and the shapes vLLM's
// clients read from them.

// /v1/models is vLLM's ModelCard: id, object, created, owned_by, root,
// parent (null for a base model), max_model_len and one model_permission.
func TestModelsIsVLLMsModelCard(t *testing.T) {
	url := behindStage(t, &recordingStage{}, func(_ *orchestrator.Pool, c *Config) { c.MaxModelLen = 4096 })
	status, _, body := send(t, "GET", url+"/v1/models", "", "")
	if status != 200 {
		t.Fatalf("GET /v1/models: %d %s", status, body)
	}
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || list.Object != "list" || len(list.Data) != 1 {
		t.Fatalf("GET /v1/models: %s (%v)", body, err)
	}
	card := list.Data[0]
	for _, key := range []string{"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"} {
		if _, ok := card[key]; !ok {
			t.Errorf("model card without %q: %s", key, body)
		}
	}
	if card["id"] != "omnipd-reference" || card["object"] != "model" || card["root"] != "omnipd-reference" || card["parent"] != nil || card["max_model_len"] != 4096.0 {
		t.Errorf("model card %v: want id and root omnipd-reference, object model, parent null, max_model_len 4096", card)
	}
	perms, _ := card["permission"].([]any)
	if len(perms) != 1 {
		t.Fatalf("permission %v: want one", card["permission"])
	}
	perm, _ := perms[0].(map[string]any)
	want := map[string]any{"object": "model_permission", "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
		"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false}
	for k, v := range want {
		if got, ok := perm[k]; !ok || got != v {
			t.Errorf("permission %s = %v, want %v", k, got, v)
		}
	}
	if id, _ := perm["id"].(string); !strings.HasPrefix(id, "modelperm-") {
		t.Errorf("permission id %q: want modelperm-…", perm["id"])
	}

	// An unknown context is null, as vLLM's Optional[int].
	url = behindStage(t, &recordingStage{}, func(*orchestrator.Pool, *Config) {})
	_, _, body = send(t, "GET", url+"/v1/models", "", "")
	if !strings.Contains(body, `"max_model_len":null`) {
		t.Errorf("unknown max model length: %s, want max_model_len null", body)
	}
}

// /version is vLLM's {"version": ...}, with omnipd's version, and needs no
// API key (vLLM's key guards only /v1).
func TestVersion(t *testing.T) {
	url := behindStage(t, &recordingStage{}, func(_ *orchestrator.Pool, c *Config) { c.APIKey = apiKey; c.Version = "v9.8.7" })
	status, header, body := send(t, "GET", url+"/version", "", "")
	if status != 200 || !strings.HasPrefix(header.Get("Content-Type"), "application/json") {
		t.Fatalf("GET /version: %d %s", status, body)
	}
	var v struct{ Version string }
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Version != "v9.8.7" {
		t.Errorf("GET /version: %s, want version v9.8.7", body)
	}
}

// tokenStage is a Thinker that serves vLLM's /tokenize and /detokenize as
// vLLM does, and refuses a prompt it finds too long the way vLLM does.
type tokenStage struct {
	mu    sync.Mutex
	calls []string // path and body of each request
}

func (s *tokenStage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.calls = append(s.calls, r.URL.Path+" "+string(b))
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case strings.Contains(string(b), "too long"):
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"This model's maximum context length is 8 tokens.","type":"BadRequestError","param":null,"code":400}}`)
	case r.URL.Path == "/tokenize":
		io.WriteString(w, `{"count":3,"max_model_len":4096,"tokens":[9707,11,1879],"token_strs":null}`)
	case r.URL.Path == "/detokenize":
		io.WriteString(w, `{"prompt":"Hello, world"}`)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// /tokenize and /detokenize go to a Thinker instance as the client sent
// them, and its answer — vLLM's TokenizeResponse, DetokenizeResponse, or
// its 400 — comes back as it is. An API key guards them, since they run
// the model's tokenizer for anyone; a wrong model is a 404 that reaches no
// stage.
func TestTokenizeAndDetokenizeReachAThinker(t *testing.T) {
	stage := &tokenStage{}
	url := behindStage(t, stage, func(_ *orchestrator.Pool, c *Config) { c.APIKey = apiKey })
	auth := "Bearer " + apiKey
	for _, c := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/tokenize", `{"model":"omnipd-reference","prompt":"Hello, world","add_special_tokens":true}`, 200, `"tokens":[9707,11,1879]`},
		{"/tokenize", `{"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":true}`, 200, `"count":3`},
		{"/detokenize", `{"model":"omnipd-reference","tokens":[9707,11,1879]}`, 200, `{"prompt":"Hello, world"}`},
		{"/tokenize", `{"prompt":"too long"}`, 400, "maximum context length"},
	} {
		status, _, body := send(t, "POST", url+c.path, auth, c.body)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("POST %s %s: %d %s, want %d with %s", c.path, c.body, status, body, c.status, c.want)
		}
	}
	stage.mu.Lock()
	calls := append([]string(nil), stage.calls...)
	stage.mu.Unlock()
	if len(calls) != 4 || calls[0] != `/tokenize {"model":"omnipd-reference","prompt":"Hello, world","add_special_tokens":true}` || !strings.HasPrefix(calls[2], "/detokenize ") {
		t.Errorf("the stage got %q: want each request passed on unchanged", calls)
	}
	for _, path := range []string{"/tokenize", "/detokenize"} {
		if status, _, body := send(t, "POST", url+path, "", `{"prompt":"x","tokens":[1]}`); status != http.StatusUnauthorized {
			t.Errorf("POST %s without the API key: %d %s, want 401", path, status, body)
		}
	}
	if status, _, body := send(t, "POST", url+"/tokenize", auth, `{"model":"other","prompt":"x"}`); status != http.StatusNotFound || !strings.Contains(body, "model_not_found") {
		t.Errorf("POST /tokenize for another model: %d %s, want 404 model_not_found", status, body)
	}
	if status, _, body := send(t, "POST", url+"/tokenize", auth, `[1,2]`); status != http.StatusBadRequest {
		t.Errorf("POST /tokenize with an array: %d %s, want 400", status, body)
	}
	stage.mu.Lock()
	defer stage.mu.Unlock()
	if len(stage.calls) != 4 {
		t.Errorf("the stage got %d requests, want 4 (none of the refused ones): %q", len(stage.calls), stage.calls)
	}
}

// The answer's id, and every streamed chunk's, is "chatcmpl-" (or "cmpl-")
// and the client's X-Request-Id exactly, as vLLM names it; the stage legs
// still carry an id of their own that starts with the client's.
func TestAnswerIDIsTheClientsRequestID(t *testing.T) {
	stage := &fakeThinker{events: 3, got: make(chan struct{}, 8)}
	rec := &idRecorder{next: stage}
	addr, _ := frontDoor(t, rec, Config{}, HTTPConfig{})
	for _, c := range []struct {
		path, body, want string
	}{
		{"/v1/chat/completions", smallChat, "chatcmpl-my-req-1"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}],"stream":true}`, "chatcmpl-my-req-1"},
		{"/v1/completions", `{"prompt":"hello","max_tokens":2}`, "cmpl-my-req-1"},
	} {
		req, _ := http.NewRequest("POST", "http://"+addr+c.path, strings.NewReader(c.body))
		req.Header.Set("X-Request-Id", "my-req-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ids := chunkID.FindAllString(string(b), -1)
		if resp.StatusCode != 200 || len(ids) == 0 {
			t.Fatalf("POST %s: %d %s", c.path, resp.StatusCode, b)
		}
		for _, id := range ids {
			if id != fmt.Sprintf(`"id":%q`, c.want) {
				t.Errorf("POST %s: %s, want every id %q", c.path, id, c.want)
			}
		}
	}
	for _, id := range rec.ids() {
		if id == "my-req-1" || !strings.HasPrefix(id, "my-req-1-") {
			t.Errorf("a stage leg carried %q: want the client's id with omnipd's suffix", id)
		}
	}
}

// idRecorder keeps the X-Request-Id of every request before next answers.
type idRecorder struct {
	mu   sync.Mutex
	seen []string
	next http.Handler
}

func (r *idRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.seen = append(r.seen, req.Header.Get("X-Request-Id"))
	r.mu.Unlock()
	r.next.ServeHTTP(w, req)
}

func (r *idRecorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// Every request gets one access line at info — both ids, method, path,
// status, duration, and for a stream its events and the time to the first
// — and only one, however many chunks it streams.
func TestOneAccessLinePerRequest(t *testing.T) {
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	up := httptest.NewServer(&fakeThinker{events: 5, got: make(chan struct{}, 8)})
	t.Cleanup(up.Close)
	c, err := stageclient.New(stageclient.Config{BaseURL: up.URL, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewOrchestrator()
	o, err := orchestrator.New(orchestrator.Config{Decode: &orchestrator.Pool{Name: "thinker", Instances: []*orchestrator.Instance{{Client: c}}}, Logger: quiet, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(New(Config{Orchestrator: o, ModelName: "omnipd-reference", Logger: log, Metrics: m}))
	t.Cleanup(hs.Close)
	requests := []struct {
		method, path, id, body string
		status                 int
		stream                 bool
	}{
		{"POST", "/v1/chat/completions", "whole-1", smallChat, 200, false},
		{"POST", "/v1/chat/completions", "stream-1", `{"messages":[{"role":"user","content":"hello"}],"stream":true}`, 200, true},
		{"GET", "/v1/models", "models-1", "", 200, false},
		{"POST", "/v1/nope", "nope-1", "{}", 404, false},
	}
	for _, r := range requests {
		req, _ := http.NewRequest(r.method, hs.URL+r.path, strings.NewReader(r.body))
		req.Header.Set("X-Request-Id", r.id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	lines := map[string][]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if l["msg"] == "request" {
			id, _ := l["client_request_id"].(string)
			lines[id] = append(lines[id], l)
		}
	}
	for _, r := range requests {
		got := lines[r.id]
		if len(got) != 1 {
			t.Errorf("%s %s: %d access lines, want 1:\n%s", r.method, r.path, len(got), logs.String())
			continue
		}
		l := got[0]
		if l["level"] != "INFO" || l["method"] != r.method || l["path"] != r.path || l["status"] != float64(r.status) || l["duration"] == nil {
			t.Errorf("%s %s: access line %v", r.method, r.path, l)
		}
		if id, _ := l["request_id"].(string); !strings.HasPrefix(id, r.id+"-") {
			t.Errorf("%s %s: request_id %q, want the legs' id", r.method, r.path, id)
		}
		_, events := l["events"]
		_, first := l["first_event"]
		if r.stream && (l["events"] != 5.0 || !first) || !r.stream && (events || first) {
			t.Errorf("%s %s (stream %v): events %v, first_event %v", r.method, r.path, r.stream, l["events"], l["first_event"])
		}
	}
}

// A token-id prompt that cannot fit the Thinker's context is refused by
// omnipd itself with vLLM's 400, before its ids are decoded or any stage
// sees it; one that fits goes on.
func TestLongTokenPromptRefusedAtTheDoor(t *testing.T) {
	stage := &recordingStage{}
	url := behindStage(t, stage, func(_ *orchestrator.Pool, c *Config) { c.MaxModelLen = 64 })
	ids := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = "7"
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	status, _, body := send(t, "POST", url+"/v1/completions", "", `{"prompt":`+ids(64)+`,"max_tokens":1}`)
	if status != http.StatusBadRequest || !strings.Contains(body, `"code":"context_length_exceeded"`) || !strings.Contains(body, `"param":"prompt"`) {
		t.Errorf("a prompt of 64 ids, context 64: %d %s, want 400 context_length_exceeded", status, body)
	}
	if bodies, _ := stage.received(); len(bodies) != 0 {
		t.Errorf("the refused prompt reached the stage: %v", bodies)
	}
	if status, _, body := send(t, "POST", url+"/v1/completions", "", `{"prompt":`+ids(63)+`,"max_tokens":1}`); status != 200 {
		t.Errorf("a prompt of 63 ids, context 64: %d %s", status, body)
	}
}
