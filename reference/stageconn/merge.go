package stageconn

import "fmt"

// Merge joins the conditioning a prefill and a decode worker computed for
// one disaggregated request into what a colocated Thinker would have
// computed: the prefill's rows for the prompt's P positions, then the
// decode's rows after its first — which recomputes the prompt's last
// position, a duplicate of the prefill's row P-1 (vllm-omni's merge keeps
// that duplicate; it must go). The TTS embeddings come from the decode,
// falling back to the prefill's; the token ids from the decode.
func Merge(prefill, decode *Stash) (*Stash, error) {
	p := len(prefill.PromptTokenIDs)
	if p == 0 {
		return nil, fmt.Errorf("stageconn: the prefill stash has no prompt")
	}
	if len(prefill.Embed) < p || len(prefill.Hidden) < p {
		return nil, fmt.Errorf("stageconn: the prefill stash has %d rows for a %d-token prompt", len(prefill.Embed), p)
	}
	if len(decode.Embed) == 0 || len(decode.Embed) != len(decode.Hidden) {
		return nil, fmt.Errorf("stageconn: the decode stash has %d embed and %d hidden rows; want at least the recomputed last prompt position", len(decode.Embed), len(decode.Hidden))
	}
	out := &Stash{
		Embed:          append(append([][]float32(nil), prefill.Embed[:p]...), decode.Embed[1:]...),
		Hidden:         append(append([][]float32(nil), prefill.Hidden[:p]...), decode.Hidden[1:]...),
		TTSPad:         pick(decode.TTSPad, prefill.TTSPad),
		TTSBos:         pick(decode.TTSBos, prefill.TTSBos),
		TTSEos:         pick(decode.TTSEos, prefill.TTSEos),
		TokenIDs:       decode.TokenIDs,
		PromptTokenIDs: prefill.PromptTokenIDs,
	}
	if len(out.TokenIDs) == 0 {
		out.TokenIDs = prefill.TokenIDs
	}
	return out, nil
}

func pick(first, fallback []float32) []float32 {
	if len(first) > 0 {
		return first
	}
	return fallback
}
