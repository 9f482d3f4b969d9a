package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/omnipd/omnipd/bench"
	"github.com/spf13/cobra"
)

type benchOptions struct {
	baseURL, model, apiKey         string
	endpoint, modalities, audioFmt string
	dataset, datasetPath           string
	inputLen, outputLen            int
	seed                           uint64
	numPrompts, warmup             int
	duration, timeout              time.Duration
	// readyTimeout is --ready-check-timeout-sec (0: no wait).
	readyTimeout                int
	requestRate                 string
	burstiness                  float64
	concurrency, maxConcurrency int
	slo, sweep                  string
	sweepConcurrency, ignoreEOS bool
	outputJSON, plotDir         string
	quiet, verbose              bool
	ignoreEOSSet, rateSet       bool
	// random-mm: vLLM's flags, and omnipd's for audio.
	mmBaseItems         int
	mmRangeRatio        float64
	mmLimits, mmBuckets string
	mmAudioRate         int
	mmAudioPart         string
	mmFlagsSet          []string
}

func newBenchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench [--base-url URL] [--dataset random|random-mm|sharegpt] [--request-rate R | --concurrency C] [flags]",
		Short: "Load-test an OpenAI-compatible server and report TTFT, TPOT, ITL, E2E, audio TTFP/RTF and goodput",
		Long: `bench is omnipd's counterpart of vllm bench serve. It streams chat (or
completions) requests to a running server, in an open loop at --request-rate
(Poisson, or gamma with --burstiness) or a closed loop of --concurrency
clients, for --num-prompts requests or --duration, and reports per-request
latencies (TTFT, TPOT, ITL, E2E; audio time to first packet and real-time
factor with --modalities text,audio), throughput and goodput against --slo.
--dataset random-mm adds synthetic images and audio clips to each prompt, as
vLLM's random-mm does (--random-mm-* flags). --sweep runs the workload at
several rates (or concurrencies). Results go to
stdout as Markdown, with --output-json and --plot-dir (SVG) for more.
Ctrl-C stops early and still reports what finished. See docs/bench.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.ignoreEOSSet = cmd.Flags().Changed("ignore-eos")
			o.rateSet = cmd.Flags().Changed("request-rate")
			for _, name := range randomMMFlags {
				if cmd.Flags().Changed(name) {
					o.mmFlagsSet = append(o.mmFlagsSet, "--"+name)
				}
			}
			return runBench(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.baseURL, "base-url", "http://127.0.0.1:8000", "the server's base URL")
	f.StringVar(&o.model, "model", "", "model to request (default: the first one /v1/models lists)")
	f.StringVar(&o.apiKey, "api-key", "", "API key, sent as a bearer token (default $OMNIPD_API_KEY or $OPENAI_API_KEY)")
	f.StringVar(&o.endpoint, "endpoint", bench.EndpointChat, "chat (/v1/chat/completions) or completions (/v1/completions)")
	f.StringVar(&o.modalities, "modalities", "text", `"text", or "text,audio" to ask for speech too and measure it`)
	f.StringVar(&o.audioFmt, "audio-format", "wav", "audio format to ask for with --modalities text,audio: wav or pcm")
	f.StringVar(&o.dataset, "dataset", "random", "random, random-mm (random text with synthetic media) or sharegpt")
	f.StringVar(&o.datasetPath, "dataset-path", "", "ShareGPT JSON file (--dataset sharegpt)")
	f.IntVar(&o.inputLen, "input-len", 128, "random datasets: prompt length in tokens as the server counts them, fitted to its tokenizer with one-token requests before the run; on the chat endpoint the chat template's tokens come on top, as with vllm bench serve")
	f.IntVar(&o.outputLen, "output-len", 0, "random dataset: max_tokens (default 128); sharegpt: cap on each answer's length (default none)")
	f.IntVar(&o.mmBaseItems, "random-mm-base-items-per-request", bench.DefaultMMBaseItemsPerRequest, "random-mm: media items a request carries, before the range ratio")
	f.Float64Var(&o.mmRangeRatio, "random-mm-num-mm-items-range-ratio", 0, "random-mm: r in [0, 1]; a request's item count is uniform in [floor(n(1-r)), ceil(n(1+r))]")
	f.StringVar(&o.mmLimits, "random-mm-limit-mm-per-prompt", bench.DefaultMMLimitPerPrompt, `random-mm: JSON caps on a request's items per modality, e.g. '{"image": 2, "audio": 1}'`)
	f.StringVar(&o.mmBuckets, "random-mm-bucket-config", bench.DefaultMMBucketConfig, "random-mm: item shapes to probabilities: (height, width, 1) an image, (0, seconds, channels) an audio clip")
	f.IntVar(&o.mmAudioRate, "random-mm-audio-sample-rate", bench.DefaultMMAudioSampleRate, "random-mm: sample rate of the synthetic audio clips, Hz (omnipd's flag)")
	f.StringVar(&o.mmAudioPart, "random-mm-audio-part", bench.AudioPartInputAudio, "random-mm: send audio as input_audio or as an audio_url data: URL (omnipd's flag)")
	f.Uint64Var(&o.seed, "seed", 0, "seed for prompts and arrivals; the same seed repeats the same workload")
	f.IntVar(&o.numPrompts, "num-prompts", 0, "requests to measure (default 100 unless --duration is given)")
	f.DurationVar(&o.duration, "duration", 0, "stop starting requests after this long (e.g. 60s)")
	f.IntVar(&o.warmup, "warmup", 0, "requests sent before the measured ones and left out of every figure")
	f.StringVar(&o.requestRate, "request-rate", "inf", "open loop: requests per second, or inf to send all at once")
	f.Float64Var(&o.burstiness, "burstiness", 1, "open loop: gamma shape of arrival gaps; 1 is Poisson, <1 burstier, >1 steadier")
	f.IntVar(&o.maxConcurrency, "max-concurrency", 0, "open loop: at most this many requests in flight (0: no cap)")
	f.IntVar(&o.concurrency, "concurrency", 0, "closed loop: this many clients, each sending its next request when the last finished")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "per-request limit, stream included (0: none)")
	f.IntVar(&o.readyTimeout, "ready-check-timeout-sec", 600, "wait up to this many seconds for the server to answer a one-token request before the run, as vllm bench serve does (0: do not wait)")
	f.BoolVar(&o.ignoreEOS, "ignore-eos", false, "ask for exactly max_tokens tokens (default true for random, false for sharegpt)")
	f.StringVar(&o.slo, "slo", "", "goodput SLO, e.g. ttft=200ms,tpot=50ms,e2e=5s (also ttfp=, rtf=); bare numbers are ms")
	f.StringVar(&o.sweep, "sweep", "", "run at each of these request rates, e.g. 1,2,4,8")
	f.BoolVar(&o.sweepConcurrency, "sweep-concurrency", false, "--sweep values are closed-loop concurrencies instead of rates")
	f.StringVar(&o.outputJSON, "output-json", "", "write settings, aggregates and every request to this JSON file")
	f.StringVar(&o.plotDir, "plot-dir", "", "write SVG charts (latency CDFs; for sweeps, goodput, throughput and TTFT vs rate) here")
	f.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	f.BoolVar(&o.verbose, "verbose", false, "log every failed request to stderr")
	cmd.AddCommand(newBenchCompareCmd())
	return cmd
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// benchPlan is a validated benchmark: what to run and how to report it.
type benchPlan struct {
	cfg      bench.Config
	loads    []bench.Load
	settings bench.Settings
}

