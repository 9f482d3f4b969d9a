package vllmplan_test

import (
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/vllmplan"
)

const mooncakeTCP = `pipeline: qwen3_omni_moe_thinker
pd:
  connector: MooncakeConnector
  kv_connector_extra_config:
    mooncake_protocol: tcp
  prefill:
    num_replicas: 2
  decode:
    num_replicas: 1
stages:
  - stage_id: 0
    tensor_parallel_size: 1
`

// vLLM's MooncakeConnector takes its bootstrap port from the environment
// (VLLM_MOONCAKE_BOOTSTRAP_PORT) and its transport from
// kv_connector_extra_config.mooncake_protocol (rdma unless set): each
// prefill gets its own port in its env, no kv_transfer_config carries a
// port key vLLM never reads, and the protocol reaches both sides.
func TestPlanVLLMMooncakePortAndProtocol(t *testing.T) {
	doc := loadText(t, "mooncake_tcp.yaml", mooncakeTCP, deploy.Options{})
	plan, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatalf("PlanVLLM: %v", err)
	}
	ports := map[string]bool{}
	for _, c := range plan.Commands {
		kv := ""
		for i, a := range c.Argv {
			if a == "--kv-transfer-config" && i+1 < len(c.Argv) {
				kv = c.Argv[i+1]
			}
		}
		if strings.Contains(kv, "mooncake_bootstrap_port") {
			t.Errorf("%s: --kv-transfer-config %s carries mooncake_bootstrap_port, which vLLM never reads", c.Name, kv)
		}
		if !strings.Contains(kv, `"mooncake_protocol":"tcp"`) {
			t.Errorf("%s: --kv-transfer-config %s lacks mooncake_protocol tcp", c.Name, kv)
		}
		var port string
		for _, e := range c.Env {
			if v, ok := strings.CutPrefix(e, "VLLM_MOONCAKE_BOOTSTRAP_PORT="); ok {
				port = v
			}
		}
		if strings.Contains(kv, "kv_producer") {
			if port == "" || ports[port] {
				t.Errorf("%s: VLLM_MOONCAKE_BOOTSTRAP_PORT %q is missing or shared with another prefill", c.Name, port)
			}
			ports[port] = true
		}
	}
	if len(ports) != 2 {
		t.Errorf("%d prefill bootstrap ports, want 2", len(ports))
	}
}
