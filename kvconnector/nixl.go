package kvconnector

import "slices"

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

// nixlRules are pullRules less remote_request_id, which vLLM's
// NixlConnector returns only since NIXL connector version 2 (vLLM PR
// #29665, ahead of the 0.14 request-id randomization). Before it — and in
// llm-d's inference simulator — the decode notifies the prefill under its
// own internal request id, which equals the prefill's because omnipd sends
// one X-Request-Id on both legs and those versions do not randomize it. A
// prefill that returns it is passed on verbatim; one that does not is
// counted (Absent), not refused.
var nixlRules = slices.DeleteFunc(slices.Clone(pullRules), func(r rule) bool { return r.key == "remote_request_id" })

var nixlOptional = []rule{{"remote_request_id", isString}}

func nixl(map[string]any) (Contract, error) {
	c := pull(NixlConnector)
	c.rules, c.optional = nixlRules, nixlOptional
	// vLLM's decode reads tp_size without a default for its lease heartbeats
	// (nixl/base_scheduler.py on_new_request: no heartbeat without it, so the
	// prefill frees the KV after kv_lease_duration while the decode still
	// queues) and in push mode (nixl/push_scheduler.py: params["tp_size"]).
	// Every vLLM prefill sends it; the seed covers one that does not.
	c.seed = func(h Handoff) map[string]any { return map[string]any{"tp_size": tp(h.Prefill)} }
	return c, nil
}

// Absent lists the optional keys of c's contract — keys a prefill response
// carries on some engine versions only — that params, the decode leg's
// kv_transfer_params, lack: for NIXL, remote_request_id. The orchestrator
// counts them so that an engine older than the contract shows on a
// dashboard instead of only in the decode's logs.
func Absent(c Contract, params map[string]any) []string {
	for {
		m, ok := c.(multiContract)
		if !ok {
			break
		}
		c = m.Contract
	}
	var cc *contract
	switch v := c.(type) {
	case *contract:
		cc = v
	case *referenceContract:
		cc = v.contract
	}
	if cc == nil || params == nil {
		return nil
	}
	var out []string
	for _, r := range cc.optional {
		if params[r.key] == nil {
			out = append(out, r.key)
		}
	}
	return out
}

// checkOptional checks the optional keys m carries; absent or null ones are
// fine, present ones must be usable.
func checkOptional(connector string, rules []rule, m map[string]any) error {
	var e HandoffError
	for _, r := range rules {
		if v, ok := m[r.key]; ok && v != nil {
			if why := r.check(v); why != "" {
				e.Invalid = append(e.Invalid, r.key+": "+why)
			}
		}
	}
	if e.Invalid == nil {
		return nil
	}
	e.Connector = connector
	return &e
}

// nixlSpec: both sides run a side channel (VLLM_NIXL_SIDE_CHANNEL_HOST and
// _PORT, 5600 by default; each DP rank adds its index), and the prefill's
// answer names its engine id and side channel, so the decode needs nothing
// from configuration: the one connector omnipd routes data-parallel.
func nixlSpec() Spec {
	return Spec{
		Name: NixlConnector, Transfer: KV, VLLM: true, Expandable: true,
		Roles:        Roles{Producer: "kv_both", Consumer: "kv_both"},
		BufferDevice: "cuda",
		Ports:        Ports{Key: "kv_port", Base: 5600, Listens: BothSides},
		Env: []EnvVar{
			{Name: "VLLM_NIXL_SIDE_CHANNEL_HOST", From: EnvListenHost, Sides: BothSides},
			{Name: "VLLM_NIXL_SIDE_CHANNEL_PORT", From: EnvKVPort, Sides: BothSides},
		},
		DataParallel:       true,
		EngineIDFromAnswer: true,
	}
}
