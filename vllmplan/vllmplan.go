package vllmplan

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
)

// Defaults of VLLMOptions.
const (
	DefaultVLLMModel    = "Qwen/Qwen3-Omni-30B-A3B-Instruct"
	DefaultVLLMHost     = "127.0.0.1"
	DefaultVLLMBasePort = 8100
)

// VLLMOptions say how the planned vllm serve instances are reached. The zero
// value plans Qwen3-Omni on loopback from port 8100.
type VLLMOptions struct {
	// Model is the checkpoint every instance serves (default DefaultVLLMModel).
	Model string
	// Host is the address the instances listen on and omnipd reaches them at
	// (default 127.0.0.1). It is also NIXL's side-channel host.
	Host string
	// BasePort is the HTTP port of the first instance; the others follow in
	// stage order, one port each (default 8100).
	BasePort int
	// ServedModelName is the model name every instance accepts (default
	// Model). omnipd forwards the client's model name, so omnipd serve must
	// be started with the same --served-model-name.
	ServedModelName string

	// For pipelines with a Talker, which run on vllm-omni stage workers:
	// StageWorkerDir is the directory on each worker's PYTHONPATH that
	// holds the worker's package (default StageWorkerDir, relative to where
	// the shell plan runs), StageDeployConfig the path of the vllm-omni
	// deploy config the workers read (default StageDeployConfigFile), and
	// WorkerFiles the worker's files the plan writes out (default
	// vllmomnistage.Files(), the ones this omnipd embeds).
	StageWorkerDir    string
	StageDeployConfig string
	WorkerFiles       []vllmomnistage.File
	// ConditioningLayer is the Thinker layer whose hidden states the
	// Talker reads (Qwen3-Omni's accept_hidden_layer): the Thinker stage
	// workers capture it (--conditioning-layer) and omnipd serve asks for
	// it (the omnipd config's accept_hidden_layer). Default: the Thinker
	// stage's accept_hidden_layer, else DefaultConditioningLayer.
	ConditioningLayer int
}

func (o VLLMOptions) withDefaults() VLLMOptions {
	if o.Model == "" {
		o.Model = DefaultVLLMModel
	}
	if o.Host == "" {
		o.Host = DefaultVLLMHost
	}
	if o.BasePort == 0 {
		o.BasePort = DefaultVLLMBasePort
	}
	if o.ServedModelName == "" {
		o.ServedModelName = o.Model
	}
	return o
}

// VLLMCommand is one planned engine instance: a vllm serve of a Thinker
// stage, or (StageWorker) omnipd's vllm-omni stage worker of any stage.
type VLLMCommand struct {
	Stage   int    // stage id
	Role    string // "prefill", "decode", "encoder" or "full"
	Replica int
	// Name identifies the instance, e.g. "thinker-prefill-0".
	Name string
	// Argv is the command line: vllm serve MODEL --port ...
	// [--ec-transfer-config JSON] [--kv-transfer-config JSON] ..., or
	// python3 -m omnipd_stage MODEL --deploy-config FILE --stage-id N
	// --port ... for a stage worker.
	Argv []string
	// Env is sorted KEY=VALUE: CUDA_VISIBLE_DEVICES, the connector's
	// variables and the stage's env; for a stage worker PYTHONPATH too,
	// relative to where the plan runs unless absolute.
	Env []string
	// StageWorker: the instance runs omnipd's vllm-omni stage worker.
	StageWorker bool
	// URL is the base URL the omnipd config points at.
	URL string
}

