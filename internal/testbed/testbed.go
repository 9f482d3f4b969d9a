// Package testbed builds a whole omnipd deployment inside one test process:
// reference prefill and decode Thinker workers, and optionally the Talker
// and Code2Wav, each serving on loopback behind a TCP proxy a test can
// stall or cut, plus the orchestrator and the public API server in front.
// It exposes what a request can leave behind — KV blocks, KV leases,
// conditioning stashes, requests in the engines and the orchestrator's
// in-flight gauges, goroutines — and switches that kill a worker the way a
// crash does, so fault tests drive the deployment only through its public
// HTTP API and then check that nothing was left over.
//
// A deployment is a deploy config (DeployConfig) wired by package wiring,
// as omnipd serve wires one: the testbed only starts the workers, in
// process, where serve would start reference worker processes.
package testbed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/metrics"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/reference/engine"
	"github.com/omnipd/omnipd/reference/engine/code2wav"
	"github.com/omnipd/omnipd/reference/engine/model"
	"github.com/omnipd/omnipd/reference/engine/talker"
	"github.com/omnipd/omnipd/reference/engine/tokenizer"
	"github.com/omnipd/omnipd/reference/worker"
	"github.com/omnipd/omnipd/server"
	"github.com/omnipd/omnipd/topology"
	"github.com/omnipd/omnipd/vllmplan"
	"github.com/omnipd/omnipd/wiring"
)

// ModelName is the model the deployment serves.
const ModelName = "omnipd-reference"

// secret is the deployment secret every stage requires.
const secret = "testbed-deployment-secret"

// Options shape a deployment. The zero value is one prefill and one decode
// over the pull handshake, text only; every stage may have several
// instances, one of which a test kills or stalls.
type Options struct {
	// Handshake is the reference connector's: "pull" (default) or "push".
	Handshake string
	// Prefills and Decodes are the Thinker instances (default 1 each).
	Prefills, Decodes int
	// Encoders adds that many encoder workers in front of the prefills
	// (encoder disaggregation, E/P/D): each media item is encoded there and
	// the prefills fetch the outputs instead of encoding.
	Encoders int
	// Omni adds the Talker and Code2Wav stages, so chat answers carry audio.
	Omni bool
	// Talkers and Code2Wavs are the audio stages' instances with Omni
	// (default 1 each).
	Talkers, Code2Wavs int
	// Colocated serves the Thinker without PD: Decodes is the number of
	// colocated Thinker instances (in Deployment.Decode), and there is no
	// prefill, KV connector or encoder.
	Colocated bool
	// AsyncChunk streams the Thinker's conditioning to the Talker (the
	// deploy config's async_chunk).
	AsyncChunk bool
	// LeaseSeconds is how long exported KV waits to be claimed (default 5:
	// a healthy decode on a busy machine claims its KV well within it, and
	// KV a fault abandoned is freed soon after).
	LeaseSeconds float64
	// NoSharedMemory keeps KV on the side channel's TCP, which every
	// byte of a transfer then crosses (and a proxy in front of it can
	// cut), although all workers share this host.
	NoSharedMemory bool
	// NumBlocks sizes each Thinker's KV cache (default 1024 blocks of 16
	// positions: room for any test, and a small heap).
	NumBlocks int
	// PrefillRetries, PrefillTimeout and StageIdleTimeout configure the
	// orchestrator as their namesakes do.
	PrefillRetries   int
	PrefillTimeout   time.Duration
	StageIdleTimeout time.Duration
	// MaxBodyBytes bounds API request bodies (default: the server's).
	MaxBodyBytes int64
	// Logger receives every component's logs (default: discarded).
	Logger *slog.Logger
}

