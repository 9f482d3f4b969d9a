package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/bench"
)

func TestBenchCompare(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, goodput float64) string {
		rep := &bench.Report{Runs: []*bench.Result{
			{Load: bench.Load{RequestRate: 2, NumPrompts: 4}, Summary: bench.Summary{Goodput: goodput}},
			{Load: bench.Load{RequestRate: 4, NumPrompts: 4}, Summary: bench.Summary{Goodput: 2 * goodput}},
		}}
		var b bytes.Buffer
		if err := rep.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+".json")
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	pd, co := write("pd", 1.5), write("co", 1.25)
	var stdout, stderr bytes.Buffer
	if code := Run(t.Context(), []string{"bench", "compare", "PD=" + pd, "colocated=" + co, "--plot-dir", filepath.Join(dir, "plots")}, &stdout, &stderr); code != 0 {
		t.Fatalf("bench compare: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "| 4 | 3.00 | 2.50 | 0.83× |") {
		t.Errorf("goodput row missing:\n%s", stdout.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "plots", "compare_goodput.svg")); err != nil {
		t.Errorf("goodput chart: %v", err)
	}
	if err := runBenchCompare([]string{pd, co}, "", "", "", &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "NAME=REPORT.json") {
		t.Errorf("arguments without names: err = %v", err)
	}
}
