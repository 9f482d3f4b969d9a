package vllmplan

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
)

// A pipeline with a Talker runs every stage — the Thinker (or its prefill
// and decode), the Talker and Code2Wav — on omnipd's vllm-omni stage
// worker: a stock vllm serve can neither run the Talker or Code2Wav nor
// export the Thinker's hidden states they read. Each instance is
//
//	python3 -m omnipd_stage MODEL --deploy-config FILE --stage-id N
//	    --host H --port P [--served-model-name NAME] --tensor-parallel-size N
//	    [--kv-transfer-config JSON] [--conditioning-layer L] [engine flags]
//
// with the environment vllm serve would get, the deployment secret as
// VLLM_API_KEY and the worker's directory on PYTHONPATH. FILE is the
// pipeline's vllm-omni deploy config as vllm-omni reads it (StageDeployConfig);
// N is the stage's id in it, the Thinker's for both of its halves; L, on a
// Thinker stage only, the layer the Talker reads (ConditioningLayer).

// Where a stage worker finds its files, by default: the shell plan writes
// the worker's package into StageWorkerDir and the vllm-omni deploy config
// to StageDeployConfigFile, both in the directory it runs in.
const (
	StageWorkerDir        = "omnipd-stage"
	StageDeployConfigFile = "omnipd-vllm-omni.yaml"
)

// StageWorkerPython is the interpreter the plans run the stage worker with.
const StageWorkerPython = "python3"

// DefaultConditioningLayer is the Thinker layer the Talker reads when
// nothing names another: talker_config.accept_hidden_layer of
// Qwen/Qwen3-Omni-30B-A3B-Instruct's config.json (24; the Talker reads the
// word embeddings and this layer's hidden states).
const DefaultConditioningLayer = 24

// conditioningLayerKey is the Thinker engine argument omnipd serve reads
// the conditioning layer from. It is omnipd's, not an engine's: the
// workers take it as --conditioning-layer, never as an engine flag.
const conditioningLayerKey = "accept_hidden_layer"

// ConditioningLayer is the layer the plan's Thinker stage workers capture
// and omnipd serve asks them for: opts.ConditioningLayer, else the Thinker
// stage's accept_hidden_layer, else DefaultConditioningLayer.
func ConditioningLayer(doc *deploy.Document, opts VLLMOptions) int {
	if opts.ConditioningLayer > 0 {
		return opts.ConditioningLayer
	}
	for _, s := range doc.Stages {
		if s.ModelStage != "thinker" || s.EngineArgs == nil {
			continue
		}
		if v := s.EngineArgs.Get(conditioningLayerKey); v != nil && v.Kind == deploy.KindScalar {
			if n, err := strconv.Atoi(v.Value); err == nil && n >= 0 {
				return n
			}
		}
	}
	return DefaultConditioningLayer
}

// WithConditioningLayer is doc with every Thinker stage's
// accept_hidden_layer set to layer, which omnipd serve then asks the
// Thinker stages to capture; doc is not changed.
func WithConditioningLayer(doc *deploy.Document, layer int) *deploy.Document {
	cp := *doc
	cp.Stages = make([]*deploy.Stage, len(doc.Stages))
	for i, s := range doc.Stages {
		sc := *s
		if s.ModelStage == "thinker" {
			sc.EngineArgs = s.EngineArgs.Clone()
			if sc.EngineArgs == nil {
				sc.EngineArgs = &deploy.Node{Kind: deploy.KindMap}
			}
			sc.EngineArgs.Set(conditioningLayerKey, integer(layer))
		}
		cp.Stages[i] = &sc
	}
	return &cp
}

// NeedsStageWorkers reports whether doc runs on vllm-omni stage workers
// rather than vllm serve: it has a stage other than the Thinker's.
func NeedsStageWorkers(doc *deploy.Document) bool {
	return slices.ContainsFunc(doc.Stages, func(s *deploy.Stage) bool { return s.ModelStage != "thinker" })
}

