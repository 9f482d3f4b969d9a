package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/stageclient"
)

// Encoder disaggregation (E/P/D) follows vLLM's disaggregated-encoder
// proxy (examples/online_serving/disaggregated_encoder/disagg_epd_proxy.py):
// each media item of a request goes to an encoder instance as a request of
// its own — that item alone, the text stripped, one output token — and then
// the prefill and the decode get the original request as without an
// encoder. A vLLM encoder keeps the item's outputs in its EC connector under
// the item's hash, where the prefill's connector finds them; a reference
// encoder answers with the key it kept them under, and the prefill leg is
// told, per item, which encoder to fetch them from
// (docs/encoder-disaggregation.md).

// encoderHandle names one media item's encoder outputs on an encoder
// instance.
type encoderHandle struct {
	URL string `json:"url,omitempty"`
	Key string `json:"key"`
}

// mediaPart is one media part of a chat request and where it sits.
type mediaPart struct {
	path string
	part openai.ContentPart
}

// mediaParts lists a chat request's media parts in order: every part that
// is not text.
func mediaParts(c *openai.ChatCompletionRequest) []mediaPart {
	var out []mediaPart
	for i, m := range c.Messages {
		if m.Content == nil {
			continue
		}
		for j, p := range m.Content.Parts {
			if p.Type != openai.PartText {
				out = append(out, mediaPart{path: fmt.Sprintf("messages[%d].content[%d]", i, j), part: p})
			}
		}
	}
	return out
}

// encode runs the encoder legs of a request with media, one item per leg,
// concurrently, and returns the handles the prefill leg carries (nil when
// the encoders are vLLM's, whose outputs the prefill finds by hash, or when
// the request has no media). On error, what was encoded is released.
func (o *Orchestrator) encode(ctx context.Context, req *Request, log *slog.Logger) ([]encoderHandle, error) {
	if o.cfg.Encoder == nil || req.Chat == nil {
		return nil, nil
	}
	parts := mediaParts(req.Chat)
	if len(parts) == 0 {
		return nil, nil
	}
	handles := make([]encoderHandle, len(parts))
	errs := make([]error, len(parts))
	// Every encoder a leg was sent to holds what it encoded under the
	// request's lease, answered or not: all are released at the end.
	var mu sync.Mutex
	sent := map[string]bool{}
	req.encoders = func() []string {
		mu.Lock()
		defer mu.Unlock()
		var urls []string
		for u := range sent {
			urls = append(urls, u)
		}
		return urls
	}
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Go(func() {
			h, err := o.encodeItem(ectx, req, i, p, func(url string) {
				mu.Lock()
				sent[url] = true
				mu.Unlock()
			}, log)
			handles[i], errs[i] = h, err
			if err != nil {
				cancel() // the request fails: the other items need not be encoded
			}
		})
	}
	wg.Wait()
	if err := firstEncoderError(errs); err != nil {
		o.releaseEncoded(req, log)
		return nil, err
	}
	for _, h := range handles {
		if h.Key == "" {
			return nil, nil // vLLM encoders: nothing to hand over
		}
	}
	return handles, nil
}

// firstEncoderError picks the error the client sees: a refusal of the
// client's media (4xx) over the failures it caused in the other legs.
func firstEncoderError(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil || errors.Is(err, context.Canceled) && first != nil {
			continue
		}
		var oe *Error
		if errors.As(err, &oe) && oe.Status < 500 {
			return err
		}
		if first == nil || errors.Is(first, context.Canceled) {
			first = err
		}
	}
	return first
}

// encodeItem sends one media item to an encoder instance, and to another
// for as long as the one it went to refused the connection (rotation.go).
func (o *Orchestrator) encodeItem(ctx context.Context, req *Request, i int, p mediaPart, sending func(url string), log *slog.Logger) (encoderHandle, error) {
	body, err := encoderBody(req, p)
	if err != nil {
		return encoderHandle{}, err
	}
	in, err := o.take(o.cfg.Encoder, nil)
	if err != nil {
		return encoderHandle{}, err
	}
	tried := map[*Instance]bool{}
	for {
		h, err := o.encodeOn(ctx, req, in, i, p, body, sending)
		o.track(o.cfg.Encoder, in, -1)
		if !refused(err) || ctx.Err() != nil {
			return h, err
		}
		if in, err = o.failover(o.cfg.Encoder, "encoder", in, tried, err, log); in == nil {
			return encoderHandle{}, err
		}
	}
}