// Deployment is a running in-process deployment.
type Deployment struct {
	// URL is the public API's base URL.
	URL string
	// Client talks to the public API; its idle connections are closed by
	// CloseIdle.
	Client *http.Client
	// Prefill and Decode are the Thinker workers (Decode holds the
	// colocated Thinkers with Options.Colocated); Encoder the encoder
	// workers of E/P/D.
	Prefill, Decode, Encoder []*Worker
	// Talker and Code2Wav are the audio stages (nil without Options.Omni):
	// the first of Talkers and Code2Wavs, which hold every instance.
	Talker, Code2Wav   *Stage
	Talkers, Code2Wavs []*Stage

	metrics   *metrics.Orchestrator
	stageHTTP *http.Client
	// pools are the Thinker pools (encoders included), which Settled
	// probes as serve's background probe would. The audio stages' are not
	// probed: a test reads their proxies' traffic as the requests' own.
	pools    []*orchestrator.Pool
	api      *http.Server
	baseline int
	// baselineStacks are the goroutines at the baseline, by stack, to name
	// the ones a request left behind.
	baselineStacks map[string]int
}

// Worker is one Thinker worker.
type Worker struct {
	Name   string
	Engine *engine.Engine
	Server *worker.Server
	// HTTP is the network in front of the worker's API: the orchestrator
	// and the Talker reach the worker only through it.
	HTTP *Proxy
	// KV is the network in front of the worker's KV side channel (a
	// producer's); with the push handshake decodes reach it through here.
	KV *Proxy
	*host
}

// Stage is a Talker or Code2Wav worker.
type Stage struct {
	Name string
	HTTP *Proxy
	*host
}

// host is one worker's HTTP server and what dies with it.
type host struct {
	srv    *http.Server
	proxy  []*Proxy
	onKill []func()

	mu     sync.Mutex
	killed bool
}

// Kill ends the worker the way a crash does: its listeners and every open
// connection — HTTP and KV, at the worker and at the proxies in front of
// it — close at once, and its engine stops. Later connections are refused.
func (h *host) Kill() {
	h.mu.Lock()
	if h.killed {
		h.mu.Unlock()
		return
	}
	h.killed = true
	h.mu.Unlock()
	for _, p := range h.proxy {
		p.Close()
	}
	h.srv.Close()
	for _, f := range h.onKill {
		f()
	}
}

// Killed reports whether Kill was called.
func (h *host) Killed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.killed
}

var (
	thinkerOnce sync.Once
	thinker     *model.Model
	tok         *tokenizer.Tokenizer
)

func thinkerModel() (*model.Model, *tokenizer.Tokenizer) {
	thinkerOnce.Do(func() { thinker, tok = model.Default(), tokenizer.Default() })
	return thinker, tok
}

// withDefaults is opts with every unset field at its default.
func withDefaults(opts Options) Options {
	if opts.Handshake == "" {
		opts.Handshake = worker.HandshakePull
	}
	if opts.Prefills <= 0 {
		opts.Prefills = 1
	}
	if opts.Decodes <= 0 {
		opts.Decodes = 1
	}
	if opts.Talkers <= 0 {
		opts.Talkers = 1
	}
	if opts.Code2Wavs <= 0 {
		opts.Code2Wavs = 1
	}
	if opts.Colocated {
		opts.Prefills, opts.Encoders = 0, 0
	}
	if opts.LeaseSeconds <= 0 {
		opts.LeaseSeconds = 5
	}
	if opts.NumBlocks <= 0 {
		opts.NumBlocks = 1024
	}
	return opts
}

