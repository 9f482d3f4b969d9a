package orchestrator

import (
	"context"
	"fmt"
	"net/http"
)

// vLLM's tokenizer endpoints, which a Thinker instance serves beside its
// OpenAI API (vllm/entrypoints/openai/api_server.py; the reference worker
// serves them too).
const (
	TokenizePath   = "/tokenize"
	DetokenizePath = "/detokenize"
)

// Tokenize sends body, a vLLM /tokenize or /detokenize request (path), to a
// Thinker instance and returns its answer as the instance wrote it. Any
// Thinker instance holds the model's tokenizer; the decode (or colocated)
// pool's are asked, least loaded first, and the call counts as a leg on the
// instance, so --max-stage-queue bounds these calls too and the in-flight
// gauge shows them. A stage that refuses the request (4xx) has its error
// relayed with its status, as for a decode leg; a failed or silent stage is
// the decode's 502, 503 or 504.
func (o *Orchestrator) Tokenize(ctx context.Context, path, requestID string, body []byte) ([]byte, error) {
	if path != TokenizePath && path != DetokenizePath {
		return nil, fmt.Errorf("orchestrator: %q is not a tokenizer endpoint", path)
	}
	in, err := o.take(o.cfg.Decode, nil)
	if err != nil {
		return nil, err
	}
	if in == nil {
		return nil, &Error{Status: http.StatusServiceUnavailable, Code: "decode_unavailable", Msg: "no Thinker instance to ask"}
	}
	defer o.track(o.cfg.Decode, in, -1)
	dog := o.watch(ctx, "decode")
	defer dog.stop()
	dog.arm()
	resp, err := in.Client.Post(dog.ctx, path, requestID, body)
	if err != nil {
		return nil, o.decodeFailure(in, dog, err)
	}
	return resp.Body, nil
}
