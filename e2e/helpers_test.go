package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/internal/testbed"
)

// Bounds. Each is a hang bound, not a guess at how long the work takes:
// the suite runs on busy machines (two test binaries at once under the race
// detector, and whatever else the machine is doing), so a request, a wait
// or a settle that outlives its bound is stuck, never merely slow.
const (
	reqTimeout = 2 * time.Minute
	// settleWithin covers a KV lease running out (testbed default: 5 s).
	settleWithin = time.Minute
	waitWithin   = time.Minute
)

// Timeouts of the deployments that fault tests stall on purpose. A stalled
// stage reaches them; a healthy leg never does, though the machine is busy:
// a bystander, or the victim's other legs, never goes that long without a
// word.
const (
	// stallIdle is the stage idle timeout (and the prefill timeout) of a
	// deployment whose stage is stalled.
	stallIdle = 5 * time.Second
	// shortLease, in seconds, is the KV lease of a test whose abandoned KV
	// must be freed by the lease running out; a healthy decode claims its
	// KV well within it.
	shortLease = 3
)

const (
	chatPath       = "/v1/chat/completions"
	completionPath = "/v1/completions"
)

// chatBody is a chat request. extra is spliced in as more top-level fields.
func chatBody(content string, maxTokens int, stream bool, extra string) string {
	b := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%v`,
		testbed.ModelName, content, maxTokens, stream)
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

// textChat asks an omni deployment for text only, so it never reaches the
// Talker.
func textChat(content string, maxTokens int, stream bool) string {
	return chatBody(content, maxTokens, stream, `"modalities":["text"]`)
}

// longChat generates until stopped: EOS is ignored.
func longChat(content string, stream bool) string {
	return chatBody(content, 20000, stream, `"ignore_eos":true,"modalities":["text"]`)
}

func completionBody(prompt string, maxTokens int, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"stream":%v}`, testbed.ModelName, prompt, maxTokens, stream)
}

// answer is how one request ended, as the client saw it.
type answer struct {
	status int
	header http.Header
	body   []byte            // the whole body as read
	events []json.RawMessage // a stream's data payloads, [DONE] excluded
	done   bool              // the stream ended with [DONE]
	err    error             // the transport's error, the client's own cancellation included
}

func (a answer) String() string {
	return fmt.Sprintf("status %d, %d events, done %v, err %v, body %.300s", a.status, len(a.events), a.done, a.err, a.body)
}

// post sends body to path.
func post(ctx context.Context, d *testbed.Deployment, path, body string, hdr ...string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return d.Client.Do(req)
}

// send posts body and reads the whole answer, stream or not.
func send(ctx context.Context, d *testbed.Deployment, path, body string, hdr ...string) answer {
	resp, err := post(ctx, d, path, body, hdr...)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	return readAnswer(resp)
}

func readAnswer(resp *http.Response) answer {
	a := answer{status: resp.StatusCode, header: resp.Header}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		a.body, a.err = io.ReadAll(resp.Body)
		return a
	}
	s := newEvents(resp.Body)
	for {
		ev, err := s.next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				a.err = err
			}
			break
		}
		a.events = append(a.events, ev)
	}
	a.done, a.body = s.done, s.raw.Bytes()
	return a
}

// events reads SSE data payloads one at a time.
type events struct {
	r    *bufio.Reader
	raw  bytes.Buffer
	done bool
}

func newEvents(r io.Reader) *events { return &events{r: bufio.NewReaderSize(r, 1<<16)} }

