package stagetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/omnipd/omnipd/stageapi"
	"github.com/omnipd/omnipd/stageclient"
)

// reply is one whole HTTP answer.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string {
	const max = 600
	b := string(bytes.TrimSpace(r.body))
	if len(b) > max {
		b = b[:max] + "…"
	}
	if r.header.Get("Content-Type") == "application/octet-stream" {
		b = fmt.Sprintf("<%d bytes of %s>", len(r.body), r.header.Get("Content-Type"))
	}
	return fmt.Sprintf("HTTP %d %s", r.status, b)
}

// withSecret is the Authorization header of the deployment.
func (c *checker) withSecret() string { return "Bearer " + c.d.Secret }

// call sends one request and reads the whole answer; a transport error
// fails the check.
func (c *checker) call(method, target, auth string, body []byte, header ...string) reply {
	c.Helper()
	r, err := c.try(method, target, auth, body, header...)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		c.Fatalf("%s %s: %v: the worker closed the connection without an answer (HTTP/1.1 keeps it open for the next request unless the answer says Connection: close)", method, target, err)
	}
	if err != nil {
		c.Fatalf("%s %s: %v", method, target, err)
	}
	return r
}

// try is call that returns the transport error.
func (c *checker) try(method, target, auth string, body []byte, header ...string) (reply, error) {
	resp, err := c.open(c.ctx, method, target, auth, body, header...)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("reading the answer: %w", err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// open sends one request and returns the answer unread. header holds
// name, value pairs.
func (c *checker) open(ctx context.Context, method, target, auth string, body []byte, header ...string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return c.http.Do(req)
}

// post sends v as JSON with the secret.
func (c *checker) post(target string, v any, header ...string) reply {
	c.Helper()
	return c.call(http.MethodPost, target, c.withSecret(), mustJSON(v), header...)
}

func mustJSON(v any) []byte {
	if raw, ok := v.([]byte); ok {
		return raw
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("stagetest: a request that is no JSON: %v", err))
	}
	return b
}

// errorBody is OpenAI's error body.
type errorBody struct {
	Error *struct {
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Param   json.RawMessage `json:"param"`
		Code    json.RawMessage `json:"code"`
	} `json:"error"`
}

// param is the error's param, "" when null or absent.
func (e errorBody) param() string {
	var s string
	_ = json.Unmarshal(e.Error.Param, &s)
	return s
}

// code is the error's code as a string, "" when null or absent.
func (e errorBody) code() string {
	var s string
	_ = json.Unmarshal(e.Error.Code, &s)
	return s
}

// openAIError reads r as OpenAI's error body, or says why it is not one.
func openAIError(r reply) (errorBody, error) {
	var e errorBody
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return e, fmt.Errorf("Content-Type %q, want application/json", ct)
	}
	if err := json.Unmarshal(r.body, &e); err != nil {
		return e, fmt.Errorf("not JSON: %v", err)
	}
	if e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return e, errors.New(`not OpenAI's error body {"error": {"message", "type", "param", "code"}}`)
	}
	return e, nil
}

// wantError checks that r is status with OpenAI's error body naming param
// (any param when param is "").
func (c *checker) wantError(what string, r reply, status int, param string) {
	c.Helper()
	if r.status != status {
		c.Errorf("%s: %v; want %d", what, r, status)
		return
	}
	e, err := openAIError(r)
	if err != nil {
		c.Errorf("%s: %v: %s", what, err, r)
		return
	}
	if param != "" && e.param() != param {
		c.Errorf("%s: param %s; want %q: %s", what, e.Error.Param, param, r)
	}
}

// completion is a /v1/completions or /v1/chat/completions answer (both
// shapes: text, or message.content).
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage            *usage          `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	Conditioning     *struct {
		Key  string `json:"key"`
		Rows *int   `json:"rows"`
	} `json:"omnipd_conditioning"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// text is the first choice's text or message content.
func (r *completion) text() string {
	if len(r.Choices) == 0 {
		return ""
	}
	ch := r.Choices[0]
	switch {
	case ch.Text != nil:
		return *ch.Text
	case ch.Message != nil && ch.Message.Content != nil:
		return *ch.Message.Content
	}
	return ""
}

// generate sends a completions or chat request (by whether body has
// messages) and decodes the answer; anything but a 200 with a choice and
// usage fails the check.
func (c *checker) generate(base, what string, body map[string]any, header ...string) *completion {
	c.Helper()
	r := c.post(base+pathOf(body), body, header...)
	return c.decodeCompletion(what, r)
}