func (o benchOptions) plan() (*benchPlan, error) {
	p := &benchPlan{}
	if o.apiKey == "" {
		// From the environment, so the key never shows in --help or ps.
		o.apiKey = firstNonEmpty(os.Getenv("OMNIPD_API_KEY"), os.Getenv("OPENAI_API_KEY"))
	}
	t := bench.Target{BaseURL: o.baseURL, APIKey: o.apiKey, Model: o.model, Endpoint: o.endpoint, AudioFormat: o.audioFmt}
	mods := strings.Split(strings.ReplaceAll(o.modalities, " ", ""), ",")
	slices.Sort(mods)
	switch strings.Join(mods, ",") {
	case "text":
	case "audio,text":
		t.Audio = true
	default:
		return nil, fmt.Errorf("--modalities %q: want text or text,audio", o.modalities)
	}
	var (
		ds         bench.Dataset
		mmSettings *bench.MMSettings
	)
	if len(o.mmFlagsSet) > 0 && o.dataset != "random-mm" {
		return nil, fmt.Errorf("%s: the random-mm flags need --dataset random-mm", strings.Join(o.mmFlagsSet, ", "))
	}
	outputLen := o.outputLen
	switch o.dataset {
	case "random":
		if outputLen == 0 {
			outputLen = 128
		}
		if o.inputLen < 1 || outputLen < 1 {
			return nil, errors.New("--input-len and --output-len: want >= 1")
		}
		ds = bench.Random{InputLen: o.inputLen, OutputLen: outputLen, Seed: o.seed}
		t.IgnoreEOS = !o.ignoreEOSSet || o.ignoreEOS
	case "random-mm":
		if outputLen == 0 {
			outputLen = 128
		}
		if o.inputLen < 1 || outputLen < 1 {
			return nil, errors.New("--input-len and --output-len: want >= 1")
		}
		if t.Endpoint == bench.EndpointCompletions {
			return nil, errors.New("--dataset random-mm needs the chat endpoint; completions take text only")
		}
		mm, err := o.randomMM(bench.Random{InputLen: o.inputLen, OutputLen: outputLen, Seed: o.seed})
		if err != nil {
			return nil, err
		}
		ds = mm
		mmSettings = mm.Settings()
		t.IgnoreEOS = !o.ignoreEOSSet || o.ignoreEOS
	case "sharegpt":
		if o.datasetPath == "" {
			return nil, errors.New("--dataset sharegpt needs --dataset-path FILE")
		}
		if outputLen < 0 {
			return nil, errors.New("--output-len: want >= 0")
		}
		fh, err := os.Open(o.datasetPath)
		if err != nil {
			return nil, fmt.Errorf("--dataset-path: %w", err)
		}
		sg, err := bench.LoadShareGPT(fh, outputLen, o.seed)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.datasetPath, err)
		}
		ds = sg
		t.IgnoreEOS = o.ignoreEOS
	default:
		return nil, fmt.Errorf("--dataset %q: want random, random-mm or sharegpt", o.dataset)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	slo, err := bench.ParseSLO(o.slo)
	if err != nil {
		return nil, fmt.Errorf("--slo: %w", err)
	}
	if slo.NeedsAudio() && !t.Audio {
		return nil, errors.New("--slo: an audio SLO (ttfp, rtf) needs --modalities text,audio")
	}
	if o.readyTimeout < 0 {
		return nil, fmt.Errorf("--ready-check-timeout-sec %d: want seconds to wait, or 0 not to", o.readyTimeout)
	}
	rate, err := parseRate(o.requestRate)
	if err != nil {
		return nil, err
	}
	load := bench.Load{RequestRate: rate, Burstiness: o.burstiness, MaxConcurrency: o.maxConcurrency, Concurrency: o.concurrency, NumPrompts: o.numPrompts, Duration: o.duration}
	if load.NumPrompts == 0 && load.Duration == 0 {
		load.NumPrompts = 100
	}
	if load.Closed() && o.rateSet {
		return nil, errors.New("--request-rate is for the open loop; --concurrency runs a closed loop")
	}
	if o.warmup < 0 {
		return nil, errors.New("--warmup: want >= 0")
	}
	var points []float64
	if o.sweep != "" {
		for _, s := range strings.Split(o.sweep, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("--sweep %q: want positive numbers, e.g. 1,2,4,8", o.sweep)
			}
			if o.sweepConcurrency && v != math.Trunc(v) {
				return nil, fmt.Errorf("--sweep %q: concurrencies are whole numbers", o.sweep)
			}
			points = append(points, v)
		}
	} else if o.sweepConcurrency {
		return nil, errors.New("--sweep-concurrency needs --sweep 1,2,4,...")
	}
	if len(points) == 0 {
		p.loads = []bench.Load{load}
	}
	for _, v := range points {
		l := load
		if o.sweepConcurrency {
			l.Concurrency = int(v)
		} else {
			if load.Closed() {
				return nil, errors.New("--sweep sweeps request rates; with --concurrency, add --sweep-concurrency to sweep concurrencies")
			}
			l.RequestRate = v
		}
		p.loads = append(p.loads, l)
	}
	for _, l := range p.loads {
		if err := l.Validate(); err != nil {
			return nil, err
		}
	}
	p.cfg = bench.Config{Target: t, Dataset: ds, Load: p.loads[0], Warmup: o.warmup, Timeout: o.timeout, SLO: slo, Seed: o.seed}
	modalities := []string{"text"}
	if t.Audio {
		modalities = append(modalities, "audio")
	}
	p.settings = bench.Settings{
		BaseURL: o.baseURL, Endpoint: o.endpoint, Modalities: modalities,
		Dataset: o.dataset, DatasetPath: o.datasetPath, RandomMM: mmSettings, InputLen: o.inputLen, OutputLen: outputLen, IgnoreEOS: t.IgnoreEOS,
		Seed: o.seed, NumPrompts: load.NumPrompts, DurationS: load.Duration.Seconds(), RequestRate: bench.Rate(rate),
		Burstiness: o.burstiness, Concurrency: o.concurrency, MaxConcurrency: o.maxConcurrency, Warmup: o.warmup,
		TimeoutS: o.timeout.Seconds(), SLO: slo, Sweep: points, SweepConcurrency: o.sweepConcurrency,
	}
	if t.Audio {
		p.settings.AudioFormat = o.audioFmt
	}
	if o.dataset == "sharegpt" {
		p.settings.InputLen = 0
	}
	return p, nil
}

