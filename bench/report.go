package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Summary aggregates one run. Token and latency figures cover completed
// requests; throughputs divide by the run's wall time, from its start until
// its last request finished.
type Summary struct {
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// Canceled requests were cut off by an interrupt; they are in neither
	// count above.
	Canceled  int     `json:"canceled"`
	DurationS float64 `json:"duration_s"`

	TotalInputTokens  int `json:"total_input_tokens"`
	TotalOutputTokens int `json:"total_output_tokens"`
	// MeanPromptTokens is the mean usage.prompt_tokens of the completed
	// requests that reported it (PromptTokensReported of them): what a
	// prompt really was, chat template and media placeholders included.
	MeanPromptTokens     float64 `json:"mean_prompt_tokens"`
	PromptTokensReported int     `json:"prompt_tokens_reported"`
	RequestThroughput    float64 `json:"request_throughput_rps"`
	OutputThroughput     float64 `json:"output_throughput_tok_s"`
	TotalTokenThroughput float64 `json:"total_token_throughput_tok_s"`

	SLO SLO `json:"slo"`
	// MetSLO counts completed requests within every limit of SLO (all of
	// them when no limit is set); Goodput is their rate and SLOAttainment
	// their share of the finished (completed and failed) requests.
	MetSLO        int     `json:"met_slo"`
	Goodput       float64 `json:"goodput_rps"`
	SLOAttainment float64 `json:"slo_attainment"`

	TTFT Dist `json:"ttft_ms"`
	TPOT Dist `json:"tpot_ms"`
	ITL  Dist `json:"itl_ms"`
	E2E  Dist `json:"e2e_ms"`

	AudioTTFP   Dist    `json:"audio_ttfp_ms"`
	AudioRTF    Dist    `json:"audio_rtf"`
	TotalAudioS float64 `json:"total_audio_s"`

	// What was sent, over every request whose body was sent, whatever its
	// outcome: media items, the size of their files, and the request
	// bodies (media base64-encoded).
	TotalMediaItems   int   `json:"total_media_items"`
	TotalMediaBytes   int64 `json:"total_media_bytes"`
	TotalRequestBytes int64 `json:"total_request_bytes"`

	// Errors are the distinct failure messages, most frequent first.
	Errors []ErrorCount `json:"errors"`
}

// ErrorCount is one failure message and how many requests failed with it.
type ErrorCount struct {
	Error string `json:"error"`
	Count int    `json:"count"`
}

// Aggregate summarises a run's records over its wall time and marks each
// record's MetSLO.
func Aggregate(records []Record, elapsed time.Duration, slo SLO) Summary {
	s := Summary{DurationS: elapsed.Seconds(), SLO: slo, Errors: []ErrorCount{}}
	var ttft, tpot, itl, e2e, ttfp, rtf []float64
	errs := map[string]int{}
	for i := range records {
		r := &records[i]
		r.MetSLO = slo.Meets(r)
		s.TotalMediaItems += r.MediaItems
		s.TotalMediaBytes += int64(r.MediaBytes)
		s.TotalRequestBytes += int64(r.RequestBytes)
		switch {
		case r.Canceled:
			s.Canceled++
			continue
		case !r.Success:
			s.Failed++
			errs[r.Error]++
			continue
		}
		s.Completed++
		if r.MetSLO {
			s.MetSLO++
		}
		s.TotalInputTokens += r.PromptTokens
		s.TotalOutputTokens += r.OutputTokens
		if r.PromptTokensReported {
			s.PromptTokensReported++
			s.MeanPromptTokens += float64(r.PromptTokens)
		}
		ttft = append(ttft, r.TTFTMS)
		if r.OutputTokens > 1 {
			tpot = append(tpot, r.TPOTMS)
		}
		itl = append(itl, r.ITLMS...)
		e2e = append(e2e, r.E2EMS)
		if r.AudioChunks > 0 {
			ttfp = append(ttfp, r.AudioTTFPMS)
			rtf = append(rtf, r.AudioRTF)
			s.TotalAudioS += r.AudioDurationS
		}
	}
	if d := elapsed.Seconds(); d > 0 {
		s.RequestThroughput = float64(s.Completed) / d
		s.OutputThroughput = float64(s.TotalOutputTokens) / d
		s.TotalTokenThroughput = float64(s.TotalInputTokens+s.TotalOutputTokens) / d
		s.Goodput = float64(s.MetSLO) / d
	}
	if n := s.Completed + s.Failed; n > 0 {
		s.SLOAttainment = float64(s.MetSLO) / float64(n)
	}
	if s.PromptTokensReported > 0 {
		s.MeanPromptTokens /= float64(s.PromptTokensReported)
	}
	s.TTFT, s.TPOT, s.ITL, s.E2E = Describe(ttft), Describe(tpot), Describe(itl), Describe(e2e)
	s.AudioTTFP, s.AudioRTF = Describe(ttfp), Describe(rtf)
	for msg, n := range errs {
		s.Errors = append(s.Errors, ErrorCount{Error: msg, Count: n})
	}
	slices.SortFunc(s.Errors, func(a, b ErrorCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Error, b.Error))
	})
	return s
}

