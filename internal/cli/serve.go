package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/internal/buildinfo"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/launch"
	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/openai"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/server"
	"github.com/omnipd/omnipd/stageclient"
	"github.com/omnipd/omnipd/topology"
	"github.com/omnipd/omnipd/vllmplan"
	"github.com/omnipd/omnipd/wiring"
	"github.com/spf13/cobra"
)

func newServeCmd() *cobra.Command {
	var (
		flags        configFlags
		configPath   string
		host         string
		port         int
		pd           bool
		drainTimeout time.Duration
		modelName    string
		stageIdle    time.Duration
		asyncChunk   bool
	)
	var access accessOptions
	cmd := &cobra.Command{
		Use:   "serve [CHECKPOINT_DIR | --config FILE] [--host H] [--port N] [--pd=false]",
		Short: "Serve the OpenAI API over a prefill/decode topology",
		Long: `serve starts omnipd's API server. Without --config it serves the embedded
default: Qwen3-Omni's Thinker split into prefill and decode on reference
workers that omnipd starts as child processes on loopback. With --config it
serves any validated topology; a stage with endpoints: is already running
(vllm serve, say) and is not started. --pd=false serves the same pipeline
with the Thinker colocated, for comparison; --async-chunk=false (or =true)
overrides the config's async_chunk, to compare the Talker reading the
Thinker's rows as the decode makes them with reading them once it is done.
/health is ready only when a
request can succeed: every stage answers its /health and takes the
deployment secret; else 503 says which stage is not, and why.

--port is bound before any worker starts, and a port written in the config
(pd.kv_port, a stage's kv_port) must be free; ports nobody chose (each
worker's, the embedded default's KV side channels) are picked free, so two
serve on one host need only different --port values.

serve CHECKPOINT_DIR serves a Hugging Face-format checkpoint on this host
(config.json, *.safetensors, tokenizer.json of a Qwen3-architecture model):
its Thinker alone, text only, on reference workers that load it (omnipd
worker --model DIR), under the directory's name unless --served-model-name
says another. serve downloads nothing: a model id of the Hugging Face Hub
is served on GPUs by vllm serve engines, which omnipd plan --target vllm
starts and serve --config then drives.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := flags.options()
			opts.PD = pd && configPath != ""
			opts.Colocated = !pd
			var checkpoint string
			var doc *deploy.Document
			var err error
			if len(args) == 1 {
				if configPath != "" {
					return fmt.Errorf("serve %s --config %s: give a checkpoint directory or a deploy config, not both", args[0], configPath)
				}
				if checkpoint, err = checkpointDir(args[0]); err != nil {
					return err
				}
				if !cmd.Flags().Changed("served-model-name") {
					modelName = args[0] // as vllm serve names a model after its --model
				}
				doc, err = loadCheckpointConfig(checkpoint, opts, cmd.ErrOrStderr())
			} else {
				doc, err = loadConfig(configPath, opts, cmd.ErrOrStderr())
			}
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("async-chunk") {
				doc.AsyncChunk = asyncChunk
			}
			if _, err := access.media.config(); err != nil {
				return err // before any worker starts
			}
			if _, err := access.media.maxBodyBytes(access.maxBodyMB); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			if percent, set := serveGCPercent(os.Getenv("GOGC")); set {
				debug.SetGCPercent(percent)
				fmt.Fprintf(cmd.OutOrStdout(), "garbage collector: GOGC=%d (set GOGC to choose)\n", percent)
			}
			if cmd.Flags().Changed("api-key") {
				warnKeyOnCommandLine(log, "--api-key", "OMNIPD_API_KEY")
			} else {
				access.apiKey = os.Getenv("OMNIPD_API_KEY")
			}
			return serve(cmd.Context(), doc, serveOptions{access: access, checkpoint: checkpoint,
				host: host, port: port, drain: drainTimeout, model: modelName, stageIdle: stageIdle,
				out: cmd.OutOrStdout(), log: log, workerLog: cmd.ErrOrStderr(), simulate: cmd.Flag("simulate").Value.String(),
				debugAddr: cmd.Flag("debug-addr").Value.String(),
			})
		},
	}
	flags.registerLayout(cmd)
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "deploy config (default: the embedded Qwen3-Omni PD topology)")
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&port, "port", 8000, "port to listen on")
	f.BoolVar(&pd, "pd", true, "disaggregate the Thinker into prefill and decode (false: one colocated Thinker stage)")
	// Unset (Changed false), the config decides; the zero default keeps
	// cobra from printing a default that is not one.
	f.BoolVar(&asyncChunk, "async-chunk", false, "stream the Thinker's rows to the Talker as the decode makes them, so audio starts while the text streams (default: the config's async_chunk; a stage's own async_chunk: false still turns it off for its edge)")
	f.DurationVar(&drainTimeout, "drain-timeout", 30*time.Second, "how long in-flight requests may finish after SIGTERM")
	f.StringVar(&modelName, "served-model-name", "omnipd-reference", "model name the API reports and accepts")
	f.DurationVar(&stageIdle, "stage-idle-timeout", orchestrator.DefaultStageIdleTimeout,
		"how long a stage after the prefill (decode, Talker, Code2Wav) may send nothing — a stream's next event, or a whole answer — before the request fails with 504 (0: wait forever)")
	f.String("simulate", "", simulateUsage("every worker omnipd starts (Thinker, Talker, Code2Wav)"))
	access.register(cmd)
	return cmd
}

type serveOptions struct {
	access      accessOptions
	host, model string
	// checkpoint, when set, is the checkpoint directory the reference
	// Thinker workers load (serve DIR).
	checkpoint     string
	port           int
	drain          time.Duration
	stageIdle      time.Duration // 0: no idle timeout
	out, workerLog io.Writer
	simulate       string
	// debugAddr, when set, is the orchestrator's profiler address; every
	// worker omnipd starts then serves its own profiler on the same host at
	// a port of its own, which it logs.
	debugAddr string
	log       *slog.Logger
}

// localWorkers counts the reference workers serve starts: the replicas
// that name no endpoint of their own.
func localWorkers(doc *deploy.Document) int {
	n := 0
	for _, s := range doc.Stages {
		for _, r := range s.Replicas {
			if r.Endpoint == "" {
				n++
			}
		}
	}
	return n
}

// checkpointDir checks serve's argument: a Hugging Face-format checkpoint
// directory on this host, returned as an absolute path for the workers.
// Anything else — a model id of the Hugging Face Hub above all, which
// vllm serve takes in the same place — gets the commands that serve it.
func checkpointDir(arg string) (string, error) {
	fi, err := os.Stat(arg)
	switch {
	case err == nil && fi.IsDir():
		if _, err := os.Stat(filepath.Join(arg, "config.json")); err != nil {
			return "", fmt.Errorf("serve %s: not a Hugging Face checkpoint directory (no config.json); the reference workers load config.json, *.safetensors and tokenizer.json", arg)
		}
		return filepath.Abs(arg)
	case err == nil:
		return "", fmt.Errorf("serve %s: not a directory; serve takes a checkpoint directory (config.json, *.safetensors, tokenizer.json), or --config FILE for a deploy config", arg)
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("serve %s: %w", arg, err)
	}
	return "", fmt.Errorf(`serve %[1]s: no such directory here, and omnipd serve downloads no model: it serves its built-in reference model (omnipd serve) or a Hugging Face checkpoint already on this host (omnipd serve DIR), on reference workers.
To serve a model of the Hub on GPUs, run it on vllm serve engines and point serve at them:
  omnipd plan --target vllm --model %[1]s --pd --connector NixlConnector --devices 0-3 THINKER.yaml > launch.sh
  sh launch.sh &  # starts the engines and stays; writes omnipd-vllm.yaml and omnipd-secret
  omnipd serve --config omnipd-vllm.yaml --secret-file omnipd-secret --served-model-name %[1]s
where THINKER.yaml is a thinker-only vllm-omni deploy config (pipeline: qwen3_omni_moe_thinker); to run a vllm-omni deploy config with a Talker on GPUs,
  omnipd plan --target vllm --model %[1]s --pd --connector NixlConnector CONFIG > launch.sh
plans every stage on omnipd's vllm-omni stage worker, started and served by the same two commands`, arg)
}

// checkpointConfig is what serve DIR serves: the Thinker alone, split into
// prefill and decode over the reference connector (--pd=false: colocated).
// A checkpoint's Talker and Code2Wav are not the reference engine's, and
// the reference ones read the reference Thinker's conditioning, so the
// pipeline is the text one.
const checkpointConfig = `pipeline: qwen3_omni_moe_thinker
pd:
  connector: ReferenceConnector
stages:
  - stage_id: 0
`

// loadCheckpointConfig loads checkpointConfig, printing its warnings.
func loadCheckpointConfig(dir string, opts deploy.Options, stderr io.Writer) (*deploy.Document, error) {
	doc, warnings, err := deploy.Load("<serve "+dir+">", []byte(checkpointConfig), opts)
	for _, w := range warnings {
		fmt.Fprintln(stderr, w)
	}
	if err != nil {
		return nil, fmt.Errorf("the Thinker-only topology for %s: %w", dir, err)
	}
	return doc, nil
}

// defaultServeGCPercent is the GOGC omnipd serve runs with unless the
// environment sets one. Its heap is small (under 2 MB live at 16 streams)
// and almost all of what it allocates is one request's garbage, so
// at Go's default of 100 the heap goal stays at its 4 MB floor and the
// collector runs dozens of times a second under load: about a tenth of
// serve's CPU per request at 16 clients (docs/benchmarks.md). 400 makes the
// floor 16 MB and the collections a quarter as many.
const defaultServeGCPercent = 400

// serveGCPercent is the GOGC serve should set, and whether to set one: not
// when the environment's GOGC (env), which the runtime has already applied,
// says otherwise.
func serveGCPercent(env string) (int, bool) {
	if env != "" {
		return 0, false
	}
	return defaultServeGCPercent, true
}

// workerProcs is each local worker's GOMAXPROCS: an equal share of the CPUs
// serve itself may use (hostProcs), at least one. Zero, which leaves each
// worker the runtime's default, when there are no local workers or the
// environment sets GOMAXPROCS (which the workers then inherit as set).
// Without a share, every worker's runtime schedules for the whole host, and
// on a host with fewer CPUs than busy processes their idle threads spin on
// CPUs another worker needs.
func workerProcs(hostProcs, workers int, envSet bool) int {
	if workers == 0 || envSet {
		return 0
	}
	return max(1, hostProcs/workers)
}

// serve starts what the topology needs and serves until ctx ends. Every
// port it will use is settled before the first worker starts: the API's is
// bound, the ones the config chose are checked free, and the ones nobody
// chose are picked free, so that a clash fails at once, naming the port,
// rather than after minutes of worker start-up. Each worker's ports stay
// bound until the worker inherits them (planLocalPorts).
func serve(ctx context.Context, doc *deploy.Document, o serveOptions) error {
	simulateArg, err := simulateWorkerArg(o.simulate)
	if err != nil {
		return err
	}
	if o.access.maxBody, err = o.access.media.maxBodyBytes(o.access.maxBodyMB); err != nil {
		return err
	}
	secret, err := deploymentSecret(doc, o.access.secretFile, o.log)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the omnipd binary to start workers: %w", err)
	}
	ln, err := listen(o.host, o.port)
	if err != nil {
		return fmt.Errorf("--port: %w", err)
	}
	defer ln.Close() // on an early return; serveListener closes it otherwise
	ports, err := planLocalPorts(doc)
	if err != nil {
		return err
	}
	defer ports.close()
	local := localWorkers(doc)
	procs := workerProcs(runtime.GOMAXPROCS(0), local, os.Getenv("GOMAXPROCS") != "")
	if procs > 0 {
		fmt.Fprintf(o.out, "reference workers: %d on this host, GOMAXPROCS=%d each (set GOMAXPROCS to choose)\n", local, procs)
	}
	launcher := &referenceLauncher{o: o, exe: exe, secret: secret, simulateArg: simulateArg, procs: procs, ports: ports}
	defer launcher.stop()
	m := metrics.NewOrchestrator()
	stageIdle := o.stageIdle
	if stageIdle <= 0 {
		stageIdle = -1 // the flag's 0 means never; the orchestrator's means the default
	}
	rt, err := wiring.Build(ctx, doc, wiring.Options{
		Secret: secret, Launcher: launcher, MaxStageQueue: o.access.maxStageQueue,
		StageIdleTimeout: stageIdle, Metrics: m, Logger: o.log, Out: o.out,
	})
	if err != nil {
		return err
	}
	// Keep unhealthy instances out of rotation between requests too.
	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	rt.Probe(probeCtx, 2*time.Second)
	o.access.warnExposure(o.host, o.log)
	warnNotReady(ctx, rt.Readiness, o.log)
	maxModelLen := o.access.thinkerMaxModelLen(ctx, rt.Config.Decode, o.log)
	fmt.Fprintf(o.out, "request bodies: up to %s (%s)\n", mib(o.access.maxBody), bodyCapWhy(o.access.maxBodyMB))
	handler := server.New(server.Config{
		APIKey: o.access.apiKey, AuthHealth: o.access.authHealth, AuthMetrics: o.access.authMetrics,
		MaxConcurrent: o.access.maxConcurrent, MaxTokensLimit: o.access.tokensLimit(maxModelLen),
		MaxModelLen: maxModelLen, MaxBodyBytes: o.access.maxBody, WriteTimeout: noneIsNegative(o.access.writeTimeout),
		Orchestrator: rt.Orchestrator, ModelName: o.model, Logger: o.log, Metrics: m, Version: buildinfo.Version(),
		Ready: rt.Readiness.Check, BodyTimeout: noneIsNegative(o.access.bodyTimeout),
	})
	hc := server.HTTPConfig{
		IdleTimeout: noneIsNegative(o.access.keepAlive),
		MaxConns:    noneIsNegative(o.access.maxConns), MaxConnsPerIP: noneIsNegative(o.access.maxConnsPerIP),
		Metrics: m,
	}
	return serveListenerWith(ctx, ln, handler, hc, o.drain, func(a net.Addr) {
		path := pathName(rt.Config.Contract)
		if e := doc.EncoderStage(); e != nil && e.EC != nil {
			path = fmt.Sprintf("encoder over %s, %s", e.EC.Connector, path)
		}
		fmt.Fprintf(o.out, "omnipd serving %s (%s) on http://%s\n", o.model, path, a)
	}, func() {
		fmt.Fprintf(o.out, "shutting down: draining in-flight requests (up to %v)\n", o.drain)
	})
}

