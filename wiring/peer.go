package wiring

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// thinkerPeer is what the KV contract needs to know of one Thinker
// instance at base URL url.
func thinkerPeer(s *deploy.Stage, r topology.Replica, url string) kvconnector.Peer {
	p := kvconnector.Peer{
		EngineID:   r.EngineID,
		KVHost:     deploy.KVHost(s),
		KVPort:     r.KVPort,
		HTTPAddr:   strings.TrimPrefix(url, "http://"),
		TP:         s.TensorParallelSize,
		NotifyPort: deploy.NotifyPort(s, r),
		// vLLM names rank k's engine <engine_id>_dp<k>; the orchestrator pins
		// both legs of a handoff to ranks when DP > 1.
		DP: s.DataParallelSize,
	}
	if r.Endpoint != "" && p.KVPort == 0 && s.KV != nil && listensOnKVPort(s) {
		// An engine omnipd did not start, whose config here names no port,
		// listens on its own default: the handoff must name that, not 0.
		p.KVPort, p.NotifyPort = kvconnector.EngineDefaultPorts(s.KV.Connector)
	}
	return p
}

// listensOnKVPort reports whether an engine of stage s listens on a side
// channel port of its connector's (kvconnector.EngineDefaultPorts). Every
// role does but the kv_consumer of a connector whose decode does not
// listen (kvconnector.Ports.Listens: Mooncake's, whose producer alone runs
// the bootstrap server): the decode is told the prefill's.
func listensOnKVPort(s *deploy.Stage) bool {
	if s.KV == nil || s.KV.Role != "kv_consumer" {
		return true
	}
	spec, ok := kvconnector.SpecOf(s.KV.Connector)
	return !ok || spec.Ports.Listens.Has(kvconnector.DecodeSide)
}

// WorkerKVConfig is the kv_transfer_config of a reference worker running
// replica r of stage s — the stage's config with the replica's engine id
// and KV port — as JSON, the form the worker's --kv-transfer-config takes.
// "" for a stage without KV transfer; an error for a connector only vLLM
// engines run.
func WorkerKVConfig(s *deploy.Stage, r topology.Replica) (string, error) {
	if s.KV == nil {
		return "", nil
	}
	if spec, ok := kvconnector.SpecOf(s.KV.Connector); !ok || spec.VLLM {
		return "", fmt.Errorf("stage %d uses %s, which reference workers cannot run; give the stage endpoints: of vLLM engines, or use %s", s.ID, s.KV.Connector, deploy.DefaultKVConnector)
	}
	m := map[string]any{"kv_connector": s.KV.Connector, "kv_role": s.KV.Role, "engine_id": r.EngineID, "kv_ip": s.KV.IP, "kv_port": r.KVPort}
	if s.KV.LoadFailurePolicy != "" {
		m["kv_load_failure_policy"] = s.KV.LoadFailurePolicy
	}
	if s.KV.ExtraConfig != nil {
		raw, err := s.KV.ExtraConfig.MarshalJSON()
		if err != nil {
			return "", fmt.Errorf("stage %d: kv_connector_extra_config: %w", s.ID, err)
		}
		m["kv_connector_extra_config"] = json.RawMessage(raw)
	}
	b, err := json.Marshal(m)
	return string(b), err
}
