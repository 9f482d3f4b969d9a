// Package deploy owns omnipd's deploy config: the YAML schema (vllm-omni's
// stages: schema as users write it, plus omnipd's pd: section, endpoints and
// replicas), strict loading that reports every mistake with file:line:column
// and field path, base_config overlays, platform sections, migration of the
// removed legacy stage_args: schema, the frozen model pipelines, PD expansion
// of the Thinker into prefill and decode stages (and, with pd.encoder, an
// encoder stage in front of them: E/P/D), and printing a resolved config
// back as YAML or JSON.
//
// Loading is pure apart from reading the config files: it starts nothing and
// contacts nothing. The resolved graph it hands on is a topology.Topology.
package deploy

import _ "embed"

//go:embed default.yaml
var defaultConfig []byte

// DefaultConfigName names the embedded default in positions and messages.
const DefaultConfigName = "<embedded default>"

// DefaultConfig returns omnipd's embedded default deploy config: Qwen3-Omni on
// reference workers with the Thinker disaggregated over the reference connector.
func DefaultConfig() []byte {
	return append([]byte(nil), defaultConfig...)
}