// referenceLauncher starts the reference workers serve runs, one child
// process for each replica that names no endpoint, on the ports held for
// it, and stops them when serve ends.
type referenceLauncher struct {
	o           serveOptions
	exe, secret string
	simulateArg string
	procs       int // each worker's GOMAXPROCS (0: the runtime's)
	ports       *localPorts
	workers     []*launch.Supervisor
}

var _ wiring.Launcher = (*referenceLauncher)(nil)

// Launch starts replica rep's worker and waits until it is healthy.
func (l *referenceLauncher) Launch(ctx context.Context, rep wiring.Replica) (wiring.Address, error) {
	o := l.o
	s, i, r := rep.Stage, rep.Index, rep.Config()
	// omnipd starts this instance: a reference worker, on the ports held
	// for it.
	spec := launch.Spec{Name: fmt.Sprintf("%s-%d", rep.Pool, i), Secret: l.secret, Procs: l.procs}
	held := l.ports.take(s.ID, i)
	spec.Listener = held.httpLn
	if held.kv != 0 {
		r.KVPort = held.kv
		if s.KV.Role == topology.KVProducer || s.KV.Role == topology.KVBoth {
			spec.KVListener = held.kvLn
		} else {
			held.kvLn.Close() // a kv_consumer opens no side channel
		}
	}
	where := ""
	if s.ModelStage == "thinker" {
		var err error
		if spec.KVTransferConfig, err = wiring.WorkerKVConfig(s, r); err != nil {
			return wiring.Address{}, err
		}
		if o.access.maxModelLen > 0 {
			spec.Args = []string{"--max-model-len", strconv.Itoa(o.access.maxModelLen)}
		}
		if o.checkpoint != "" {
			spec.Args = append(spec.Args, "--model", o.checkpoint)
		}
		// The client's model names the legs too: the worker must
		// answer to the name serve answers to.
		spec.Args = append(spec.Args, "--served-model-name", o.model)
		spec.Args = append(spec.Args, kvCacheArgs(s)...)
		spec.Args = append(spec.Args, o.access.media.args()...)
		spec.Args = append(spec.Args, "--max-request-body-size-mb", strconv.FormatInt(legBodyMB(o.access.maxBody), 10))
		if s.EC != nil {
			// The encoder and the prefill of E/P/D.
			if s.EC.Connector != worker.ReferenceECConnector {
				return wiring.Address{}, fmt.Errorf("stage %d uses %s, which reference workers cannot run; give the stage endpoints: of vLLM engines, or use %s", s.ID, s.EC.Connector, worker.ReferenceECConnector)
			}
			ec, err := vllmplan.ECTransferJSON(s, r)
			if err != nil {
				return wiring.Address{}, err
			}
			spec.Args = append(spec.Args, "--ec-transfer-config", ec)
		}
		if r.KVPort != 0 {
			where = fmt.Sprintf(" (KV side channel %s, %s)", net.JoinHostPort(deploy.KVHost(s), strconv.Itoa(r.KVPort)), held.kvWhy)
		}
	} else {
		spec.Args = []string{"--stage", s.ModelStage}
	}
	if l.simulateArg != "" {
		spec.Args = append(spec.Args, "--simulate", l.simulateArg)
	}
	if o.debugAddr != "" {
		spec.Args = append(spec.Args, "--debug-addr", childDebugAddr(o.debugAddr))
	}
	fmt.Fprintf(o.out, "stage %d (%s): starting reference worker %s%s\n", s.ID, rep.Pool, spec.Name, where)
	w, err := launch.Supervise(l.exe, spec, o.workerLog, func(line string) { fmt.Fprintln(o.out, line) })
	if err != nil {
		return wiring.Address{}, err
	}
	l.workers = append(l.workers, w)
	readyCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = w.WaitHealthy(readyCtx)
	cancel()
	if err != nil {
		return wiring.Address{}, err
	}
	fmt.Fprintf(o.out, "stage %d (%s): %s ready at %s\n", s.ID, rep.Pool, spec.Name, w.URL())
	return wiring.Address{URL: w.URL(), KVPort: r.KVPort}, nil
}

