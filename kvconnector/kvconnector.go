// Package kvconnector owns the router-side contract of each KV connector that
// moves a prompt's KV cache from a prefill engine to a decode engine: the
// kv_transfer_params the prefill leg carries, the keys its response must
// carry, how the decode leg's kv_transfer_params are built from that response,
// the X-Request-Id of each leg, and whether the two legs may be sent at the
// same time. It also holds each connector's facts as plain data (Spec): its
// roles, ports, environment, parallelism and claims, which every other
// package reads from here instead of keeping its own list of connectors.
//
// vllm-omni's router checks one contract (NIXL's) and needs remote_request_id
// in every prefill response; vLLM's MooncakeConnector answers a prefill with
// null, so vllm-omni patches the engine (vllm_omni/distributed/kv_transfer/
// mooncake_pd_patch.py fills transfer_id, remote_request_id, remote_host and
// remote_port into the producer's answer). omnipd drives stock engines: each
// connector states its own contract — Mooncake's needs nothing from the
// prefill's answer — and contracts are built by factories held in a Registry
// value (never a global), so tests and embedders can add their own.
//
// The package is pure: it does no IO, starts no goroutines and reads no
// clock. The orchestrator does the HTTP; this package only says what to send.
package kvconnector

import (
	"errors"
	"fmt"
	"strings"
)

// Dispatch says when the decode leg may be sent relative to the prefill leg.
type Dispatch int

const (
	// Sequential: the decode leg needs the prefill's response (NIXL pull,
	// MoRIIO read, P2pNccl, LMCache, reference pull). Send the prefill, wait
	// for its non-streaming response, then send the decode.
	Sequential Dispatch = iota
	// Concurrent: the decode leg is built from configuration alone, so
	// prefill and decode may be sent at the same time (Mooncake, reference
	// push). The decode registers and waits while the prefill pushes.
	Concurrent
)

func (d Dispatch) String() string {
	switch d {
	case Sequential:
		return "sequential"
	case Concurrent:
		return "concurrent"
	}
	return fmt.Sprintf("Dispatch(%d)", int(d))
}

// Peer is what the orchestrator knows about one engine instance from the
// deploy config.
type Peer struct {
	EngineID string // kv_transfer_config engine_id of the instance
	KVHost   string // kv_ip (side-channel / bootstrap host)
	// KVPort is the instance's side-channel port: Mooncake bootstrap port,
	// NIXL side channel, reference kv_port, P2pNccl kv_port.
	KVPort   int
	HTTPAddr string // host:port of its HTTP API
	TP       int    // tensor-parallel size; 0 means 1
	// NotifyPort is a MoRIIO instance's notify_port; 0: KVPort + TP, the
	// port PD expansion gives it.
	NotifyPort int
	// DP is the instance's data_parallel_size: that many ranks behind one
	// API server, each its own KV engine (vLLM names rank k's engine
	// "<EngineID>_dp<k>"). 0 means 1.
	DP int
}

// DataParallel is p's data-parallel size, 1 when the config leaves it
// unset.
func (p Peer) DataParallel() int {
	if p.DP <= 0 {
		return 1
	}
	return p.DP
}

// Handoff is one request's routing facts.
type Handoff struct {
	RequestID  string // one id per user request, sent as X-Request-Id on every leg
	TransferID string // "xfer-" + RequestID
	Prefill    Peer
	Decode     Peer
	// PrefillRank and DecodeRank are the data-parallel ranks the legs are
	// pinned to (X-data-parallel-rank) on instances with DP > 1; 0
	// otherwise.
	PrefillRank, DecodeRank int
}

// NewHandoff builds the handoff of one request, deriving its transfer id the
// way every peer router does, so that prefill and decode rendezvous on it.
func NewHandoff(requestID string, prefill, decode Peer) Handoff {
	return Handoff{RequestID: requestID, TransferID: "xfer-" + requestID, Prefill: prefill, Decode: decode}
}

