// Package simulate owns the reference engine's GPU latency model: a profile
// that says how long one scheduler step and one KV transfer take on the
// hardware being modeled, so that a worker started with --simulate behaves,
// in time, like a vLLM instance of a large model while computing nothing
// heavy.
//
// The model, per engine step (one forward pass in vLLM):
//
//	prefill part  a + b·P   P = prompt positions computed in the step (a chunk)
//	decode part   c + d·B   B = sequences decoding one token in the step
//	step          prefill part + decode part (each only when present)
//
// A mixed step costs the sum, not the max: vLLM's chunked prefill runs the
// chunk and the decodes as one forward pass over the concatenated tokens, so
// nothing overlaps and every decode in that step waits for the whole chunk
// (the inter-token latency spike that max_num_batched_tokens trades against
// time to first token). The max would describe prefill and decode running
// side by side on separate hardware, which is what disaggregation buys.
// The sum over-counts the fixed part of a mixed step by up to min(a, c),
// since the weights are read once; docs/simulate.md quantifies it for the
// calibrated profile.
//
// A KV transfer of T prompt tokens takes setup + T·bytes_per_token/bandwidth
// with bytes_per_token = 2 (K and V) × layers × kv_heads × head_dim ×
// dtype_bytes of the modeled model.
//
// A step that encodes media adds the encoders' time (Encoder.BatchTime),
// as vLLM runs the encoders inside the step, before the forward pass.
//
// This package is a pure core: parsing, validation and cost arithmetic, no
// IO but Load, which reads a profile file or an embedded built-in profile.
package simulate

import (
	"math"
	"time"
)

// Profile is one modeled deployment: a model on a GPU, behind a KV link.
// The zero value costs nothing.
type Profile struct {
	// Name identifies the profile in logs ("h100-qwen3-omni-30b-a3b").
	Name string
	// Description is free text from the profile file.
	Description string
	// Prefill is a + b·P: Base a per step with prompt work, PerUnit b per
	// prompt position computed.
	Prefill Linear
	// Decode is c + d·B: Base c per step with decodes, PerUnit d per
	// sequence decoding.
	Decode Linear
	// KV is the prefill-to-decode KV transfer.
	KV KVTransfer
	// Model sizes the KV cache of the modeled model, for transfer bytes.
	Model KVModel
	// MaxNumSeqs and MaxNumBatchedTokens are the modeled engine's batching
	// caps (vLLM's max_num_seqs, max_num_batched_tokens); 0 leaves the
	// engine's own setting.
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	// Talker and Code2Wav are the audio stages (audio.go); zero when the
	// profile models the Thinker alone.
	Talker   Talker
	Code2Wav Code2Wav
	// Encoder is the Thinker's multimodal encoders (encoder.go), paid in
	// the engine step that encodes a prompt's media; zero when the profile
	// has no encoder section.
	Encoder Encoder
}

// Linear is a cost Base + PerUnit·n.
type Linear struct {
	Base    time.Duration
	PerUnit time.Duration
}

// At is the cost for n units: 0 for n <= 0, Base + PerUnit·n otherwise.
func (l Linear) At(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return addSat(l.Base, mulSat(l.PerUnit, int64(n)))
}

// KVTransfer is setup + bytes/bandwidth.
type KVTransfer struct {
	// Setup is the fixed cost of one transfer (handshake, descriptor
	// preparation, completion notice).
	Setup time.Duration
	// BytesPerSecond is the link's effective bandwidth; 0 means the bytes
	// cost nothing (no bandwidth term).
	BytesPerSecond float64
}

// KVModel is the KV cache geometry of the modeled model.
type KVModel struct {
	Layers, KVHeads, HeadDim int
	// DTypeBytes is the size of one cached element (2 for bfloat16).
	DTypeBytes int
}

// BytesPerToken is 2 (K and V) × layers × kv_heads × head_dim × dtype
// bytes; 0 when the model is not set.
func (m KVModel) BytesPerToken() int64 {
	return 2 * int64(m.Layers) * int64(m.KVHeads) * int64(m.HeadDim) * int64(m.DTypeBytes)
}

// StepTime is the modeled duration of one engine step that computes
// prefillTokens prompt (or recomputed) positions and decodes decodeSeqs
// sequences by one token each.
func (p *Profile) StepTime(prefillTokens, decodeSeqs int) time.Duration {
	return addSat(p.Prefill.At(prefillTokens), p.Decode.At(decodeSeqs))
}

// KVBytes is the size of the KV cache of tokens prompt positions.
func (p *Profile) KVBytes(tokens int) int64 {
	if tokens <= 0 {
		return 0
	}
	per := p.Model.BytesPerToken()
	if per > 0 && int64(tokens) > math.MaxInt64/per {
		return math.MaxInt64
	}
	return int64(tokens) * per
}

// TransferTime is the modeled duration of moving the KV cache of tokens
// prompt positions from a prefill to a decode: setup + bytes/bandwidth,
// rounded up to the nanosecond (it is a lower bound the engine waits for).
func (p *Profile) TransferTime(tokens int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	t := p.KV.Setup
	if bw := p.KV.BytesPerSecond; bw > 0 {
		ns := math.Ceil(float64(p.KVBytes(tokens)) / bw * 1e9)
		if ns >= math.MaxInt64 {
			return math.MaxInt64
		}
		t = addSat(t, time.Duration(ns))
	}
	return t
}

// IsZero reports whether every cost of the Thinker's engine is zero (its
// steps, its KV transfers and its encoders): the engine then never waits.
// The audio stages are the Talker's and Code2Wav's workers' own.
func (p *Profile) IsZero() bool {
	return p.Prefill == Linear{} && p.Decode == Linear{} && p.KV.Setup == 0 && (p.KV.BytesPerSecond == 0 || p.Model.BytesPerToken() == 0) &&
		p.Encoder.IsZero()
}

func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func mulSat(d time.Duration, n int64) time.Duration {
	if d == 0 || n == 0 {
		return 0
	}
	if int64(d) > math.MaxInt64/n {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}