// VLLMPlan is how to run a deploy config's stages on GPU engines — a
// thinker-only pipeline on stock vllm serve instances, a pipeline with a
// Talker on vllm-omni stage workers — and point omnipd at them.
type VLLMPlan struct {
	Commands []VLLMCommand
	// Config is the omnipd deploy config (YAML) whose replicas name the
	// planned instances' endpoints.
	Config []byte
	// DeployConfig is the vllm-omni deploy config the stage workers read
	// (StageDeployConfig), and WorkerFiles the worker's files; both are nil
	// for a plan of vllm serve instances.
	DeployConfig []byte
	WorkerFiles  []vllmomnistage.File
	// workerDir and deployConfig are where Shell writes them: the paths the
	// stage workers' command lines name.
	workerDir, deployConfig string
	// colocated: the Thinker is one stage, which omnipd serve must not
	// split (its --pd is on by default).
	colocated bool
	// Notes are things the operator should know: skipped stages, engine
	// arguments not passed on, the served model name.
	Notes []string
	// ServedModelName is the name every instance serves.
	ServedModelName string
}

// vllmOmniOnlyArgs are stage keys vllm-omni understands but vllm serve
// rejects as unknown flags.
var vllmOmniOnlyArgs = map[string]bool{
	"model_stage":               true,
	"engine_output_type":        true,
	"worker_type":               true,
	"scheduler_cls":             true,
	"hf_config_name":            true,
	"model_arch":                true,
	"custom_process_input_func": true,
	"is_comprehension":          true,
	"stage_type":                true,
}

// plannedArgs are flags the plan sets itself; an engine argument of the same
// name would contradict it.
var plannedArgs = map[string]bool{
	"model":                true,
	"host":                 true,
	"port":                 true,
	"served_model_name":    true,
	"tensor_parallel_size": true,
	"data_parallel_size":   true,
	"kv_transfer_config":   true,
	"ec_transfer_config":   true,
}

// negatableArgs are boolean engine arguments whose false vllm serve takes
// as a --no- flag, where vLLM's default is true: leaving a false to the
// default would turn the feature on. (vLLM's disaggregated-encoder
// examples start the encoder with --no-enable-prefix-caching.)
var negatableArgs = map[string]bool{
	"enable_prefix_caching": true,
}

// PlanVLLM plans one engine instance per replica of each stage of doc that
// is not already running (has no endpoint), and the omnipd config that
// drives them. It is pure: it starts and contacts nothing.
//
// A thinker-only (text) pipeline runs on stock vllm serve instances. A
// pipeline with a Talker runs every stage on omnipd's vllm-omni stage
// worker (see stageplan.go): a stock vllm serve runs neither the Talker nor
// Code2Wav, and cannot export the Thinker conditioning the Talker reads.
func PlanVLLM(doc *deploy.Document, opts VLLMOptions) (*VLLMPlan, error) {
	opts = opts.withDefaults()
	if NeedsStageWorkers(doc) {
		return planStageWorkers(doc, opts)
	}

	plan := &VLLMPlan{ServedModelName: opts.ServedModelName, colocated: colocated(doc)}
	planned, err := planReplicas(doc, opts, plan, func(s *deploy.Stage) (instanceFunc, error) {
		if err := checkECConnector(s); err != nil {
			return nil, err
		}
		args, notes := engineFlags(s)
		plan.Notes = append(plan.Notes, notes...)
		return func(ri int, r topology.Replica, port int) (VLLMCommand, error) {
			return planInstance(s, ri, r, port, args, opts)
		}, nil
	})
	if err != nil {
		return nil, err
	}
	plan.Notes = append(plan.Notes, ecNotes(doc)...)
	if len(plan.Commands) == 0 {
		plan.Notes = append(plan.Notes, "every Thinker replica already has an endpoint; nothing to start")
	}

	cfg, err := configWithEndpoints(doc, planned)
	if err != nil {
		return nil, err
	}
	plan.Config = cfg
	return plan, nil
}

// instanceFunc plans replica r (index ri) of one stage at HTTP port.
type instanceFunc func(ri int, r topology.Replica, port int) (VLLMCommand, error)