// Contract is one connector's router-side behaviour. Implementations are
// values built by a Registry, not globals; they are immutable and safe for
// concurrent use.
type Contract interface {
	Name() string
	Dispatch() Dispatch
	// PrefillParams is the kv_transfer_params object for the prefill leg (nil:
	// send none). Each call returns a new map the caller may modify.
	PrefillParams(h Handoff) map[string]any
	// RequestIDs are the X-Request-Id values for the prefill and decode legs
	// (P2pNccl encodes both addresses in it).
	RequestIDs(h Handoff) (prefill, decode string)
	// Required lists the keys the prefill response's kv_transfer_params must
	// carry (nil for Mooncake, P2pNccl, LMCache and reference push).
	Required() []string
	// DecodeParams builds the decode leg's kv_transfer_params from the prefill
	// response's. prefillResponse is that field as encoding/json decodes it
	// into an any (nil for null; json.Number is fine), or its raw
	// json.RawMessage. It is not modified; nested values are shared with the
	// result.
	//
	// Missing or malformed required keys, or a response that is not an object,
	// give a *HandoffError (errors.Is ErrInvalidHandoff) that names the keys;
	// bad input never panics. The result is built as vllm-omni builds it (last
	// wins): transfer_id, remote_bootstrap_addr and remote_engine_id where the
	// contract knows them from configuration, then everything the prefill
	// returned (unknown keys passed on), then do_remote_prefill: true and
	// do_remote_decode: false. Contracts that send no decode params (P2pNccl,
	// LMCache) return nil.
	DecodeParams(h Handoff, prefillResponse any) (map[string]any, error)
}

// Releaser is a Contract whose producer the router can tell to drop one
// request's exported KV — omnipd's reference connector, whose workers take
// the release by key over HTTP. LeaseKey is that key. vLLM's connectors
// have no such call: a router's only lever there is a decode leg that
// claims the KV, and otherwise the engine's own timeout frees it.
type Releaser interface {
	Contract
	LeaseKey(h Handoff) string
}

// PromptClaimer is a Contract whose consumer claims every prompt's KV from
// a remote producer, whatever the decode leg carries: P2pNccl and MoRIIO
// decide to load in get_num_new_matched_tokens before they read
// kv_transfer_params. Such a decode must never be sent without its prefill
// (the decode-only path, pd.fallback: local): it would wait for KV nobody
// sends.
type PromptClaimer interface {
	Contract
	ClaimsEveryPrompt() bool
}

var (
	// ErrInvalidHandoff: the prefill's response cannot be handed to the
	// decode. Peers answer it with HTTP 502 (Dynamo's invalid_prefill_handoff).
	ErrInvalidHandoff = errors.New("invalid prefill handoff")
	// ErrUnknownConnector: a kv_connector name with no registered contract.
	ErrUnknownConnector = errors.New("unknown KV connector")
	// ErrInvalidConfig: a connector's kv_connector_extra_config asks for
	// something its contract cannot do.
	ErrInvalidConfig = errors.New("invalid KV connector config")
)

// HandoffError says what is wrong with a prefill's kv_transfer_params. It
// unwraps to ErrInvalidHandoff.
type HandoffError struct {
	Connector string
	// Shape is set when the response is not a JSON object ("null", "array",
	// ...); then every required key is Missing.
	Shape string
	// Missing are required keys that are absent or null.
	Missing []string
	// Invalid are required keys present with an unusable value, as
	// "key: reason".
	Invalid []string
}

func (e *HandoffError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: %s prefill response", ErrInvalidHandoff, e.Connector)
	if e.Shape != "" {
		fmt.Fprintf(&b, ": kv_transfer_params is %s, want an object", e.Shape)
	}
	if len(e.Missing) > 0 {
		fmt.Fprintf(&b, ": missing %s", strings.Join(e.Missing, ", "))
	}
	for _, s := range e.Invalid {
		b.WriteString(": ")
		b.WriteString(s)
	}
	return b.String()
}

func (e *HandoffError) Unwrap() error { return ErrInvalidHandoff }