// planStageWorkers plans one stage worker per replica of every stage of
// doc that is not already running, and the omnipd config that drives them.
func planStageWorkers(doc *deploy.Document, opts VLLMOptions) (*VLLMPlan, error) {
	if e := doc.EncoderStage(); e != nil {
		return nil, fmt.Errorf("stage %d: an encoder stage (E/P/D) in front of a pipeline with a Talker is not planned on vllm-omni stage workers: the stage worker takes no --ec-transfer-config; drop pd.encoder, or plan a thinker-only pipeline (pipeline: qwen3_omni_moe_thinker) for E/P/D on vllm serve", e.ID)
	}
	deployConfig, err := StageDeployConfig(doc)
	if err != nil {
		return nil, err
	}
	plan := &VLLMPlan{
		ServedModelName: opts.ServedModelName,
		DeployConfig:    deployConfig,
		WorkerFiles:     opts.workerFiles(),
		workerDir:       opts.stageWorkerDir(),
		deployConfig:    opts.stageDeployConfig(),
		colocated:       colocated(doc),
	}
	planned, err := planReplicas(doc, opts, plan, func(s *deploy.Stage) (instanceFunc, error) {
		return func(ri int, r topology.Replica, port int) (VLLMCommand, error) {
			return StageWorkerInstance(doc, s, ri, r, port, opts)
		}, nil
	})
	if err != nil {
		return nil, err
	}
	if len(plan.Commands) == 0 {
		plan.Notes = append(plan.Notes, "every replica already has an endpoint; nothing to start")
	} else {
		plan.Notes = append(plan.Notes, fmt.Sprintf("every stage runs omnipd's vllm-omni stage worker (python3 -m %s, written against vllm-omni %s), which reads each stage's engine arguments from %s; its command line repeats the ones vllm serve takes as flags",
			vllmomnistage.Package, vllmomnistage.VLLMOmniVersion, opts.stageDeployConfig()))
	}
	cfg, err := configWithEndpoints(WithConditioningLayer(doc, ConditioningLayer(doc, opts)), planned)
	if err != nil {
		return nil, err
	}
	plan.Config = cfg
	return plan, nil
}

// StageWorkerInstance is the stage worker command PlanVLLM gives replica r
// (index ri) of stage s of doc when it listens on opts.Host at port. The
// flags after the stage id, and the environment, are the ones vllm serve
// gets from VLLMInstance — except that only a Thinker stage answers to a
// served model name — plus PYTHONPATH. Renderers for other targets build
// their stage workers from it.
func StageWorkerInstance(doc *deploy.Document, s *deploy.Stage, ri int, r topology.Replica, port int, opts VLLMOptions) (VLLMCommand, error) {
	opts = opts.withDefaults()
	id, err := VLLMOmniStageID(doc, s)
	if err != nil {
		return VLLMCommand{}, err
	}
	cmd := newCommand(s, ri, port, opts)
	cmd.StageWorker = true
	thinker := s.ModelStage == "thinker"
	flags, err := instanceFlags(s, r, port, opts, thinker)
	if err != nil {
		return VLLMCommand{}, err
	}
	if thinker {
		flags = append(flags, "--conditioning-layer", strconv.Itoa(ConditioningLayer(doc, opts)))
	}
	engineArgs, _ := engineFlags(withoutEngineArg(s, conditioningLayerKey))
	cmd.Argv = append([]string{StageWorkerPython, "-m", vllmomnistage.Package, opts.Model,
		"--deploy-config", opts.stageDeployConfig(),
		"--stage-id", strconv.Itoa(id),
	}, flags...)
	cmd.Argv = append(cmd.Argv, engineArgs...)
	env := instanceEnv(s, r, opts)
	// The worker's package first: a PYTHONPATH the stage's env sets stays
	// behind it.
	env["PYTHONPATH"] = strings.Join(slices.DeleteFunc([]string{opts.stageWorkerDir(), env["PYTHONPATH"]}, func(p string) bool { return p == "" }), ":")
	cmd.Env = sortedEnv(env)
	return cmd, nil
}

// VLLMOmniStageID is the id vllm-omni knows stage s of doc by: its stage's
// id in the model's pipeline (Qwen3-Omni: 0 Thinker, 1 Talker, 2 Code2Wav),
// which is also its stage_id in a vllm-omni deploy config. Both halves of a
// split Thinker have the Thinker's id: vllm-omni's deploy config has one
// Thinker stage, and the worker learns its half from --kv-transfer-config.
func VLLMOmniStageID(doc *deploy.Document, s *deploy.Stage) (int, error) {
	p, ok := deploy.LookupPipeline(doc.Pipeline)
	if !ok {
		return 0, fmt.Errorf("stage %d: unknown pipeline %q", s.ID, doc.Pipeline)
	}
	// A variant (the thinker-only pipeline) numbers its stages as its
	// family's full pipeline does, which is the one vllm-omni knows.
	if full, ok := deploy.LookupPipeline(p.Family); ok {
		p = full
	}
	for _, ps := range p.Stages {
		if ps.ModelStage == s.ModelStage {
			return ps.ID, nil
		}
	}
	return 0, fmt.Errorf("stage %d: pipeline %s has no %s stage", s.ID, p.Name, s.ModelStage)
}