// randomMMFlags are the flags only --dataset random-mm reads.
var randomMMFlags = []string{
	"random-mm-base-items-per-request", "random-mm-num-mm-items-range-ratio", "random-mm-limit-mm-per-prompt",
	"random-mm-bucket-config", "random-mm-audio-sample-rate", "random-mm-audio-part",
}

// randomMM builds the random-mm dataset from its flags; bucket media are
// synthesized here, before the load.
func (o benchOptions) randomMM(text bench.Random) (*bench.RandomMM, error) {
	limits, err := bench.ParseMMLimits(o.mmLimits)
	if err != nil {
		return nil, fmt.Errorf("--random-mm-limit-mm-per-prompt %s: %w", o.mmLimits, err)
	}
	buckets, err := bench.ParseBucketConfig(o.mmBuckets)
	if err != nil {
		return nil, fmt.Errorf("--random-mm-bucket-config %s: %w", o.mmBuckets, err)
	}
	return bench.NewRandomMM(text, bench.MMConfig{
		BaseItemsPerRequest: o.mmBaseItems, NumItemsRangeRatio: o.mmRangeRatio,
		LimitPerPrompt: limits, Buckets: buckets, AudioSampleRate: o.mmAudioRate, AudioPart: o.mmAudioPart,
	})
}

