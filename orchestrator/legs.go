package orchestrator

import (
	"encoding/json"
	"fmt"

	"github.com/omnipd/omnipd/openai"
)

// prefillBody is the prefill leg: the client's request, cloned, asking for
// exactly one token that nothing can end early (Mooncake keeps KV only for
// length-capped requests), without streaming, and with the connector's
// producer params in place of whatever the client sent.
func prefillBody(req *Request, params map[string]any) ([]byte, error) {
	one, no := 1, false
	if req.Chat != nil {
		c := req.Chat.Clone()
		c.MaxTokens = &one
		if c.MaxCompletionTokens != nil {
			c.MaxCompletionTokens = &one
		}
		c.Stream, c.StreamOptions = &no, nil
		prefillSampling(&c.SamplingParams)
		delete(c.Extra, "min_completion_tokens")
		c.KVTransferParams = params
		key, layer := req.keep.prefill()
		thinkerExtras(c, key, layer, req.keep.streams())
		if req.encoded != nil {
			raw, _ := json.Marshal(req.encoded)
			if c.Extra == nil {
				c.Extra = map[string]json.RawMessage{}
			}
			c.Extra[openai.EncoderCacheMember] = raw
		}
		return marshal(c)
	}
	c := req.Completion.Clone()
	c.MaxTokens = &one
	c.Stream, c.StreamOptions = &no, nil
	prefillSampling(&c.SamplingParams)
	delete(c.Extra, "min_completion_tokens")
	c.KVTransferParams = params
	return marshal(c)
}

// prefillSampling makes the one prefill token unconditional: one choice,
// no minimum, no stops, EOS ignored.
func prefillSampling(sp *openai.SamplingParams) {
	one, yes, no := 1, true, false
	sp.N = &one
	sp.MinTokens = nil
	sp.Stop, sp.StopTokenIDs = nil, nil
	sp.IncludeStopStrInOutput = &no
	sp.IgnoreEOS = &yes
}

// decodeBody is the decode leg: the client's request with the consumer
// params the connector built (client-sent kv_transfer_params never reach an
// engine).
func decodeBody(req *Request, params map[string]any) ([]byte, error) {
	if req.Chat != nil {
		c := req.Chat.Clone()
		c.KVTransferParams = params
		key, layer := req.keep.thinker()
		thinkerExtras(c, key, layer, req.keep.streams())
		return marshal(c)
	}
	c := req.Completion.Clone()
	c.KVTransferParams = params
	return marshal(c)
}

// marshal encodes a leg's body. The request types encode themselves, so
// calling their MarshalJSON directly spares encoding/json's second pass
// over the output (and its HTML escaping of prompts).
func marshal(v json.Marshaler) ([]byte, error) {
	b, err := v.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode the stage request: %w", err)
	}
	return b, nil
}
