package kvconnector

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

func nixl(map[string]any) (Contract, error) { return pull(NixlConnector), nil }
