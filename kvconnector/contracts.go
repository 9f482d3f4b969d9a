package kvconnector

import (
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
)

// Connector names, as kv_transfer_config.kv_connector spells them.
const (
	NixlConnector      = "NixlConnector"
	MooncakeConnector  = "MooncakeConnector"
	P2pNcclConnector   = "P2pNcclConnector"
	LMCacheConnectorV1 = "LMCacheConnectorV1"
	MoRIIOConnector    = "MoRIIOConnector"
	MultiConnector     = "MultiConnector"
	ReferenceConnector = "ReferenceConnector"
)

// contract is the table-driven Contract every built-in is a value of: the
// connectors differ only in data, so the data is what each factory states.
type contract struct {
	name     string
	dispatch Dispatch
	// prefill builds the prefill leg's kv_transfer_params; nil sends none.
	prefill func(h Handoff) map[string]any
	// rules are the keys the prefill response must carry, in report order.
	rules []rule
	// decode says whether the decode leg carries kv_transfer_params at all.
	decode bool
	// seed is what the router knows from configuration for the decode leg;
	// the prefill's response overrides it (vllm-omni's order). nil: the
	// decode gets the prefill's object verbatim.
	seed func(h Handoff) map[string]any
	// requestIDs overrides the default of the one request id on both legs.
	requestIDs func(h Handoff) (prefill, decode string)
}

var _ Contract = (*contract)(nil)

func (c *contract) Name() string       { return c.name }
func (c *contract) Dispatch() Dispatch { return c.dispatch }

func (c *contract) PrefillParams(h Handoff) map[string]any {
	if c.prefill == nil {
		return nil
	}
	return c.prefill(h)
}

func (c *contract) RequestIDs(h Handoff) (prefill, decode string) {
	if c.requestIDs != nil {
		return c.requestIDs(h)
	}
	return h.RequestID, h.RequestID
}

func (c *contract) Required() []string {
	if len(c.rules) == 0 {
		return nil
	}
	keys := make([]string, len(c.rules))
	for i, r := range c.rules {
		keys[i] = r.key
	}
	return keys
}

func (c *contract) DecodeParams(h Handoff, prefillResponse any) (map[string]any, error) {
	if !c.decode {
		// The connector finds the KV without the router's help (by request id
		// or by content), so whatever the prefill returned is not needed.
		return nil, nil
	}
	resp, err := checkResponse(c.name, c.rules, prefillResponse)
	if err != nil {
		return nil, err
	}
	out := make(map[string]any, len(resp)+6)
	if c.seed != nil {
		maps.Copy(out, c.seed(h))
	}
	maps.Copy(out, resp)
	// Forced last: a prefill echoing its own do_remote_decode: true would make
	// the decode export instead of import.
	out["do_remote_prefill"] = true
	out["do_remote_decode"] = false
	return out, nil
}

// pullRules are what a NIXL-shaped decode needs to pull: which blocks
// (remote_block_ids), from which engine (remote_engine_id) at which side
// channel (remote_host, remote_port), under which lease (remote_request_id:
// the prefill's internal id, which vLLM ≥ 0.14 randomizes, so only the
// prefill can say it). tp_size is not required: the decode takes 1 when it
// is absent, and it is passed on whenever the prefill sends it.
var pullRules = []rule{
	{"remote_block_ids", isList},
	{"remote_engine_id", isString},
	{"remote_request_id", isString},
	{"remote_host", isString},
	{"remote_port", isPort},
}

// pull is the NIXL-shaped handoff: sequential, the decode gets the prefill's
// object verbatim.
func pull(name string) *contract {
	return &contract{
		name:     name,
		dispatch: Sequential,
		prefill: func(Handoff) map[string]any {
			return map[string]any{"do_remote_decode": true, "do_remote_prefill": false}
		},
		rules:  pullRules,
		decode: true,
	}
}

// push is the Mooncake-shaped handoff: both legs rendezvous on transfer_id,
// and the decode learns where the prefill is from configuration, so it can be
// sent before the prefill answers (which answers null).
func push(name string) *contract {
	return &contract{
		name:     name,
		dispatch: Concurrent,
		prefill: func(h Handoff) map[string]any {
			return map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": h.TransferID}
		},
		decode: true,
		seed: func(h Handoff) map[string]any {
			return map[string]any{
				"transfer_id": h.TransferID,
				// http:// is required: Mooncake's decode appends "/query".
				"remote_bootstrap_addr": "http://" + net.JoinHostPort(h.Prefill.KVHost, strconv.Itoa(h.Prefill.KVPort)),
				"remote_engine_id":      h.Prefill.EngineID,
			}
		},
	}
}

func nixl(map[string]any) (Contract, error) { return pull(NixlConnector), nil }

func mooncake(map[string]any) (Contract, error) { return push(MooncakeConnector), nil }

// p2pNccl: no kv_transfer_params either way. The prefill sends the KV over
// NCCL to the decode address it reads from its request id, and the decode
// matches it by the same id, so both legs carry one X-Request-Id (and both
// engines need VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1).
func p2pNccl(map[string]any) (Contract, error) {
	return &contract{
		name:     P2pNcclConnector,
		dispatch: Sequential,
		requestIDs: func(h Handoff) (string, string) {
			id := p2pNcclRequestID(h)
			return id, id
		},
	}, nil
}

