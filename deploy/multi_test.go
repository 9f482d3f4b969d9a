package deploy

import (
	"os"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
)

// multiStages are hand-written prefill and decode stages over vLLM's
// MultiConnector: NIXL moves the KV between them, an LMCache tier beside it.
const multiStages = `pipeline: qwen3_omni_moe
stages:
  - stage_id: 0
    model_stage: thinker
    devices: "0"
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MultiConnector
      kv_role: kv_both
      engine_id: p0
      kv_connector_extra_config:
        connectors:
          - kv_connector: NixlConnector
            kv_role: kv_both
          - kv_connector: LMCacheConnectorV1
            kv_role: kv_both
  - stage_id: 1
    model_stage: thinker
    devices: "1"
    is_decode_only: true
    kv_transfer_config:
      kv_connector: MultiConnector
      kv_role: kv_both
      engine_id: d0
      kv_connector_extra_config:
        connectors:
          - kv_connector: NixlConnector
            kv_role: kv_both
          - kv_connector: LMCacheConnectorV1
            kv_role: kv_both
  - stage_id: 2
    devices: "2"
  - stage_id: 3
    devices: "2"
`

// The router routes MultiConnector as its PD child, so a config that names
// it on hand-written prefill and decode stages, or in pd.connector beside
// them, loads.
func TestLoadMultiConnectorStages(t *testing.T) {
	for name, src := range map[string]string{
		"stages":       multiStages,
		"pd.connector": multiStages + "pd:\n  connector: MultiConnector\n",
	} {
		t.Run(name, func(t *testing.T) {
			doc, _, err := Load("multi.yaml", []byte(src), Options{})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if doc.PD == nil || doc.PD.Connector != kvconnector.MultiConnector {
				t.Fatalf("pd settings %+v, want the pair over %s", doc.PD, kvconnector.MultiConnector)
			}
		})
	}
}

// PD expansion cannot write a MultiConnector's children, so splitting a
// Thinker over it asks for the stages by hand rather than calling the
// connector unknown.
func TestExpandRefusesMultiConnector(t *testing.T) {
	data, err := os.ReadFile("testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml")
	if err != nil {
		t.Fatal(err)
	}
	src := string(data) + "pd:\n  connector: MultiConnector\n"
	_, _, err = Load("multi.yaml", []byte(src), Options{})
	if err == nil {
		t.Fatal("Load: no error")
	}
	if testing.Verbose() {
		t.Log(err)
	}
	msg := err.Error()
	if strings.Contains(msg, "unknown KV connector") || !strings.Contains(msg, "pd.connector") || !strings.Contains(msg, "is_prefill_only") {
		t.Fatalf("Load: %v\nwant an error at pd.connector asking for hand-written prefill and decode stages", err)
	}
}