// planReplicas plans every replica of doc that has no endpoint yet, on
// HTTP ports counted up from opts.BasePort in stage order, into plan: its
// commands, and a note for each replica already running. forStage checks a
// stage and returns how to plan its replicas. The result holds, by stage
// index and replica, the URL of each planned instance.
func planReplicas(doc *deploy.Document, opts VLLMOptions, plan *VLLMPlan, forStage func(*deploy.Stage) (instanceFunc, error)) ([][]string, error) {
	kvPorts := map[int]string{}
	for _, s := range doc.Stages {
		for i, r := range s.Replicas {
			if r.KVPort != 0 {
				kvPorts[r.KVPort] = fmt.Sprintf("stage %d replica %d", s.ID, i)
			}
		}
	}
	planned := make([][]string, len(doc.Stages))
	port := opts.BasePort
	for si, s := range doc.Stages {
		if s.KV != nil {
			if spec, ok := kvconnector.SpecOf(s.KV.Connector); ok && !spec.VLLM {
				return nil, fmt.Errorf("stage %d: kv_connector %s is omnipd's reference connector, not a vLLM KV connector; choose one vLLM has (--connector %s), or run reference workers with omnipd serve",
					s.ID, s.KV.Connector, orList(vllmKVConnectors()))
			}
		}
		instance, err := forStage(s)
		if err != nil {
			return nil, err
		}
		planned[si] = make([]string, len(s.Replicas))
		for ri, r := range s.Replicas {
			if r.Endpoint != "" {
				plan.Notes = append(plan.Notes, fmt.Sprintf("stage %d replica %d already runs at %s; not planned", s.ID, ri, r.Endpoint))
				continue
			}
			if owner, ok := kvPorts[port]; ok {
				return nil, fmt.Errorf("stage %d replica %d: HTTP port %d is the KV port of %s; choose another --base-port", s.ID, ri, port, owner)
			}
			cmd, err := instance(ri, r, port)
			if err != nil {
				return nil, err
			}
			planned[si][ri] = cmd.URL
			plan.Commands = append(plan.Commands, cmd)
			port++
		}
	}
	return planned, nil
}

// VLLMInstance is the vllm serve command PlanVLLM gives replica r (index
// ri) of Thinker stage s when it listens on opts.Host at port: the
// replica's engine id, KV port and devices go where PlanVLLM puts them.
// It checks nothing PlanVLLM checks about the pipeline; call PlanVLLM for
// that. Renderers for other targets build their instances from it, so that
// every target passes an engine the same arguments.
func VLLMInstance(s *deploy.Stage, ri int, r topology.Replica, port int, opts VLLMOptions) (VLLMCommand, error) {
	args, _ := engineFlags(s)
	return planInstance(s, ri, r, port, args, opts.withDefaults())
}

func planInstance(s *deploy.Stage, ri int, r topology.Replica, port int, engineArgs []string, opts VLLMOptions) (VLLMCommand, error) {
	cmd := newCommand(s, ri, port, opts)
	flags, err := instanceFlags(s, r, port, opts, true)
	if err != nil {
		return VLLMCommand{}, err
	}
	cmd.Argv = append([]string{"vllm", "serve", opts.Model}, flags...)
	cmd.Argv = append(cmd.Argv, engineArgs...)
	cmd.Env = sortedEnv(instanceEnv(s, r, opts))
	return cmd, nil
}

// newCommand names replica ri of stage s, listening at port, without its
// command line.
func newCommand(s *deploy.Stage, ri, port int, opts VLLMOptions) VLLMCommand {
	role := s.Role.String()
	name := s.ModelStage
	if s.Role != topology.RoleFull {
		name += "-" + role
	}
	name += "-" + strconv.Itoa(ri)
	return VLLMCommand{
		Stage:   s.ID,
		Role:    role,
		Replica: ri,
		Name:    name,
		URL:     "http://" + net.JoinHostPort(opts.Host, strconv.Itoa(port)),
	}
}

