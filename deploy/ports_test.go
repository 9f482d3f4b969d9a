package deploy

import "testing"

// A port is chosen when the config writes it; the connector's defaults that
// PD expansion counts up are not, so omnipd serve may move them.
func TestKVPortsChosen(t *testing.T) {
	const thinker = `pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    devices: "0,1"
`
	for _, tc := range []struct {
		name, cfg       string
		prefill, decode bool
	}{
		{name: "embedded default", cfg: string(DefaultConfig())},
		{name: "pd without ports", cfg: thinker + "pd: {connector: ReferenceConnector}\n"},
		{name: "pd.kv_port", cfg: thinker + "pd: {connector: ReferenceConnector, kv_port: 20000}\n", prefill: true, decode: true},
		{name: "pd.prefill.kv_port", cfg: thinker + "pd: {connector: ReferenceConnector, prefill: {kv_port: 20000}}\n", prefill: true},
		{name: "pd.decode.kv_port", cfg: thinker + "pd: {connector: ReferenceConnector, decode: {kv_port: 20010}}\n", decode: true},
		{name: "stages written out", cfg: `pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    is_prefill_only: true
    kv_transfer_config: {kv_connector: ReferenceConnector, kv_role: kv_producer, engine_id: p0, kv_port: 20000}
  - stage_id: 1
    is_decode_only: true
    kv_transfer_config: {kv_connector: ReferenceConnector, kv_role: kv_consumer, engine_id: d0}
`, prefill: true},
	} {
		doc, _, err := Load(tc.name+".yaml", []byte(tc.cfg), Options{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := doc.Stages[0].KVPortsChosen(); got != tc.prefill {
			t.Errorf("%s: prefill KVPortsChosen = %v, want %v (replicas %+v)", tc.name, got, tc.prefill, doc.Stages[0].Replicas)
		}
		if got := doc.Stages[1].KVPortsChosen(); got != tc.decode {
			t.Errorf("%s: decode KVPortsChosen = %v, want %v (replicas %+v)", tc.name, got, tc.decode, doc.Stages[1].Replicas)
		}
	}
}