// stageDeployKeysDropped are what the vllm-omni deploy config leaves out of
// a stage: the plan gives each instance its devices and KV transfer config
// on its own command line, runs one process per replica, and splits the
// Thinker itself; model_stage is implied by the stage id.
//
// The rest is written as vllm-omni reads a stage (StageDeployConfig in
// vllm_omni/config/stage_config.py, vllm-project/vllm-omni 001275f2):
// stage_id, async_chunk, input_connectors, output_connectors,
// default_sampling_params, env, and the engine arguments flat.

// StageDeployConfig is doc's pipeline as a vllm-omni deploy config, the
// file every stage worker reads (--deploy-config): its stages as vllm-omni
// numbers them, the Thinker once however it is split, with their engine
// arguments (the pipeline-wide ones included), sampling defaults,
// environment, async chunking and stage connectors, and the pipeline's
// connectors. It leaves out omnipd's own keys (pd:, endpoints, replicas)
// and what the plan sets per instance on its command line: devices (each
// instance gets CUDA_VISIBLE_DEVICES), num_replicas (one process per
// replica) and kv_transfer_config. base_config and platforms: are already
// applied.
func StageDeployConfig(doc *deploy.Document) ([]byte, error) {
	p, ok := deploy.LookupPipeline(doc.Pipeline)
	if !ok {
		return nil, fmt.Errorf("unknown pipeline %q", doc.Pipeline)
	}
	ids := map[int]int{} // omnipd stage id -> vllm-omni stage id
	for _, s := range doc.Stages {
		id, err := VLLMOmniStageID(doc, s)
		if err != nil {
			return nil, err
		}
		ids[s.ID] = id
	}
	// One stage per vllm-omni id: of a split Thinker, the decode, which
	// keeps the Thinker's sampling defaults and stage connectors.
	chosen := map[int]*deploy.Stage{}
	var order []int
	for _, s := range doc.Stages {
		id := ids[s.ID]
		if prev, ok := chosen[id]; ok {
			if prev.Role != topology.RolePrefill && prev.Role != topology.RoleEncoder {
				continue
			}
		} else {
			order = append(order, id)
		}
		chosen[id] = s
	}
	slices.Sort(order)

	root := &deploy.Node{Kind: deploy.KindMap}
	root.Set("pipeline", str(cmp.Or(p.Family, p.Name)))
	root.Set("async_chunk", boolean(doc.AsyncChunk))
	if len(doc.Connectors) > 0 {
		conns := &deploy.Node{Kind: deploy.KindMap}
		for _, c := range doc.Connectors {
			cn := &deploy.Node{Kind: deploy.KindMap}
			cn.Set("name", str(c.Class))
			if c.Extra != nil {
				cn.Set("extra", c.Extra.Clone())
			}
			conns.Set(c.Name, cn)
		}
		root.Set("connectors", conns)
	}
	stages := &deploy.Node{Kind: deploy.KindSeq}
	for _, id := range order {
		s := chosen[id]
		n := &deploy.Node{Kind: deploy.KindMap}
		n.Set("stage_id", integer(id))
		n.Set("tensor_parallel_size", integer(max(1, s.TensorParallelSize)))
		if s.AsyncChunk != nil {
			n.Set("async_chunk", boolean(*s.AsyncChunk))
		}
		if c := stageConnectors(s.InputConnectors, "from_stage_", ids); c != nil {
			n.Set("input_connectors", c)
		}
		if c := stageConnectors(s.OutputConnectors, "to_stage_", ids); c != nil {
			n.Set("output_connectors", c)
		}
		if s.DefaultSamplingParams != nil && len(s.DefaultSamplingParams.Keys) > 0 {
			n.Set("default_sampling_params", s.DefaultSamplingParams.Clone())
		}
		if s.Env != nil && len(s.Env.Keys) > 0 {
			n.Set("env", s.Env.Clone())
		}
		if s.EngineArgs != nil {
			for i, k := range s.EngineArgs.Keys {
				if k.Value != conditioningLayerKey {
					n.Set(k.Value, s.EngineArgs.Values[i].Clone())
				}
			}
		}
		stages.Items = append(stages.Items, n)
	}
	root.Set("stages", stages)
	body, err := root.MarshalYAML()
	if err != nil {
		return nil, fmt.Errorf("print the vllm-omni deploy config: %w", err)
	}
	header := "# vllm-omni deploy config of omnipd's stage workers (python3 -m omnipd_stage --deploy-config).\n" +
		"# Each worker runs one stage (--stage-id); its devices (CUDA_VISIBLE_DEVICES), ports and\n" +
		"# KV transfer config are on its own command line, so no stage here names them.\n"
	return append([]byte(header), body...), nil
}

