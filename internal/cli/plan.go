package cli

import (
	"fmt"
	"io"

	"github.com/omnipd/omnipd/launch"
	"github.com/spf13/cobra"
)

func newPlanCmd() *cobra.Command {
	var (
		flags  configFlags
		target string
		opts   launch.VLLMOptions
	)
	cmd := &cobra.Command{
		Use:   "plan --target vllm [--model M] [--host H] [--base-port N] [--pd] [--connector NAME] [--devices LIST] [--platform NAME] [FILE]",
		Short: "Print how to run a config's Thinker stages on vllm serve",
		Long: `plan prints a shell script that starts one stock vllm serve instance per
replica of each Thinker stage (prefill, decode, or a colocated Thinker), each
with its --kv-transfer-config, devices and connector environment, followed by
the omnipd deploy config whose replicas name those instances' endpoints, for
omnipd serve --config. Stages that already have endpoints are not started.

Only thinker-only (text) pipelines can be planned: vllm serve runs neither the
Talker nor Code2Wav and cannot export the Thinker conditioning they read; use
pipeline: qwen3_omni_moe_thinker, or reference workers with omnipd serve.
The reference connector is omnipd's own; choose a vLLM connector with
--connector. plan starts nothing and writes only the script to stdout.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPlan(target, fileArg(args), flags, opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	flags.register(cmd)
	f := cmd.Flags()
	f.StringVar(&target, "target", "vllm", "what to plan for; vllm is the only target so far")
	f.StringVar(&opts.Model, "model", launch.DefaultVLLMModel, "checkpoint every vllm serve instance serves")
	f.StringVar(&opts.Host, "host", launch.DefaultVLLMHost, "address the instances listen on and omnipd reaches them at")
	f.IntVar(&opts.BasePort, "base-port", launch.DefaultVLLMBasePort, "HTTP port of the first instance; one port per instance in stage order")
	f.StringVar(&opts.ServedModelName, "served-model-name", "", "model name every instance accepts (default: --model); start omnipd serve with the same")
	return cmd
}

func runPlan(target, path string, flags configFlags, opts launch.VLLMOptions, stdout, stderr io.Writer) error {
	if target != "vllm" {
		return fmt.Errorf("--target %q: vllm is the only target so far", target)
	}
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
