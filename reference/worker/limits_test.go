package worker

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// A prompt that does not fit --max-model-len, alone or with its max_tokens,
// is a 400 context_length_exceeded naming the numbers, before the engine
// runs; one that fits is served.
func TestContextLengthExceeded(t *testing.T) {
	w := newPlainWorker(t, 64)
	tokens := func(n int) string {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprint(i + 1)
		}
		return "[" + strings.Join(ids, ",") + "]"
	}
	for _, c := range []struct {
		path, body string
		param      string
		numbers    []string
	}{
		{"/v1/completions", `{"prompt":` + tokens(70) + `,"max_tokens":1}`, "prompt", []string{"64", "70"}},
		{"/v1/completions", `{"prompt":` + tokens(60) + `,"max_tokens":10}`, "prompt", []string{"64", "60", "10"}},
		{"/v1/completions", `{"prompt":` + tokens(60) + `}`, "prompt", []string{"64", "60", "16"}}, // the default max_tokens
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + strings.Repeat("a", 80) + `"}]}`, "messages", []string{"64"}},
	} {
		status, _, b := call(t, "POST", w.url+c.path, "", c.body)
		var e struct {
			Error struct{ Message, Code, Param string } `json:"error"`
		}
		if status != 400 || json.Unmarshal([]byte(b), &e) != nil || e.Error.Code != CodeContextLengthExceeded || e.Error.Param != c.param {
			t.Errorf("%s %.40s: %d %s; want 400 %s on %s", c.path, c.body, status, b, CodeContextLengthExceeded, c.param)
			continue
		}
		for _, n := range c.numbers {
			if !strings.Contains(e.Error.Message, n) {
				t.Errorf("%q does not name %s", e.Error.Message, n)
			}
		}
	}
	if st := w.eng.Stats(); st.PromptTokensComputed != 0 {
		t.Errorf("refused prompts reached the engine: %+v", st)
	}
	if status, _, b := call(t, "POST", w.url+"/v1/completions", "", `{"prompt":`+tokens(60)+`,"max_tokens":4}`); status != 200 {
		t.Errorf("a prompt that fits: %d %s", status, b)
	}
	if _, _, b := call(t, "GET", w.url+"/v1/models", "", ""); !strings.Contains(b, `"max_model_len":64`) {
		t.Errorf("/v1/models does not report the configured length: %s", b)
	}
	if _, err := New(Config{Engine: w.eng, MaxModelLen: testModel.Config.MaxPositionEmbeddings + 1}); err == nil {
		t.Error("a max model length beyond the model's positions was accepted")
	}
}

// A prompt far longer than the context — as text, for either endpoint, or
// for /tokenize — is refused with vLLM's message and a lower bound on its
// tokens, having cost memory proportional to its body (the bytes read and
// the decoded string), not to its tokens: tokenizing stops past
// --max-model-len.
func TestHugePromptRefusedWithoutTokenizingIt(t *testing.T) {
	w := newPlainWorker(t, 64)
	const size = 4 << 20
	text := strings.Repeat("lorem ipsum ", size/12)
	for _, c := range []struct{ path, body, param string }{
		{"/v1/completions", `{"prompt":"` + text + `","max_tokens":1}`, "prompt"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + text + `"}]}`, "messages"},
		{"/tokenize", `{"prompt":"` + text + `"}`, "prompt"},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		status, _, b := call(t, "POST", w.url+c.path, "", c.body)
		runtime.ReadMemStats(&after)
		var e struct {
			Error struct{ Message, Code, Param string } `json:"error"`
		}
		want := "This model's maximum context length is 64 tokens. However, your request has at least "
		if status != 400 || json.Unmarshal([]byte(b), &e) != nil || e.Error.Code != CodeContextLengthExceeded || e.Error.Param != c.param ||
			!strings.HasPrefix(e.Error.Message, want) || !strings.HasSuffix(e.Error.Message, " input tokens. Please reduce the length of the input messages.") {
			t.Errorf("%s: %d %.300s; want 400 %s on %s, %q…", c.path, status, b, CodeContextLengthExceeded, c.param, want)
		}
		// Client and server share this process: the request body is
		// built, sent, read and decoded here — about five copies of it.
		if got := after.TotalAlloc - before.TotalAlloc; got > 8*size {
			t.Errorf("%s: refusing a %d MiB prompt allocated %d MiB; want at most %d", c.path, size>>20, got>>20, 8*size>>20)
		}
	}
	if st := w.eng.Stats(); st.PromptTokensComputed != 0 {
		t.Errorf("refused prompts reached the engine: %+v", st)
	}
}

// A prompt of token ids far past --max-model-len, sent to the worker
// directly, is refused with vLLM's 400 before its ids are decoded: refusing
// 15 MiB of ids costs no more than refusing a text prompt of the same size,
// where decoding them would cost eight bytes an id.
func TestTokenPromptPastTheContextIsRefusedUndecoded(t *testing.T) {
	w := newPlainWorker(t, 64)
	const ids = 15 << 20 / 2 // ids of one digit and a comma
	tokens := `{"max_tokens":1,"prompt":[` + strings.Repeat("1,", ids-1) + `1]}`
	text := `{"max_tokens":1,"prompt":"` + strings.Repeat("a", len(tokens)-len(`{"max_tokens":1,"prompt":""}`)) + `"}`
	refuse := func(body string) (allocated uint64, status int, answer string) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		status, _, answer = call(t, "POST", w.url+"/v1/completions", "", body)
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc, status, answer
	}
	// The yardstick: the body read and one copy of its text.
	yardstick, status, b := refuse(text)
	if status != 400 {
		t.Fatalf("a text prompt of %d bytes: %d %.300s, want 400", len(text), status, b)
	}
	alloc, status, b := refuse(tokens)
	var e struct {
		Error struct{ Message, Code, Param string } `json:"error"`
	}
	want := fmt.Sprintf("This model's maximum context length is 64 tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", ids)
	if status != 400 || json.Unmarshal([]byte(b), &e) != nil || e.Error.Code != CodeContextLengthExceeded || e.Error.Param != "prompt" || e.Error.Message != want {
		t.Errorf("a prompt of %d ids: %d %.300s; want 400 %s on prompt, %q", ids, status, b, CodeContextLengthExceeded, want)
	}
	t.Logf("refusing %d MiB of token ids allocated %d MiB; a text prompt of that size, %d MiB", len(tokens)>>20, alloc>>20, yardstick>>20)
	if alloc > yardstick {
		t.Errorf("refusing %d MiB of token ids allocated %d MiB, more than refusing a text prompt of that size (%d MiB)", len(tokens)>>20, alloc>>20, yardstick>>20)
	}
	if st := w.eng.Stats(); st.PromptTokensComputed != 0 {
		t.Errorf("refused prompts reached the engine: %+v", st)
	}
}
