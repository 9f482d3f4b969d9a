package kvconnector

import (
	"maps"
	"strings"
)

// moriio is vLLM's MoRIIOConnector (v1/moriio, read at vLLM main 0158326,
// moriio_common.py at 028a39c). Its mode is kv_connector_extra_config
// read_mode, read as vLLM reads it; vLLM's default is WRITE.
//
//   - READ: the decode reads the prefill's blocks, so it needs the blocks
//     and engine id the prefill's response reports: sequential.
//   - WRITE: the decode allocates blocks and tells the prefill's notify port
//     which they are; the prefill writes into them. The decode leg is built
//     from configuration alone and must be sent while the prefill runs:
//     concurrent.
//
// In both modes the prefill's scheduler builds a transfer record from its
// own kv_transfer_params (transfer_id, remote_block_ids, remote_engine_id
// read by key, so they are sent even when null) and takes the decode's host,
// handshake and notify ports from them; without those it parses them from
// the request id and a plain id fails the engine. So the router sends them.
func moriio(extra map[string]any) (Contract, error) {
	read := moriioReadMode(extra["read_mode"])
	c := &contract{
		name:              MoRIIOConnector,
		dispatch:          Sequential,
		claimsEveryPrompt: moriioSpec().ClaimsEveryPrompt,
		prefill: func(h Handoff) map[string]any {
			p := moriioPeer(h.Decode)
			p["do_remote_decode"] = true
			p["do_remote_prefill"] = false
			p["transfer_id"] = h.TransferID
			p["remote_engine_id"] = nil
			p["remote_block_ids"] = nil
			// The decode's layout, which the prefill's toy-proxy contract
			// names remote_dp_size and remote_tp_size.
			p["remote_tp_size"] = tp(h.Decode)
			return p
		},
		decode: true,
		seed: func(h Handoff) map[string]any {
			// Where the prefill is. Newer prefills answer these keys
			// themselves (and win); older ones only reported the blocks.
			p := moriioPeer(h.Prefill)
			p["transfer_id"] = h.TransferID
			p["tp_size"] = tp(h.Prefill)
			p["remote_tp_size"] = tp(h.Prefill)
			// omnipd sends no X-data-parallel-rank header, so the prefill ran
			// on DP rank 0.
			p["remote_dp_rank"] = 0
			return p
		},
	}
	if read {
		c.rules = []rule{
			{"remote_block_ids", isList},
			{"remote_engine_id", isString},
			{"transfer_id", isString},
		}
		return c, nil
	}
	c.dispatch = Concurrent
	return moriioWrite{c}, nil
}

// moriioWrite is MoRIIO in WRITE mode. The decode is sent before the prefill
// answers, so what the prefill later says cannot change it: the response is
// not read at all (its remote_block_ids are the prefill's own blocks, which
// a WRITE decode has no use for).
type moriioWrite struct{ *contract }

var _ Contract = moriioWrite{}

func (m moriioWrite) DecodeParams(h Handoff, _ any) (map[string]any, error) {
	out := make(map[string]any, 12)
	maps.Copy(out, m.seed(h))
	// The decode's scheduler reads these by key in both modes.
	out["remote_engine_id"] = nil
	out["remote_block_ids"] = nil
	out["do_remote_prefill"] = true
	out["do_remote_decode"] = false
	return out, nil
}

// moriioPeer is where one MoRIIO engine listens: its handshake port (the
// instance's KV port; TP rank r listens on +r) and its notify port.
// remote_port is what vLLM's toy proxy sends beside them; the engine reads
// the handshake port.
func moriioPeer(p Peer) map[string]any {
	return map[string]any{
		"remote_host":           p.KVHost,
		"remote_port":           p.KVPort,
		"remote_handshake_port": p.KVPort,
		"remote_notify_port":    MoRIIONotifyPort(p),
		"remote_dp_size":        1,
	}
}

// MoRIIONotifyPort is a MoRIIO instance's base notify port: the
// configuration's when it says one, otherwise the port after its TP ranks'
// handshake ports (omnipd's layout: an instance takes 2×TP ports from its
// KV port, handshake ports first).
func MoRIIONotifyPort(p Peer) int {
	if p.NotifyPort != 0 {
		return p.NotifyPort
	}
	return p.KVPort + tp(p)
}

// moriioReadMode reads read_mode as vLLM does: str(value).lower().strip()
// in ("true", "1"); anything else, or no key, is WRITE mode.
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

// moriioSpec: vLLM's MoRIIO (moriio_common.py MoRIIOConfig) reads
// handshake_port and notify_port from kv_connector_extra_config (each TP
// rank adds its rank; MoRIIOConstants.DEFAULT_HANDSHAKE_PORT 6301 and
// DEFAULT_NOTIFY_PORT 61005, applied by MoRIIOConnector._set_port_defaults
// at 6fbdff48), and proxy_ip, proxy_ping_port and http_port without
// defaults. PD expansion picks READ mode, which is routed sequentially, so
// a prefill that fails never leaves a decode waiting for writes; an empty
// proxy_ip keeps the engine from pinging a discovery proxy: omnipd routes
// from the config.
func moriioSpec() Spec {
	return Spec{
		Name: MoRIIOConnector, Transfer: KV, VLLM: true, Expandable: true,
		Roles: kvRoles,
		ExtraConfig: []Setting{
			{"read_mode", true},
			{"proxy_ip", ""},
			{"proxy_ping_port", 0},
		},
		Ports: Ports{
			Key: "handshake_port", InExtraConfig: true, Base: 6301, Listens: BothSides, PerRank: 2,
			NotifyKey: "notify_port", HTTPPortKey: "http_port",
			EngineDefault: 6301, NotifyEngineDefault: 61005,
		},
		ExpansionEnv: []Setting{{keepRequestIDs, "1"}},
		Env:          []EnvVar{{Name: keepRequestIDs, From: EnvLiteral, Value: "1", Sides: BothSides}},
		// moriio_connector.py get_num_new_matched_tokens: a consumer claims
		// the prompt's KV for every request, in READ and WRITE mode.
		ClaimsEveryPrompt: true,
		DecodeAlone:       "a MoRIIO decode claims KV no prefill made (WRITE mode waits for it forever, READ mode computes on blocks it never loaded)",
	}
}
