package deploy_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
)

// portless drops the side-channel ports, which a hand-written config picks
// freely, so that topologies compare on their structure.
func portless(t *topology.Topology) *topology.Topology {
	for i := range t.Stages {
		for j := range t.Stages[i].Replicas {
			t.Stages[i].Replicas[j].KVPort = 0
		}
	}
	t.Connectors = nil
	for i := range t.Stages {
		t.Stages[i].InputConnectors, t.Stages[i].OutputConnectors = nil, nil
	}
	return t
}

// The legacy 4-stage PD config and the expansion of the 3-stage default
// describe the same prefill/decode topology.
func TestLegacyPDEqualsExpandedDefault(t *testing.T) {
	legacy, warnings, err := deploy.LoadFile(fixtures+"legacy_qwen3_omni_moe_pd_separation.yaml", deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) == 0 || !strings.Contains(warnings[0].Msg, "legacy stage_args") {
		t.Errorf("loading a legacy config must warn that it was migrated; got %v", warnings)
	}
	for _, base := range []string{"qwen3_omni_moe.yaml", "legacy_qwen3_omni_moe.yaml"} {
		expanded, _, err := deploy.LoadFile(fixtures+base, deploy.Options{PD: true, Connector: "MooncakeConnector"})
		if err != nil {
			t.Fatal(err)
		}
		got, want := portless(legacy.Topology()), portless(expanded.Topology())
		if !reflect.DeepEqual(got, want) {
			t.Errorf("legacy PD topology differs from expanding %s:\n legacy:   %+v\n expanded: %+v", base, got.Stages, want.Stages)
		}
		if legacy.PD == nil || expanded.PD == nil || legacy.PD.Connector != expanded.PD.Connector {
			t.Errorf("PD settings differ: legacy %+v, expanded %+v", legacy.PD, expanded.PD)
		}
	}
}

func TestMigratePrintsStagesSchema(t *testing.T) {
	n, warnings, err := deploy.MigrateFile(fixtures+"legacy_qwen3_omni_moe_pd_separation.yaml", deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 {
		t.Fatalf("want one migration warning, got %v", warnings)
	}
	out, err := n.MarshalYAML()
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for _, want := range []string{"stages:", "is_prefill_only: true", "input_sources: [0]", "kv_role: kv_producer", "devices: \"2\"", "max_num_seqs: 16"} {
		if !strings.Contains(text, want) {
			t.Errorf("migrated document lacks %q:\n%s", want, text)
		}
	}
	for _, gone := range []string{"stage_args", "engine_args", "runtime", "scheduler_cls", "engine_input_source"} {
		if strings.Contains(text, gone) {
			t.Errorf("migrated document still has %q:\n%s", gone, text)
		}
	}
	// The migrated document loads without the legacy warning, to the same topology.
	again, warnings, err := deploy.Load("migrated.yaml", out, deploy.Options{})
	if err != nil {
		t.Fatalf("migrated document does not load: %v", err)
	}
	if len(warnings) != 0 {
		t.Errorf("migrated document loads with warnings: %v", warnings)
	}
	orig, _, _ := deploy.LoadFile(fixtures+"legacy_qwen3_omni_moe_pd_separation.yaml", deploy.Options{})
	if !reflect.DeepEqual(again.Topology(), orig.Topology()) {
		t.Errorf("migrated document resolves differently from the legacy file")
	}
}

// serve --pd=false: the same pipeline with the Thinker as one stage; a
// config whose Thinker is already split cannot be served that way.
func TestColocatedOption(t *testing.T) {
	doc, _, err := deploy.Load(deploy.DefaultConfigName, deploy.DefaultConfig(), deploy.Options{Colocated: true})
	if err != nil {
		t.Fatal(err)
	}
	if doc.PD != nil || len(doc.Stages) != 3 || doc.Stages[0].ModelStage != "thinker" || doc.Disaggregated() {
		t.Errorf("colocated default: PD %+v, %d stages", doc.PD, len(doc.Stages))
	}
	_, _, err = deploy.LoadFile(fixtures+"legacy_qwen3_omni_moe_pd_separation.yaml", deploy.Options{Colocated: true})
	if err == nil || !strings.Contains(err.Error(), "already split") {
		t.Errorf("a split Thinker served colocated: %v", err)
	}
}
