package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// Series is one line of a Chart.
type Series struct {
	Name string
	X, Y []float64
	// Dashed draws the line dashed; Markers puts a dot on every point;
	// Step draws a step function (each Y holds until the next X), for CDFs.
	Dashed, Markers, Step bool
	// Color is an SVG color; empty picks the palette entry of Shade.
	Color string
	Shade int
}

// Chart is a line chart drawn as a standalone SVG document with axes,
// ticks, grid, axis labels, a title and a legend.
type Chart struct {
	Title, XLabel, YLabel string
	// Subtitle is an optional smaller line under the title.
	Subtitle string
	Series   []Series
	// YMax fixes the top of the y axis (1 for a CDF); 0 fits the data.
	YMax float64
}

// palette is distinguishable in colour and in grey.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

const (
	chartW, chartH           = 820, 480
	plotL, plotT             = 84, 62
	plotR, plotB             = chartW - 210, chartH - 64
	plotWidth, plotHeight    = plotR - plotL, plotB - plotT
	legendX                  = plotR + 18
	maxTicks, maxStepsPerCDF = 8, 1000
	maxLegendRunes           = 24
)

// SVG renders the chart. Axes start at 0 when the data is non-negative.
func (c Chart) SVG() []byte {
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	points := 0
	for _, s := range c.Series {
		for i := range min(len(s.X), len(s.Y)) {
			if !finite(s.X[i]) || !finite(s.Y[i]) {
				continue
			}
			xlo, xhi = math.Min(xlo, s.X[i]), math.Max(xhi, s.X[i])
			ylo, yhi = math.Min(ylo, s.Y[i]), math.Max(yhi, s.Y[i])
			points++
		}
	}
	if points == 0 {
		xlo, xhi, ylo, yhi = 0, 1, 0, 1
	}
	xlo, ylo = math.Min(xlo, 0), math.Min(ylo, 0)
	if c.YMax > 0 {
		yhi = c.YMax
	}
	xt, xlo, xhi := niceTicks(xlo, xhi)
	yt, ylo, yhi := niceTicks(ylo, yhi)
	if c.YMax > 0 {
		yhi = c.YMax
	}
	px := func(x float64) float64 { return plotL + (x-xlo)/(xhi-xlo)*plotWidth }
	py := func(y float64) float64 { return plotB - (y-ylo)/(yhi-ylo)*plotHeight }

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	text(&b, chartW/2, 28, "middle", 17, "bold", "", c.Title)
	if c.Subtitle != "" {
		text(&b, chartW/2, 45, "middle", 12, "", "", c.Subtitle)
	}
	// Grid and ticks.
	b.WriteString(`<g class="grid" stroke="#e3e3e3" stroke-width="1">` + "\n")
	for _, t := range xt {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", px(t), plotT, px(t), plotB)
	}
	for _, t := range yt {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`+"\n", plotL, py(t), plotR, py(t))
	}
	b.WriteString("</g>\n")
	b.WriteString(`<g class="axes" stroke="#222" stroke-width="1.2">` + "\n")
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d"/>`+"\n", plotL, plotB, plotR, plotB)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d"/>`+"\n", plotL, plotT, plotL, plotB)
	for _, t := range xt {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", px(t), plotB, px(t), plotB+5)
	}
	for _, t := range yt {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`+"\n", plotL-5, py(t), plotL, py(t))
	}
	b.WriteString("</g>\n")
	b.WriteString(`<g class="ticks" fill="#222">` + "\n")
	for _, t := range xt {
		text(&b, px(t), plotB+20, "middle", 12, "", "", tickLabel(t, xt))
	}
	for _, t := range yt {
		text(&b, plotL-9, py(t)+4, "end", 12, "", "", tickLabel(t, yt))
	}
	b.WriteString("</g>\n")
	text(&b, (plotL+plotR)/2, chartH-18, "middle", 14, "", "", c.XLabel)
	text(&b, 22, (plotT+plotB)/2, "middle", 14, "", fmt.Sprintf("rotate(-90 22 %d)", (plotT+plotB)/2), c.YLabel)
	if points == 0 {
		text(&b, (plotL+plotR)/2, (plotT+plotB)/2, "middle", 15, "", "", "no data")
	}
	// Lines, clipped to the plot area.
	// The clip leaves room for markers on the plot's edges.
	fmt.Fprintf(&b, `<clipPath id="plot"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath>`+"\n", plotL-6, plotT-6, plotWidth+12, plotHeight+12)
	b.WriteString(`<g class="series" clip-path="url(#plot)">` + "\n")
	for _, s := range c.Series {
		color := s.color()
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="7 4"`
		}
		var pts bytes.Buffer
		prevY := 0.0
		for i := range min(len(s.X), len(s.Y)) {
			x, y := s.X[i], s.Y[i]
			if !finite(x) || !finite(y) {
				continue
			}
			if s.Step {
				fmt.Fprintf(&pts, "%.1f,%.1f ", px(x), py(prevY))
				prevY = y
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(x), py(y))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, bytes.TrimSpace(pts.Bytes()))
		if s.Markers {
			for i := range min(len(s.X), len(s.Y)) {
				if finite(s.X[i]) && finite(s.Y[i]) {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", px(s.X[i]), py(s.Y[i]), color)
				}
			}
		}
	}
	b.WriteString("</g>\n")
	// Legend.
	b.WriteString(`<g class="legend">` + "\n")
	for i, s := range c.Series {
		y := plotT + 8 + 22*i
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="7 4"`
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.5"%s/>`+"\n", legendX, y, legendX+26, y, s.color(), dash)
		text(&b, legendX+34, y+4, "start", 12, "", "", shorten(s.Name, maxLegendRunes))
	}
	b.WriteString("</g>\n</svg>\n")
	return b.Bytes()
}

