package vllmplan_test

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
	"github.com/omnipd/omnipd/vllmplan"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/vllm")

const thinkingFixture = "../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe_thinking.yaml"

// xpydNixl is thinker-only 2P1D over NIXL, TP 1.
const xpydNixl = `pipeline: qwen3_omni_moe_thinker
pd:
  connector: NixlConnector
  prefill:
    num_replicas: 2
  decode:
    num_replicas: 1
stages:
  - stage_id: 0
    tensor_parallel_size: 1
    max_num_seqs: 32
    gpu_memory_utilization: 0.85
    trust_remote_code: true
    env:
      VLLM_LOGGING_LEVEL: INFO
`

func loadFile(t *testing.T, path string, opts deploy.Options) *deploy.Document {
	t.Helper()
	doc, _, err := deploy.LoadFile(path, opts)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return doc
}

func loadText(t *testing.T, name, text string, opts deploy.Options) *deploy.Document {
	t.Helper()
	doc, _, err := deploy.Load(name, []byte(text), opts)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return doc
}

func TestPlanVLLMGolden(t *testing.T) {
	type planCase struct {
		name string
		doc  func(t *testing.T) *deploy.Document
	}
	var cases []planCase
	for _, c := range []string{"MooncakeConnector", "NixlConnector", "P2pNcclConnector", "LMCacheConnectorV1", "MoRIIOConnector"} {
		cases = append(cases, planCase{
			name: "thinking_pd_" + strings.ToLower(strings.TrimSuffix(c, "Connector")),
			doc: func(t *testing.T) *deploy.Document {
				return loadFile(t, thinkingFixture, deploy.Options{PD: true, Connector: c})
			},
		})
	}
	cases = append(cases, planCase{
		name: "lmcache_pd",
		doc: func(t *testing.T) *deploy.Document {
			return loadText(t, "lmcache_pd.yaml", lmcachePD, deploy.Options{})
		},
	})
	cases = append(cases, planCase{
		name: "xpyd_nixl",
		doc: func(t *testing.T) *deploy.Document {
			return loadText(t, "xpyd_nixl.yaml", xpydNixl, deploy.Options{})
		},
	})

	for _, name := range []string{"thinking_epd_nixl", "thinking_2e2p1d_mooncake"} {
		cases = append(cases, planCase{
			name: name,
			doc: func(t *testing.T) *deploy.Document {
				return loadFile(t, filepath.Join("testdata", name+".yaml"), deploy.Options{})
			},
		})
	}

	cases = append(cases, planCase{
		name: "dp_nixl",
		doc: func(t *testing.T) *deploy.Document {
			return loadFile(t, "testdata/dp_nixl.yaml", deploy.Options{})
		},
	})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := c.doc(t)
			plan, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
			if err != nil {
				t.Fatalf("PlanVLLM: %v", err)
			}
			got := plan.Shell()
			golden := filepath.Join("testdata", "vllm", c.name+".golden.sh")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./vllmplan -update)", err)
			}
			if got != string(want) {
				t.Errorf("Shell() differs from %s (run go test ./vllmplan -update and review the diff)\ngot:\n%s", golden, got)
			}
			checkConfig(t, doc, plan)
		})
	}
}

// checkConfig checks that the plan's config loads and validates (it is
// what omnipd serve is started with), that each Thinker replica in it
// names its planned instance, and that each instance gets the transfer
// configs of its role: an encoder only --ec-transfer-config, a prefill
// both when there is an encoder, a decode only --kv-transfer-config.
func checkConfig(t *testing.T, doc *deploy.Document, plan *vllmplan.VLLMPlan) {
	t.Helper()
	cfg, warnings, err := deploy.Load("plan.yaml", plan.Config, deploy.Options{})
	if err != nil {
		t.Fatalf("the plan's config does not load: %v\n%s", err, plan.Config)
	}
	if len(warnings) > 0 {
		t.Errorf("the plan's config loads with warnings: %v", warnings)
	}
	if v := topology.Validate(cfg.Topology()); len(v) > 0 {
		t.Fatalf("the plan's config has violations: %v", v)
	}
	urls := map[[2]int]string{}
	for _, c := range plan.Commands {
		urls[[2]int{c.Stage, c.Replica}] = c.URL
	}
	n := 0
	for _, s := range cfg.Stages {
		if s.ModelStage != "thinker" {
			continue
		}
		for i, r := range s.Replicas {
			n++
			want, ok := urls[[2]int{s.ID, i}]
			if !ok {
				t.Errorf("stage %d replica %d: no planned instance", s.ID, i)
				continue
			}
			if r.Endpoint != want {
				t.Errorf("stage %d replica %d: endpoint %q, want %q", s.ID, i, r.Endpoint, want)
			}
		}
	}
	if n != len(plan.Commands) {
		t.Errorf("%d Thinker replicas in the config, %d planned instances", n, len(plan.Commands))
	}
	if len(cfg.Stages) != len(doc.Stages) {
		t.Errorf("config has %d stages, the document %d", len(cfg.Stages), len(doc.Stages))
	}
	encoder := doc.EncoderStage() != nil
	for _, c := range plan.Commands {
		if c.Argv[0] != "vllm" || c.Argv[1] != "serve" {
			t.Errorf("%s: argv %q does not start with vllm serve", c.Name, c.Argv)
		}
		kv, ec := slices.Index(c.Argv, "--kv-transfer-config"), slices.Index(c.Argv, "--ec-transfer-config")
		wantKV, wantEC := c.Role != "encoder", c.Role == "encoder" || c.Role == "prefill" && encoder
		if (kv >= 0) != wantKV || (ec >= 0) != wantEC {
			t.Errorf("%s (%s): --kv-transfer-config %v, --ec-transfer-config %v; want %v, %v", c.Name, c.Role, kv >= 0, ec >= 0, wantKV, wantEC)
		}
	}
}

func TestPlanVLLMSkipsRunningReplicas(t *testing.T) {
	doc := loadFile(t, "../deploy/testdata/expand/endpoints.yaml", deploy.Options{})
	plan, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatalf("PlanVLLM: %v", err)
	}
	if len(plan.Commands) != 0 {
		t.Errorf("planned %d instances for stages that already run", len(plan.Commands))
	}
	if _, _, err := deploy.Load("plan.yaml", plan.Config, deploy.Options{}); err != nil {
		t.Errorf("the plan's config does not load: %v", err)
	}
}

func TestPlanVLLMErrors(t *testing.T) {
	t.Run("reference connector", func(t *testing.T) {
		doc := loadFile(t, thinkingFixture, deploy.Options{PD: true, Connector: "ReferenceConnector"})
		_, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
		if err == nil || !strings.Contains(err.Error(), "ReferenceConnector") || !strings.Contains(err.Error(), "not a vLLM KV connector") {
			t.Fatalf("err = %v, want one naming ReferenceConnector as not a vLLM connector", err)
		}
	})
}

// The plan owns --data-parallel-size as it owns --tensor-parallel-size: the
// devices, side-channel ports and rank routing all follow from it.
func TestPlanVLLMDataParallel(t *testing.T) {
	plan, err := vllmplan.PlanVLLM(loadFile(t, "testdata/dp_nixl.yaml", deploy.Options{}), vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range plan.Commands {
		argv := strings.Join(c.Argv, " ")
		if !strings.Contains(argv, "--tensor-parallel-size 2 --data-parallel-size 2 ") || strings.Count(argv, "--data-parallel-size") != 1 {
			t.Errorf("%s: argv %q, want --data-parallel-size 2 once, beside --tensor-parallel-size 2", c.Name, argv)
		}
	}
}
