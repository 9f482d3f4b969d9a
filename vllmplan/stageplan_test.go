package vllmplan_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
	"github.com/omnipd/omnipd/vllmplan"
	"go.yaml.in/yaml/v4"
)

const omniFixture = "../deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml"

// standInWorker stands for the stage worker's files in the goldens, which
// pin the plan's shape rather than the worker's sources (those are checked
// against the embedded copy where the plan writes them).
var standInWorker = []vllmomnistage.File{
	{Name: "omnipd_stage/__init__.py", Data: []byte("\"\"\"stand-in for the stage worker's package\"\"\"\n")},
	{Name: "omnipd_stage/__main__.py", Data: []byte("import sys\nsys.exit(2)\n")},
}

// stageCases are pipelines with a Talker: split over each connector family
// the goldens of thinker-only plans cover, xPyD with the batch hand-off, and
// unsplit.
func stageCases() []struct {
	name string
	doc  func(t *testing.T) *deploy.Document
} {
	return []struct {
		name string
		doc  func(t *testing.T) *deploy.Document
	}{
		{"omni_pd_mooncake", func(t *testing.T) *deploy.Document {
			return loadFile(t, omniFixture, deploy.Options{PD: true, Connector: "MooncakeConnector"})
		}},
		{"omni_pd_nixl", func(t *testing.T) *deploy.Document {
			return loadFile(t, omniFixture, deploy.Options{PD: true, Connector: "NixlConnector"})
		}},
		{"omni_2p1d_batch", func(t *testing.T) *deploy.Document {
			return loadFile(t, "testdata/omni_2p1d_batch.yaml", deploy.Options{})
		}},
		{"omni_colocated", func(t *testing.T) *deploy.Document {
			return loadFile(t, omniFixture, deploy.Options{})
		}},
	}
}