// next returns the next payload; io.EOF after [DONE] or at the end.
func (e *events) next() (json.RawMessage, error) {
	for {
		line, err := e.r.ReadString('\n')
		e.raw.WriteString(line)
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			if data == "[DONE]" {
				e.done = true
				return nil, io.EOF
			}
			return json.RawMessage(data), nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// stream is a streaming request being read by the test.
type stream struct {
	resp   *http.Response
	ev     *events
	cancel context.CancelFunc
	seen   []json.RawMessage
}

// openStream starts a streaming request; cancel leaves it as a client
// that hangs up does.
func openStream(t *testing.T, d *testbed.Deployment, path, body string) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	resp, err := post(ctx, d, path, body)
	if err != nil {
		cancel()
		t.Fatalf("open stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("open stream: %d %s", resp.StatusCode, b)
	}
	s := &stream{resp: resp, ev: newEvents(resp.Body), cancel: cancel}
	t.Cleanup(s.close)
	return s
}

// until reads events until pred holds for one; false at the end of the stream.
func (s *stream) until(pred func(json.RawMessage) bool) bool {
	for {
		ev, err := s.ev.next()
		if err != nil {
			return false
		}
		s.seen = append(s.seen, ev)
		if pred(ev) {
			return true
		}
	}
}

// rest reads the stream to its end, and closes it: a stream read only up
// to its [DONE] may hold its connection, which is neither idle nor closed,
// until the test's cleanup — after the test has checked that nothing was
// left behind.
func (s *stream) rest() answer {
	defer s.close()
	a := answer{status: s.resp.StatusCode, header: s.resp.Header}
	for {
		ev, err := s.ev.next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				a.err = err
			}
			break
		}
		s.seen = append(s.seen, ev)
	}
	a.events, a.done, a.body = s.seen, s.ev.done, s.ev.raw.Bytes()
	return a
}

