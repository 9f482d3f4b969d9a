package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/omnipd/omnipd/openai"
)

// Endpoints a benchmark can drive.
const (
	EndpointChat        = "chat"
	EndpointCompletions = "completions"
)

// Target is the server under test and the shape of every request.
type Target struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8000.
	BaseURL string
	APIKey  string
	// Model is sent as "model"; empty leaves it out.
	Model string
	// Endpoint is EndpointChat (the default) or EndpointCompletions.
	Endpoint string
	// Audio asks a chat request for text and audio; otherwise text only.
	Audio bool
	// AudioFormat is wav (the default) or pcm.
	AudioFormat string
	// IgnoreEOS asks the server to generate exactly max_tokens.
	IgnoreEOS bool
}

func (t Target) audioFormat() string {
	if t.AudioFormat == "" {
		return "wav"
	}
	return t.AudioFormat
}

// Validate reports a target the benchmark cannot drive.
func (t Target) Validate() error {
	switch t.Endpoint {
	case "", EndpointChat:
	case EndpointCompletions:
		if t.Audio {
			return errors.New("audio needs the chat endpoint; completions answer text only")
		}
	default:
		return fmt.Errorf("endpoint %q: want chat or completions", t.Endpoint)
	}
	if f := t.audioFormat(); f != "wav" && f != "pcm" {
		return fmt.Errorf("audio format %q: the benchmark measures wav or pcm", f)
	}
	if !strings.HasPrefix(t.BaseURL, "http://") && !strings.HasPrefix(t.BaseURL, "https://") {
		return fmt.Errorf("base URL %q: want http://host:port", t.BaseURL)
	}
	return nil
}

func (t Target) url() string {
	base := strings.TrimRight(t.BaseURL, "/")
	if t.Endpoint == EndpointCompletions {
		return base + "/v1/completions"
	}
	return base + "/v1/chat/completions"
}

// Body is the JSON request for prompt p: always streamed, with usage in
// the last chunk. A prompt with media is one user message whose content is
// the text part and then the media parts, the order vLLM's bench sends them
// in (mm_position "last").
func (t Target) Body(p Prompt) ([]byte, error) {
	req := map[string]any{
		"max_tokens":     p.MaxTokens,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if t.Model != "" {
		req["model"] = t.Model
	}
	if t.IgnoreEOS {
		req["ignore_eos"] = true
	}
	if t.Endpoint == EndpointCompletions {
		if len(p.Media) > 0 {
			return nil, errors.New("bench: media need the chat endpoint; completions take text only")
		}
		req["prompt"] = p.Text
	} else {
		var content any = p.Text
		if len(p.Media) > 0 {
			parts := []any{map[string]string{"type": "text", "text": p.Text}}
			for i := range p.Media {
				parts = append(parts, mediaMarker(i))
			}
			content = parts
		}
		req["messages"] = []map[string]any{{"role": "user", "content": content}}
		req["modalities"] = []string{openai.ModalityText}
		if t.Audio {
			req["modalities"] = []string{openai.ModalityText, openai.ModalityAudio}
			req["audio"] = map[string]string{"format": t.audioFormat()}
		}
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("bench: encoding the request: %w", err)
	}
	if len(p.Media) == 0 {
		return b, nil
	}
	return spliceMedia(b, p.Media)
}

// mediaMarker stands for media part i in the marshaled request until
// spliceMedia replaces it. spliceMedia looks for it as an element after a
// comma, which no text can produce: every quote inside a JSON string is
// escaped, so a quote there follows a backslash.
func mediaMarker(i int) string { return fmt.Sprintf("\x00omnipd-media-%d", i) }

// spliceMedia writes the request with each marker replaced by its part's
// JSON, copying the parts' shared pieces once, straight into the body:
// marshaling megabytes of base64 as a Go string would scan and copy them
// again for every request.
func spliceMedia(b []byte, media []MediaPart) ([]byte, error) {
	size := len(b)
	for _, m := range media {
		size += m.jsonLen()
	}
	out := make([]byte, 0, size)
	rest := b
	for i, m := range media {
		marker, _ := json.Marshal(mediaMarker(i))
		marker = append([]byte{','}, marker...)
		at := bytes.Index(rest, marker)
		if at < 0 {
			return nil, fmt.Errorf("bench: media part %d has no place in the request", i)
		}
		out = append(out, rest[:at+1]...)
		for _, piece := range m.pieces {
			out = append(out, piece...)
		}
		rest = rest[at+len(marker):]
	}
	return append(out, rest...), nil
}

// NewHTTPClient is a client tuned for load generation: keep-alive with room
// for conns idle connections to the host (so every concurrent request
// reuses one), no compression (it would buffer SSE), no proxy, and no
// overall timeout, which would cut long streams; bound each request with
// its context instead.
func NewHTTPClient(conns int) *http.Client {
	conns = max(conns, 16)
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		TLSHandshakeTimeout: 10 * time.Second,
	}}
}

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// send runs one request and measures it. It never returns an error: a
// failure is the record's.
func send(ctx context.Context, hc *http.Client, t Target, p Prompt, rec *Record, timeout time.Duration) {
	rec.MaxTokens = p.MaxTokens
	rec.PromptTokens = p.InputTokens
	rec.MediaItems, rec.MediaBytes = len(p.Media), p.MediaBytes()
	body, err := t.Body(p)
	if err != nil {
		rec.Error = err.Error()
		return
	}
	rec.RequestBytes = len(body)
	reqCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		reqCtx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	hreq, err := http.NewRequestWithContext(reqCtx, http.MethodPost, t.url(), bytes.NewReader(body))
	if err != nil {
		rec.Error = err.Error()
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	hreq.Header.Set("X-Request-Id", rec.RequestID)
	if t.APIKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+t.APIKey)
	}
	fail := func(err error) {
		switch {
		case ctx.Err() != nil:
			rec.Canceled = true
			rec.Error = "canceled: the benchmark was interrupted"
		case errors.Is(err, context.DeadlineExceeded) || reqCtx.Err() != nil:
			rec.Error = fmt.Sprintf("timed out after %v", timeout)
		default:
			rec.Error = err.Error()
		}
	}
	start := time.Now()
	resp, err := hc.Do(hreq)
	if err != nil {
		fail(err)
		return
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		rec.Error = httpError(resp.StatusCode, raw)
		return
	}
	p2 := newStreamParser(rec, t)
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			fail(fmt.Errorf("reading the response: %w", err))
			return
		}
		if err := p2.whole(time.Since(start), raw); err != nil {
			rec.Error = err.Error()
			return
		}
	} else {
		sse := openai.NewSSEReader(resp.Body, 0)
		for {
			ev, err := sse.Next()
			if errors.Is(err, io.EOF) {
				drainAfterDone(resp.Body)
				break
			}
			if err != nil {
				fail(fmt.Errorf("reading the stream: %w", err))
				return
			}
			if err := p2.event(time.Since(start), ev); err != nil {
				rec.Error = err.Error()
				return
			}
		}
	}
	if err := p2.finish(); err != nil {
		rec.Error = err.Error()
	}
}

