package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/omnipd/omnipd/bench"
	"github.com/spf13/cobra"
)

func newBenchCompareCmd() *cobra.Command {
	var plotDir, title, slo string
	cmd := &cobra.Command{
		Use:   "compare NAME=REPORT.json NAME=REPORT.json... [--plot-dir DIR]",
		Short: "Compare sweeps of several deployments: goodput, SLO attainment and latency per point",
		Long: `compare reads the --output-json reports of two or more sweeps (bench --sweep)
of the same workload against different deployments — PD against colocated,
say — and prints, per metric, a Markdown table with a row per sweep point and
a column per deployment. With --plot-dir it also draws each metric against the
rate (or concurrency) as SVG, a line per deployment. --slo judges every
recorded request again against another SLO, so one set of runs shows goodput
under several.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBenchCompare(args, plotDir, title, slo, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&plotDir, "plot-dir", "", "write one SVG chart per metric here")
	cmd.Flags().StringVar(&title, "title", "", "what the charts compare, e.g. \"chat workload\" (default: the reports' names)")
	cmd.Flags().StringVar(&slo, "slo", "", "judge every request against this SLO instead of the one each run used, e.g. ttft=2s,tpot=15ms")
	return cmd
}

func runBenchCompare(args []string, plotDir, title, sloFlag string, stdout, stderr io.Writer) error {
	var slo *bench.SLO
	if sloFlag != "" {
		s, err := bench.ParseSLO(sloFlag)
		if err != nil {
			return fmt.Errorf("--slo: %w", err)
		}
		slo = &s
	}
	var reports []bench.Labeled
	var names []string
	for _, a := range args {
		name, path, ok := strings.Cut(a, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("%q: want NAME=REPORT.json", a)
		}
		rep, err := bench.ReadReportFile(path)
		if err != nil {
			return err
		}
		if slo != nil {
			rep.Rejudge(*slo)
		}
		reports = append(reports, bench.Labeled{Name: name, Report: rep})
		names = append(names, name)
	}
	if err := bench.WriteComparison(stdout, reports); err != nil {
		return err
	}
	if plotDir == "" {
		return nil
	}
	if title == "" {
		title = strings.Join(names, " vs ")
	}
	paths, err := bench.WriteComparisonPlots(plotDir, title, reports)
	for _, p := range paths {
		fmt.Fprintln(stderr, "wrote", p)
	}
	return err
}
