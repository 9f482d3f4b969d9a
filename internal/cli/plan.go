package cli

import (
	"fmt"
	"io"

	"github.com/omnipd/omnipd/internal/buildinfo"
	"github.com/omnipd/omnipd/kube"
	"github.com/omnipd/omnipd/launch"
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
		opts     launch.VLLMOptions
		kopts    kube.Options
		workload string
	)
	cmd := &cobra.Command{
		Use:   "plan --target vllm|kubernetes [--model M] [--pd] [--connector NAME] [--devices LIST] [--platform NAME] [FILE]",
		Short: "Print how to run a config's Thinker stages on vllm serve, on one host or on Kubernetes",
		Long: `plan prints how to run a config's Thinker stages (prefill, decode, or a
colocated Thinker) on stock vllm serve instances, and the omnipd deploy config
that drives them. It starts nothing and writes only the plan to stdout.

--target vllm (the default) prints a shell script that starts one vllm serve
instance per replica on this host, each with its --kv-transfer-config,
devices and connector environment, followed by the omnipd deploy config whose
replicas name those instances' endpoints, for omnipd serve --config. Stages
that already have endpoints are not started. --host and --base-port say
where the instances listen.

--target kubernetes prints Kubernetes objects, for kubectl apply -f: the
prefill and decode roles as one LWS DisaggregatedSet (--workload
disaggregatedset, which needs the LWS controller) or as a Deployment each
(--workload deployment), each engine pod asking for one nvidia.com/gpu per
tensor-parallel rank; a ClusterIP Service per role; the omnipd orchestrator
Deployment (--image) and its Service; and a ConfigMap with the omnipd deploy
config whose stage endpoints are the role Services. The engines get the same
vllm serve arguments as with --target vllm; ports are fixed per container
and per-pod addresses come from the pod. --namespace and --name-prefix say
where the objects go. Credentials (the deployment secret, the API key, a
Hugging Face token) come from an optional Secret PREFIX-secrets that you
create. See docs/kubernetes.md.

Only thinker-only (text) pipelines can be planned: vllm serve runs neither the
Talker nor Code2Wav and cannot export the Thinker conditioning they read; use
pipeline: qwen3_omni_moe_thinker, or reference workers with omnipd serve.
The reference connector is omnipd's own; choose a vLLM connector with
--connector.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch target {
			case targetVLLM:
				for _, name := range []string{"namespace", "name-prefix", "image", "vllm-image", "workload"} {
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
				kopts.Model, kopts.ServedModelName = opts.Model, opts.ServedModelName
				kopts.Workload = kube.Workload(workload)
				return runPlanKube(fileArg(args), flags, kopts, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			return fmt.Errorf("--target %q: want %s or %s", target, targetVLLM, targetKubernetes)
		},
	}
	flags.register(cmd)
	f := cmd.Flags()
	f.StringVar(&target, "target", targetVLLM, "what to plan for: vllm (a shell script for this host) or kubernetes (objects for kubectl apply)")
	f.StringVar(&opts.Model, "model", launch.DefaultVLLMModel, "checkpoint every vllm serve instance serves")
	f.StringVar(&opts.ServedModelName, "served-model-name", "", "model name every instance accepts (default: --model); start omnipd serve with the same")
	f.StringVar(&opts.Host, "host", launch.DefaultVLLMHost, "vllm: address the instances listen on and omnipd reaches them at")
	f.IntVar(&opts.BasePort, "base-port", launch.DefaultVLLMBasePort, "vllm: HTTP port of the first instance; one port per instance in stage order")
	f.StringVar(&kopts.Namespace, "namespace", kube.DefaultNamespace, "kubernetes: namespace of every object")
	f.StringVar(&kopts.NamePrefix, "name-prefix", kube.DefaultNamePrefix, "kubernetes: prefix of every object's name")
	f.StringVar(&kopts.Image, "image", defaultImage(), "kubernetes: omnipd image of the orchestrator")
	f.StringVar(&kopts.VLLMImage, "vllm-image", kube.DefaultVLLMImage, "kubernetes: image of the engines; it must have vllm on its PATH")
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

func runPlan(path string, flags configFlags, opts launch.VLLMOptions, stdout, stderr io.Writer) error {
	doc, err := loadConfig(path, flags.options(), stderr)
	if err != nil {
		return err
	}
	plan, err := launch.PlanVLLM(doc, opts)
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