func (c *checker) decodeCompletion(what string, r reply) *completion {
	c.Helper()
	if r.status != http.StatusOK {
		c.Fatalf("%s: %v", what, r)
	}
	var out completion
	if err := json.Unmarshal(r.body, &out); err != nil {
		c.Fatalf("%s: the answer is not JSON: %v: %s", what, err, r)
	}
	if len(out.Choices) != 1 || out.Usage == nil {
		c.Fatalf("%s: want one choice and usage: %s", what, r)
	}
	return &out
}

func pathOf(body map[string]any) string {
	if _, chat := body["messages"]; chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// sampling is how a request samples: the checks compare an engine with
// itself greedy and seeded.
type sampling struct {
	name        string
	temperature float64
	seed        int64
}

var samplings = []sampling{{name: "greedy"}, {name: "seeded", temperature: 0.8, seed: 1234}}

func (s sampling) apply(body map[string]any) map[string]any {
	body = maps.Clone(body)
	body["temperature"] = s.temperature
	if s.temperature > 0 {
		body["seed"] = s.seed
	}
	return body
}

// completionBody is a completions request for a text prompt.
func (c *checker) completionBody(prompt string, maxTokens int) map[string]any {
	return map[string]any{"model": c.d.Model, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0.0}
}

// chatBody is a chat request of one user turn.
func (c *checker) chatBody(content string, maxTokens int) map[string]any {
	return map[string]any{"model": c.d.Model, "messages": []map[string]any{{"role": "user", "content": content}},
		"max_tokens": maxTokens, "temperature": 0.0}
}

// keep asks the Thinker to keep the request's conditioning under key.
func (c *checker) keep(body map[string]any, key string, stream bool) map[string]any {
	body = maps.Clone(body)
	cond := map[string]any{"key": key, "layer": c.d.Layer}
	if stream {
		cond["stream"] = true
	}
	body["omnipd_conditioning"] = cond
	return body
}

// event is one SSE event's data.
type event struct {
	data string
}

// readSSE reads a whole SSE body strictly as vLLM frames one: every event
// a single "data: <payload>" line ended by a blank line (comment lines
// allowed, no other field), the last event [DONE] and nothing after it.
func readSSE(r io.Reader) ([]event, error) {
	var events []event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	var pending *event
	done := false
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		switch {
		case text == "":
			if pending != nil {
				events = append(events, *pending)
				pending = nil
			}
		case strings.HasPrefix(text, ":"):
		case done:
			return events, fmt.Errorf("line %d: %.80q after data: [DONE]", line, text)
		case strings.HasPrefix(text, "data:"):
			if pending != nil {
				return events, fmt.Errorf("line %d: a second data line in one event: %.80q", line, text)
			}
			// The one space after the colon is optional (the SSE spec).
			pending = &event{data: strings.TrimPrefix(strings.TrimPrefix(text, "data:"), " ")}
			done = pending.data == "[DONE]"
		default:
			return events, fmt.Errorf("line %d: %.80q is no SSE data line", line, text)
		}
	}
	if err := sc.Err(); err != nil {
		return events, err
	}
	if pending != nil {
		return events, fmt.Errorf("the last event, %.80q, is not ended by a blank line", pending.data)
	}
	if !done {
		return events, errors.New("the stream ended without data: [DONE]")
	}
	return events[:len(events)-1], nil
}