func parseRate(s string) (float64, error) {
	if strings.EqualFold(strings.TrimSpace(s), "inf") {
		return math.Inf(1), nil
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("--request-rate %q: want a positive number or inf", s)
	}
	return v, nil
}

// runBench runs the benchmark and reports it. An interrupt (ctx ending)
// still reports what finished and exits 130; a benchmark whose every
// request failed exits 1.
func runBench(ctx context.Context, o benchOptions, stdout, stderr io.Writer) error {
	p, err := o.plan()
	if err != nil {
		return err
	}
	// A report that cannot be written is found out now, before the load,
	// not after it: a long run's results would otherwise be lost.
	if err := prepareOutputs(o.outputJSON, o.plotDir); err != nil {
		return err
	}
	cfg := p.cfg
	cfg.Client = bench.ClientFor(p.loads...)
	if o.readyTimeout > 0 {
		status := stderr
		if o.quiet {
			status = nil
		}
		if err := bench.WaitReady(ctx, &cfg, time.Duration(o.readyTimeout)*time.Second, status); err != nil {
			return err
		}
	}
	if cfg.Target.Model == "" {
		m, err := bench.FirstModel(ctx, cfg.Client, cfg.Target.BaseURL, cfg.Target.APIKey)
		if err != nil {
			return err
		}
		cfg.Target.Model = m
	}
	p.settings.Model = cfg.Target.Model
	if ds, ok := cfg.Dataset.(fittable); ok {
		if err := fitPrompts(ctx, &cfg, ds, &p.settings, o.quiet, stderr); err != nil {
			return err
		}
	}
	p.settings.StartedAt = time.Now().UTC().Format(time.RFC3339)
	if !o.quiet {
		cfg.Progress = bench.NewProgress(stderr, isTerminal(stderr))
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if o.verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	runs, err := bench.Sweep(ctx, cfg, p.loads)
	if err != nil {
		return err
	}
	rep := &bench.Report{Settings: p.settings, Runs: runs, Interrupted: ctx.Err() != nil}
	// Every output is attempted even when another fails, so one bad
	// destination costs only its own copy of the results.
	var failed []error
	if err := rep.WriteMarkdown(stdout); err != nil {
		failed = append(failed, err)
	}
	if o.outputJSON != "" {
		if err := writeJSONReport(o.outputJSON, rep); err != nil {
			failed = append(failed, err)
		}
	}
	if o.plotDir != "" {
		files, err := rep.WritePlots(o.plotDir)
		if err != nil {
			failed = append(failed, err)
		} else if !o.quiet {
			fmt.Fprintf(stderr, "wrote %d charts to %s\n", len(files), o.plotDir)
		}
	}
	if len(failed) > 0 {
		return errors.Join(failed...)
	}
	if rep.Interrupted {
		fmt.Fprintln(stderr, "interrupted: the report covers the requests that finished")
		return exitError{130}
	}
	for _, r := range runs {
		if r.Summary.Completed > 0 {
			return nil
		}
	}
	fmt.Fprintln(stderr, "omnipd bench: every request failed")
	return exitError{1}
}

// fittable is a dataset whose prompts can be fitted to the server's token
// counts (the random datasets).
type fittable interface {
	Fit(*bench.PromptFit) (bench.Dataset, error)
}

// fitPrompts fits cfg's dataset to --input-len tokens as the server counts
// them. A server whose counts cannot be had (no usage reported, requests
// failing) gets the prompts unfitted, with a warning and the reason in the
// report: the run still measures what it can.
func fitPrompts(ctx context.Context, cfg *bench.Config, ds fittable, st *bench.Settings, quiet bool, stderr io.Writer) error {
	if !quiet {
		fmt.Fprintln(stderr, "fitting prompts to --input-len: measuring the server's token counts with one-token requests")
	}
	fit, err := bench.MeasureFit(ctx, *cfg)
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "interrupted before the run")
		return exitError{130}
	}
	if err != nil {
		st.InputFitError = err.Error()
		fmt.Fprintf(stderr, "omnipd bench: warning: prompts not fitted to tokens (%v); each is %d words, about one token each in a BPE vocabulary, and the report shows the tokens sent\n", err, st.InputLen)
		return nil
	}
	fitted, err := ds.Fit(fit)
	if err != nil {
		return err
	}
	cfg.Dataset, st.InputFit = fitted, fit
	return nil
}

