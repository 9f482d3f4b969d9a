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
		name:     P2pNcclConnector,
		dispatch: Sequential,
		// p2p_nccl_connector.py get_num_new_matched_tokens: a consumer
		// returns len(prompt) - 1 for every request.
		claimsEveryPrompt: true,
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
