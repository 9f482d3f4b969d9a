package kvconnector

import (
	"encoding/hex"
	"strconv"
)

// p2pNccl: no kv_transfer_params either way. The prefill sends the KV over
// NCCL to the decode address it reads from its request id, and the decode
// matches it by the same id, so both legs carry one X-Request-Id (and both
// engines need VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1).
func p2pNccl(map[string]any) (Contract, error) {
	return &contract{
		name:              P2pNcclConnector,
		dispatch:          Sequential,
		claimsEveryPrompt: p2pNcclSpec().ClaimsEveryPrompt,
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

// p2pNcclSpec: the engine binds tcp://<VLLM_HOST_IP>:<kv_port + TP rank>
// on both sides (kv_port 14579 by default, vllm/config/kv_transfer.py),
// and get_ip() is VLLM_HOST_IP or the primary interface's address; omnipd
// names kv_ip (127.0.0.1 when unset) in the request id, so the engine must
// listen there. It matches a transfer by request id on both sides.
func p2pNcclSpec() Spec {
	return Spec{
		Name: P2pNcclConnector, Transfer: KV, VLLM: true, Expandable: true,
		Roles:        kvRoles,
		ExtraConfig:  []Setting{{"send_type", "PUT_ASYNC"}},
		Ports:        Ports{Key: "kv_port", Base: 21001, Listens: BothSides, PerRank: 1, EngineDefault: 14579},
		ExpansionEnv: []Setting{{keepRequestIDs, "1"}},
		Env: []EnvVar{
			{Name: keepRequestIDs, From: EnvLiteral, Value: "1", Sides: BothSides},
			{Name: "VLLM_HOST_IP", From: EnvKVHost, Sides: BothSides},
		},
		// p2p_nccl_connector.py get_num_new_matched_tokens: a consumer
		// returns len(prompt) - 1 for every request, and recv_tensor then
		// waits for tensors nobody sends (p2p_nccl_engine.py).
		ClaimsEveryPrompt: true,
		DecodeAlone:       "a P2pNccl decode waits forever for KV no prefill sends",
		SharedAddress:     "omnipd names each side's kv_ip:kv_port (the role Services) in the request id, which is only right with one pod per role",
	}
}
