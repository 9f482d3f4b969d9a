package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Labeled is a report under the name a comparison shows it by, such as
// "PD 1P+1D" or "colocated ×2".
type Labeled struct {
	Name   string
	Report *Report
}

// ReadReport reads a report written by WriteJSON.
func ReadReport(r io.Reader) (*Report, error) {
	var rep Report
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return nil, fmt.Errorf("bench: reading a JSON report: %w", err)
	}
	if len(rep.Runs) == 0 {
		return nil, fmt.Errorf("bench: the report has no runs")
	}
	return &rep, nil
}

// ReadReportFile is ReadReport of a file.
func ReadReportFile(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	rep, err := ReadReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

// Rejudge re-aggregates every run of r against slo, from the requests it
// recorded: what the goodput would have been under another SLO, without
// running the benchmark again. Latency figures do not change; goodput, SLO
// attainment and each request's MetSLO do.
func (r *Report) Rejudge(slo SLO) {
	r.Settings.SLO = slo
	for _, run := range r.Runs {
		elapsed := time.Duration(math.Round(run.Summary.DurationS * float64(time.Second)))
		run.Summary = Aggregate(run.Requests, elapsed, slo)
	}
}

// point is where a run sits on a sweep's x axis: its rate or concurrency.
func point(l Load) float64 {
	if l.Closed() {
		return float64(l.Concurrency)
	}
	return l.RequestRate
}

// checkComparable refuses reports whose points mean different things: a
// rate sweep against a concurrency sweep.
func checkComparable(reports []Labeled) error {
	if len(reports) < 2 {
		return fmt.Errorf("bench: a comparison needs at least two reports")
	}
	for _, l := range reports[1:] {
		if l.Report.Settings.SweepConcurrency != reports[0].Report.Settings.SweepConcurrency ||
			l.Report.Runs[0].Load.Closed() != reports[0].Report.Runs[0].Load.Closed() {
			return fmt.Errorf("bench: %q and %q sweep different things (rate against concurrency)", reports[0].Name, l.Name)
		}
	}
	return nil
}

// WriteComparison writes one Markdown table per metric that matters for
// choosing a topology — throughput, goodput, SLO attainment, TTFT p50 and
// p99, TPOT p99 and E2E p50 — with a row per sweep point and a column per report. Two
// reports get a third column, the second's figure over the first's.
func WriteComparison(w io.Writer, reports []Labeled) error {
	if err := checkComparable(reports); err != nil {
		return err
	}
	var b strings.Builder
	axis := "rate (req/s)"
	if reports[0].Report.Runs[0].Load.Closed() {
		axis = "concurrency"
	}
	for _, m := range comparedMetrics {
		fmt.Fprintf(&b, "**%s**\n\n| %s |", m.title, axis)
		sep := "|---:|"
		for _, l := range reports {
			fmt.Fprintf(&b, " %s |", mdEscape(l.Name))
			sep += "---:|"
		}
		if len(reports) == 2 {
			fmt.Fprintf(&b, " %s / %s |", mdEscape(reports[1].Name), mdEscape(reports[0].Name))
			sep += "---:|"
		}
		b.WriteString("\n" + sep + "\n")
		for _, x := range unionPoints(reports) {
			fmt.Fprintf(&b, "| %s |", formatNum(x))
			for _, l := range reports {
				if run := runAt(l.Report, x); run != nil {
					fmt.Fprintf(&b, " %s |", m.format(m.pick(&run.Summary)))
				} else {
					b.WriteString(" – |")
				}
			}
			if len(reports) == 2 {
				b.WriteString(" " + ratio(reports, x, m.pick) + " |")
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("bench: writing the comparison: %w", err)
	}
	return nil
}

// ratio is the second report's figure at x over the first's, or "–" when
// either is missing or the first is zero.
func ratio(reports []Labeled, x float64, pick func(*Summary) float64) string {
	a, b := runAt(reports[0].Report, x), runAt(reports[1].Report, x)
	if a == nil || b == nil || pick(&a.Summary) == 0 {
		return "–"
	}
	return f2(pick(&b.Summary)/pick(&a.Summary)) + "×"
}

var comparedMetrics = []struct {
	title, file, ylabel string
	pick                func(*Summary) float64
	format              func(float64) string
}{
	{"Request throughput (req/s)", "compare_throughput.svg", "requests per second", func(s *Summary) float64 { return s.RequestThroughput }, f2},
	{"Goodput (req/s within SLO)", "compare_goodput.svg", "requests per second", func(s *Summary) float64 { return s.Goodput }, f2},
	{"SLO attainment (%)", "compare_slo_attainment.svg", "% of requests within SLO", func(s *Summary) float64 { return 100 * s.SLOAttainment }, f1},
	{"TTFT p50 (ms)", "compare_ttft_p50.svg", "TTFT p50 (ms)", func(s *Summary) float64 { return s.TTFT.P50 }, f2},
	{"TTFT p99 (ms)", "compare_ttft_p99.svg", "TTFT p99 (ms)", func(s *Summary) float64 { return s.TTFT.P99 }, f1},
	{"TPOT p99 (ms)", "compare_tpot_p99.svg", "TPOT p99 (ms)", func(s *Summary) float64 { return s.TPOT.P99 }, f1},
	{"E2E p50 (ms)", "compare_e2e_p50.svg", "E2E p50 (ms)", func(s *Summary) float64 { return s.E2E.P50 }, f2},
}

// unionPoints lists every sweep point of the reports, ascending.
func unionPoints(reports []Labeled) []float64 {
	seen := map[float64]bool{}
	var xs []float64
	for _, l := range reports {
		for _, run := range l.Report.Runs {
			if x := point(run.Load); !seen[x] {
				seen[x] = true
				xs = append(xs, x)
			}
		}
	}
	slices.Sort(xs)
	return xs
}

func runAt(r *Report, x float64) *Result {
	for _, run := range r.Runs {
		if point(run.Load) == x {
			return run
		}
	}
	return nil
}

// WriteComparisonPlots writes one SVG chart per compared metric into dir,
// a line per report against the swept rate or concurrency, and returns
// their paths.
func WriteComparisonPlots(dir, title string, reports []Labeled) ([]string, error) {
	if err := checkComparable(reports); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: plot directory: %w", err)
	}
	axis := "request rate (req/s)"
	if reports[0].Report.Runs[0].Load.Closed() {
		axis = "concurrency (clients)"
	}
	var written []string
	for _, m := range comparedMetrics {
		c := Chart{Title: m.title + " — " + title, XLabel: axis, YLabel: m.ylabel}
		if slo := reports[0].Report.Settings.SLO; !slo.IsZero() {
			c.Subtitle = "SLO " + slo.String()
		}
		if m.file == "compare_slo_attainment.svg" {
			c.YMax = 100
		}
		for i, l := range reports {
			s := Series{Name: l.Name, Markers: true, Shade: i}
			for _, run := range l.Report.Runs {
				s.X = append(s.X, point(run.Load))
				s.Y = append(s.Y, m.pick(&run.Summary))
			}
			c.Series = append(c.Series, s)
		}
		path := filepath.Join(dir, m.file)
		if err := os.WriteFile(path, c.SVG(), 0o644); err != nil {
			return written, fmt.Errorf("bench: writing %s: %w", path, err)
		}
		written = append(written, path)
	}
	return written, nil
}
