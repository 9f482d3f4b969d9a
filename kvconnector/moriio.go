package kvconnector

import (
	"fmt"
	"strings"
)

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
