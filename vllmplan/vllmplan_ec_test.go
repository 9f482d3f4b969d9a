package vllmplan_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/vllmplan"
)

// flagValue is the value after flag in argv, and whether flag is there.
func flagValue(argv []string, flag string) (string, bool) {
	i := slices.Index(argv, flag)
	if i < 0 || i+1 >= len(argv) {
		return "", i >= 0
	}
	return argv[i+1], true
}

func ecConfig(t *testing.T, c vllmplan.VLLMCommand) map[string]any {
	t.Helper()
	raw, ok := flagValue(c.Argv, "--ec-transfer-config")
	if !ok {
		t.Fatalf("%s: no --ec-transfer-config", c.Name)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("%s: --ec-transfer-config %q: %v", c.Name, raw, err)
	}
	return m
}

// The encoder instances start the way vLLM's disaggregated-encoder
// examples start theirs; the prefill takes what they make.
func TestPlanVLLMEncoder(t *testing.T) {
	plan, err := vllmplan.PlanVLLM(loadFile(t, "testdata/thinking_2e2p1d_mooncake.yaml", deploy.Options{}), vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var roles, names []string
	for _, c := range plan.Commands {
		roles = append(roles, c.Role)
		names = append(names, c.Name)
	}
	if want := []string{"encoder", "encoder", "prefill", "prefill", "decode"}; !slices.Equal(roles, want) {
		t.Fatalf("planned roles %v, want %v (%v)", roles, want, names)
	}
	for i, c := range plan.Commands[:2] {
		argv := strings.Join(c.Argv, " ")
		for _, want := range []string{"--enforce-eager", "--no-enable-prefix-caching", "--max-num-batched-tokens 114688", "--tensor-parallel-size 1 "} {
			if !strings.Contains(argv, want) {
				t.Errorf("%s: argv %q lacks %q", c.Name, argv, want)
			}
		}
		if strings.Contains(argv, "--enable-prefix-caching") {
			t.Errorf("%s: the encoder turns prefix caching on: %q", c.Name, argv)
		}
		ec := ecConfig(t, c)
		extra, _ := ec["ec_connector_extra_config"].(map[string]any)
		if ec["ec_connector"] != "ECExampleConnector" || ec["ec_role"] != "ec_producer" || ec["engine_id"] != []string{"thinker-encoder-0", "thinker-encoder-1"}[i] || extra["shared_storage_path"] != "/data/ec_cache" {
			t.Errorf("%s: --ec-transfer-config %v", c.Name, ec)
		}
		if env := strings.Join(c.Env, " "); !strings.Contains(env, "CUDA_VISIBLE_DEVICES="+[]string{"0", "1"}[i]) {
			t.Errorf("%s: env %q, want encoder %d on device %d", c.Name, env, i, i)
		}
	}
	for _, c := range plan.Commands[2:4] {
		ec := ecConfig(t, c)
		extra, _ := ec["ec_connector_extra_config"].(map[string]any)
		if ec["ec_role"] != "ec_consumer" || extra["shared_storage_path"] != "/data/ec_cache" {
			t.Errorf("%s: --ec-transfer-config %v, want the consumer end of /data/ec_cache", c.Name, ec)
		}
		if slices.Index(c.Argv, "--ec-transfer-config") > slices.Index(c.Argv, "--kv-transfer-config") {
			t.Errorf("%s: --ec-transfer-config after --kv-transfer-config; vLLM's example gives it first", c.Name)
		}
	}
	if !slices.ContainsFunc(plan.Notes, func(n string) bool {
		return strings.Contains(n, "/data/ec_cache") && strings.Contains(n, "never deletes")
	}) {
		t.Errorf("notes %q do not say where ECExampleConnector keeps the encoder outputs", plan.Notes)
	}
}

func TestPlanVLLMRefusesReferenceECConnector(t *testing.T) {
	doc := loadText(t, "ref_ec.yaml", `base_config: ../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe_thinking.yaml
pd:
  connector: NixlConnector
  encoder:
    ec_connector: ReferenceECConnector
`, deploy.Options{})
	_, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
	if err == nil || !strings.Contains(err.Error(), "ReferenceECConnector is not a vLLM EC connector") || !strings.Contains(err.Error(), "ECExampleConnector") {
		t.Fatalf("err = %v, want one naming ReferenceECConnector as not a vLLM EC connector", err)
	}
}

func TestECTransferJSON(t *testing.T) {
	doc := loadFile(t, "testdata/thinking_epd_nixl.yaml", deploy.Options{})
	enc, prefill, decode := doc.Stages[0], doc.Stages[1], doc.Stages[2]
	got, err := vllmplan.ECTransferJSON(enc, enc.Replicas[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"ec_connector":"ECExampleConnector","ec_role":"ec_producer","engine_id":"thinker-encoder","ec_connector_extra_config":{"shared_storage_path":"/tmp/ec_cache"}}`; got != want {
		t.Errorf("encoder: %s\nwant %s", got, want)
	}
	if got, _ := vllmplan.ECTransferJSON(prefill, prefill.Replicas[0]); !strings.Contains(got, `"ec_role":"ec_consumer","engine_id":"thinker-prefill"`) {
		t.Errorf("prefill: %s", got)
	}
	if got, err := vllmplan.ECTransferJSON(decode, decode.Replicas[0]); got != "" || err != nil {
		t.Errorf("decode: %q, %v; want none", got, err)
	}
}
