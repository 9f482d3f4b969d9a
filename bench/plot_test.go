package bench

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// svgDoc is what a test needs to know about an SVG file: it decoded as XML,
// and which elements and texts it has.
type svgDoc struct {
	root     string
	elements map[string]int
	texts    []string
}

func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	d := svgDoc{elements: map[string]int{}}
	dec := xml.NewDecoder(strings.NewReader(string(b)))
	inText := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, b)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if d.root == "" {
				d.root = tok.Name.Space + " " + tok.Name.Local
			}
			d.elements[tok.Name.Local]++
			inText = tok.Name.Local == "text"
		case xml.CharData:
			if inText {
				d.texts = append(d.texts, string(tok))
			}
		case xml.EndElement:
			inText = false
		}
	}
	return d
}

func TestChartSVG(t *testing.T) {
	c := Chart{Title: "Latency <p99> & friends", XLabel: "request rate (req/s)", YLabel: "TTFT (ms)", Series: []Series{
		{Name: "TTFT p50", X: []float64{1, 2, 4, 8}, Y: []float64{12, 14, 30, 250}, Markers: true},
		{Name: "TTFT p99", X: []float64{1, 2, 4, 8}, Y: []float64{20, 25, 80, 900}, Markers: true, Dashed: true, Shade: 1},
	}}
	d := parseSVG(t, c.SVG())
	if d.root != "http://www.w3.org/2000/svg svg" {
		t.Errorf("root %q", d.root)
	}
	if d.elements["polyline"] != 2 || d.elements["circle"] != 8 {
		t.Errorf("elements %v; want 2 lines with 4 markers each", d.elements)
	}
	for _, want := range []string{"Latency <p99> & friends", "request rate (req/s)", "TTFT (ms)", "TTFT p50", "TTFT p99", "0", "1000"} {
		if !slices.Contains(d.texts, want) {
			t.Errorf("no text %q in %q", want, d.texts)
		}
	}
	// Ticks: several on each axis.
	if n := d.elements["line"]; n < 12 {
		t.Errorf("%d lines (axes, ticks, grid, legend)", n)
	}

	empty := parseSVG(t, Chart{Title: "nothing", Series: []Series{{Name: "none"}}}.SVG())
	if !slices.Contains(empty.texts, "no data") {
		t.Errorf("empty chart texts %q", empty.texts)
	}
}

func TestNiceTicks(t *testing.T) {
	ticks, lo, hi := niceTicks(0, 937)
	if lo != 0 || hi != 1000 || !slices.Equal(ticks, []float64{0, 200, 400, 600, 800, 1000}) {
		t.Errorf("ticks %v [%v, %v]", ticks, lo, hi)
	}
	ticks, _, _ = niceTicks(0, 1)
	if len(ticks) < 3 || len(ticks) > maxTicks+1 || tickLabel(ticks[1], ticks) != "0.2" {
		t.Errorf("ticks %v", ticks)
	}
	if ticks, lo, hi := niceTicks(5, 5); len(ticks) < 2 || !(hi > lo) {
		t.Errorf("degenerate range: %v [%v, %v]", ticks, lo, hi)
	}
}

func TestWritePlots(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rep   *Report
		files []string
	}{
		{"single", sampleReport(1, false), []string{"ttft_cdf.svg", "e2e_cdf.svg", "tpot_itl_cdf.svg"}},
		{"sweep with audio", sampleReport(3, true), []string{"ttft_cdf.svg", "e2e_cdf.svg", "tpot_itl_cdf.svg", "audio_ttfp_cdf.svg", "audio_rtf_cdf.svg",
			"goodput_vs_rate.svg", "throughput_vs_rate.svg", "ttft_vs_rate.svg"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "plots")
			written, err := tt.rep.WritePlots(dir)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range written {
				names = append(names, filepath.Base(p))
			}
			if !slices.Equal(names, tt.files) {
				t.Errorf("wrote %v; want %v", names, tt.files)
			}
			for _, p := range written {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				d := parseSVG(t, b)
				if d.elements["polyline"] == 0 || d.elements["text"] < 5 {
					t.Errorf("%s: elements %v", p, d.elements)
				}
			}
			if len(tt.rep.Runs) > 1 {
				b, _ := os.ReadFile(filepath.Join(dir, "goodput_vs_rate.svg"))
				d := parseSVG(t, b)
				if d.elements["polyline"] != 3 || !slices.Contains(d.texts, "offered rate") || !slices.Contains(d.texts, "request rate (req/s)") {
					t.Errorf("goodput chart: %v %q", d.elements, d.texts)
				}
				b, _ = os.ReadFile(filepath.Join(dir, "ttft_cdf.svg"))
				if d := parseSVG(t, b); d.elements["polyline"] != 3 || !slices.Contains(d.texts, "rate 2") {
					t.Errorf("sweep CDF: one line per point: %v %q", d.elements, d.texts)
				}
			}
		})
	}
}

func TestCDFSeriesThinned(t *testing.T) {
	xs := make([]float64, 10*maxStepsPerCDF+3)
	for i := range xs {
		xs[i] = float64(len(xs) - i)
	}
	s := cdfSeries("ITL", xs, 0, false)
	if len(s.X) != maxStepsPerCDF || s.X[len(s.X)-1] != float64(len(xs)) || s.Y[len(s.Y)-1] != 1 || !slices.IsSorted(s.X) {
		t.Errorf("%d points, last (%v, %v)", len(s.X), s.X[len(s.X)-1], s.Y[len(s.Y)-1])
	}
}
