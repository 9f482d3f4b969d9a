package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/vllmplan"
	"github.com/spf13/cobra"
)

// configFlags are the flags shared by the commands that load a deploy config.
type configFlags struct {
	platform  string
	pd        bool
	connector string
	devices   string
}

func (f *configFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.pd, "pd", false, "split the Thinker into prefill and decode stages even without a pd: section")
	f.registerLayout(cmd)
}

// registerLayout registers the flags that shape an expansion, without --pd
// (serve has a --pd of its own, on by default).
func (f *configFlags) registerLayout(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.platform, "platform", "", "apply the config's platforms.NAME section (npu, rocm, xpu, musa, ...)")
	cmd.Flags().StringVar(&f.connector, "connector", "", "KV connector between prefill and decode ("+strings.Join(deploy.KVConnectors(), ", ")+")")
	cmd.Flags().StringVar(&f.devices, "devices", "", `device pool for the prefill/decode layout, e.g. "0-4" or "0,1,2"`)
}

func (f *configFlags) options() deploy.Options {
	return deploy.Options{Platform: f.platform, PD: f.pd, Connector: f.connector, Devices: f.devices}
}

// loadConfig loads a deploy config and prints its warnings and errors on
// stderr. It returns nil after reporting when the config does not load.
// An empty path means the embedded default.
func loadConfig(path string, opts deploy.Options, stderr io.Writer) (*deploy.Document, error) {
	var (
		doc      *deploy.Document
		warnings []deploy.Warning
		err      error
	)
	if path == "" {
		path = deploy.DefaultConfigName
		doc, warnings, err = deploy.Load(path, deploy.DefaultConfig(), opts)
	} else {
		doc, warnings, err = deploy.LoadFile(path, opts)
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, w)
	}
	if err != nil {
		var es deploy.Errors
		if errors.As(err, &es) {
			for _, e := range es {
				fmt.Fprintln(stderr, e)
			}
			fmt.Fprintf(stderr, "%s: %d error(s)\n", path, len(es))
			return nil, exitError{code: 1}
		}
		fmt.Fprintln(stderr, "omnipd:", err)
		return nil, exitError{code: 1}
	}
	return doc, nil
}

func newValidateCmd() *cobra.Command {
	var (
		flags configFlags
		model string
	)
	cmd := &cobra.Command{
		Use:   "validate [--model M] [FILE]",
		Short: "Check a deploy config and summarise its topology",
		Long: `validate loads a deploy config (vllm-omni stages: or legacy stage_args:),
applies base_config, the chosen platform and PD expansion, and checks every
topology invariant. It exits 0 and prints a summary, or exits 1 and prints
each error with file:line:column and field path on stderr. Without FILE it
checks omnipd's embedded default. For a config whose stages run on vllm-omni
stage workers (what omnipd plan writes for a pipeline with a Talker) it adds
what a deployment still needs: the checkpoint (--model, as given to plan),
the vllm-omni release, python3 with vllm_omni, and each stage's GPUs.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := loadConfig(fileArg(args), flags.options(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), doc.Summary())
			for _, line := range deploymentNeeds(doc, model) {
				fmt.Fprintln(cmd.OutOrStdout(), line)
			}
			return nil
		},
	}
	flags.register(cmd)
	cmd.Flags().StringVar(&model, "model", vllmplan.DefaultVLLMModel, "checkpoint the stage workers serve (as plan --model), for what a deployment still needs")
	return cmd
}

func newExpandCmd() *cobra.Command {
	var (
		flags   configFlags
		migrate bool
		output  string
	)
	cmd := &cobra.Command{
		Use:   "expand [--pd] [--connector NAME] [--devices LIST] [--platform NAME] [--migrate] [-o yaml|json] [FILE]",
		Short: "Print the fully resolved deploy config",
		Long: `expand prints the deploy config with everything resolved: the pipeline's
stage contracts, base_config overlays, the chosen platform, and (with a pd:
section or --pd) the Thinker split into prefill and decode stages with their
kv_transfer_config, engine ids, ports and devices. The output loads back
unchanged. With --migrate it prints a legacy stage_args: config rewritten in
the stages: schema, without resolving it. Without FILE it expands omnipd's
embedded default.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "yaml" && output != "json" {
				return fmt.Errorf("-o %q: want yaml or json", output)
			}
			var node *deploy.Node
			if migrate {
				if len(args) == 0 {
					return fmt.Errorf("--migrate needs the FILE to migrate")
				}
				n, warnings, err := deploy.MigrateFile(args[0], flags.options())
				for _, w := range warnings {
					fmt.Fprintln(cmd.ErrOrStderr(), w)
				}
				if err != nil {
					var es deploy.Errors
					if errors.As(err, &es) {
						fmt.Fprintln(cmd.ErrOrStderr(), es)
						return exitError{code: 1}
					}
					return err
				}
				node = n
			} else {
				doc, err := loadConfig(fileArg(args), flags.options(), cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				node = doc.Node()
			}
			var out []byte
			var err error
			if output == "json" {
				out, err = node.MarshalJSON()
				out = append(out, '\n')
			} else {
				out, err = node.MarshalYAML()
			}
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	flags.register(cmd)
	cmd.Flags().BoolVar(&migrate, "migrate", false, "print a legacy stage_args: config in the stages: schema")
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "output format: yaml or json")
	return cmd
}

func fileArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}