// instanceFlags are the flags after the model that replica r of stage s
// takes, on vllm serve and on the stage worker alike: where it listens, the
// name it answers to (servedName), its parallelism and its transfer configs.
func instanceFlags(s *deploy.Stage, r topology.Replica, port int, opts VLLMOptions, servedName bool) ([]string, error) {
	flags := []string{"--host", opts.Host, "--port", strconv.Itoa(port)}
	if servedName {
		flags = append(flags, "--served-model-name", opts.ServedModelName)
	}
	flags = append(flags, "--tensor-parallel-size", strconv.Itoa(max(1, s.TensorParallelSize)))
	if s.DataParallelSize > 1 {
		// One API server over DP ranks on this host: vLLM's defaults
		// (data_parallel_size_local = data_parallel_size, IPC between the
		// API server and the engines, master ports it picks free) need no
		// other --data-parallel-* flag, and each rank adds its DP index to
		// VLLM_NIXL_SIDE_CHANNEL_PORT itself.
		flags = append(flags, "--data-parallel-size", strconv.Itoa(s.DataParallelSize))
	}
	if s.EC != nil {
		ec, err := ECTransferJSON(s, r)
		if err != nil {
			return nil, fmt.Errorf("stage %d: ec_transfer_config: %w", s.ID, err)
		}
		flags = append(flags, "--ec-transfer-config", ec)
	}
	if s.KV != nil {
		kv, err := kvTransferJSON(s, r, port)
		if err != nil {
			return nil, fmt.Errorf("stage %d: kv_transfer_config: %w", s.ID, err)
		}
		flags = append(flags, "--kv-transfer-config", kv)
	}
	return flags, nil
}

// instanceEnv is the environment of replica r of stage s: the stage's env,
// its devices and its connector's variables.
func instanceEnv(s *deploy.Stage, r topology.Replica, opts VLLMOptions) map[string]string {
	// The stage's env first: the per-instance values below are derived from
	// the same config but differ between replicas, so they win.
	env := map[string]string{}
	if s.Env != nil {
		for i, k := range s.Env.Keys {
			env[k.Value] = s.Env.Values[i].Value
		}
	}
	if len(r.Devices) > 0 {
		ds := make([]string, len(r.Devices))
		for i, d := range r.Devices {
			ds[i] = strconv.Itoa(d)
		}
		env["CUDA_VISIBLE_DEVICES"] = strings.Join(ds, ",")
	}
	if s.KV == nil {
		return env
	}
	spec, _ := kvconnector.SpecOf(s.KV.Connector)
	for _, e := range spec.Env {
		if !deploy.OnSides(s, e.Sides) {
			continue
		}
		switch e.From {
		case kvconnector.EnvLiteral:
			env[e.Name] = e.Value
		case kvconnector.EnvKVPort:
			if r.KVPort != 0 {
				env[e.Name] = strconv.Itoa(r.KVPort)
			}
		case kvconnector.EnvListenHost:
			env[e.Name] = opts.Host
		case kvconnector.EnvKVHost:
			env[e.Name] = deploy.KVHost(s)
		}
	}
	return env
}

// vllmKVConnectors are the KV connectors a vllm plan can run: vLLM's own
// that PD expansion can write.
func vllmKVConnectors() []string {
	return kvconnector.Names(kvconnector.KV, func(s kvconnector.Spec) bool { return s.VLLM && s.Expandable })
}

