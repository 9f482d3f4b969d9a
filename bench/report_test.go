package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleRecords() []Record {
	return []Record{
		{Index: 0, Success: true, Status: 200, PromptTokens: 10, OutputTokens: 5, TextChunks: 5, TTFTMS: 50, TPOTMS: 37.5, ITLMS: []float64{10, 20, 30, 40}, E2EMS: 200},
		{Index: 1, Success: true, Status: 200, PromptTokens: 20, OutputTokens: 1, TextChunks: 1, TTFTMS: 150, E2EMS: 150},
		{Index: 2, Success: true, Status: 200, PromptTokens: 30, OutputTokens: 3, TextChunks: 3, TTFTMS: 80, TPOTMS: 5, ITLMS: []float64{5, 5}, E2EMS: 90,
			AudioChunks: 2, AudioTTFPMS: 120, AudioDurationS: 0.8, AudioRTF: 0.25},
		{Index: 3, Status: 500, Error: "HTTP 500: boom"},
		{Index: 4, Canceled: true, Error: "canceled: the benchmark was interrupted"},
	}
}

func TestAggregate(t *testing.T) {
	recs := sampleRecords()
	s := Aggregate(recs, 2*time.Second, SLO{TTFT: 100 * time.Millisecond})
	check := func(name string, got, want float64) {
		t.Helper()
		if !near(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if s.Completed != 3 || s.Failed != 1 || s.Canceled != 1 || s.MetSLO != 2 {
		t.Fatalf("counts %+v", s)
	}
	check("duration", s.DurationS, 2)
	check("request throughput", s.RequestThroughput, 1.5)
	check("output throughput", s.OutputThroughput, 4.5)           // 9 tokens / 2 s
	check("total token throughput", s.TotalTokenThroughput, 34.5) // (60 + 9) / 2 s
	check("goodput", s.Goodput, 1)                                // requests 0 and 2 / 2 s
	check("attainment", s.SLOAttainment, 0.5)                     // 2 of 4 finished
	if s.TPOT.Count != 2 || s.ITL.Count != 6 || s.TTFT.Count != 3 || s.E2E.Count != 3 || s.AudioTTFP.Count != 1 {
		t.Errorf("sample sizes: TPOT %d, ITL %d, TTFT %d, E2E %d, TTFP %d", s.TPOT.Count, s.ITL.Count, s.TTFT.Count, s.E2E.Count, s.AudioTTFP.Count)
	}
	check("TTFT p50", s.TTFT.P50, 80)
	check("ITL mean", s.ITL.Mean, 110.0/6)
	check("TPOT mean", s.TPOT.Mean, 21.25)
	check("audio", s.TotalAudioS, 0.8)
	if len(s.Errors) != 1 || s.Errors[0] != (ErrorCount{"HTTP 500: boom", 1}) {
		t.Errorf("errors %+v", s.Errors)
	}
	if !recs[0].MetSLO || recs[1].MetSLO || !recs[2].MetSLO || recs[3].MetSLO {
		t.Errorf("met_slo marks %v %v %v %v", recs[0].MetSLO, recs[1].MetSLO, recs[2].MetSLO, recs[3].MetSLO)
	}
}

func sampleReport(runs int, audio bool) *Report {
	rep := &Report{Settings: Settings{BaseURL: "http://127.0.0.1:8000", Model: "m", Endpoint: "chat", Modalities: []string{"text"},
		Dataset: "random", InputLen: 16, OutputLen: 8, NumPrompts: 5, RequestRate: Rate(math.Inf(1)), Burstiness: 1,
		SLO: SLO{TTFT: 100 * time.Millisecond, E2E: time.Second}, StartedAt: "2026-01-02T03:04:05Z"}}
	if audio {
		rep.Settings.Modalities = append(rep.Settings.Modalities, "audio")
	}
	for i := range runs {
		recs := sampleRecords()
		for j := range recs {
			recs[j].TTFTMS += float64(10 * i)
		}
		load := Load{RequestRate: math.Inf(1), Burstiness: 1, NumPrompts: 5}
		if runs > 1 {
			load.RequestRate = float64(i + 1)
			rep.Settings.Sweep = append(rep.Settings.Sweep, float64(i+1))
		}
		rep.Runs = append(rep.Runs, &Result{Load: load, Requests: recs, Summary: Aggregate(recs, time.Duration(i+1)*time.Second, rep.Settings.SLO)})
	}
	return rep
}

func TestReportJSONRoundTrip(t *testing.T) {
	for _, rep := range []*Report{sampleReport(1, false), sampleReport(3, true)} {
		var buf bytes.Buffer
		if err := rep.WriteJSON(&buf); err != nil {
			t.Fatal(err)
		}
		var back Report
		if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
			t.Fatalf("%v\n%s", err, buf.String())
		}
		if !reflect.DeepEqual(&back, rep) {
			t.Errorf("round trip changed the report:\n%s", buf.String())
		}
		for _, key := range []string{`"ttft_ms"`, `"tpot_ms"`, `"itl_ms"`, `"e2e_ms"`, `"audio_ttfp_ms"`, `"audio_rtf"`, `"request_throughput_rps"`,
			`"output_throughput_tok_s"`, `"total_token_throughput_tok_s"`, `"goodput_rps"`, `"slo_attainment"`, `"duration_s"`, `"requests"`, `"request_rate": "inf"`} {
			if !strings.Contains(buf.String(), key) && !(key == `"request_rate": "inf"` && len(rep.Runs) > 1) {
				t.Errorf("JSON lacks %s", key)
			}
		}
	}
}

func TestReportMarkdown(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport(1, true).WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, row := range []string{"| completed requests | 3 |", "| failed requests | 1 |", "| canceled requests | 1 |", "| duration (s) | 1.00 |",
		"| request throughput (req/s) | 3.00 |", "| output token throughput (tok/s) |", "| total token throughput (tok/s) |", "| goodput (req/s) | 2.00 |",
		"| requests meeting SLO (%) | 50.0 |", "| total audio (s) | 0.80 |", "| TTFT (ms) | ", "| TPOT (ms) | ", "| ITL (ms) | ", "| E2E (ms) | ",
		"| audio TTFP (ms) | ", "| audio RTF | ", "| 1 | HTTP 500: boom |", "SLO ttft=100ms,e2e=1s"} {
		if !strings.Contains(md, row) {
			t.Errorf("Markdown lacks %q:\n%s", row, md)
		}
	}
	buf.Reset()
	if err := sampleReport(3, false).WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	md = buf.String()
	if strings.Contains(md, "audio") || !strings.Contains(md, "## Sweep") || !strings.Contains(md, "| rate 2 | 3 | 1 |") || strings.Count(md, "| TTFT (ms) |") != 3 {
		t.Errorf("sweep Markdown:\n%s", md)
	}
}

func TestLoadLabel(t *testing.T) {
	for l, want := range map[Load]string{{RequestRate: math.Inf(1)}: "rate inf", {RequestRate: 2.5}: "rate 2.5", {Concurrency: 8, RequestRate: 3}: "concurrency 8"} {
		if got := l.Label(); got != want {
			t.Errorf("%+v: %q, want %q", l, got, want)
		}
	}
}