// stream sends body and reads its SSE answer whole: the events before
// [DONE].
func (c *checker) stream(target, what string, body any) []event {
	c.Helper()
	resp, err := c.open(c.ctx, http.MethodPost, target, c.withSecret(), mustJSON(body))
	if err != nil {
		c.Fatalf("%s: %v", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		c.Fatalf("%s: %v", what, reply{resp.StatusCode, resp.Header, b})
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		c.Errorf("%s: Content-Type %q, want text/event-stream", what, ct)
	}
	events, err := readSSE(resp.Body)
	if err != nil {
		c.Fatalf("%s: %v", what, err)
	}
	return events
}

// stashPath is a conditioning key's URL on a Thinker.
func stashPath(base, key string) string {
	return base + stageapi.ConditioningPath + url.PathEscape(key)
}

// ocndHeader is the wire form's header: magic, version, six counts.
const ocndHeader = 4 + 1 + 6*4

// checkOCND checks body against its own header, before decoding it, so
// that a mismatch is reported in the wire form's terms.
func checkOCND(body []byte) error {
	if len(body) < ocndHeader {
		return fmt.Errorf("%d bytes: shorter than the %d-byte header", len(body), ocndHeader)
	}
	if string(body[:4]) != "OCND" || body[4] != 1 {
		return fmt.Errorf("starts %q, version %d; want magic OCND, version 1", body[:4], body[4])
	}
	var n [6]uint64
	for i := range n {
		n[i] = uint64(binary.LittleEndian.Uint32(body[5+4*i:]))
	}
	rows, embed, hidden, tts, ids, prompt := n[0], n[1], n[2], n[3], n[4], n[5]
	want := ocndHeader + 4*(rows*embed+rows*hidden+3*tts+ids+prompt)
	if uint64(len(body)) != want {
		return fmt.Errorf("%d bytes; its header (rows %d, embed width %d, hidden width %d, TTS width %d, %d token ids, %d prompt ids) says %d",
			len(body), rows, embed, hidden, tts, ids, prompt, want)
	}
	return nil
}

// decodeStash checks r is a conditioning body and decodes it with the
// project's own decoder.
func decodeStash(r reply) (*stageapi.Conditioning, error) {
	if r.status != http.StatusOK {
		return nil, fmt.Errorf("%v; want 200", r)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/octet-stream" {
		return nil, fmt.Errorf("Content-Type %q; want application/octet-stream", ct)
	}
	if err := checkOCND(r.body); err != nil {
		return nil, err
	}
	return stageapi.DecodeConditioning(r.body)
}

// fetch takes the stash under key whole (a GET, which frees it).
func (c *checker) fetch(base, key string) *stageapi.Conditioning {
	c.Helper()
	st, err := decodeStash(c.call(http.MethodGet, stashPath(base, key), c.withSecret(), nil))
	if err != nil {
		c.Fatalf("GET %s%s: %v", stageapi.ConditioningPath, key, err)
	}
	return st
}

// wantGone checks that the stash under key is no longer there.
func (c *checker) wantGone(base, key, why string) {
	c.Helper()
	if r := c.call(http.MethodGet, stashPath(base, key), c.withSecret(), nil); r.status != http.StatusNotFound {
		c.Errorf("GET %s%s %s: %v; want 404", stageapi.ConditioningPath, key, why, r)
	}
}

// metric sums every series of name on base's /metrics (the project's own
// exposition reader); found is false when there is none.
func (c *checker) metric(base, name string) (value float64, found bool) {
	c.Helper()
	sc, err := stageclient.New(stageclient.Config{BaseURL: base, HTTP: c.http})
	if err != nil {
		c.Fatalf("%s: %v", base, err)
	}
	samples, err := sc.Metrics(c.ctx)
	if err != nil {
		c.Fatalf("%s/metrics: %v", base, err)
	}
	value, found = stageclient.SumSeries(samples, name)
	return value, found
}

// stashesMetric is the gauge of conditioning stashes a Thinker holds.
const stashesMetric = "omnipd_conditioning_stashes"

// stashes reads base's omnipd_conditioning_stashes; its absence fails.
func (c *checker) stashes(base string) int {
	c.Helper()
	v, ok := c.metric(base, stashesMetric)
	if !ok {
		c.Fatalf("%s/metrics has no %s", base, stashesMetric)
	}
	return int(v)
}

// wantStashes checks that base holds n stashes.
func (c *checker) wantStashes(base string, n int, why string) {
	c.Helper()
	if got := c.stashes(base); got != n {
		c.Errorf("%s %s: %s %d; want %d", base, why, stashesMetric, got, n)
	}
}

// eventually polls cond until it holds or the check's deadline passes,
// and says whether it held. The pace is a politeness to a busy machine,
// never a bound: only a hang reaches the deadline.
func (c *checker) eventually(cond func() bool) bool {
	for {
		if cond() {
			return true
		}
		select {
		case <-c.ctx.Done():
			return cond()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rowsEqual says whether two row sets are bit for bit the same, and where
// they first differ.
func rowsEqual(a, b [][]float32) (bool, string) {
	if len(a) != len(b) {
		return false, fmt.Sprintf("%d rows against %d", len(a), len(b))
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false, fmt.Sprintf("row %d: width %d against %d", i, len(a[i]), len(b[i]))
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return false, fmt.Sprintf("row %d, element %d: %v against %v", i, j, a[i][j], b[i][j])
			}
		}
	}
	return true, ""
}

func vecEqual(a, b []float32) bool {
	ok, _ := rowsEqual([][]float32{a}, [][]float32{b})
	return ok
}

func intsString(ids []int) string {
	parts := make([]string, len(ids))
	for i, v := range ids {
		parts[i] = strconv.Itoa(v)
	}
	if len(parts) > 24 {
		parts = append(parts[:24], "…")
	}
	return "[" + strings.Join(parts, " ") + "]"
}