// Bounds on reading a body past its [DONE]: a server ends the body right
// after it, and one that goes on sending must not hold the next request up.
const (
	drainGrace = 100 * time.Millisecond
	drainLimit = 64 << 10
)

// drainAfterDone reads what follows [DONE] up to the end of the body, as
// the OpenAI SDKs do. Closing a body before its end makes net/http drop the
// connection, and the next request would pay for a new one: a cost of the
// client, not of the server under test.
func drainAfterDone(body io.ReadCloser) {
	t := time.AfterFunc(drainGrace, func() { body.Close() })
	defer t.Stop()
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainLimit))
}

// httpError words a non-200 answer: the OpenAI error body's message when
// there is one, else the start of the body.
func httpError(status int, body []byte) string {
	var e openai.ErrorResponse
	if json.Unmarshal(body, &e) == nil && e.Detail.Message != "" {
		msg := e.Detail.Message
		if e.Detail.Code != nil && *e.Detail.Code != "" {
			msg += " (" + *e.Detail.Code + ")"
		}
		return fmt.Sprintf("HTTP %d: %s", status, msg)
	}
	text := strings.TrimSpace(string(body))
	if len(text) > 200 {
		text = text[:200] + "…"
	}
	if text == "" {
		text = http.StatusText(status)
	}
	return fmt.Sprintf("HTTP %d: %s", status, text)
}

// FirstModel asks the server's /v1/models for the model it serves, as
// vllm bench serve does when no model is named.
func FirstModel(ctx context.Context, hc *http.Client, baseURL, apiKey string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	url := strings.TrimRight(baseURL, "/") + "/v1/models"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("bench: listing models: %w", err)
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("bench: listing models at %s: %w", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("bench: listing models at %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("bench: listing models at %s: %s", url, httpError(resp.StatusCode, raw))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &list); err != nil || len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", fmt.Errorf("bench: %s lists no model; pass --model", url)
	}
	return list.Data[0].ID, nil
}
