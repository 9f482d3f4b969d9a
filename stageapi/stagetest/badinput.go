package stagetest

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/omnipd/omnipd/stageapi"
)

// badRequest is one refused request: the status and the param OpenAI's
// error body must name ("" where no one parameter is at fault, or where
// OpenAI itself names none, as for an unknown model).
type badRequest struct {
	name, path, body string
	status           int
	param            string
}

func (c *checker) refuseAll(base string, reqs []badRequest) {
	c.Helper()
	for _, b := range reqs {
		r := c.call(http.MethodPost, base+b.path, c.withSecret(), []byte(b.body))
		c.wantError(fmt.Sprintf("%s (POST %s %.80s)", b.name, b.path, b.body), r, b.status, b.param)
	}
}

// checkBadInputThinker: bad requests to a Thinker are 4xx with OpenAI's
// error body naming the parameter, keep nothing, and leave it healthy.
func checkBadInputThinker(c *checker) {
	base := c.thinker()
	_, maxLen := c.modelCard(base)
	cond := func(v string) string {
		return fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2,"omnipd_conditioning":%s}`, c.d.Model, v)
	}
	tooMany := "[" + strings.TrimSuffix(strings.Repeat("1,", maxLen+1), ",") + "]"
	reqs := []badRequest{
		{"invalid JSON", "/v1/completions", `{"prompt": "hi",`, 400, ""},
		{"invalid JSON", "/v1/chat/completions", `{"messages": [`, 400, ""},
		{"an unknown model", "/v1/completions", `{"model":"no-such-model","prompt":"hi","max_tokens":2}`, 404, ""},
		{"an unknown model", "/v1/chat/completions", `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, 404, ""},
		{"omnipd_conditioning that is no object", "/v1/completions", cond(`"k"`), 400, "omnipd_conditioning"},
		{"omnipd_conditioning without a key", "/v1/completions", cond(fmt.Sprintf(`{"layer":%d}`, c.d.Layer)), 400, "omnipd_conditioning"},
		{"omnipd_conditioning with an empty key", "/v1/completions", cond(fmt.Sprintf(`{"key":"","layer":%d}`, c.d.Layer)), 400, "omnipd_conditioning"},
		{"omnipd_conditioning at layer 0", "/v1/completions", cond(`{"key":"bad/0","layer":0}`), 400, "omnipd_conditioning"},
		{"omnipd_conditioning past the last layer", "/v1/completions", cond(`{"key":"bad/deep","layer":1000000}`), 400, "omnipd_conditioning"},
		{"omnipd_conditioning with a layer that is no integer", "/v1/completions", cond(`{"key":"bad/s","layer":"2"}`), 400, "omnipd_conditioning"},
		{"omnipd_conditioning that is no object", "/v1/chat/completions",
			fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"omnipd_conditioning":[]}`, c.d.Model), 400, "omnipd_conditioning"},
		{"invalid JSON", "/tokenize", `{"prompt":`, 400, ""},
		{"an unknown model", "/tokenize", `{"model":"no-such-model","prompt":"hi"}`, 404, ""},
		{"invalid JSON", "/detokenize", `{"tokens":[1,`, 400, ""},
		{"an unknown model", "/detokenize", `{"model":"no-such-model","tokens":[1]}`, 404, ""},
		{"a negative token id", "/detokenize", `{"tokens":[1,-1]}`, 400, "tokens"},
		{"an id that is no integer", "/detokenize", `{"tokens":[1,"a"]}`, 400, "tokens[1]"},
		{"more ids than max_model_len", "/detokenize", `{"tokens":` + tooMany + `}`, 400, "tokens"},
	}
	c.refuseAll(base, reqs)
	// An id past any vocabulary: vLLM's words for it.
	r := c.call(http.MethodPost, base+"/detokenize", c.withSecret(), []byte(`{"tokens":[2147483647]}`))
	c.wantError("an id outside the vocabulary", r, 400, "tokens")
	if e, err := openAIError(r); err == nil && !strings.Contains(e.Error.Message, "Token id 2147483647 is out of vocabulary") {
		c.Errorf("an id outside the vocabulary: message %q; want vLLM's \"Token id 2147483647 is out of vocabulary\"", e.Error.Message)
	}
	r = c.call(http.MethodPost, base+"/detokenize", c.withSecret(), []byte(`{"tokens":`+tooMany+`}`))
	if e, err := openAIError(r); err == nil && e.code() != "context_length_exceeded" {
		c.Errorf("more ids than max_model_len: code %s; want context_length_exceeded, as a /tokenize text that long", e.Error.Code)
	}
	c.wantStashes(base, 0, "after refused requests")
	if r := c.call(http.MethodGet, base+"/health", "", nil); r.status != http.StatusOK {
		c.Errorf("GET /health after bad requests: %v", r)
	}
	// And it still serves.
	c.generate(base, "a completion after bad requests", c.completionBody(shortPrompt, 2))
}

// checkBadInputTalker: bad Talker requests are 400s naming the parameter,
// before any stream and before the Talker fetches anything: the stash a
// refused request names is still there, and a corrected request reads it.
func checkBadInputTalker(c *checker) {
	base := c.talker()
	three := mustJSON(stageapi.TalkerRequest{MaxFrames: 2, Conditioning: []stageapi.ConditioningHandle{
		{URL: "http://127.0.0.1:1", Key: "a"}, {URL: "http://127.0.0.1:1", Key: "b"}, {URL: "http://127.0.0.1:1", Key: "c"}}})
	c.refuseAll(base, []badRequest{
		{"invalid JSON", stageapi.TalkerPath, `{"conditioning": [`, 400, ""},
		{"no conditioning", stageapi.TalkerPath, `{"conditioning": [], "max_frames": 2}`, 400, "conditioning"},
		{"three handles", stageapi.TalkerPath, string(three), 400, "conditioning"},
	})
	if c.d.Thinker == nil {
		c.Logf("no Thinker to keep a stash: that refused requests leave it is not checked")
	} else {
		c.badParamsKeepTheStash(base)
	}
	if r := c.call(http.MethodGet, base+"/health", "", nil); r.status != http.StatusOK {
		c.Errorf("GET /health after bad requests: %v", r)
	}
}

// talkerBadParams are Talker parameters out of range (docs/stage-api.md),
// as JSON members.
var talkerBadParams = []struct{ what, member, param string }{
	{"a negative max_frames", `"max_frames": -1`, "max_frames"},
	{"a max_frames that is no integer", `"max_frames": "4"`, "max_frames"},
	{"a negative temperature", `"temperature": -0.5`, "temperature"},
	{"a temperature past any float", `"temperature": 1e400`, "temperature"},
	// -1 is vLLM's spelling of top_k 0 (off), which a worker on vLLM may take.
	{"a top_k below -1", `"top_k": -2`, "top_k"},
	{"a top_k that is no integer", `"top_k": 2.5`, "top_k"},
	{"a seed that is a string", `"seed": "42"`, "seed"},
	{"a seed that is no integer", `"seed": 1.5`, "seed"},
}

// badParamsKeepTheStash sends the Talker requests for a kept stash with
// each bad parameter, batch and async chunk: every one is refused, the
// stash stays, and a corrected request reads it.
func (c *checker) badParamsKeepTheStash(base string) {
	thinker := c.thinker()
	const key = "bad-input/kept"
	c.generate(thinker, "the Thinker", c.keep(c.chatBody(shortPrompt, 4), key, false))
	handle := []stageapi.ConditioningHandle{{URL: thinker, Key: key}}
	for _, async := range []bool{false, true} {
		var reqs []badRequest
		for _, p := range talkerBadParams {
			reqs = append(reqs, badRequest{fmt.Sprintf("%s, async_chunk %v", p.what, async), stageapi.TalkerPath,
				fmt.Sprintf(`{"conditioning": %s, "async_chunk": %v, %s}`, mustJSON(handle), async, p.member), 400, p.param})
		}
		c.refuseAll(base, reqs)
	}
	c.wantStashes(thinker, 1, "after Talker requests refused for their parameters")
	if frames := c.talk(base, "the corrected request", stageapi.TalkerRequest{MaxFrames: 2, Conditioning: handle}); len(frames) == 0 {
		c.Errorf("the corrected request: no frames")
	}
	c.wantGone(thinker, key, "after the Talker read it")
}

// checkBadInputCode2Wav: bad Code2Wav requests are 400s naming the
// parameter.
func checkBadInputCode2Wav(c *checker) {
	base := c.code2wav()
	frames := func(n, id int) [][]int {
		out := make([][]int, n)
		for i := range out {
			out[i] = make([]int, stageapi.Codebooks)
			for q := range out[i] {
				out[i][q] = id
			}
		}
		return out
	}
	req := func(f [][]int, context int) string {
		return string(mustJSON(stageapi.Code2WavRequest{Codes: stageapi.FramesToWire(f), NumFrames: len(f), ContextFrames: context}))
	}
	short := string(mustJSON(stageapi.Code2WavRequest{Codes: make([]int, 2*stageapi.Codebooks-1), NumFrames: 2}))
	c.refuseAll(base, []badRequest{
		{"invalid JSON", stageapi.Code2WavPath, `{"codes": [1,`, 400, ""},
		{"an id past 2047", stageapi.Code2WavPath, req(frames(2, codebookSize), 0), 400, "codes"},
		{"a negative id", stageapi.Code2WavPath, req(frames(2, -1), 0), 400, "codes"},
		{"codes that are not 16 per frame", stageapi.Code2WavPath, short, 400, "codes"},
		{"more context than frames", stageapi.Code2WavPath, req(frames(2, 1), 3), 400, "context_frames"},
		{"negative context", stageapi.Code2WavPath, req(frames(2, 1), -1), 400, "context_frames"},
	})
	if r := c.call(http.MethodGet, base+"/health", "", nil); r.status != http.StatusOK {
		c.Errorf("GET /health after bad requests: %v", r)
	}
}