// prepareOutputs creates the directories the report goes to and checks
// that files can be written there.
func prepareOutputs(jsonPath, plotDir string) error {
	if jsonPath != "" {
		if fi, err := os.Stat(jsonPath); err == nil && fi.IsDir() {
			return fmt.Errorf("--output-json %s: is a directory", jsonPath)
		}
		if err := writableDir(filepath.Dir(jsonPath)); err != nil {
			return fmt.Errorf("--output-json %s: %w", jsonPath, err)
		}
	}
	if plotDir != "" {
		if err := writableDir(plotDir); err != nil {
			return fmt.Errorf("--plot-dir %s: %w", plotDir, err)
		}
	}
	return nil
}

// writableDir creates dir if need be and proves a file can be created in it.
func writableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".omnipd-bench-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// writeJSONReport writes the report to a temporary file beside path and
// renames it over path, so path holds a whole report or what it held before.
func writeJSONReport(path string, rep *bench.Report) error {
	fh, err := os.CreateTemp(filepath.Dir(path), ".omnipd-bench-*.json")
	if err != nil {
		return fmt.Errorf("--output-json: %w", err)
	}
	defer os.Remove(fh.Name()) // after a successful rename there is nothing left to remove
	if err := rep.WriteJSON(fh); err != nil {
		fh.Close()
		return fmt.Errorf("--output-json: %w", err)
	}
	if err := fh.Close(); err != nil {
		return fmt.Errorf("--output-json: %w", err)
	}
	if err := os.Chmod(fh.Name(), 0o644); err != nil {
		return fmt.Errorf("--output-json: %w", err)
	}
	if err := os.Rename(fh.Name(), path); err != nil {
		return fmt.Errorf("--output-json: %w", err)
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal), where
// progress can be redrawn in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
