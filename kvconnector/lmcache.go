package kvconnector

import (
	"fmt"
	"strconv"
	"strings"
)

// lmcache is LMCacheConnectorV1. Which of its two modes a deployment runs is
// LMCache's own config key enable_pd, which LMCache also takes from
// kv_connector_extra_config as "lmcache.enable_pd" (LMCache
// lmcache/integration/vllm/vllm_v1_adapter.py, _apply_extra_config: every
// "lmcache."-prefixed key overrides the LMCache config). omnipd reads it
// there, the one place both the engine and the router see.
//
//   - storage mode: content-addressed. The prefill stores KV under the hash
//     of the token content and the decode finds it by the same hash; the
//     router only orders the legs.
//   - PD mode: the prefill (pd_role sender) pushes the prompt's KV into the
//     decode's (pd_role receiver) buffer at the address the prefill leg's
//     disagg_spec names, then pushes a done notice for disagg_spec.req_id to
//     the router, once per decode TP rank (see DoneNotifier).
func lmcache(extra map[string]any) (Contract, error) {
	pd, err := lmcacheFlag(extra, "lmcache.enable_pd")
	if err != nil {
		return nil, err
	}
	if !pd {
		return &contract{name: LMCacheConnectorV1, dispatch: Sequential}, nil
	}
	if role, ok := extra["lmcache.pd_role"]; ok && role != "sender" {
		// The contract is the prefill's: a prefill whose LMCache is a
		// receiver would wait for KV instead of sending it.
		return nil, fmt.Errorf("%w: lmcache.pd_role %s on the prefill; want \"sender\"", ErrInvalidConfig, describe(role))
	}
	return &lmcachePD{contract{
		name:     LMCacheConnectorV1,
		dispatch: Sequential,
		prefill:  lmcacheDisaggSpec,
		// The decode leg carries nothing: the receiver finds the pushed KV
		// in its own buffer by token content.
	}}, nil
}

// lmcacheFlag reads a boolean LMCache key the way LMCache's config parser
// takes it: a YAML/JSON boolean or its spelling as a string.
func lmcacheFlag(extra map[string]any, key string) (bool, error) {
	switch v := extra[key].(type) {
	case nil:
		return false, nil
	case bool:
		return v, nil
	case string:
		b, err := strconv.ParseBool(strings.ToLower(v))
		if err == nil {
			return b, nil
		}
	}
	return false, fmt.Errorf("%w: %s %s; want true or false", ErrInvalidConfig, key, describe(extra[key]))
}

// lmcacheDisaggSpec is the PD-mode prefill leg, as LMCache's disaggregated
// proxy (examples/disagg_prefill/disagg_proxy_server.py) builds it:
// ret_first_tok makes request_finished answer {"first_tok": id}, and
// update_state_after_alloc copies disagg_spec into the request's transfer
// spec. The sender indexes receiver_init_port and receiver_alloc_port by
// its own TP rank (pd_backend.py batched_submit_put_task), so both lists
// have one port per decode TP rank: the decode's pd_peer_init_port and
// pd_peer_alloc_port, which PD expansion sets to KVPort+r and KVPort+TP+r.
func lmcacheDisaggSpec(h Handoff) map[string]any {
	n := tp(h.Decode)
	initPorts, allocPorts := make([]int, n), make([]int, n)
	for r := range n {
		initPorts[r], allocPorts[r] = LMCacheReceiverPorts(h.Decode, r)
	}
	return map[string]any{
		"ret_first_tok": true,
		"disagg_spec": map[string]any{
			"req_id":              lmcacheReqID(h),
			"receiver_host":       h.Decode.KVHost,
			"receiver_init_port":  initPorts,
			"receiver_alloc_port": allocPorts,
		},
	}
}

// LMCacheReceiverPorts are an LMCache PD receiver's NIXL init port and ZMQ
// alloc port for one TP rank: KVPort+rank and KVPort+TP+rank, the ranges PD
// expansion writes into the receiver's pd_peer_init_port and
// pd_peer_alloc_port.
func LMCacheReceiverPorts(p Peer, rank int) (initPort, allocPort int) {
	return p.KVPort + rank, p.KVPort + tp(p) + rank
}

// lmcacheReqID is the disagg_spec req_id. LMCache never matches it against
// vLLM's request id (which vLLM randomizes): it only comes back in the done
// notices, so any id unique per request works; the transfer id is one.
func lmcacheReqID(h Handoff) string { return h.TransferID }

// DoneNotifier is a Contract whose producer announces, out of band, that a
// request's KV has landed in the consumer, and whose consumer must not be
// sent the decode leg before: LMCache's PD mode. Its receiver registers a
// chunk in its buffer when the sender asks for room, before the write
// (pd_backend.py _allocate_and_put: "decode vllm will not be able to see the
// decode request until proxy receives the ack"), and looks KV up only when
// the decode leg arrives: a decode sent early reads unwritten memory or
// recomputes the prompt. The router waits for DoneCount notices under
// DoneKey, as LMCache's proxy does (wait_decode_kv_ready).
type DoneNotifier interface {
	Contract
	// DoneKey is the id the producer's notices carry for this request.
	DoneKey(h Handoff) string
	// DoneCount is how many notices mean done: one per consumer TP rank.
	DoneCount(h Handoff) int
}

type lmcachePD struct{ contract }

var _ DoneNotifier = (*lmcachePD)(nil)

func (*lmcachePD) DoneKey(h Handoff) string { return lmcacheReqID(h) }
func (*lmcachePD) DoneCount(h Handoff) int  { return tp(h.Decode) }

// lmcacheSpec: storage mode needs no port of the router's; PD mode's
// ports and keys are the deploy config's (lmcache.*). LMCache keys chunks
// by Python hashes, so a decode with another PYTHONHASHSEED finds nothing
// the prefill stored (disagg_vllm_launcher.sh): PD expansion gives both
// engines the example launcher's seed. A fixed seed makes hash flooding
// predictable; a deployment that cares sets its own, which wins.
func lmcacheSpec() Spec {
	return Spec{
		Name: LMCacheConnectorV1, Transfer: KV, VLLM: true, Expandable: true,
		Roles:        kvRoles,
		ExpansionEnv: []Setting{{"PYTHONHASHSEED", "123"}},
	}
}
