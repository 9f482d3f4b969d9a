package kvconnector

// EngineDefaultPorts are the side-channel ports a vLLM engine listens on
// when its kv_transfer_config names none, for the connectors whose handoff
// the router builds from configuration rather than from the prefill's
// answer: Mooncake's bootstrap server (VLLM_MOONCAKE_BOOTSTRAP_PORT, 8998 by
// default, vllm/envs.py), P2pNccl's kv_port (KVTransferConfig.kv_port,
// 14579, vllm/config/kv_transfer.py), and MoRIIO's handshake and notify
// ports (MoRIIOConstants.DEFAULT_HANDSHAKE_PORT 6301 and
// DEFAULT_NOTIFY_PORT 61005, moriio/moriio_common.py, applied by
// MoRIIOConnector._set_port_defaults at 6fbdff48). Zero for a connector
// whose prefill answers with its own side channel (NIXL) or that needs none.
func EngineDefaultPorts(connector string) (kvPort, notifyPort int) {
	switch connector {
	case MooncakeConnector:
		return 8998, 0
	case P2pNcclConnector:
		return 14579, 0
	case MoRIIOConnector:
		return 6301, 61005
	}
	return 0, 0
}