// Start builds and starts a deployment; everything stops when t ends.
func Start(t testing.TB, opts Options) *Deployment {
	t.Helper()
	opts = withDefaults(opts)
	lg := opts.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	d := &Deployment{
		metrics: metrics.NewOrchestrator(),
		stageHTTP: &http.Client{Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		Client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
	}
	t.Cleanup(d.stop)

	doc, err := loadDeployConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := wiring.Build(context.Background(), doc, wiring.Options{
		Secret:   secret,
		Launcher: wiring.LauncherFunc(func(_ context.Context, r wiring.Replica) (wiring.Address, error) { return d.launch(t, r, opts, lg) }),
		HTTP:     d.stageHTTP, PoolName: poolName,
		StageIdleTimeout: opts.StageIdleTimeout, PrefillTimeout: opts.PrefillTimeout,
		Metrics: d.metrics, Logger: lg,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range doc.Stages {
		if s.ModelStage == "thinker" {
			d.pools = append(d.pools, rt.Pools[i])
		}
	}
	if opts.Omni {
		d.Talker, d.Code2Wav = d.Talkers[0], d.Code2Wavs[0]
	}
	api := server.New(server.Config{Orchestrator: rt.Orchestrator, ModelName: ModelName, MaxBodyBytes: opts.MaxBodyBytes, Metrics: d.metrics, Logger: lg})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The public API is served as omnipd serve serves it.
	hc := server.HTTPConfig{ErrorLog: log.New(io.Discard, "", 0), Metrics: d.metrics}
	d.api = server.NewHTTPServer(api, hc)
	go d.api.Serve(server.LimitListener(ln, hc))
	d.URL = "http://" + ln.Addr().String()
	return d
}

// launch starts the in-process worker of replica r: a Thinker, with the
// KV and encoder-output transfer its stage's config gives it, or a Talker
// or Code2Wav.
func (d *Deployment) launch(t testing.TB, r wiring.Replica, opts Options, lg *slog.Logger) (wiring.Address, error) {
	t.Helper()
	s, name := r.Stage, fmt.Sprintf("%s-%d", r.Pool, r.Index)
	switch s.ModelStage {
	case "talker":
		st := d.startStage(t, name, worker.NewTalker(talker.Default(), talker.DefaultSegmenter(), secret, lg))
		d.Talkers = append(d.Talkers, st)
		return wiring.Address{URL: st.HTTP.URL()}, nil
	case "code2wav":
		st := d.startStage(t, name, worker.NewCode2Wav(code2wav.Default(), secret, lg))
		d.Code2Wavs = append(d.Code2Wavs, st)
		return wiring.Address{URL: st.HTTP.URL()}, nil
	}
	replica := r.Config()
	replica.KVPort = 0 // any free port: tests run side by side
	kv, err := wiring.WorkerKVConfig(s, replica)
	if err != nil {
		return wiring.Address{}, err
	}
	ec, err := vllmplan.ECTransferJSON(s, replica)
	if err != nil {
		return wiring.Address{}, err
	}
	wcfg := worker.Config{Secret: secret, Logger: lg}
	if wcfg.KV, err = worker.ParseKVTransferConfig(kv); err != nil {
		return wiring.Address{}, fmt.Errorf("stage %d: %w", s.ID, err)
	}
	if wcfg.EC, err = worker.ParseECTransferConfig(ec); err != nil {
		return wiring.Address{}, fmt.Errorf("stage %d: %w", s.ID, err)
	}
	w := d.startThinker(t, name, wcfg, opts, lg)
	switch s.Role {
	case topology.RoleEncoder:
		d.Encoder = append(d.Encoder, w)
	case topology.RolePrefill:
		d.Prefill = append(d.Prefill, w)
	default:
		d.Decode = append(d.Decode, w)
	}
	addr := wiring.Address{URL: w.HTTP.URL()}
	if w.KV != nil {
		_, port, _ := net.SplitHostPort(w.KV.Addr())
		addr.KVPort, _ = strconv.Atoi(port)
	}
	return addr, nil
}

// startThinker starts a Thinker worker of configuration wcfg (its engine
// aside) behind proxies.
func (d *Deployment) startThinker(t testing.TB, name string, wcfg worker.Config, opts Options, lg *slog.Logger) *Worker {
	t.Helper()
	m, tk := thinkerModel()
	eng, err := engine.New(m, tk, engine.Config{NumBlocks: opts.NumBlocks, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	wcfg.Engine = eng
	srv, err := worker.New(wcfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &Worker{Name: name, Engine: eng, Server: srv}
	w.host = d.serve(t, srv)
	w.HTTP = w.host.proxy[0]
	if addr := srv.KVAddr(); addr != "" {
		if w.KV, err = NewProxy(addr); err != nil {
			t.Fatal(err)
		}
		w.host.proxy = append(w.host.proxy, w.KV)
	}
	w.onKill = append(w.onKill, func() {
		srv.Close() // the KV side channel: listener, connections, leases
		cancel()
		<-done
	})
	return w
}

func (d *Deployment) startStage(t testing.TB, name string, h http.Handler) *Stage {
	t.Helper()
	s := &Stage{Name: name, host: d.serve(t, h)}
	s.HTTP = s.host.proxy[0]
	return s
}

// serve starts h on loopback behind a proxy.
func (d *Deployment) serve(t testing.TB, h http.Handler) *host {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &host{srv: &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}}
	go hs.srv.Serve(ln)
	p, err := NewProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	hs.proxy = []*Proxy{p}
	t.Cleanup(hs.Kill)
	return hs
}

func (d *Deployment) stop() {
	if d.api != nil {
		d.api.Close()
	}
	d.CloseIdle()
}

// CloseIdle closes the idle keep-alive connections of every client in the
// process that talks to the deployment — the test's, the orchestrator's,
// and the default one the Talker and conditioning releases use — so their
// goroutines end.
func (d *Deployment) CloseIdle() {
	d.Client.CloseIdleConnections()
	d.stageHTTP.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
}

// Workers is every Thinker worker, killed ones included.
func (d *Deployment) Workers() []*Worker {
	return append(append(append([]*Worker(nil), d.Encoder...), d.Prefill...), d.Decode...)
}

// Usage is what the deployment holds on behalf of requests: all zero when
// it is idle.
type Usage struct {
	// UsedBlocks are KV cache blocks in use (free blocks short of the total),
	// summed over the live Thinker workers.
	UsedBlocks int
	// LeasedBlocks are exported KV blocks waiting to be claimed.
	LeasedBlocks int
	// Stashes are conditioning stashes waiting for the Talker.
	Stashes int
	// EncoderOutputs are media items' encoder outputs held for a prefill.
	EncoderOutputs int
	// EngineRequests are requests running or waiting in the engines.
	EngineRequests int
	// StageInFlight is the orchestrator's in-flight gauge summed over every
	// stage instance.
	StageInFlight int
}

func (u Usage) String() string {
	return fmt.Sprintf("KV blocks in use %d, leased %d, stashes %d, encoder outputs %d, engine requests %d, orchestrator in flight %d",
		u.UsedBlocks, u.LeasedBlocks, u.Stashes, u.EncoderOutputs, u.EngineRequests, u.StageInFlight)
}

// Usage reads the gauges now.
func (d *Deployment) Usage() Usage {
	var u Usage
	for _, w := range d.Workers() {
		if w.Killed() {
			continue
		}
		st := w.Engine.Stats()
		u.UsedBlocks += st.NumBlocks - w.Engine.Cache().FreeBlocks()
		leased, _ := w.Server.KVStats()
		u.LeasedBlocks += leased
		u.Stashes += w.Server.Stashes()
		u.EncoderOutputs += w.Server.EncoderOutputs()
		u.EngineRequests += st.Running + st.Waiting
	}
	u.StageInFlight = d.stageInFlight()
	return u
}

// ExpiredLeases is how many KV leases ran out unclaimed, over the live
// workers: a lease that expires was freed late, not promptly.
func (d *Deployment) ExpiredLeases() uint64 {
	var n uint64
	for _, w := range d.Workers() {
		if !w.Killed() {
			_, e := w.Server.KVStats()
			n += e
		}
	}
	return n
}

// stageInFlight sums omnipd_stage_requests_in_flight from the
// orchestrator's registry, read in process.
func (d *Deployment) stageInFlight() int {
	rec := httptest.NewRecorder()
	d.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	total := 0.0
	for _, line := range bytes.Split(rec.Body.Bytes(), []byte("\n")) {
		s := string(line)
		if !strings.HasPrefix(s, "omnipd_stage_requests_in_flight{") {
			continue
		}
		if f, err := strconv.ParseFloat(s[strings.LastIndexByte(s, ' ')+1:], 64); err == nil {
			total += f
		}
	}
	return int(total)
}