func (s *stream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// chunk is the parts of a stream chunk the tests read.
type chunk struct {
	Modality string `json:"modality"`
	Choices  []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func parseChunk(ev json.RawMessage) chunk {
	var c chunk
	_ = json.Unmarshal(ev, &c)
	return c
}

// hasContent holds for a chunk that carries text or audio.
func hasContent(ev json.RawMessage) bool {
	c := parseChunk(ev)
	for _, ch := range c.Choices {
		if ch.Delta.Content != "" || ch.Text != "" {
			return true
		}
	}
	return false
}

func isAudio(ev json.RawMessage) bool {
	c := parseChunk(ev)
	return c.Modality == "audio" && hasContent(ev)
}

// wellFormed checks a successful answer: 200, and a JSON completion with a
// choice, or a stream of chunks with no error event, one finish reason for
// each modality, and [DONE].
func wellFormed(a answer, streaming bool) error {
	if a.err != nil || a.status != http.StatusOK {
		return fmt.Errorf("not a success: %v", a)
	}
	if !streaming {
		var c struct {
			Object  string            `json:"object"`
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.Unmarshal(a.body, &c); err != nil || len(c.Choices) == 0 || c.Object == "" {
			return fmt.Errorf("malformed completion (%v): %.300s", err, a.body)
		}
		return nil
	}
	if !a.done {
		return fmt.Errorf("stream without [DONE]: %v", a)
	}
	// vllm-omni's rule: each modality's last chunk, and only it, carries
	// that modality's finish reason (a text-only stream has no modality
	// field, and one finish reason).
	finishes := map[string]int{}
	for _, ev := range a.events {
		c := parseChunk(ev)
		if c.Error != nil {
			return fmt.Errorf("error event in a successful stream: %s", ev)
		}
		if _, ok := finishes[c.Modality]; !ok {
			finishes[c.Modality] = 0
		}
		for _, ch := range c.Choices {
			if ch.FinishReason != nil {
				finishes[c.Modality]++
			}
		}
	}
	for modality, n := range finishes {
		if n != 1 {
			return fmt.Errorf("%d finish reasons for modality %q in the stream: %v", n, modality, a)
		}
	}
	return nil
}

// openAIError parses an OpenAI error body, checking it has a message and a
// type.
func openAIError(raw []byte) (*errorDetail, error) {
	var e struct {
		Error *errorDetail `json:"error"`
	}
	if err := json.Unmarshal(raw, &e); err != nil || e.Error == nil {
		return nil, fmt.Errorf("not an OpenAI error body (%v): %.300s", err, raw)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		return nil, fmt.Errorf("error body without message or type: %s", raw)
	}
	return e.Error, nil
}

// cleanError checks that a ended with an HTTP error status and an OpenAI
// error body, with code when code is not empty.
func cleanError(t *testing.T, a answer, status int, code string) {
	t.Helper()
	if a.err != nil || a.status != status {
		t.Errorf("want %d with an error body; got %v", status, a)
		return
	}
	e, err := openAIError(a.body)
	if err != nil {
		t.Error(err)
		return
	}
	if code != "" && (e.Code == nil || *e.Code != code) {
		t.Errorf("error code %v, want %q: %s", e.Code, code, a.body)
	}
}

// streamError checks that a is a stream that ended with an error event (an
// OpenAI error object, with code when code is not empty) and then [DONE].
func streamError(t *testing.T, a answer, code string) {
	t.Helper()
	if a.err != nil || a.status != http.StatusOK || !a.done || len(a.events) == 0 {
		t.Errorf("want a stream ended by an error event and [DONE]; got %v", a)
		return
	}
	last := a.events[len(a.events)-1]
	if _, err := openAIError(last); err != nil {
		t.Errorf("last event: %v", err)
		return
	}
	if c := parseChunk(last); code != "" && (c.Error.Code == nil || *c.Error.Code != code) {
		t.Errorf("error event code %v, want %q: %s", c.Error.Code, code, last)
	}
}

// warm serves one request of each kind, then records the deployment's
// goroutine baseline.
func warm(t *testing.T, d *testbed.Deployment) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	for _, stream := range []bool{false, true} {
		if err := wellFormed(send(ctx, d, chatPath, textChat("warm up", 4, stream)), stream); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
	d.Settled(t, settleWithin)
	d.Baseline(t)
}

// waitFor polls cond until it holds, failing t after waitWithin.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitWithin)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// bystanders send unrelated requests one after another — chat and
// completions, streamed and not, text only — while a fault happens
// elsewhere. Each must succeed.
type bystanders struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	failures []string
}

func startBystanders(d *testbed.Deployment) *bystanders {
	b := &bystanders{stop: make(chan struct{})}
	b.wg.Go(func() {
		for i := 0; ; i++ {
			// The first one always runs: a victim that fails fast could
			// otherwise be over before this goroutine first looked.
			select {
			case <-b.stop:
				if i > 0 {
					return
				}
			default:
			}
			stream := i%2 == 1
			path, body := chatPath, textChat(fmt.Sprintf("bystander %d", i), 6, stream)
			if i%4 >= 2 {
				path, body = completionPath, completionBody(fmt.Sprintf("bystander %d", i), 6, stream)
			}
			ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
			a := send(ctx, d, path, body)
			cancel()
			b.mu.Lock()
			if err := wellFormed(a, stream); err != nil {
				b.failures = append(b.failures, fmt.Sprintf("%s %s: %v", path, body, err))
			}
			b.mu.Unlock()
		}
	})
	return b
}

// finish stops the bystanders, once at least one has run, and fails t
// unless every one succeeded.
func (b *bystanders) finish(t *testing.T) {
	t.Helper()
	close(b.stop)
	b.wg.Wait()
	for _, f := range b.failures {
		t.Errorf("an unrelated request failed during the fault: %s", f)
	}
}

// hold stalls the answers of every worker in ws, starts a request with
// send, and returns the worker the request reached; the others resume.
func hold(t *testing.T, ws []*testbed.Worker, send func()) *testbed.Worker {
	t.Helper()
	before := make([]int64, len(ws))
	for i, w := range ws {
		w.HTTP.StallResponses()
		before[i] = w.HTTP.BytesUp()
	}
	send()
	var held *testbed.Worker
	waitFor(t, "the request to reach a worker", func() bool {
		for i, w := range ws {
			if w.HTTP.BytesUp() > before[i] {
				held = w
				return true
			}
		}
		return false
	})
	for _, w := range ws {
		if w != held {
			w.HTTP.Resume()
		}
	}
	return held
}

// running returns the worker whose engine is running a request.
func running(t *testing.T, ws []*testbed.Worker) *testbed.Worker {
	t.Helper()
	var found *testbed.Worker
	waitFor(t, "an engine to run the request", func() bool {
		for _, w := range ws {
			if w.Engine.Stats().Running > 0 {
				found = w
				return true
			}
		}
		return false
	})
	return found
}

// metric reads a sample of the public /metrics: the sum over every series
// of the named metric.
func metric(t *testing.T, d *testbed.Deployment, name string) float64 {
	t.Helper()
	resp, err := d.Client.Get(d.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			total += v
		}
	}
	return total
}
