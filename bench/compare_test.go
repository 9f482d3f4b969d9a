package bench

import (
	"bytes"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sweepReport(slo SLO, points map[float64]float64) *Report {
	r := &Report{Settings: Settings{SLO: slo}}
	for _, x := range []float64{1, 2, 4, 8} {
		good, ok := points[x]
		if !ok {
			continue
		}
		r.Runs = append(r.Runs, &Result{Load: Load{RequestRate: x, NumPrompts: 10},
			Summary: Summary{Goodput: good, SLOAttainment: good / x, TTFT: Dist{P99: 100 * x}, TPOT: Dist{P99: 10 * x}, E2E: Dist{P50: 1000 * x}}})
	}
	return r
}

func TestWriteComparison(t *testing.T) {
	pd := Labeled{"PD", sweepReport(SLO{}, map[float64]float64{1: 1, 2: 2, 4: 3.5})}
	co := Labeled{"colocated", sweepReport(SLO{}, map[float64]float64{1: 1, 2: 1.5, 8: 2})}
	var b bytes.Buffer
	if err := WriteComparison(&b, []Labeled{pd, co}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"**Goodput (req/s within SLO)**\n\n| rate (req/s) | PD | colocated | colocated / PD |\n|---:|---:|---:|---:|\n| 1 | 1.00 | 1.00 | 1.00× |\n| 2 | 2.00 | 1.50 | 0.75× |\n| 4 | 3.50 | – | – |\n| 8 | – | 2.00 | – |\n",
		"**SLO attainment (%)**",
		"| 4 | 87.5 | – | – |",
		"**TTFT p99 (ms)**", "| 2 | 200.0 | 200.0 |",
		"**TPOT p99 (ms)**", "**E2E p50 (ms)**", "| 8 | – | 8000.00 | – |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("comparison lacks %q:\n%s", want, out)
		}
	}
}

func TestCompareRefusesMixedSweeps(t *testing.T) {
	rate := Labeled{"rate", sweepReport(SLO{}, map[float64]float64{1: 1})}
	closed := Labeled{"closed", &Report{Settings: Settings{SweepConcurrency: true}, Runs: []*Result{{Load: Load{Concurrency: 4, NumPrompts: 1}}}}}
	if err := WriteComparison(&bytes.Buffer{}, []Labeled{rate, closed}); err == nil || !strings.Contains(err.Error(), "sweep different things") {
		t.Errorf("rate against concurrency: err = %v", err)
	}
	if err := WriteComparison(&bytes.Buffer{}, []Labeled{rate}); err == nil {
		t.Error("one report compared with nothing: no error")
	}
}

func TestComparisonPlotsAndJSON(t *testing.T) {
	dir := t.TempDir()
	var reports []Labeled
	for _, name := range []string{"a", "b"} {
		var buf bytes.Buffer
		if err := sweepReport(SLO{}, map[float64]float64{1: 1, 2: 1.8}).WriteJSON(&buf); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+".json")
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		rep, err := ReadReportFile(path)
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, Labeled{name, rep})
	}
	paths, err := WriteComparisonPlots(filepath.Join(dir, "plots"), "test", reports)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != len(comparedMetrics) {
		t.Fatalf("wrote %d charts, want %d", len(paths), len(comparedMetrics))
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			XMLName xml.Name
		}
		if err := xml.Unmarshal(data, &doc); err != nil || doc.XMLName.Local != "svg" {
			t.Errorf("%s: not an SVG document: %v", p, err)
		}
		for _, name := range []string{">a<", ">b<"} {
			if !bytes.Contains(data, []byte(name)) {
				t.Errorf("%s: legend lacks %s", p, name)
			}
		}
	}
	if _, err := ReadReport(strings.NewReader(`{"config":{},"runs":[]}`)); err == nil {
		t.Error("a report without runs was read")
	}
}

func TestRejudge(t *testing.T) {
	recs := []Record{
		{Index: 0, Success: true, TTFTMS: 100, TPOTMS: 10, OutputTokens: 10, E2EMS: 200},
		{Index: 1, Success: true, TTFTMS: 100, TPOTMS: 30, OutputTokens: 10, E2EMS: 400},
		{Index: 2, Success: false, Error: "boom"},
	}
	r := &Report{Runs: []*Result{{Load: Load{RequestRate: 1, NumPrompts: 3}, Requests: recs}}}
	r.Runs[0].Summary = Aggregate(r.Runs[0].Requests, 2*time.Second, SLO{})
	if got := r.Runs[0].Summary.MetSLO; got != 2 {
		t.Fatalf("without an SLO: met %d, want 2", got)
	}
	slo, err := ParseSLO("tpot=20ms")
	if err != nil {
		t.Fatal(err)
	}
	r.Rejudge(slo)
	s := r.Runs[0].Summary
	if s.MetSLO != 1 || s.Goodput != 0.5 || s.Completed != 2 || s.Failed != 1 || r.Settings.SLO != slo {
		t.Errorf("rejudged: met %d goodput %v completed %d failed %d slo %v; want 1, 0.5, 2, 1, %v", s.MetSLO, s.Goodput, s.Completed, s.Failed, r.Settings.SLO, slo)
	}
	if !r.Runs[0].Requests[0].MetSLO || r.Runs[0].Requests[1].MetSLO {
		t.Error("per-request MetSLO not rejudged")
	}
}