// stop stops every worker started.
func (l *referenceLauncher) stop() {
	for _, w := range l.workers {
		if err := w.Stop(10 * time.Second); err != nil {
			l.o.log.Warn("stopping worker", "err", err)
		}
	}
}

// noneIsNegative maps a flag's 0 ("no bound") to the server configs'
// negative, whose 0 means the default.
func noneIsNegative[T int | time.Duration](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// warnNotReady checks every stage once before serving and says what stands
// in the way. A stage that refuses the deployment secret is the loud case:
// its /health is green, yet every request through it fails.
func warnNotReady(ctx context.Context, r *stageclient.Readiness, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := r.Check(ctx)
	switch {
	case err == nil:
	case errors.Is(err, stageclient.ErrSecretRefused):
		log.Warn("stages refuse omnipd's deployment secret: every request through them will fail, and /health says not ready, until --secret-file or OMNIPD_SECRET holds the engines' key (vllm serve: VLLM_API_KEY)", "err", err)
	default:
		log.Warn("not every stage is ready; /health says not ready until they are", "err", err)
	}
}

// legBodyMB is the body cap, in MiB rounded up, of the workers serve
// starts for a client cap of clientMax bytes: room for any leg serve sends
// for a body within it (openai.MaxLegBodyBytes).
func legBodyMB(clientMax int64) int64 {
	return (openai.MaxLegBodyBytes(clientMax) + 1<<20 - 1) >> 20
}

func pathName(c kvconnector.Contract) string {
	if c == nil {
		return "Thinker colocated"
	}
	return "prefill/decode over " + c.Name()
}

func newSecret() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make the deployment secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// accessOptions are serve's settings for who may call it and how much one
// request or one stage may take on.
type accessOptions struct {
	apiKey                  string
	authHealth, authMetrics bool
	secretFile              string
	maxConcurrent           int
	bodyTimeout             time.Duration
	keepAlive               time.Duration
	maxConns, maxConnsPerIP int
	maxTokensLimit          int
	maxModelLen             int
	maxStageQueue           int
	writeTimeout            time.Duration
	// maxBodyMB is --max-request-body-size-mb; maxBody the cap it
	// resolves to, in bytes.
	maxBodyMB int
	maxBody   int64
	media     mediaFlags
}

func (a *accessOptions) register(cmd *cobra.Command) {
	f := cmd.Flags()
	// No default from the environment here: cobra prints flag defaults in
	// its usage text, and the key must never be printed.
	f.StringVar(&a.apiKey, "api-key", "", "require \"Authorization: Bearer KEY\" on /v1/* (default $OMNIPD_API_KEY; the flag wins)")
	f.BoolVar(&a.authHealth, "auth-health", false, "require the API key on /health too")
	f.BoolVar(&a.authMetrics, "auth-metrics", false, "require the API key on /metrics too")
	f.StringVar(&a.secretFile, "secret-file", "", "file holding the deployment secret stage calls carry (default $OMNIPD_SECRET; generated when omnipd starts every stage)")
	f.IntVar(&a.maxConcurrent, "max-concurrent", 1024, "requests in flight at once; more get 429 with Retry-After")
	f.DurationVar(&a.bodyTimeout, "body-timeout", server.DefaultBodyTimeout, "how long a client may take to send a request's body; slower gets 408 (0: no bound)")
	f.DurationVar(&a.keepAlive, "keep-alive-timeout", server.DefaultIdleTimeout, "close a keep-alive connection idle this long (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE; 0: never)")
	f.IntVar(&a.maxConns, "max-connections", server.DefaultMaxConns, "connections open at once; one more is answered 503 and closed (0: no bound)")
	f.IntVar(&a.maxConnsPerIP, "max-connections-per-ip", server.DefaultMaxConnsPerIP, "connections open at once from one client address (an IPv6 /64); one more is answered 429 and closed (0: no bound; behind a proxy, raise it or turn it off)")
	f.IntVar(&a.maxTokensLimit, "max-tokens-limit", 0, "largest max_tokens a request may ask for; more is 400 (0: the Thinker's max model length; negative: no limit of omnipd's own)")
	f.IntVar(&a.maxModelLen, "max-model-len", 0, "the Thinker's context, prompt plus output, in tokens, for the reference workers omnipd starts (0: the model's)")
	f.IntVar(&a.maxStageQueue, "max-stage-queue", 512, "requests omnipd may have queued or in flight on each stage instance; when every instance of a stage is full, 429 (0: no bound)")
	f.DurationVar(&a.writeTimeout, "write-timeout", server.DefaultWriteTimeout, "how long one write of an answer may wait on a client that reads nothing (nginx's send_timeout); then the client is dropped and its stage legs cancelled. Reset before every write, so it never cuts a stream being read (0: no bound)")
	f.IntVar(&a.maxBodyMB, "max-request-body-size-mb", 0, maxBodyMBUsage)
	a.media.register(cmd)
}

// tokensLimit resolves --max-tokens-limit: by default the Thinker's max
// model length, maxModelLen (0: unknown).
func (a *accessOptions) tokensLimit(maxModelLen int) int {
	switch {
	case a.maxTokensLimit < 0:
		return 0
	case a.maxTokensLimit > 0:
		return a.maxTokensLimit
	}
	return maxModelLen
}

// thinkerMaxModelLen is the Thinker's context, prompt plus output, in
// tokens: --max-model-len, which serve gives the workers it starts, or what
// the Thinker reports on /v1/models (vLLM and the reference worker both
// do); 0 when neither says.
func (a *accessOptions) thinkerMaxModelLen(ctx context.Context, thinker *orchestrator.Pool, log *slog.Logger) int {
	switch {
	case a.maxModelLen > 0:
		return a.maxModelLen
	case thinker == nil || len(thinker.Instances) == 0:
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := thinker.Instances[0].Client.MaxModelLen(ctx)
	if err != nil || n <= 0 {
		log.Warn("the Thinker's max model length is unknown: /v1/models reports none, max_tokens is bounded only by the engines (set --max-tokens-limit), and token-id prompts are measured by the engines", "err", err)
		return 0
	}
	return n
}

// mib words a byte count in MiB.
func mib(n int64) string {
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}

// bodyCapWhy says where the body cap came from, for serve's start-up line.
func bodyCapWhy(mb int) string {
	if mb > 0 {
		return "--max-request-body-size-mb"
	}
	return "room for every prompt --media-max-item-mb and --limit-mm-per-prompt allow; --max-request-body-size-mb to choose"
}

// warnExposure says so when the API can be reached from other hosts and
// nothing but the network stands in the way.
func (a *accessOptions) warnExposure(host string, log *slog.Logger) {
	if a.apiKey == "" && !isLoopback(host) {
		log.Warn("omnipd serve listens beyond this host without an API key: anyone who can reach it can use the model; set --api-key or OMNIPD_API_KEY", "host", host)
	}
}

// kvCacheArgs sizes a reference Thinker's KV cache from the engine
// arguments vLLM sizes its own with: num_gpu_blocks_override (the cache in
// blocks) and block_size. Other engine arguments keep the worker's defaults,
// so that a config tuned for a GPU (max_num_seqs: 1, say) does not throttle
// the reference engine.
func kvCacheArgs(s *deploy.Stage) []string {
	var args []string
	for _, a := range []struct{ key, flag string }{{"num_gpu_blocks_override", "--num-blocks"}, {"block_size", "--block-size"}} {
		if n, ok := s.EngineArgs.Number(a.key); ok && n >= 1 && n == math.Trunc(n) {
			args = append(args, a.flag, strconv.Itoa(int(n)))
		}
	}
	return args
}

// isLoopback reports whether listening on host keeps a server on this
// machine. An empty host, 0.0.0.0 and :: listen everywhere; a name other
// than localhost may resolve to anything.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// deploymentSecret is the secret every stage call carries and every
// reference worker omnipd starts requires: the one --secret-file or
// $OMNIPD_SECRET gives (engines already running — vllm serve with
// VLLM_API_KEY, omnipd workers with OMNIPD_SECRET — must know it), else a
// fresh one when omnipd starts every stage itself. With running engines and
// no secret given, stage calls go without one, and it says so.
func deploymentSecret(doc *deploy.Document, file string, log *slog.Logger) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--secret-file: %w", err)
		}
		if fi, err := os.Stat(file); err == nil && fi.Mode().Perm()&0o077 != 0 {
			// ssh refuses such a private key; omnipd says so and goes on,
			// since the file may be shared on purpose (a group of operators).
			log.Warn("--secret-file is readable by other users of this host, so they can call the stage engines as omnipd; chmod 600 it",
				"file", file, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
		}
		secret := strings.TrimSpace(string(b))
		if secret == "" {
			return "", fmt.Errorf("--secret-file %s is empty", file)
		}
		return secret, nil
	}
	if secret := os.Getenv("OMNIPD_SECRET"); secret != "" {
		return secret, nil
	}
	for _, s := range doc.Stages {
		for _, r := range s.Replicas {
			if r.Endpoint != "" {
				log.Warn("stages with endpoints: and no deployment secret (OMNIPD_SECRET or --secret-file): stage calls carry no credential, so the engines accept anyone who can reach them")
				return "", nil
			}
		}
	}
	return newSecret()
}

// warnKeyOnCommandLine says that a key given as flag is visible to every
// user of this host (ps, /proc/PID/cmdline), and where it belongs instead.
// It never prints the key. Workers serve starts get the deployment secret in
// their environment (launch.Spec.Secret), which only their user can read.
func warnKeyOnCommandLine(log *slog.Logger, flag, env string) {
	log.Warn(flag+" puts the key on the command line, where every user of this host can read it (ps, /proc/PID/cmdline); set "+env+" in the environment instead", "flag", flag)
}
