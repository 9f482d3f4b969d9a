package openai

// Wire names of the OpenAI-compatible API that are not members of a type
// here: omnipd's and vLLM's extra members of its bodies, and its headers.

// omnipd's members of the chat and completions bodies. They ride on the
// requests and answers between the orchestrator and its Thinker stages —
// extra members, which vLLM ignores — and never on a client's: the public
// server refuses them from a client, and Relay strips the answer's. They are
// defined here, with the bodies that carry them, because this package may
// import nothing of ours and both Relay and every side of a leg need them;
// omnipd's own endpoints (/v1/omnipd/...) are stageapi's.
const (
	// ExtensionPrefix begins the name of every omnipd member.
	ExtensionPrefix = "omnipd_"
	// ConditioningMember asks a Thinker leg to keep the conditioning rows
	// it computes for the Talker ({"key", "layer", "stream"}); the leg's
	// whole answer carries their handle ({"key", "rows"}). See
	// docs/stage-api.md.
	ConditioningMember = "omnipd_conditioning"
	// EncoderCacheMember names encoder outputs (E/P/D). An encoder leg may
	// carry {"lease": <name>}: the outputs are held for that lease (default:
	// the request's X-Request-Id) until it is released (DELETE
	// stageapi.EncoderLeasePath{lease}). An encoder worker's answer lists
	// the keys it stored, one per media item of the request ({"key": ...}),
	// and the prefill leg carries, per media item of its request in order,
	// where to fetch them ({"url": <encoder worker>, "key": ...}). vLLM
	// ignores the member: its EC connectors find encoder outputs by hash.
	EncoderCacheMember = "omnipd_encoder_cache"
)

// KVTransferParamsMember is vLLM's member that carries a KV connector's
// handoff: set by the router on a prefill and a decode leg, written by vLLM
// into every whole answer (null included).
const KVTransferParamsMember = "kv_transfer_params"

// PDPathHeader is the header of omnipd's public answers that names the path
// a request took through the Thinker stages (disaggregated, decode-only,
// fallback, colocated: the orchestrator's Path constants).
const PDPathHeader = "X-Omnipd-Pd-Path"

// RequestIDHeader carries a request's id: the client's on the public API
// (echoed in the answer), omnipd's own on every stage leg, where vLLM takes
// it as the request's id and some KV connectors match a prefill to its
// decode by it.
const RequestIDHeader = "X-Request-Id"