// encodeOn sends one media item to the encoder instance in. A refused
// connection is returned as it is, for encodeItem to move the leg.
func (o *Orchestrator) encodeOn(ctx context.Context, req *Request, in *Instance, i int, p mediaPart, body []byte, sending func(url string)) (encoderHandle, error) {
	ctx, cancel := context.WithTimeout(ctx, o.cfg.PrefillTimeout)
	defer cancel()
	resp, err := in.Client.Post(ctx, req.path(), fmt.Sprintf("%s-enc-%d", req.ID, i), body)
	if refused(err) {
		return encoderHandle{}, err // nothing reached it: it keeps nothing under the request's lease
	}
	// It may keep what it encoded under the request's lease, answered or
	// not: released with the request.
	sending(in.Client.BaseURL())
	if err != nil {
		return encoderHandle{}, encoderFailure(in, p.path, err, ctx)
	}
	in.ok()
	raw, err := openai.MemberValue(resp.Body, openai.EncoderCacheMember)
	if err != nil || raw == nil {
		return encoderHandle{}, nil // a vLLM encoder: its connector keeps the outputs
	}
	b, _ := json.Marshal(raw)
	var kept []encoderHandle
	if err := json.Unmarshal(b, &kept); err != nil || len(kept) != 1 || kept[0].Key == "" {
		return encoderHandle{}, &Error{Status: 502, Code: "encoder_upstream_invalid", Msg: "the encoder's answer does not name the outputs it kept", Cause: fmt.Errorf("%s: %s", openai.EncoderCacheMember, b)}
	}
	return encoderHandle{URL: in.Client.BaseURL(), Key: kept[0].Key}, nil
}

// encoderBody is an encoder leg, as vLLM's proxy builds it: the client's
// request with one media item as its only content, no text, one token, no
// streaming, and none of omnipd's own fields.
func encoderBody(req *Request, p mediaPart) ([]byte, error) {
	one, no := 1, false
	c := req.Chat.Clone()
	c.Messages = []openai.ChatMessage{{Role: "user", Content: &openai.Content{Parts: []openai.ContentPart{p.part}}}}
	c.MaxTokens = &one
	c.MaxCompletionTokens = nil
	c.Stream, c.StreamOptions = &no, nil
	c.KVTransferParams = nil
	prefillSampling(&c.SamplingParams)
	for k := range c.Extra {
		if strings.HasPrefix(k, openai.ExtensionPrefix) {
			delete(c.Extra, k)
		}
	}
	if c.Extra == nil {
		c.Extra = map[string]json.RawMessage{}
	}
	c.Extra[openai.EncoderCacheMember], _ = json.Marshal(map[string]string{"lease": encoderLease(req)})
	return marshal(c)
}

// encoderLease names what the encoders keep for a request.
func encoderLease(req *Request) string { return req.ID + "/encoder" }

// encoderFailure classifies a failed encoder leg for the client. A refusal
// of the item (a 4xx: bad media) names the client's part, not the leg's
// one-part request.
func encoderFailure(in *Instance, path string, err error, ctx context.Context) error {
	var ue *stageclient.UpstreamError
	switch {
	case errors.As(err, &ue) && ue.Status < 500:
		return &Error{Status: ue.Status, Code: "encoder_rejected", Msg: "the encoder stage rejected the request", Cause: err, Upstream: reparent(ue.Body, path)}
	case errors.Is(err, stageclient.ErrConnect):
		in.eject(time.Now())
		return unreachable("encoder", in, err)
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		// Quiet past its bound: it sits out, as a quiet Thinker does, so
		// that the next items do not wait on it in turn.
		in.eject(time.Now())
		return &Error{Status: 504, Code: "encoder_upstream_timeout", Msg: "the encoder stage did not answer in time", Cause: err}
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return &Error{Status: 502, Code: "encoder_failed", Msg: "the encoder stage failed", Cause: err}
}

// reparent rewrites an encoder's error so that its param, which names the
// one part of the leg (messages[0].content[0]…), names the client's part
// instead.
func reparent(e *openai.ErrorResponse, path string) *openai.ErrorResponse {
	const leg = "messages[0].content[0]"
	if e == nil || e.Detail.Param == nil || !strings.HasPrefix(*e.Detail.Param, leg) {
		return e
	}
	out := *e
	np := path + strings.TrimPrefix(*e.Detail.Param, leg)
	out.Detail.Param = &np
	out.Detail.Message = strings.ReplaceAll(e.Detail.Message, leg, path)
	return &out
}

// releaseEncoded ends the request's lease on every encoder a leg was sent
// to, in the background (release.go): a lease already gone (its TTL) or
// never taken (a vLLM encoder, or one that died) answers not found, which
// is fine.
func (o *Orchestrator) releaseEncoded(req *Request, log *slog.Logger) {
	if req.encoders == nil {
		return
	}
	lease := encoderLease(req)
	for _, url := range req.encoders() {
		c := clientFor(url, o.cfg.Encoder)
		if c == nil {
			log.Debug("no encoder instance at the URL; its outputs are freed at their TTL", "lease", lease, "encoder", url)
			continue
		}
		o.background(releaseEncoder, log, func(ctx context.Context) {
			if err := c.ReleaseEncoderLease(ctx, lease); err != nil {
				log.Debug("could not release encoder outputs; they are freed at their TTL", "lease", lease, "encoder", url, "err", err)
			}
		}, "lease", lease, "encoder", url)
	}
}