func TestPlanStageWorkersGolden(t *testing.T) {
	for _, c := range stageCases() {
		t.Run(c.name, func(t *testing.T) {
			doc := c.doc(t)
			opts := vllmplan.VLLMOptions{WorkerFiles: standInWorker}
			plan, err := vllmplan.PlanVLLM(doc, opts)
			if err != nil {
				t.Fatalf("PlanVLLM: %v", err)
			}
			got := plan.Shell()
			golden := filepath.Join("testdata", "vllm", c.name+".golden.sh")
			if *update {
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
			checkStagePlan(t, doc, plan, opts)
		})
	}
}

// wantStageID is the contract's --stage-id of each stage of Qwen3-Omni.
var wantStageID = map[string]string{"thinker": "0", "talker": "1", "code2wav": "2"}

// wantLayer is the conditioning layer of Qwen3-Omni-30B-A3B: its
// config.json's talker_config.accept_hidden_layer.
const wantLayer = "24"

// checkStagePlan checks a plan of stage workers: every replica of every
// stage has one, on a port of its own from the base port; its command line
// is the contract's head followed by exactly the flags vllm serve would get
// for it (its --kv-transfer-config, parallelism and engine arguments; the
// served model name only on the Thinker); its environment is vllm serve's
// plus PYTHONPATH; and the omnipd config names each one.
func checkStagePlan(t *testing.T, doc *deploy.Document, plan *vllmplan.VLLMPlan, opts vllmplan.VLLMOptions) {
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
	if len(cfg.Stages) != len(doc.Stages) {
		t.Fatalf("config has %d stages, the document %d", len(cfg.Stages), len(doc.Stages))
	}
	byReplica := map[[2]int]vllmplan.VLLMCommand{}
	ports := map[string]bool{}
	for _, c := range plan.Commands {
		byReplica[[2]int{c.Stage, c.Replica}] = c
		if ports[c.URL] {
			t.Errorf("%s: %s is another instance's too", c.Name, c.URL)
		}
		ports[c.URL] = true
	}
	base := vllmplan.DefaultVLLMBasePort
	if opts.BasePort != 0 {
		base = opts.BasePort
	}
	n := 0
	for si, s := range doc.Stages {
		for ri, r := range s.Replicas {
			c, ok := byReplica[[2]int{s.ID, ri}]
			if !ok {
				t.Errorf("stage %d replica %d: no stage worker planned", s.ID, ri)
				continue
			}
			wantURL := "http://127.0.0.1:" + strconv.Itoa(base+n)
			n++
			if c.URL != wantURL {
				t.Errorf("%s: URL %s, want %s (one port each from the base port, in stage order)", c.Name, c.URL, wantURL)
			}
			if got := cfg.Stages[si].Replicas[ri].Endpoint; got != c.URL {
				t.Errorf("config stage %d replica %d: endpoint %q, want %q", s.ID, ri, got, c.URL)
			}
			if s.ModelStage == "thinker" {
				if v := cfg.Stages[si].EngineArgs.Get("accept_hidden_layer"); v == nil || v.Value != wantLayer {
					t.Errorf("config stage %d: accept_hidden_layer %v, want %s, the layer its workers capture", s.ID, v, wantLayer)
				}
			}
			checkStageWorker(t, s, ri, r, c)
		}
	}
	if n != len(plan.Commands) {
		t.Errorf("%d replicas, %d planned stage workers", n, len(plan.Commands))
	}

	// The vllm-omni deploy config: one stage per pipeline stage, the Thinker
	// once, none of omnipd's keys or the per-instance ones.
	var written struct {
		Pipeline string           `yaml:"pipeline"`
		Stages   []map[string]any `yaml:"stages"`
	}
	if err := yaml.Unmarshal(plan.DeployConfig, &written); err != nil {
		t.Fatalf("the vllm-omni deploy config does not parse: %v\n%s", err, plan.DeployConfig)
	}
	var ids []string
	for _, st := range written.Stages {
		ids = append(ids, fmt.Sprint(st["stage_id"]))
		for _, k := range []string{"pd", "endpoints", "replicas", "num_replicas", "devices", "kv_transfer_config", "is_prefill_only", "is_decode_only", "model_stage", "input_sources"} {
			if _, ok := st[k]; ok {
				t.Errorf("vllm-omni deploy config stage %v has %s", st["stage_id"], k)
			}
		}
	}
	if !slices.Equal(ids, []string{"0", "1", "2"}) {
		t.Errorf("vllm-omni deploy config stage ids %v, want 0, 1, 2", ids)
	}
	if len(plan.WorkerFiles) == 0 {
		t.Error("the plan carries no stage worker files")
	}
}

// checkStageWorker checks replica ri of stage s against the vllm serve
// command the same replica would get.
func checkStageWorker(t *testing.T, s *deploy.Stage, ri int, r topology.Replica, c vllmplan.VLLMCommand) {
	t.Helper()
	if !c.StageWorker {
		t.Errorf("%s: not marked a stage worker", c.Name)
	}
	head := []string{"python3", "-m", "omnipd_stage", vllmplan.DefaultVLLMModel,
		"--deploy-config", vllmplan.StageDeployConfigFile, "--stage-id", wantStageID[s.ModelStage],
		"--host", "127.0.0.1"}
	if len(c.Argv) < len(head) || !slices.Equal(c.Argv[:len(head)], head) {
		t.Fatalf("%s: argv %q, want it to start %q", c.Name, c.Argv, head)
	}
	port, err := strconv.Atoi(c.Argv[slices.Index(c.Argv, "--port")+1])
	if err != nil {
		t.Fatalf("%s: argv %q: %v", c.Name, c.Argv, err)
	}
	serve, err := vllmplan.VLLMInstance(s, ri, r, port, vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(serve.Argv[3:]) // after vllm serve MODEL
	if s.ModelStage != "thinker" {
		i := slices.Index(want, "--served-model-name")
		want = slices.Delete(want, i, i+2)
	}
	got := slices.Clone(c.Argv[len(head)-2:])
	// A Thinker captures the layer the Talker reads, which omnipd serve
	// asks for: its config's accept_hidden_layer.
	if i := slices.Index(got, "--conditioning-layer"); s.ModelStage == "thinker" {
		if i < 0 || i+1 >= len(got) || got[i+1] != wantLayer {
			t.Errorf("%s: argv %q, want --conditioning-layer %s", c.Name, c.Argv, wantLayer)
		} else {
			got = slices.Delete(got, i, i+2)
		}
	} else if i >= 0 {
		t.Errorf("%s: argv %q: --conditioning-layer on a %s", c.Name, c.Argv, s.ModelStage)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: flags\n%q\nwant vllm serve's\n%q", c.Name, got, want)
	}
	wantEnv := append(slices.Clone(serve.Env), "PYTHONPATH="+vllmplan.StageWorkerDir)
	slices.Sort(wantEnv)
	if !slices.Equal(c.Env, wantEnv) {
		t.Errorf("%s: env %q, want vllm serve's and PYTHONPATH: %q", c.Name, c.Env, wantEnv)
	}
	if (slices.Index(c.Argv, "--kv-transfer-config") >= 0) != (s.KV != nil) {
		t.Errorf("%s (%s): --kv-transfer-config in %q, want it only on a split Thinker", c.Name, c.Role, c.Argv)
	}
}

// The vllm-omni deploy config holds the user's stages as they wrote them
// (as vllm-omni reads them): every key of every stage of vllm-omni's own
// file, with its value, but for the devices the plan gives each instance.
func TestStageDeployConfigIsTheUsersStages(t *testing.T) {
	raw, err := os.ReadFile(omniFixture)
	if err != nil {
		t.Fatal(err)
	}
	var user struct {
		AsyncChunk bool             `yaml:"async_chunk"`
		Connectors map[string]any   `yaml:"connectors"`
		Stages     []map[string]any `yaml:"stages"`
	}
	if err := yaml.Unmarshal(raw, &user); err != nil {
		t.Fatal(err)
	}
	for _, pd := range []bool{false, true} {
		doc := loadFile(t, omniFixture, deploy.Options{PD: pd, Connector: "MooncakeConnector"})
		b, err := vllmplan.StageDeployConfig(doc)
		if err != nil {
			t.Fatal(err)
		}
		var written struct {
			AsyncChunk bool             `yaml:"async_chunk"`
			Connectors map[string]any   `yaml:"connectors"`
			Stages     []map[string]any `yaml:"stages"`
		}
		if err := yaml.Unmarshal(b, &written); err != nil {
			t.Fatalf("pd %v: %v\n%s", pd, err, b)
		}
		if written.AsyncChunk != user.AsyncChunk || !reflect.DeepEqual(written.Connectors, user.Connectors) {
			t.Errorf("pd %v: async_chunk %v, connectors %v; want the file's %v, %v", pd, written.AsyncChunk, written.Connectors, user.AsyncChunk, user.Connectors)
		}
		if len(written.Stages) != len(user.Stages) {
			t.Fatalf("pd %v: %d stages, want the file's %d:\n%s", pd, len(written.Stages), len(user.Stages), b)
		}
		for i, us := range user.Stages {
			for k, v := range us {
				if k == "devices" {
					continue
				}
				got := written.Stages[i][k]
				if k == "default_sampling_params" {
					// With the pipeline's constraints, which vllm-omni
					// applies whatever the file says (the Talker's
					// detokenize and stop_token_ids).
					got = subsetOf(got, v)
				}
				if !reflect.DeepEqual(got, v) {
					t.Errorf("pd %v: stage %v %s = %v, want the file's %v", pd, us["stage_id"], k, got, v)
				}
			}
		}
		// And omnipd reads it as the same pipeline.
		back, _, err := deploy.Load("vllm-omni.yaml", b, deploy.Options{})
		if err != nil {
			t.Fatalf("pd %v: omnipd does not load the vllm-omni deploy config: %v\n%s", pd, err, b)
		}
		if len(back.Stages) != 3 || back.Stages[0].ModelStage != "thinker" || back.Stages[2].ModelStage != "code2wav" {
			t.Errorf("pd %v: the vllm-omni deploy config loads as %s", pd, back.Summary())
		}
	}
}

// A stage with endpoints runs already: its replicas are not planned, and
// the config still names them.
func TestPlanStageWorkersSkipsRunningReplicas(t *testing.T) {
	doc := loadText(t, "talker_running.yaml", `base_config: `+mustAbs(t, omniFixture)+`
stages:
  - stage_id: 1
    endpoints: ["http://talker.example:9000"]
`, deploy.Options{PD: true, Connector: "NixlConnector"})
	plan, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range plan.Commands {
		if c.Stage == 2 {
			t.Errorf("planned %s for the Talker, which runs at an endpoint", c.Name)
		}
	}
	if len(plan.Commands) != 3 || !strings.Contains(string(plan.Config), "http://talker.example:9000") {
		t.Errorf("%d planned; config:\n%s", len(plan.Commands), plan.Config)
	}
}

// The layer the Thinker workers capture and omnipd serve asks for is one:
// the plan's, else the one the config names, else Qwen3-Omni-30B-A3B's. It
// is no engine argument: neither a flag nor in the vllm-omni deploy config.
func TestPlanStageWorkersConditioningLayer(t *testing.T) {
	named := loadText(t, "layer.yaml", "base_config: "+mustAbs(t, omniFixture)+"\nstages:\n  - stage_id: 0\n    accept_hidden_layer: 20\n", deploy.Options{})
	for _, c := range []struct {
		name string
		doc  *deploy.Document
		opts vllmplan.VLLMOptions
		want string
	}{
		{"default", loadFile(t, omniFixture, deploy.Options{}), vllmplan.VLLMOptions{}, "24"},
		{"the config's", named, vllmplan.VLLMOptions{}, "20"},
		{"the plan's", named, vllmplan.VLLMOptions{ConditioningLayer: 12}, "12"},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, err := vllmplan.PlanVLLM(c.doc, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			thinker := plan.Commands[0]
			if i := slices.Index(thinker.Argv, "--conditioning-layer"); i < 0 || thinker.Argv[i+1] != c.want || slices.Contains(thinker.Argv, "--accept-hidden-layer") {
				t.Errorf("argv %q: want --conditioning-layer %s and no --accept-hidden-layer", thinker.Argv, c.want)
			}
			cfg, _, err := deploy.Load("plan.yaml", plan.Config, deploy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if v := cfg.Stages[0].EngineArgs.Get("accept_hidden_layer"); v == nil || v.Value != c.want {
				t.Errorf("config's accept_hidden_layer %v, want %s", v, c.want)
			}
			if bytes.Contains(plan.DeployConfig, []byte("accept_hidden_layer")) {
				t.Errorf("the vllm-omni deploy config names accept_hidden_layer:\n%s", plan.DeployConfig)
			}
		})
	}
}

func TestPlanStageWorkersRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		opts deploy.Options
		text string
		want []string
	}{
		{name: "reference connector", opts: deploy.Options{PD: true, Connector: "ReferenceConnector"},
			want: []string{"ReferenceConnector", "not a vLLM KV connector"}},
		{name: "encoder", text: "pd:\n  connector: NixlConnector\n  encoder: {}\n",
			want: []string{"encoder stage", "--ec-transfer-config", "pd.encoder"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := loadText(t, "omni.yaml", "base_config: "+mustAbs(t, omniFixture)+"\n"+c.text, c.opts)
			_, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
			if err == nil {
				t.Fatal("planned; want an error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The stage worker's files the plan carries by default are the ones this
// omnipd embeds.
func TestPlanStageWorkersCarriesTheEmbeddedWorker(t *testing.T) {
	plan, err := vllmplan.PlanVLLM(loadFile(t, omniFixture, deploy.Options{}), vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatal(err)
	}
	embedded := vllmomnistage.Files()
	if len(embedded) == 0 || !reflect.DeepEqual(plan.WorkerFiles, embedded) {
		t.Fatalf("plan carries %d files, the embedded worker has %d", len(plan.WorkerFiles), len(embedded))
	}
	sh := plan.Shell()
	for _, f := range embedded {
		if !bytes.Contains([]byte(sh), f.Data) {
			t.Errorf("the script does not write %s", f.Name)
		}
	}
}

// subsetOf is the part of map got with the keys of want.
func subsetOf(got, want any) any {
	g, ok1 := got.(map[string]any)
	w, ok2 := want.(map[string]any)
	if !ok1 || !ok2 {
		return got
	}
	out := map[string]any{}
	for k := range w {
		if v, ok := g[k]; ok {
			out[k] = v
		}
	}
	return out
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// The release the plans name (validate, the script's install hint, the
// default image) is the one the worker declares it is written against, and
// checks at start-up.
func TestStageWorkerReleaseIsTheWorkers(t *testing.T) {
	declared := regexp.MustCompile(`(?m)^WRITTEN_AGAINST = "([^"]+)"$`)
	for _, f := range vllmomnistage.Files() {
		if m := declared.FindSubmatch(f.Data); m != nil {
			if string(m[1]) != vllmomnistage.VLLMOmniVersion {
				t.Errorf("%s is written against vllm-omni %s; vllmomnistage.VLLMOmniVersion is %s", f.Name, m[1], vllmomnistage.VLLMOmniVersion)
			}
			return
		}
	}
	t.Fatal("no file of the stage worker declares WRITTEN_AGAINST, the vllm-omni release it checks at start-up")
}