func (s Series) color() string {
	if s.Color != "" {
		return s.Color
	}
	return palette[s.Shade%len(palette)]
}

func text[X, Y int | float64](b *bytes.Buffer, x X, y Y, anchor string, size int, weight, transform, s string) {
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d"`, float64(x), float64(y), anchor, size)
	if weight != "" {
		fmt.Fprintf(b, ` font-weight="%s"`, weight)
	}
	if transform != "" {
		fmt.Fprintf(b, ` transform="%s"`, transform)
	}
	b.WriteString(">")
	_ = xml.EscapeText(b, []byte(s))
	b.WriteString("</text>\n")
}

// shorten cuts s to n runes, ending in an ellipsis when cut.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// niceTicks covers [lo, hi] with at most maxTicks ticks at a step of 1, 2
// or 5 times a power of ten, and returns the widened range they span.
func niceTicks(lo, hi float64) (ticks []float64, from, to float64) {
	if !(hi > lo) {
		hi = lo + 1
	}
	step := niceStep((hi - lo) / (maxTicks - 2))
	from, to = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	for i := 0; i <= 4*maxTicks; i++ {
		v := from + float64(i)*step
		if v > to+step/2 {
			break
		}
		ticks = append(ticks, v)
	}
	return ticks, from, to
}

func niceStep(raw float64) float64 {
	exp := math.Floor(math.Log10(raw))
	base := math.Pow(10, exp)
	switch f := raw / base; {
	case f <= 1:
		return base
	case f <= 2:
		return 2 * base
	case f <= 5:
		return 5 * base
	}
	return 10 * base
}

// tickLabel writes t with as many decimals as the tick step needs.
func tickLabel(t float64, ticks []float64) string {
	decimals := 0
	if len(ticks) > 1 {
		step := ticks[1] - ticks[0]
		decimals = max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	}
	if math.Abs(t) < 1e-12 {
		t = 0
	}
	return strconv.FormatFloat(t, 'f', decimals, 64)
}

// cdfSeries is the empirical CDF of xs as a step series, thinned to at
// most maxStepsPerCDF steps so large samples stay small files.
func cdfSeries(name string, xs []float64, shade int, dashed bool) Series {
	v, f := CDF(xs)
	if n := len(v); n > maxStepsPerCDF {
		var tv, tf []float64
		for i := range maxStepsPerCDF {
			j := (i+1)*n/maxStepsPerCDF - 1
			tv, tf = append(tv, v[j]), append(tf, f[j])
		}
		v, f = tv, tf
	}
	return Series{Name: name, X: v, Y: f, Step: true, Shade: shade, Dashed: dashed}
}

// WritePlots writes the report's charts into dir as SVG files and returns
// their paths: latency CDFs (TTFT, TPOT with ITL, E2E; audio TTFP and RTF
// when audio was asked for), one line per run; and for a sweep, goodput
// and throughput against the swept rate or concurrency, and TTFT p50/p99
// against it.
func (r *Report) WritePlots(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: plot directory: %w", err)
	}
	var written []string
	write := func(name string, c Chart) error {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, c.SVG(), 0o644); err != nil {
			return fmt.Errorf("bench: writing %s: %w", path, err)
		}
		written = append(written, path)
		return nil
	}
	for _, c := range r.charts() {
		if err := write(c.file, c.Chart); err != nil {
			return written, err
		}
	}
	return written, nil
}

type namedChart struct {
	file string
	Chart
}