// orList joins names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// sortedEnv is env as sorted KEY=VALUE.
func sortedEnv(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// kvTransferJSON is the --kv-transfer-config of one replica: the stage's
// config with the replica's engine id and ports (httpPort is its API's).
func kvTransferJSON(s *deploy.Stage, r topology.Replica, httpPort int) (string, error) {
	kv := s.KV
	n := &deploy.Node{Kind: deploy.KindMap}
	n.Set("kv_connector", str(kv.Connector))
	n.Set("kv_role", str(kv.Role))
	engineID := r.EngineID
	if engineID == "" {
		engineID = kv.EngineID
	}
	if engineID != "" {
		n.Set("engine_id", str(engineID))
	}
	if kv.BufferDevice != "" {
		n.Set("kv_buffer_device", str(kv.BufferDevice))
	}
	if kv.BufferSize != nil {
		n.Set("kv_buffer_size", kv.BufferSize.Clone())
	}
	if kv.IP != "" {
		n.Set("kv_ip", str(kv.IP))
	}
	if kv.Port != 0 {
		p := kv.Port
		if r.KVPort != 0 {
			p = r.KVPort
		}
		n.Set("kv_port", integer(p))
	}
	if kv.Rank != nil {
		n.Set("kv_rank", integer(*kv.Rank))
	}
	if kv.ParallelSize != nil {
		n.Set("kv_parallel_size", integer(*kv.ParallelSize))
	}
	if kv.LoadFailurePolicy != "" {
		n.Set("kv_load_failure_policy", str(kv.LoadFailurePolicy))
	}
	extra := kv.ExtraConfig.Clone()
	ports := kvconnector.Ports{}
	if spec, ok := kvconnector.SpecOf(kv.Connector); ok {
		ports = spec.Ports
	}
	perInstance := ports.InExtraConfig && !ports.EnvOnly
	if ports.InExtraConfig && ports.EnvOnly && extra != nil {
		// The deploy config keeps each instance's port there (omnipd serve
		// reads it there, e.g. Mooncake's mooncake_bootstrap_port), but the
		// engine reads only its environment variable, which the instance's
		// env carries; a copy here would mislead.
		extra.Delete(ports.Key)
		if len(extra.Keys) == 0 {
			extra = nil
		}
	}
	if perInstance || ports.HTTPPortKey != "" {
		// The engine reads its ports from here, each replica its own, and
		// its HTTP port with no default (MoRIIO: what its discovery ping
		// would announce).
		if extra == nil {
			extra = &deploy.Node{Kind: deploy.KindMap}
		}
		if perInstance && r.KVPort != 0 {
			extra.Set(ports.Key, integer(r.KVPort))
			if ports.NotifyKey != "" {
				extra.Set(ports.NotifyKey, integer(deploy.NotifyPort(s, r)))
			}
		}
		if ports.HTTPPortKey != "" {
			extra.Set(ports.HTTPPortKey, integer(httpPort))
		}
	}
	if initPorts, allocPorts := deploy.LMCacheReceiverPorts(s, r); initPorts != nil {
		// The stage's extra config holds its first receiver's ports; each
		// instance binds its own, the ones the router names for it.
		extra.Set("lmcache.pd_peer_init_port", intList(initPorts))
		extra.Set("lmcache.pd_peer_alloc_port", intList(allocPorts))
	}
	if extra != nil {
		n.Set("kv_connector_extra_config", extra)
	}
	if kv.Other != nil {
		for i, k := range kv.Other.Keys {
			n.Set(k.Value, kv.Other.Values[i].Clone())
		}
	}
	b, err := n.MarshalJSON()
	return string(b), err
}

// engineFlags maps a stage's engine arguments to vllm serve flags, in the
// order written, and notes what it leaves out.
func engineFlags(s *deploy.Stage) (args, notes []string) {
	if s.EngineArgs == nil {
		return nil, nil
	}
	var dropped, falses []string
	for i, k := range s.EngineArgs.Keys {
		key, v := k.Value, s.EngineArgs.Values[i]
		if vllmOmniOnlyArgs[key] || plannedArgs[key] {
			dropped = append(dropped, key)
			continue
		}
		flag := "--" + strings.ReplaceAll(key, "_", "-")
		switch v.Kind {
		case deploy.KindNull:
			// Unset: vLLM's default applies.
		case deploy.KindScalar:
			if v.Tag == "!!bool" {
				switch b, _ := strconv.ParseBool(strings.ToLower(v.Value)); {
				case b:
					args = append(args, flag)
				case negatableArgs[key]:
					args = append(args, "--no-"+strings.TrimPrefix(flag, "--"))
				default:
					falses = append(falses, key)
				}
				continue
			}
			args = append(args, flag, v.Value)
		case deploy.KindSeq:
			if scalars(v) {
				// vLLM's list arguments take one value per item.
				args = append(args, flag)
				for _, it := range v.Items {
					args = append(args, it.Value)
				}
				continue
			}
			fallthrough
		default:
			b, err := v.MarshalJSON()
			if err != nil {
				dropped = append(dropped, key)
				continue
			}
			args = append(args, flag, string(b))
		}
	}
	if len(dropped) > 0 {
		notes = append(notes, fmt.Sprintf("stage %d: not passed to vllm serve (vllm-omni only, or set by the plan): %s", s.ID, strings.Join(dropped, ", ")))
	}
	if len(falses) > 0 {
		notes = append(notes, fmt.Sprintf("stage %d: false booleans left to vLLM's default: %s", s.ID, strings.Join(falses, ", ")))
	}
	return args, notes
}

func scalars(seq *deploy.Node) bool {
	for _, it := range seq.Items {
		if it.Kind != deploy.KindScalar {
			return false
		}
	}
	return true
}

// configWithEndpoints prints doc with each planned replica's endpoint set,
// so that omnipd serve --config drives the planned instances.
func configWithEndpoints(doc *deploy.Document, planned [][]string) ([]byte, error) {
	cp := *doc
	cp.Stages = make([]*deploy.Stage, len(doc.Stages))
	for si, s := range doc.Stages {
		sc := *s
		sc.Replicas = slices.Clone(s.Replicas)
		sc.Endpoints = nil
		for ri := range sc.Replicas {
			if ri < len(planned[si]) && planned[si][ri] != "" {
				sc.Replicas[ri].Endpoint = planned[si][ri]
			}
			if sc.Replicas[ri].Endpoint != "" {
				sc.Endpoints = append(sc.Endpoints, sc.Replicas[ri].Endpoint)
			}
		}
		cp.Stages[si] = &sc
	}
	return cp.Node().MarshalYAML()
}

func str(s string) *deploy.Node {
	return &deploy.Node{Kind: deploy.KindScalar, Tag: "!!str", Value: s}
}

func intList(xs []int) *deploy.Node {
	n := &deploy.Node{Kind: deploy.KindSeq}
	for _, x := range xs {
		n.Items = append(n.Items, integer(x))
	}
	return n
}

func integer(i int) *deploy.Node {
	return &deploy.Node{Kind: deploy.KindScalar, Tag: "!!int", Value: strconv.Itoa(i)}
}

// VLLMConfigFile is the name Shell saves the omnipd config under.
const VLLMConfigFile = "omnipd-vllm.yaml"

// VLLMSecretFile is where Shell keeps the deployment secret: every instance
// requires it of its callers (vllm serve's VLLM_API_KEY), and omnipd serve
// --secret-file sends it on every stage call, so nothing outside the
// deployment can use the engines or their KV.
const VLLMSecretFile = "omnipd-secret"

// Shell renders p as a shell script (POSIX sh) meant to run in a terminal
// of its own, or in the background with its own log. It fails at once when
// vllm (or curl, with which it polls /health) is not on PATH — for stage
// workers, when python3 is not, or cannot import vllm_omni — and writes the
// stage worker's files and the vllm-omni deploy config; starts each
// instance in the background with its environment and its output in
// NAME.log; writes the omnipd config to VLLMConfigFile; waits until every
// instance answers /health (VLLM_READY_TIMEOUT seconds at most, 1800 by
// default: a first start downloads and compiles), failing with the end of
// the log of one that exits first; prints the omnipd serve command; and
// then stays while the instances run. When one exits it stops the others
// and exits 1; when it is stopped (Ctrl-C, SIGTERM) it stops them all.
func (p *VLLMPlan) Shell() string {
	var b strings.Builder
	workers := p.WorkerFiles != nil || slices.ContainsFunc(p.Commands, func(c VLLMCommand) bool { return c.StageWorker })
	engine, missing := "vllm serve instances", "vllm is missing"
	if workers {
		engine, missing = "vllm-omni stage workers", "python3 or vllm_omni is missing"
	}
	b.WriteString("#!/bin/sh\n")
	fmt.Fprintf(&b, "# %s for omnipd: %d planned.\n", engine, len(p.Commands))
	for _, n := range p.Notes {
		fmt.Fprintf(&b, "# note: %s\n", n)
	}
	if len(p.Commands) > 0 {
		fmt.Fprintf(&b, `#
# Run it in a terminal of its own, or in the background with its own log:
#   sh launch.sh > launch.log 2>&1 &
# It starts every instance (each logs to NAME.log), waits until each answers
# /health, prints the omnipd serve command to run next, and stays while the
# instances run. It exits non-zero when %s or an instance exits,
# stopping the others; stopping it (Ctrl-C, kill) stops them all.
`, missing)
	}
	b.WriteString("set -eu\n")
	if len(p.Commands) > 0 {
		if workers {
			install := fmt.Sprintf("install vllm-omni %[1]s (pip install vllm==%[1]s vllm-omni==%[1]s) or activate its environment, then run this again", vllmomnistage.VLLMOmniVersion)
			fmt.Fprintf(&b, `
command -v python3 >/dev/null 2>&1 || { echo "launch.sh: python3 is not on PATH: %[1]s" >&2; exit 127; }
python3 -c 'import vllm_omni' >/dev/null 2>&1 || { echo "launch.sh: python3 cannot import vllm_omni: %[1]s" >&2; exit 127; }`, install)
		} else {
			b.WriteString(`
command -v vllm >/dev/null 2>&1 || { echo "launch.sh: vllm is not on PATH: install vLLM or activate its environment, then run this again" >&2; exit 127; }`)
		}
		b.WriteString(`
command -v curl >/dev/null 2>&1 || { echo "launch.sh: curl is not on PATH; this script polls each instance's /health with it" >&2; exit 127; }
`)
	}
	fmt.Fprintf(&b, "\n# The deployment secret, made once and kept (owner-only) for omnipd serve --secret-file.\n")
	fmt.Fprintf(&b, "[ -s %[1]s ] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > %[1]s)\n", VLLMSecretFile)
	if workers && len(p.Commands) > 0 {
		p.writeStageWorker(&b)
	}
	if len(p.Commands) > 0 {
		b.WriteString(`
# name|pid|url of each instance started; every one is stopped when this script ends.
instances=
started() { instances="$instances $1|$2|$3"; }
stop() { for i in $instances; do p=${i#*|}; kill "${p%%|*}" 2>/dev/null || true; done; }
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
failed() {
  echo "launch.sh: $1 exited$2; stopping the others. The end of $1.log:" >&2
  tail -n 20 "$1.log" >&2 || true
  exit 1
}
`)
	}
	for _, c := range p.Commands {
		fmt.Fprintf(&b, "\n# %s: stage %d (%s), replica %d -> %s\n", c.Name, c.Stage, c.Role, c.Replica, c.URL)
		fmt.Fprintf(&b, "VLLM_API_KEY=\"$(cat %s)\" \\\n", VLLMSecretFile)
		for _, e := range c.Env {
			k, v, _ := strings.Cut(e, "=")
			fmt.Fprintf(&b, "%s=%s \\\n", k, shellEnvValue(c, k, v))
		}
		// The command and its model on the first line, then a flag and its
		// values per line.
		b.WriteString(shellQuote(c.Argv[0]))
		for i := 1; i < len(c.Argv); i++ {
			a := c.Argv[i]
			if strings.HasPrefix(a, "--") {
				b.WriteString(" \\\n  ")
			} else {
				b.WriteByte(' ')
			}
			b.WriteString(shellQuote(a))
		}
		fmt.Fprintf(&b, " > %s 2>&1 &\n", shellQuote(c.Name+".log"))
		fmt.Fprintf(&b, "started %s $! %s\n", shellQuote(c.Name), shellQuote(c.URL))
	}
	serveCmd := p.ServeCommand()
	fmt.Fprintf(&b, "\n# The omnipd config naming these instances, for:\n#   %s\n", serveCmd)
	fmt.Fprintf(&b, "cat > %s <<'EOF'\n", VLLMConfigFile)
	b.Write(p.Config)
	if len(p.Config) > 0 && p.Config[len(p.Config)-1] != '\n' {
		b.WriteByte('\n')
	}
	b.WriteString("EOF\n")
	if len(p.Commands) == 0 {
		return b.String()
	}
	b.WriteString(`
timeout=${VLLM_READY_TIMEOUT:-1800}
deadline=$(( $(date +%s) + timeout ))
for i in $instances; do
  name=${i%%|*}; rest=${i#*|}; pid=${rest%%|*}; url=${rest#*|}
  echo "launch.sh: waiting for $name at $url/health (log: $name.log)"
  until curl -fsS -o /dev/null --max-time 5 "$url/health" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || failed "$name" " before it was ready"
    [ "$(date +%s)" -lt "$deadline" ] || { echo "launch.sh: $name not ready within ${timeout}s; set VLLM_READY_TIMEOUT to wait longer" >&2; exit 1; }
    sleep 2
  done
  echo "launch.sh: $name ready"
done
`)
	fmt.Fprintf(&b, "echo \"launch.sh: every instance is ready. Next, in another terminal:\"\necho %s\n", shellQuote("  "+serveCmd))
	b.WriteString(`echo "launch.sh: running until an instance exits or this script is stopped (Ctrl-C)"
while :; do
  for i in $instances; do
    rest=${i#*|}
    kill -0 "${rest%%|*}" 2>/dev/null || failed "${i%%|*}" ""
  done
  sleep 2
done
`)
	return b.String()
}

// ServeCommand is the omnipd serve command that drives the planned
// instances, with the config and secret file Shell writes: omnipd serve
// splits a Thinker by default, so a plan whose Thinker is one stage says
// --pd=false.
func (p *VLLMPlan) ServeCommand() string {
	cmd := fmt.Sprintf("omnipd serve --config %s --secret-file %s --served-model-name %s", VLLMConfigFile, VLLMSecretFile, shellQuote(p.ServedModelName))
	if p.colocated {
		cmd += " --pd=false"
	}
	return cmd
}

// colocated reports whether doc's Thinker is one stage, neither split into
// prefill and decode nor fronted by an encoder.
func colocated(doc *deploy.Document) bool {
	return !slices.ContainsFunc(doc.Stages, func(s *deploy.Stage) bool { return s.Role != topology.RoleFull })
}

// shellEnvValue is the shell word for variable k=v of c. A stage worker's
// PYTHONPATH starts with the worker's directory, which the plan names
// relative to where the script runs and the workers get as an absolute
// path, and ends with the PYTHONPATH the script runs with: where its
// python3 found vllm_omni, it must find it again.
func shellEnvValue(c VLLMCommand, k, v string) string {
	if !c.StageWorker || k != "PYTHONPATH" {
		return shellQuote(v)
	}
	first, rest, more := strings.Cut(v, ":")
	w := shellQuote(first)
	if !strings.HasPrefix(first, "/") {
		w = `"$PWD"/` + w
	}
	if more {
		w += shellQuote(":" + rest)
	}
	return w + "${PYTHONPATH:+:$PYTHONPATH}"
}

// shellQuote quotes s for sh when it needs it, in single quotes.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:,=@%+", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