// p2pNcclRequestID encodes both side-channel addresses in the request id as
// vLLM's P2pNccl proxy does:
//
//	___prefill_addr_<kv_ip:kv_port>___decode_addr_<kv_ip:kv_port>_<hex of the request id>
//
// The prefill finds its decode with `___decode_addr_(.*):(\d+)` and the decode
// its prefill with `___prefill_addr_(.*):(\d+)___`. The first `(.*)` is greedy:
// any ':' followed by digits after the decode address would be taken for the
// port. vLLM's proxy ends the id with a uuid's hex; omnipd ends it with the
// hex of its own request id, which keeps the tail to [0-9a-f] whatever the id
// holds and can be decoded back when reading logs. Addresses are joined with a
// bare ':' because the engine splits on the last one and formats its own
// address the same way. kv_port is the base port; each TP rank adds its rank
// on both sides.
func p2pNcclRequestID(h Handoff) string {
	return "___prefill_addr_" + h.Prefill.KVHost + ":" + strconv.Itoa(h.Prefill.KVPort) +
		"___decode_addr_" + h.Decode.KVHost + ":" + strconv.Itoa(h.Decode.KVPort) +
		"_" + hex.EncodeToString([]byte(h.RequestID))
}

// lmcache: content-addressed. The prefill stores KV under the hash of the
// token content and the decode finds it by the same hash; the router only
// orders the legs.
func lmcache(map[string]any) (Contract, error) {
	return &contract{name: LMCacheConnectorV1, dispatch: Sequential}, nil
}

// moriio is MoRIIO in READ mode: the decode reads the prefill's blocks, so it
// needs the prefill's response and the legs are sequential. The prefill is
// told the decode's parallel layout so that it can lay out the KV for it.
//
// vLLM's default is WRITE mode, where the prefill writes into blocks the
// decode registers first: a sequential router would deadlock (the prefill
// waits for the decode it has not been sent) and the decode's address must be
// encoded in the request id. That contract is not built, so WRITE mode is
// refused here rather than left to hang.
func moriio(extra map[string]any) (Contract, error) {
	if !moriioReadMode(extra["read_mode"]) {
		return nil, fmt.Errorf("%w: kv_connector_extra_config.read_mode is %s; omnipd routes MoRIIO in read mode only (WRITE mode needs the decode sent before the prefill answers); set \"read_mode\": true on both instances", ErrInvalidConfig, describe(extra["read_mode"]))
	}
	return &contract{
		name:     MoRIIOConnector,
		dispatch: Sequential,
		prefill: func(h Handoff) map[string]any {
			return map[string]any{
				"do_remote_decode": true,
				"transfer_id":      h.TransferID,
				"remote_dp_size":   1,
				"remote_tp_size":   tp(h.Decode),
			}
		},
		rules: []rule{
			{"remote_block_ids", isList},
			{"remote_engine_id", isString},
			{"transfer_id", isString},
		},
		decode: true,
		seed: func(h Handoff) map[string]any {
			// omnipd sends no X-data-parallel-rank header, so the prefill ran on
			// DP rank 0.
			return map[string]any{"transfer_id": h.TransferID, "remote_dp_rank": 0}
		},
	}, nil
}

// moriioReadMode reads read_mode as vLLM does: str(value).lower() in
// ("true", "1").
func moriioReadMode(v any) bool {
	switch v := v.(type) {
	case bool:
		return v
	case string:
		s := strings.ToLower(strings.TrimSpace(v))
		return s == "true" || s == "1"
	}
	n, ok := wholeNumber(v)
	return ok && n == 1
}

// reference is omnipd's own connector (package worker). Its
// kv_connector_extra_config.handshake picks the shape; absent means pull, as
// the worker defaults.
func reference(extra map[string]any) (Contract, error) {
	h, ok := extra["handshake"]
	if !ok {
		return &referenceContract{pull(ReferenceConnector)}, nil
	}
	switch h {
	case "pull":
		return &referenceContract{pull(ReferenceConnector)}, nil
	case "push":
		return &referenceContract{push(ReferenceConnector)}, nil
	}
	return nil, fmt.Errorf("%w: kv_connector_extra_config.handshake is %s; want \"pull\" or \"push\"", ErrInvalidConfig, describe(h))
}

// referenceContract is the reference connector's contract, which also names
// the key its producer leases a request's KV under.
type referenceContract struct{ *contract }

var _ Releaser = (*referenceContract)(nil)

// LeaseKey: the transfer id the push legs rendezvous on, or the prefill
// leg's request id, which keys a pull (the worker's kv_transfer_params
// remote_request_id).
func (c *referenceContract) LeaseKey(h Handoff) string {
	if c.dispatch == Concurrent {
		return h.TransferID
	}
	pid, _ := c.RequestIDs(h)
	return pid
}

// tp is a peer's tensor-parallel size, 1 when the config leaves it unset.
func tp(p Peer) int {
	if p.TP <= 0 {
		return 1
	}
	return p.TP
}
