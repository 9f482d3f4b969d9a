package kvconnector

func mooncake(map[string]any) (Contract, error) { return push(MooncakeConnector), nil }

// mooncakeSpec: the decode learns the prefill's bootstrap server from
// configuration, so only the prefill listens, on
// VLLM_MOONCAKE_BOOTSTRAP_PORT (8998 by default, vllm/envs.py), which
// vLLM reads only from the environment (mooncake_utils.py
// get_mooncake_bootstrap_addr); omnipd serve reads the deploy config's
// mooncake_bootstrap_port. Only a producer runs the bootstrap server
// (MooncakeConnectorWorker starts it "if not self.is_kv_consumer",
// mooncake/mooncake_connector.py at 5c512330).
func mooncakeSpec() Spec {
	return Spec{
		Name: MooncakeConnector, Transfer: KV, VLLM: true, Expandable: true,
		Roles: kvRoles,
		Ports: Ports{
			Key: "mooncake_bootstrap_port", InExtraConfig: true, EnvOnly: true,
			Base: 8998, Listens: PrefillSide, EngineDefault: 8998,
		},
		Env:           []EnvVar{{Name: "VLLM_MOONCAKE_BOOTSTRAP_PORT", From: EnvKVPort, Sides: PrefillSide}},
		SharedAddress: "the decode fetches the KV from the prefill's bootstrap server at the prefill Service, which is only right with one prefill pod",
	}
}