// withoutEngineArg is s without engine argument key.
func withoutEngineArg(s *deploy.Stage, key string) *deploy.Stage {
	if s.EngineArgs == nil || s.EngineArgs.Get(key) == nil {
		return s
	}
	sc := *s
	sc.EngineArgs = s.EngineArgs.Clone()
	sc.EngineArgs.Delete(key)
	return &sc
}

// stageConnectors writes a stage's connector edges with vllm-omni's stage
// ids; an edge between the halves of the Thinker, which vllm-omni sees as
// one stage, is no edge.
func stageConnectors(cs []deploy.StageConnector, prefix string, ids map[int]int) *deploy.Node {
	if len(cs) == 0 {
		return nil
	}
	n := &deploy.Node{Kind: deploy.KindMap}
	for _, c := range cs {
		n.Set(prefix+strconv.Itoa(ids[c.Stage]), str(c.Name))
	}
	return n
}

func boolean(b bool) *deploy.Node {
	return &deploy.Node{Kind: deploy.KindScalar, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func (o VLLMOptions) workerFiles() []vllmomnistage.File {
	if o.WorkerFiles != nil {
		return o.WorkerFiles
	}
	return vllmomnistage.Files()
}

func (o VLLMOptions) stageWorkerDir() string { return cmp.Or(o.StageWorkerDir, StageWorkerDir) }

func (o VLLMOptions) stageDeployConfig() string {
	return cmp.Or(o.StageDeployConfig, StageDeployConfigFile)
}

// writeStageWorker writes the shell that puts the worker's files and the
// vllm-omni deploy config where the stage workers' command lines name them.
func (p *VLLMPlan) writeStageWorker(b *strings.Builder) {
	fmt.Fprintf(b, "\n# omnipd's vllm-omni stage worker (written against vllm-omni %s), from this omnipd:\n", vllmomnistage.VLLMOmniVersion)
	fmt.Fprintf(b, "# the package %s in %s/, which every worker has on its PYTHONPATH.\n", vllmomnistage.Package, p.workerDir)
	dir := path.Join(p.workerDir, vllmomnistage.Package)
	fmt.Fprintf(b, "rm -rf %[1]s && mkdir -p %[1]s\n", shellQuote(dir))
	for _, f := range p.WorkerFiles {
		writeHeredoc(b, path.Join(p.workerDir, f.Name), f.Data)
	}
	fmt.Fprintf(b, "\n# The vllm-omni deploy config every stage worker reads (--deploy-config).\n")
	if d := path.Dir(p.deployConfig); d != "." && d != "/" {
		fmt.Fprintf(b, "mkdir -p %s\n", shellQuote(d))
	}
	writeHeredoc(b, p.deployConfig, p.DeployConfig)
}

// writeHeredoc writes `cat > name <<'EOF'` with data, ended by a delimiter
// no line of data is; data that does not end a line gets a newline.
func writeHeredoc(b *strings.Builder, name string, data []byte) {
	delim := "EOF"
	lines := strings.Split(string(data), "\n")
	for i := 1; slices.Contains(lines, delim); i++ {
		delim = "EOF_" + strconv.Itoa(i)
	}
	fmt.Fprintf(b, "cat > %s <<'%s'\n", shellQuote(name), delim)
	b.Write(data)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		b.WriteByte('\n')
	}
	b.WriteString(delim + "\n")
}