func sortRecords(rs []Record) {
	slices.SortFunc(rs, func(a, b Record) int { return cmp.Compare(a.Index, b.Index) })
}

// Rate is a request rate that writes +Inf as the JSON string "inf".
type Rate float64

// MarshalJSON writes a number, or "inf".
func (r Rate) MarshalJSON() ([]byte, error) {
	if math.IsInf(float64(r), 1) {
		return []byte(`"inf"`), nil
	}
	return json.Marshal(float64(r))
}

// UnmarshalJSON reads a number or "inf".
func (r *Rate) UnmarshalJSON(b []byte) error {
	if string(b) == `"inf"` {
		*r = Rate(math.Inf(1))
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("bench: rate: want a number or \"inf\": %w", err)
	}
	*r = Rate(f)
	return nil
}

type loadJSON struct {
	RequestRate    Rate    `json:"request_rate"`
	Burstiness     float64 `json:"burstiness"`
	MaxConcurrency int     `json:"max_concurrency"`
	Concurrency    int     `json:"concurrency"`
	NumPrompts     int     `json:"num_prompts"`
	DurationS      float64 `json:"duration_s"`
}

// MarshalJSON writes the load with its duration in seconds.
func (l Load) MarshalJSON() ([]byte, error) {
	return json.Marshal(loadJSON{Rate(l.RequestRate), l.Burstiness, l.MaxConcurrency, l.Concurrency, l.NumPrompts, l.Duration.Seconds()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *Load) UnmarshalJSON(b []byte) error {
	var j loadJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("bench: load: %w", err)
	}
	*l = Load{float64(j.RequestRate), j.Burstiness, j.MaxConcurrency, j.Concurrency, j.NumPrompts, time.Duration(math.Round(j.DurationS * float64(time.Second)))}
	return nil
}

// Settings records how a benchmark was asked for, for the report.
type Settings struct {
	BaseURL     string   `json:"base_url"`
	Model       string   `json:"model"`
	Endpoint    string   `json:"endpoint"`
	Modalities  []string `json:"modalities"`
	AudioFormat string   `json:"audio_format,omitempty"`
	Dataset     string   `json:"dataset"`
	DatasetPath string   `json:"dataset_path,omitempty"`
	// RandomMM is the random-mm dataset's media.
	RandomMM *MMSettings `json:"random_mm,omitempty"`
	// InputLen is the prompt length asked for (the random datasets).
	InputLen int `json:"input_len"`
	// InputFit is how the random datasets' prompts were fitted to InputLen
	// tokens as the server counts them; InputFitError says why they were
	// not, and InputLen then counts words.
	InputFit       *PromptFit `json:"input_fit,omitempty"`
	InputFitError  string     `json:"input_fit_error,omitempty"`
	OutputLen      int        `json:"output_len"`
	IgnoreEOS      bool       `json:"ignore_eos"`
	Seed           uint64     `json:"seed"`
	NumPrompts     int        `json:"num_prompts"`
	DurationS      float64    `json:"duration_s"`
	RequestRate    Rate       `json:"request_rate"`
	Burstiness     float64    `json:"burstiness"`
	Concurrency    int        `json:"concurrency"`
	MaxConcurrency int        `json:"max_concurrency"`
	Warmup         int        `json:"warmup"`
	TimeoutS       float64    `json:"timeout_s"`
	SLO            SLO        `json:"slo"`
	Sweep          []float64  `json:"sweep,omitempty"`
	// SweepConcurrency: the sweep's points are closed-loop concurrencies
	// rather than request rates.
	SweepConcurrency bool   `json:"sweep_concurrency"`
	StartedAt        string `json:"started_at"`
}

// Audio reports whether the benchmark asked for audio.
func (s Settings) Audio() bool { return slices.Contains(s.Modalities, "audio") }

// Report is everything a benchmark produced: how it was asked for and
// each run (one, or one per sweep point).
type Report struct {
	Settings    Settings  `json:"config"`
	Runs        []*Result `json:"runs"`
	Interrupted bool      `json:"interrupted"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("bench: writing the JSON report: %w", err)
	}
	return nil
}

// Metric rows of the Markdown report, in order; the audio rows appear when
// the benchmark asked for audio.
var latencyRows = []struct {
	name  string
	audio bool
	pick  func(*Summary) Dist
}{
	{"TTFT (ms)", false, func(s *Summary) Dist { return s.TTFT }},
	{"TPOT (ms)", false, func(s *Summary) Dist { return s.TPOT }},
	{"ITL (ms)", false, func(s *Summary) Dist { return s.ITL }},
	{"E2E (ms)", false, func(s *Summary) Dist { return s.E2E }},
	{"audio TTFP (ms)", true, func(s *Summary) Dist { return s.AudioTTFP }},
	{"audio RTF", true, func(s *Summary) Dist { return s.AudioRTF }},
}

// WriteMarkdown writes the report as Markdown tables: a sweep's overview
// row per point first, then each run's results and latency distributions.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	st := r.Settings
	b.WriteString("# omnipd bench\n\n")
	mods := strings.Join(st.Modalities, "+")
	data := st.Dataset
	if mm := st.RandomMM; mm != nil {
		items := strconv.Itoa(mm.ItemsPerRequest[0])
		if mm.ItemsPerRequest[1] != mm.ItemsPerRequest[0] {
			items += "–" + strconv.Itoa(mm.ItemsPerRequest[1])
		}
		noun := "items"
		if items == "1" {
			noun = "item"
		}
		data += fmt.Sprintf(" (%s, output %d tokens; %s media %s a request from %s)", st.inputWords(), st.OutputLen, items, noun, mm.BucketConfig)
	} else if st.Dataset == "random" {
		data += fmt.Sprintf(" (%s, output %d tokens)", st.inputWords(), st.OutputLen)
	} else if st.DatasetPath != "" {
		data += " (" + st.DatasetPath + ")"
	}
	fmt.Fprintf(&b, "%s · %s · %s · %s · SLO %s\n\n", st.Endpoint, mods, st.Model, data, st.SLO)
	if r.Interrupted {
		b.WriteString("**Interrupted:** the figures cover the requests that finished.\n\n")
	}
	if len(r.Runs) > 1 {
		r.sweepTable(&b)
	}
	for _, run := range r.Runs {
		if len(r.Runs) > 1 {
			fmt.Fprintf(&b, "## %s\n\n", run.Load.Label())
		}
		runTables(&b, run, st)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("bench: writing the report: %w", err)
	}
	return nil
}

func (r *Report) sweepTable(b *strings.Builder) {
	audio := r.Settings.Audio()
	head := "| point | completed | failed | duration (s) | req/s | goodput (req/s) | met SLO (%) | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | ITL p50 (ms) | E2E p50 (ms) | E2E p99 (ms) |"
	sep := "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	if audio {
		head += " TTFP p50 (ms) | RTF p50 |"
		sep += "---:|---:|"
	}
	b.WriteString("## Sweep\n\n" + head + "\n" + sep + "\n")
	for _, run := range r.Runs {
		s := &run.Summary
		fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |",
			run.Load.Label(), s.Completed, s.Failed, f2(s.DurationS), f2(s.RequestThroughput), f2(s.Goodput), f1(100*s.SLOAttainment),
			f2(s.OutputThroughput), f2(s.TTFT.P50), f2(s.TTFT.P99), f2(s.TPOT.P50), f2(s.ITL.P50), f2(s.E2E.P50), f2(s.E2E.P99))
		if audio {
			fmt.Fprintf(b, " %s | %s |", f2(s.AudioTTFP.P50), f3(s.AudioRTF.P50))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// inputWords says what the random datasets' input length is: tokens, and
// on the chat endpoint the template's on top, or words when the prompts
// could not be fitted to the server's tokenizer.
func (st Settings) inputWords() string {
	switch f := st.InputFit; {
	case f == nil:
		return fmt.Sprintf("input %d words, not fitted to tokens", st.InputLen)
	case !f.AddedInInputLen && f.Added > 0:
		return fmt.Sprintf("input %d tokens and the chat template's %d", st.InputLen, f.Added)
	}
	return fmt.Sprintf("input %d", st.InputLen)
}

func runTables(b *strings.Builder, run *Result, st Settings) {
	audio := st.Audio()
	s := &run.Summary
	rows := [][2]string{
		{"completed requests", strconv.Itoa(s.Completed)},
		{"failed requests", strconv.Itoa(s.Failed)},
	}
	if s.Canceled > 0 {
		rows = append(rows, [2]string{"canceled requests", strconv.Itoa(s.Canceled)})
	}
	rows = append(rows,
		[2]string{"duration (s)", f2(s.DurationS)},
		[2]string{"total input tokens", strconv.Itoa(s.TotalInputTokens)},
	)
	switch f := st.InputFit; {
	case st.InputLen > 0 && f == nil:
		rows = append(rows, [2]string{"input words per request, asked (--input-len, not fitted to tokens)", strconv.Itoa(st.InputLen)})
	case st.InputLen > 0:
		rows = append(rows, [2]string{"input tokens per request, asked (--input-len)", strconv.Itoa(st.InputLen)})
		if !f.AddedInInputLen {
			rows = append(rows, [2]string{"chat template tokens per request", strconv.Itoa(f.Added)})
		}
	}
	sent := "n/a (no usage reported)"
	if s.PromptTokensReported > 0 {
		sent = f2(s.MeanPromptTokens)
	}
	rows = append(rows,
		[2]string{"input tokens per request, sent (mean usage.prompt_tokens)", sent},
		[2]string{"total output tokens", strconv.Itoa(s.TotalOutputTokens)},
		[2]string{"request throughput (req/s)", f2(s.RequestThroughput)},
		[2]string{"output token throughput (tok/s)", f2(s.OutputThroughput)},
		[2]string{"total token throughput (tok/s)", f2(s.TotalTokenThroughput)},
		[2]string{"goodput (req/s)", f2(s.Goodput)},
		[2]string{"requests meeting SLO (%)", f1(100 * s.SLOAttainment)},
	)
	if audio {
		rows = append(rows, [2]string{"total audio (s)", f2(s.TotalAudioS)})
	}
	if s.TotalMediaItems > 0 {
		rows = append(rows,
			[2]string{"media items sent", strconv.Itoa(s.TotalMediaItems)},
			[2]string{"media sent (MB)", f2(float64(s.TotalMediaBytes) / 1e6)},
			[2]string{"request bodies sent (MB)", f2(float64(s.TotalRequestBytes) / 1e6)},
		)
	}
	b.WriteString("| result | value |\n|---|---:|\n")
	for _, row := range rows {
		fmt.Fprintf(b, "| %s | %s |\n", row[0], row[1])
	}
	b.WriteString("\n| latency | mean | std | min | p50 | p90 | p99 | max | n |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range latencyRows {
		if row.audio && !audio {
			continue
		}
		d := row.pick(s)
		f := f2
		if row.name == "audio RTF" {
			f = f3
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", row.name, f(d.Mean), f(d.Std), f(d.Min), f(d.P50), f(d.P90), f(d.P99), f(d.Max), d.Count)
	}
	b.WriteString("\n")
	if len(s.Errors) > 0 {
		b.WriteString("| failures | error |\n|---:|---|\n")
		for i, e := range s.Errors {
			if i == 10 {
				fmt.Fprintf(b, "| … | %d more distinct errors |\n", len(s.Errors)-10)
				break
			}
			fmt.Fprintf(b, "| %d | %s |\n", e.Count, mdEscape(e.Error))
		}
		b.WriteString("\n")
	}
}

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
func f3(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// formatNum writes v without trailing zeros: 4, 0.5, 12.25.
func formatNum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