// charts builds every chart of the report.
func (r *Report) charts() []namedChart {
	sweep := len(r.Runs) > 1
	name := func(run *Result, metric string) string {
		if sweep {
			return run.Load.Label()
		}
		return metric
	}
	cdf := func(file, title, xlabel, metric string, pick func(*Result) []float64) namedChart {
		c := Chart{Title: title, XLabel: xlabel, YLabel: "fraction of requests", YMax: 1}
		for i, run := range r.Runs {
			c.Series = append(c.Series, cdfSeries(name(run, metric), pick(run), i, false))
		}
		return namedChart{file, c}
	}
	collect := func(f func(*Record) (float64, bool)) func(*Result) []float64 {
		return func(run *Result) []float64 {
			var out []float64
			for i := range run.Requests {
				if v, ok := f(&run.Requests[i]); ok && run.Requests[i].Success {
					out = append(out, v)
				}
			}
			return out
		}
	}
	out := []namedChart{
		cdf("ttft_cdf.svg", "Time to first token (CDF)", "TTFT (ms)", "TTFT", collect(func(r *Record) (float64, bool) { return r.TTFTMS, true })),
		cdf("e2e_cdf.svg", "End-to-end latency (CDF)", "E2E (ms)", "E2E", collect(func(r *Record) (float64, bool) { return r.E2EMS, true })),
	}
	tpot := collect(func(r *Record) (float64, bool) { return r.TPOTMS, r.OutputTokens > 1 })
	itl := func(run *Result) []float64 {
		var out []float64
		for _, rec := range run.Requests {
			if rec.Success {
				out = append(out, rec.ITLMS...)
			}
		}
		return out
	}
	ti := Chart{Title: "Time per output token and inter-token latency (CDF)", XLabel: "milliseconds", YLabel: "fraction of tokens or requests", YMax: 1}
	for i, run := range r.Runs {
		prefix := ""
		if sweep {
			prefix = " " + run.Load.Label()
		}
		ti.Series = append(ti.Series, cdfSeries("TPOT"+prefix, tpot(run), i, false), cdfSeries("ITL"+prefix, itl(run), i, true))
	}
	if !sweep {
		ti.Series[1].Shade = 1
	}
	out = append(out, namedChart{"tpot_itl_cdf.svg", ti})
	if r.Settings.Audio() {
		out = append(out,
			cdf("audio_ttfp_cdf.svg", "Audio time to first packet (CDF)", "TTFP (ms)", "audio TTFP", collect(func(r *Record) (float64, bool) { return r.AudioTTFPMS, r.AudioChunks > 0 })),
			cdf("audio_rtf_cdf.svg", "Audio real-time factor (CDF)", "RTF (generation time / audio duration)", "audio RTF", collect(func(r *Record) (float64, bool) { return r.AudioRTF, r.AudioChunks > 0 })),
		)
	}
	if !sweep {
		return out
	}
	axis, suffix := "request rate (req/s)", "rate"
	if r.Settings.SweepConcurrency {
		axis, suffix = "concurrency (clients)", "concurrency"
	}
	var xs []float64
	for _, run := range r.Runs {
		if run.Load.Closed() {
			xs = append(xs, float64(run.Load.Concurrency))
		} else {
			xs = append(xs, run.Load.RequestRate)
		}
	}
	pick := func(f func(*Summary) float64) []float64 {
		var ys []float64
		for _, run := range r.Runs {
			ys = append(ys, f(&run.Summary))
		}
		return ys
	}
	sub := "goodput: requests per second within SLO " + r.Settings.SLO.String()
	if r.Settings.SLO.IsZero() {
		sub = "no SLO set: goodput counts every completed request"
	}
	good := Chart{Title: "Goodput and throughput vs " + suffix, Subtitle: sub, XLabel: axis, YLabel: "requests per second", Series: []Series{
		{Name: "goodput", X: xs, Y: pick(func(s *Summary) float64 { return s.Goodput }), Markers: true, Shade: 2},
		{Name: "request throughput", X: xs, Y: pick(func(s *Summary) float64 { return s.RequestThroughput }), Markers: true, Dashed: true, Shade: 0},
	}}
	if !r.Settings.SweepConcurrency {
		good.Series = append(good.Series, Series{Name: "offered rate", X: xs, Y: xs, Dashed: true, Color: "#999999"})
	}
	tput := Chart{Title: "Token throughput vs " + suffix, XLabel: axis, YLabel: "tokens per second", Series: []Series{
		{Name: "output tokens/s", X: xs, Y: pick(func(s *Summary) float64 { return s.OutputThroughput }), Markers: true, Shade: 0},
		{Name: "total tokens/s", X: xs, Y: pick(func(s *Summary) float64 { return s.TotalTokenThroughput }), Markers: true, Dashed: true, Shade: 3},
	}}
	ttft := Chart{Title: "TTFT p50 and p99 vs " + suffix, XLabel: axis, YLabel: "TTFT (ms)", Series: []Series{
		{Name: "TTFT p50", X: xs, Y: pick(func(s *Summary) float64 { return s.TTFT.P50 }), Markers: true, Shade: 0},
		{Name: "TTFT p99", X: xs, Y: pick(func(s *Summary) float64 { return s.TTFT.P99 }), Markers: true, Shade: 1},
	}}
	return append(out,
		namedChart{"goodput_vs_" + suffix + ".svg", good},
		namedChart{"throughput_vs_" + suffix + ".svg", tput},
		namedChart{"ttft_vs_" + suffix + ".svg", ttft},
	)
}
