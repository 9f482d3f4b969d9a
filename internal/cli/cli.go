// Package cli wires omnipd's subcommands. Each command is a function of its
// arguments and output streams, so tests drive it the way a user does.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/omnipd/omnipd/internal/buildinfo"
	"github.com/spf13/cobra"
)

// exitError carries the process exit code for an error already reported.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Run executes omnipd with args (without the program name) and returns the
// process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintln(stderr, "omnipd:", err)
	return 2
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "omnipd",
		Short: "Serve multi-stage omni models with prefill/decode disaggregation",
		Long: `omnipd serves multi-stage omni models (Qwen3-Omni: Thinker -> Talker -> Code2Wav)
with the Thinker split into a prefill and a decode stage. It reads vllm-omni
deploy configs as they are written.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version (and -v), as vllm --version; the same line as
		// "omnipd version".
		Version: buildinfo.Read().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newServeCmd(), newChatCmd(), newValidateCmd(), newExpandCmd(), newPlanCmd(), newWorkerCmd(), newVersionCmd())
	root.AddCommand(newBenchCmd())
	registerDebugAddr(root)
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print omnipd's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), buildinfo.Read())
			return nil
		},
	}
}
