package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/internal/buildinfo"
	"github.com/omnipd/omnipd/kube"
	"github.com/omnipd/omnipd/topology"
	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
	"github.com/omnipd/omnipd/vllmplan"
	"github.com/spf13/cobra"
)

// Targets of omnipd plan.
const (
	targetVLLM       = "vllm"
	targetKubernetes = "kubernetes"
)

func newPlanCmd() *cobra.Command {
	var (
		flags    configFlags
		target   string
		opts     vllmplan.VLLMOptions
		kopts    kube.Options
		workload string
	)
	cmd := &cobra.Command{
		Use:   "plan --target vllm|kubernetes [--model M] [--pd] [--connector NAME] [--devices LIST] [--platform NAME] [FILE]",
		Short: "Print how to run a config's stages on GPU engines, on one host or on Kubernetes",
		Long: `plan prints how to run a config's stages on GPU engines, and the omnipd
deploy config that drives them. It starts nothing and writes only the plan to
stdout. A thinker-only (text) pipeline runs its Thinker stages (prefill,
decode, or a colocated Thinker) on stock vllm serve instances. A pipeline
with a Talker runs every stage — the Thinker or its prefill and decode, the
Talker, Code2Wav — on omnipd's vllm-omni stage worker (python3 -m
omnipd_stage), which runs vllm-omni's model code for one stage and serves
omnipd's contracts; it reads the pipeline's vllm-omni deploy config, which
the plan writes too.

--target vllm (the default) prints a shell script that starts one instance
per replica on this host, each with its --kv-transfer-config, devices and
connector environment, followed by the omnipd deploy config whose replicas
name those instances' endpoints, for omnipd serve --config. For stage
workers it first checks that python3 imports vllm_omni and writes the
worker's files (omnipd-stage/) and the vllm-omni deploy config
(omnipd-vllm-omni.yaml). Stages that already have endpoints are not started.
--host and --base-port say where the instances listen.

--target kubernetes prints Kubernetes objects, for kubectl apply -f: the
prefill and decode roles as one LWS DisaggregatedSet (--workload
disaggregatedset, which needs the LWS controller) or as a Deployment each
(--workload deployment), each engine pod asking for one nvidia.com/gpu per
tensor-parallel rank; a ClusterIP Service per role; the omnipd orchestrator
Deployment (--image) and its Service; and a ConfigMap with the omnipd deploy
config whose stage endpoints are the role Services. The engines get the same
vllm serve arguments as with --target vllm; ports are fixed per container
and per-pod addresses come from the pod. --namespace and --name-prefix say
where the objects go. A pipeline with a Talker adds a Deployment and a
Service for each of the Talker and Code2Wav, every pod running the stage
worker in the vllm-omni image (--stage-image) with its files and the
vllm-omni deploy config from two ConfigMaps. Credentials (the deployment
secret, the API key, a Hugging Face token) come from an optional Secret
PREFIX-secrets that you create. See docs/kubernetes.md.

The reference connector is omnipd's own; choose a vLLM connector with
--connector.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch target {
			case targetVLLM:
				for _, name := range []string{"namespace", "name-prefix", "image", "vllm-image", "stage-image", "workload"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s is for --target %s", name, targetKubernetes)
					}
				}
				return runPlan(fileArg(args), flags, opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
			case targetKubernetes:
				for _, name := range []string{"host", "base-port"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s is for --target %s; on Kubernetes each container listens on port %d of its pod", name, targetVLLM, kube.EnginePort)
					}
				}
				kopts.Model, kopts.ServedModelName, kopts.ConditioningLayer = opts.Model, opts.ServedModelName, opts.ConditioningLayer
				kopts.Workload = kube.Workload(workload)
				return runPlanKube(fileArg(args), flags, kopts, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			return fmt.Errorf("--target %q: want %s or %s", target, targetVLLM, targetKubernetes)
		},
	}
	flags.register(cmd)
	f := cmd.Flags()
	f.StringVar(&target, "target", targetVLLM, "what to plan for: vllm (a shell script for this host) or kubernetes (objects for kubectl apply)")
	f.StringVar(&opts.Model, "model", vllmplan.DefaultVLLMModel, "checkpoint every engine serves (vllm serve, or the vllm-omni stage workers of a pipeline with a Talker)")
	f.StringVar(&opts.ServedModelName, "served-model-name", "", "model name every instance accepts (default: --model); start omnipd serve with the same")
	f.IntVar(&opts.ConditioningLayer, "conditioning-layer", 0, fmt.Sprintf("pipelines with a Talker: the Thinker layer whose hidden states the Talker reads, which the Thinker stage workers capture and omnipd asks for (default: the Thinker stage's accept_hidden_layer, else %d, Qwen3-Omni-30B-A3B's)", vllmplan.DefaultConditioningLayer))
	f.StringVar(&opts.Host, "host", vllmplan.DefaultVLLMHost, "vllm: address the instances listen on and omnipd reaches them at")
	f.IntVar(&opts.BasePort, "base-port", vllmplan.DefaultVLLMBasePort, "vllm: HTTP port of the first instance; one port per instance in stage order")
	f.StringVar(&kopts.Namespace, "namespace", kube.DefaultNamespace, "kubernetes: namespace of every object")
	f.StringVar(&kopts.NamePrefix, "name-prefix", kube.DefaultNamePrefix, "kubernetes: prefix of every object's name")
	f.StringVar(&kopts.Image, "image", defaultImage(), "kubernetes: omnipd image of the orchestrator")
	f.StringVar(&kopts.VLLMImage, "vllm-image", kube.DefaultVLLMImage, "kubernetes: image of the engines; it must have vllm on its PATH")
	f.StringVar(&kopts.StageImage, "stage-image", kube.DefaultStageImage, "kubernetes: image of the vllm-omni stage workers of a pipeline with a Talker; its python3 must import vllm_omni")
	f.StringVar(&workload, "workload", string(kube.WorkloadDisaggregatedSet), "kubernetes: what runs the engine pods: disaggregatedset (LWS) or deployment")
	return cmd
}

// defaultImage is the omnipd image of this build's version.
func defaultImage() string { return imageFor(buildinfo.Read()) }

// imageFor is the omnipd image of a build: tagged with its version when
// that names a release, "latest" for a development build, whose version
// (dev, a pseudo-version, a +dirty tree) no published image carries.
func imageFor(info buildinfo.Info) string {
	tag := "latest"
	if info.Release() {
		tag = info.Version
	}
	return kube.DefaultImageRepository + ":" + tag
}

func runPlan(path string, flags configFlags, opts vllmplan.VLLMOptions, stdout, stderr io.Writer) error {
	doc, err := loadConfig(path, flags.options(), stderr)
	if err != nil {
		return err
	}
	plan, err := vllmplan.PlanVLLM(doc, opts)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, plan.Shell())
	return err
}

func runPlanKube(path string, flags configFlags, opts kube.Options, stdout, stderr io.Writer) error {
	doc, err := loadConfig(path, flags.options(), stderr)
	if err != nil {
		return err
	}
	objs, err := kube.Render(doc, opts)
	if err != nil {
		return err
	}
	notes, err := kube.Notes(doc, opts)
	if err != nil {
		return err
	}
	return kube.WriteYAML(stdout, objs, notes...)
}

// deploymentNeeds are the lines validate adds for a config whose stages run
// on vllm-omni stage workers at endpoints — what omnipd plan writes for a
// pipeline with a Talker: what a real deployment needs beyond the config,
// one line each. It is nil for any other config.
func deploymentNeeds(doc *deploy.Document, model string) []string {
	external := false
	for _, s := range doc.Stages {
		for _, r := range s.Replicas {
			external = external || r.Endpoint != ""
		}
	}
	if !vllmplan.NeedsStageWorkers(doc) || !external {
		return nil
	}
	version := vllmomnistage.VLLMOmniVersion
	lines := []string{
		"a real deployment of this config on vllm-omni stage workers still needs:",
		"  checkpoint: " + checkpointNeed(model),
		fmt.Sprintf("  vllm-omni %[1]s on every stage host, the release omnipd's stage worker is written against: pip install vllm==%[1]s vllm-omni==%[1]s, or the image %[2]s", version, kube.DefaultStageImage),
		fmt.Sprintf("  python3 that imports vllm_omni on every stage host (python3 -c 'import vllm_omni'): the workers run as python3 -m %s", vllmomnistage.Package),
	}
	var gpus []string
	for _, s := range doc.Stages {
		name := s.ModelStage
		if s.Role != topology.RoleFull {
			name += " " + s.Role.String()
		}
		per := max(1, s.TensorParallelSize) * max(1, s.DataParallelSize)
		g := fmt.Sprintf("[%d] %s %d per instance x%d", s.ID, name, per, max(1, s.NumReplicas))
		if d := topology.FormatDevices(s.Devices); d != "" {
			g += " (devices " + d + ")"
		}
		gpus = append(gpus, g)
	}
	return append(lines, "  GPUs: "+strings.Join(gpus, "; "))
}

// checkpointNeed says where the stage workers find model: a directory on
// this host (which every stage host needs at the same path), a path that
// is none, or a model of the Hugging Face Hub each host downloads.
func checkpointNeed(model string) string {
	if fi, err := os.Stat(model); err == nil && fi.IsDir() {
		return fmt.Sprintf("the local directory %s (--model): every stage host needs it at this path (config.json, *.safetensors, the tokenizer)", model)
	}
	if filepath.IsAbs(model) || strings.HasPrefix(model, ".") || strings.HasPrefix(model, "~") {
		return fmt.Sprintf("%s (--model) is no directory here: every stage host needs the checkpoint at this path", model)
	}
	return fmt.Sprintf("%s (--model) from the Hugging Face Hub: every stage host downloads it into its cache (HF_HOME, by default ~/.cache/huggingface) on first start; set HF_TOKEN for a gated model, or give plan and validate --model a local directory", model)
}
