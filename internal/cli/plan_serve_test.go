package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kube"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
	"github.com/omnipd/omnipd/vllmplan"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// plannedConnectors are the vLLM KV connectors plan offers (--connector);
// omnipd's reference connector is refused by plan on purpose.
var plannedConnectors = []string{
	kvconnector.NixlConnector,
	kvconnector.MooncakeConnector,
	kvconnector.P2pNcclConnector,
	kvconnector.LMCacheConnectorV1,
	kvconnector.MoRIIOConnector,
}

// What plan writes, serve must take as it is: an operator runs the plan's
// script and then the omnipd serve --config it prints, with nothing to edit
// in between. Each config is served for real — loaded the way serve
// --config loads it, its prefill stage's contract looked up, the
// orchestrator built and the API port bound — and serve is stopped once it
// says it serves. The engines are not running; serve only warns of that.
func TestPlanVLLMConfigIsServed(t *testing.T) {
	for _, connector := range plannedConnectors {
		t.Run(connector, func(t *testing.T) {
			var script, errOut bytes.Buffer
			flags := configFlags{pd: true, connector: connector}
			// The instances' ports come from a free one, so that no engine of
			// another test answers for them.
			opts := vllmplan.VLLMOptions{BasePort: freePort(t)}
			if err := runPlan(fixtures+"qwen3_omni_moe_thinking.yaml", flags, opts, &script, &errOut); err != nil {
				t.Fatalf("plan --target vllm --pd --connector %s: %v\n%s", connector, err, errOut.String())
			}
			cfg, ok := heredoc(script.String(), vllmplan.VLLMConfigFile)
			if !ok {
				t.Fatalf("the plan writes no %s:\n%s", vllmplan.VLLMConfigFile, script.String())
			}
			wantServed(t, connector, cfg)
		})
	}
}

// An E/P/D config — vLLM's 1E1P1D shape and two encoders over Mooncake —
// planned for vllm serve and for Kubernetes is one serve takes: it routes
// through the encoder (its serving line says so) as well as the P/D pair.
func TestPlanEPDConfigIsServed(t *testing.T) {
	for _, c := range []struct{ config, connector string }{
		{"../../vllmplan/testdata/thinking_epd_nixl.yaml", kvconnector.NixlConnector},
		{"../../vllmplan/testdata/thinking_2e2p1d_mooncake.yaml", kvconnector.MooncakeConnector},
	} {
		t.Run(filepath.Base(c.config), func(t *testing.T) {
			var script, errOut bytes.Buffer
			if err := runPlan(c.config, configFlags{}, vllmplan.VLLMOptions{BasePort: freePort(t)}, &script, &errOut); err != nil {
				t.Fatalf("plan --target vllm: %v\n%s", err, errOut.String())
			}
			if !strings.Contains(script.String(), "--ec-transfer-config") {
				t.Fatalf("the plan starts no encoder:\n%s", script.String())
			}
			cfg, ok := heredoc(script.String(), vllmplan.VLLMConfigFile)
			if !ok {
				t.Fatalf("the plan writes no %s:\n%s", vllmplan.VLLMConfigFile, script.String())
			}
			out := wantServed(t, c.connector, cfg)
			if !strings.Contains(out, "encoder over ECExampleConnector") {
				t.Errorf("serve does not say it routes through the encoder:\n%s", out)
			}

			var objects bytes.Buffer
			errOut.Reset()
			kopts := kube.Options{Namespace: kube.DefaultNamespace, NamePrefix: kube.DefaultNamePrefix,
				Image: defaultImage(), VLLMImage: kube.DefaultVLLMImage, Workload: kube.WorkloadDisaggregatedSet,
				Model: vllmplan.DefaultVLLMModel}
			if err := runPlanKube(c.config, configFlags{}, kopts, &objects, &errOut); err != nil {
				t.Fatalf("plan --target kubernetes: %v\n%s", err, errOut.String())
			}
			objs, err := kube.ReadYAML(strings.NewReader(objects.String()))
			if err != nil {
				t.Fatalf("the plan does not decode into objects: %v", err)
			}
			var kcfg []byte
			for _, o := range objs {
				if cm, ok := o.(*corev1.ConfigMap); ok && cm.Data[kube.ConfigKey] != "" {
					kcfg = []byte(cm.Data[kube.ConfigKey])
				}
			}
			if kcfg == nil {
				t.Fatalf("the Kubernetes plan holds no ConfigMap with %s", kube.ConfigKey)
			}
			if out := wantServed(t, c.connector, kcfg); !strings.Contains(out, "encoder over ECExampleConnector") {
				t.Errorf("serve of the Kubernetes plan's config does not route through the encoder:\n%s", out)
			}
		})
	}
}

// A NIXL prefill and decode of two DP ranks each: serve takes the planned
// config and routes each instance's ranks (Peer.DP from data_parallel_size).
func TestPlanVLLMDataParallelNixlConfigIsServed(t *testing.T) {
	var script, errOut bytes.Buffer
	opts := vllmplan.VLLMOptions{BasePort: freePort(t)}
	if err := runPlan("../../vllmplan/testdata/dp_nixl.yaml", configFlags{}, opts, &script, &errOut); err != nil {
		t.Fatalf("plan --target vllm of a DP NIXL config: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(script.String(), "--data-parallel-size 2") {
		t.Fatalf("the plan starts no DP instance:\n%s", script.String())
	}
	cfg, ok := heredoc(script.String(), vllmplan.VLLMConfigFile)
	if !ok {
		t.Fatalf("the plan writes no %s:\n%s", vllmplan.VLLMConfigFile, script.String())
	}
	wantServed(t, kvconnector.NixlConnector, cfg)
}

// LMCache in PD mode, selected in the deploy config as a user writes it:
// serve must take the planned config and bind the senders' notice address
// the prefill's extra config names (here a free port, not the default).
func TestPlanVLLMLMCachePDConfigIsServed(t *testing.T) {
	fixture, err := filepath.Abs(fixtures + "qwen3_omni_moe_thinking.yaml")
	if err != nil {
		t.Fatal(err)
	}
	deployCfg := filepath.Join(t.TempDir(), "lmcache_pd.yaml")
	text := fmt.Sprintf("base_config: %s\npd:\n  connector: LMCacheConnectorV1\n  kv_connector_extra_config:\n    lmcache.enable_pd: true\n    lmcache.pd_proxy_port: %d\n", fixture, freePort(t))
	if err := os.WriteFile(deployCfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var script, errOut bytes.Buffer
	opts := vllmplan.VLLMOptions{BasePort: freePort(t)}
	if err := runPlan(deployCfg, configFlags{pd: true}, opts, &script, &errOut); err != nil {
		t.Fatalf("plan --target vllm: %v\n%s", err, errOut.String())
	}
	cfg, ok := heredoc(script.String(), vllmplan.VLLMConfigFile)
	if !ok {
		t.Fatalf("the plan writes no %s:\n%s", vllmplan.VLLMConfigFile, script.String())
	}
	if !strings.Contains(string(cfg), "lmcache.pd_role: receiver") {
		t.Fatalf("the planned config is not LMCache PD mode:\n%s", cfg)
	}
	wantServed(t, kvconnector.LMCacheConnectorV1, cfg)
}

// The same for the omnipd config the Kubernetes plan puts in its ConfigMap,
// which the orchestrator Deployment serves with serve --config.
func TestPlanKubernetesConfigIsServed(t *testing.T) {
	for _, connector := range plannedConnectors {
		t.Run(connector, func(t *testing.T) {
			var out, errOut bytes.Buffer
			flags := configFlags{pd: true, connector: connector}
			kopts := kube.Options{Namespace: kube.DefaultNamespace, NamePrefix: kube.DefaultNamePrefix,
				Image: defaultImage(), VLLMImage: kube.DefaultVLLMImage, Workload: kube.WorkloadDisaggregatedSet,
				Model: vllmplan.DefaultVLLMModel}
			if err := runPlanKube(fixtures+"qwen3_omni_moe_thinking.yaml", flags, kopts, &out, &errOut); err != nil {
				t.Fatalf("plan --target kubernetes --pd --connector %s: %v\n%s", connector, err, errOut.String())
			}
			objs, err := kube.ReadYAML(strings.NewReader(out.String()))
			if err != nil {
				t.Fatalf("the plan does not decode into objects: %v", err)
			}
			var cfg []byte
			for _, o := range objs {
				if cm, ok := o.(*corev1.ConfigMap); ok && cm.Data[kube.ConfigKey] != "" {
					cfg = []byte(cm.Data[kube.ConfigKey])
				}
			}
			if cfg == nil {
				t.Fatalf("the plan holds no ConfigMap with %s", kube.ConfigKey)
			}
			wantServed(t, connector, cfg)
		})
	}
}

// LMCache in PD mode cannot run on Kubernetes yet (its pods would name
// their own loopback as each other's address): plan refuses it rather than
// print a deployment that never exchanges KV.
func TestPlanKubernetesRefusesLMCachePD(t *testing.T) {
	fixture, err := filepath.Abs(fixtures + "qwen3_omni_moe_thinking.yaml")
	if err != nil {
		t.Fatal(err)
	}
	deployCfg := filepath.Join(t.TempDir(), "lmcache_pd.yaml")
	text := fmt.Sprintf("base_config: %s\npd:\n  connector: LMCacheConnectorV1\n  kv_connector_extra_config:\n    lmcache.enable_pd: true\n", fixture)
	if err := os.WriteFile(deployCfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err = runPlanKube(deployCfg, configFlags{pd: true}, kube.Options{}, &out, &errOut)
	if !errors.Is(err, kube.ErrNotRenderable) || !strings.Contains(err.Error(), "lmcache.enable_pd") {
		t.Fatalf("plan --target kubernetes of LMCache PD mode: err = %v, want ErrNotRenderable naming lmcache.enable_pd", err)
	}
	if out.Len() != 0 {
		t.Errorf("plan printed objects it refuses:\n%s", out.String())
	}
}

// wantServed writes cfg where serve --config would read it and runs serve on
// it until it says it serves, failing t with whatever serve refuses.
func wantServed(t *testing.T, connector string, cfg []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), vllmplan.VLLMConfigFile)
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	// serve's own options for --config FILE with the default --pd.
	var loadErr bytes.Buffer
	doc, err := loadConfig(path, deploy.Options{PD: true}, &loadErr)
	if err != nil {
		t.Fatalf("serve --config refuses the planned config:\n%s\nconfig:\n%s", loadErr.String(), cfg)
	}
	prefill := stageOf(doc, topology.RolePrefill)
	if prefill == nil || prefill.KV == nil {
		t.Fatalf("the planned config has no prefill stage with a kv_transfer_config:\n%s", cfg)
	}
	if prefill.KV.Connector != connector {
		t.Errorf("the planned prefill's kv_connector is %s, want %s", prefill.KV.Connector, connector)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &signalWriter{want: "omnipd serving", seen: make(chan struct{})}
	var logs lockedBuffer
	errc := make(chan error, 1)
	go func() {
		errc <- serve(ctx, doc, serveOptions{
			host: "127.0.0.1", port: 0, drain: time.Second, model: vllmplan.DefaultVLLMModel,
			out: out, workerLog: io.Discard, log: slog.New(slog.NewTextHandler(&logs, nil)),
		})
	}()
	select {
	case <-out.seen:
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("serve stopped with %v", err)
		}
		if !strings.Contains(out.String(), connector) {
			t.Errorf("serve does not say it routes over %s:\n%s", connector, out.String())
		}
	case err := <-errc:
		t.Fatalf("serve --config refuses the config plan wrote for %s: %v\n%s%s\nconfig:\n%s", connector, err, out.String(), logs.String(), cfg)
	}
	return out.String()
}

func stageOf(doc *deploy.Document, role topology.Role) *deploy.Stage {
	for _, s := range doc.Stages {
		if s.ModelStage == "thinker" && s.Role == role {
			return s
		}
	}
	return nil
}

// heredoc returns the body of the script's `cat > NAME <<'EOF'` document.
func heredoc(script, name string) ([]byte, bool) {
	_, rest, ok := strings.Cut(script, "cat > "+name+" <<'EOF'\n")
	if !ok {
		return nil, false
	}
	body, _, ok := strings.Cut(rest, "\nEOF\n")
	if !ok {
		return nil, false
	}
	return []byte(body + "\n"), true
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// signalWriter closes seen the first time what was written holds want.
type signalWriter struct {
	mu   sync.Mutex
	b    bytes.Buffer
	want string
	seen chan struct{}
	done bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if !w.done && strings.Contains(w.b.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// plannedServe is what an operator runs after a plan: its omnipd config in
// a directory of its own, and the serve command the plan prints, as
// arguments of omnipd with the files it names in that directory.
type plannedServe struct {
	dir  string
	cfg  []byte
	args []string
}

// vllmPlanServe runs plan --target vllm on config and takes the omnipd
// config and the serve command from the script.
func vllmPlanServe(t *testing.T, config string, flags configFlags, opts vllmplan.VLLMOptions) (plannedServe, string) {
	t.Helper()
	var script, errOut bytes.Buffer
	if err := runPlan(config, flags, opts, &script, &errOut); err != nil {
		t.Fatalf("plan --target vllm %s: %v\n%s", config, err, errOut.String())
	}
	cfg, ok := heredoc(script.String(), vllmplan.VLLMConfigFile)
	if !ok {
		t.Fatalf("the plan writes no %s:\n%s", vllmplan.VLLMConfigFile, script.String())
	}
	_, next, ok := strings.Cut(script.String(), "Next, in another terminal:\"\necho '  ")
	if !ok {
		t.Fatalf("the plan prints no serve command:\n%s", script.String())
	}
	line, _, _ := strings.Cut(next, "'\n")
	p := plannedServe{dir: t.TempDir(), cfg: cfg}
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != "omnipd" || fields[1] != "serve" {
		t.Fatalf("serve command %q", line)
	}
	for i := 1; i < len(fields); i++ {
		a := fields[i]
		if (a == "--config" || a == "--secret-file") && i+1 < len(fields) {
			p.args = append(p.args, a, filepath.Join(p.dir, fields[i+1]))
			i++
			continue
		}
		p.args = append(p.args, a)
	}
	if err := os.WriteFile(filepath.Join(p.dir, vllmplan.VLLMConfigFile), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	// What the script makes once: the deployment secret, owner-only.
	if err := os.WriteFile(filepath.Join(p.dir, vllmplan.VLLMSecretFile), []byte("planned-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, script.String()
}

// kubePlanServe runs plan --target kubernetes on config and takes the
// omnipd config from its ConfigMap and the serve command from the
// orchestrator Deployment, its --config in a directory of its own and on
// a loopback port.
func kubePlanServe(t *testing.T, config string, flags configFlags, kopts kube.Options) (plannedServe, []kube.Object) {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := runPlanKube(config, flags, kopts, &out, &errOut); err != nil {
		t.Fatalf("plan --target kubernetes %s: %v\n%s", config, err, errOut.String())
	}
	objs, err := kube.ReadYAML(strings.NewReader(out.String()))
	if err != nil {
		t.Fatalf("the plan does not decode into objects: %v", err)
	}
	p := plannedServe{dir: t.TempDir()}
	var command []string
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ConfigMap:
			if c, ok := o.Data[kube.ConfigKey]; ok && o.Name == kopts.NamePrefix+"-config" {
				p.cfg = []byte(c)
			}
		case *appsv1.Deployment:
			if o.Name == kopts.NamePrefix {
				command = o.Spec.Template.Spec.Containers[0].Command
			}
		}
	}
	if p.cfg == nil || len(command) < 2 || command[0] != "omnipd" || command[1] != "serve" {
		t.Fatalf("the plan holds no omnipd config (%d bytes) or serve command %q", len(p.cfg), command)
	}
	path := filepath.Join(p.dir, kube.ConfigKey)
	if err := os.WriteFile(path, p.cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(command); i++ {
		switch command[i] {
		case "--config":
			p.args = append(p.args, "--config", path)
			i++
		case "--host", "--port":
			i++ // the pod's; the test serves on loopback
		default:
			p.args = append(p.args, command[i])
		}
	}
	return p, objs
}

// serveOptions are the deploy options serve loads its --config with,
// given its --pd flag.
func (p plannedServe) loadOptions() deploy.Options {
	if slices.Contains(p.args, "--pd=false") {
		return deploy.Options{Colocated: true}
	}
	return deploy.Options{PD: true}
}

// start runs omnipd with p's arguments on a free loopback port until the
// test ends, and returns serve's base URL once it serves.
func (p plannedServe) start(t *testing.T) (string, *lockedBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := &lockedBuffer{}, &lockedBuffer{}
	var code int
	exited := make(chan struct{})
	args := append(slices.Clone(p.args), "--host", "127.0.0.1", "--port", "0")
	go func() { code = Run(ctx, args, out, logs); close(exited) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-exited:
			if code != 0 && !t.Failed() {
				t.Errorf("omnipd %s exited %d:\n%s", strings.Join(args, " "), code, logs.String())
			}
		case <-time.After(time.Minute):
			t.Error("serve did not stop")
		}
	})
	addr := regexp.MustCompile(`omnipd serving .* on (http://\S+)`)
	// A safety bound only: serve starts at once with every stage down.
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			return m[1], logs
		}
		select {
		case <-exited:
			t.Fatalf("omnipd %s exited %d, refusing the planned config:\n%s\n%s\nconfig:\n%s", strings.Join(args, " "), code, out.String(), logs.String(), p.cfg)
		default:
		}
	}
	t.Fatalf("serve did not start:\n%s\n%s", out.String(), logs.String())
	return "", nil
}

// talkerPlans are the pipelines with a Talker a plan runs on vllm-omni stage
// workers: split over two connectors, xPyD with the batch hand-off, and
// unsplit.
var talkerPlans = []struct {
	name, config string
	flags        configFlags
}{
	{"pd_mooncake", fixtures + "qwen3_omni_moe.yaml", configFlags{pd: true, connector: kvconnector.MooncakeConnector}},
	{"pd_nixl", fixtures + "qwen3_omni_moe.yaml", configFlags{pd: true, connector: kvconnector.NixlConnector}},
	{"2p1d_batch", "../../vllmplan/testdata/omni_2p1d_batch.yaml", configFlags{}},
	{"colocated", fixtures + "qwen3_omni_moe.yaml", configFlags{}},
}

// A pipeline with a Talker planned for vllm-omni stage workers is one serve
// takes as the plan says to start it: the config loads with serve's
// options, every replica of every stage — Thinker, Talker, Code2Wav — names
// the instance the plan starts for it, and serve serves.
func TestPlanTalkerPipelineConfigIsServed(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	planned := regexp.MustCompile(`(?m)^# \S+: stage (\d+) \(\w+\), replica (\d+) -> (\S+)$`)
	for _, c := range talkerPlans {
		t.Run(c.name, func(t *testing.T) {
			p, script := vllmPlanServe(t, c.config, c.flags, vllmplan.VLLMOptions{BasePort: freePort(t)})
			doc, err := loadConfig(filepath.Join(p.dir, vllmplan.VLLMConfigFile), p.loadOptions(), io.Discard)
			if err != nil {
				t.Fatalf("serve's options refuse the planned config:\n%s", p.cfg)
			}
			urls := map[string]string{}
			for _, m := range planned.FindAllStringSubmatch(script, -1) {
				urls[m[1]+"/"+m[2]] = m[3]
			}
			n := 0
			for _, s := range doc.Stages {
				for i, r := range s.Replicas {
					n++
					if want := urls[fmt.Sprintf("%d/%d", s.ID, i)]; r.Endpoint == "" || r.Endpoint != want {
						t.Errorf("stage %d (%s) replica %d: endpoint %q, want the planned instance %q", s.ID, s.ModelStage, i, r.Endpoint, want)
					}
				}
			}
			if n != len(urls) || !slices.ContainsFunc(doc.Stages, func(s *deploy.Stage) bool { return s.ModelStage == "code2wav" }) {
				t.Errorf("%d replicas in the config, %d planned instances", n, len(urls))
			}
			p.start(t)
		})
	}
	for _, c := range []struct {
		name, config string
		flags        configFlags
		workload     kube.Workload
	}{
		{"kubernetes_pd_nixl", fixtures + "qwen3_omni_moe.yaml", configFlags{pd: true, connector: kvconnector.NixlConnector}, kube.WorkloadDisaggregatedSet},
		{"kubernetes_colocated", fixtures + "qwen3_omni_moe.yaml", configFlags{}, kube.WorkloadDeployment},
	} {
		t.Run(c.name, func(t *testing.T) {
			kopts := kube.Options{Namespace: kube.DefaultNamespace, NamePrefix: kube.DefaultNamePrefix,
				Image: defaultImage(), VLLMImage: kube.DefaultVLLMImage, StageImage: kube.DefaultStageImage,
				Workload: c.workload, Model: vllmplan.DefaultVLLMModel}
			p, objs := kubePlanServe(t, c.config, c.flags, kopts)
			doc, err := loadConfig(filepath.Join(p.dir, kube.ConfigKey), p.loadOptions(), io.Discard)
			if err != nil {
				t.Fatalf("serve's options refuse the planned config:\n%s", p.cfg)
			}
			services := map[string]bool{}
			for _, o := range objs {
				if svc, ok := o.(*corev1.Service); ok {
					services[fmt.Sprintf("http://%s.%s.svc:%d", svc.Name, svc.Namespace, kube.EnginePort)] = true
				}
			}
			for _, s := range doc.Stages {
				for i, r := range s.Replicas {
					if !services[r.Endpoint] {
						t.Errorf("stage %d (%s) replica %d: endpoint %q is no rendered Service", s.ID, s.ModelStage, i, r.Endpoint)
					}
				}
			}
			p.start(t)
		})
	}
}

// fakeStage stands for a stage worker at a planned endpoint: /health is 503
// until it is ready (the worker's engine loading), and every other path
// requires the deployment secret, as the stage worker's contract says.
type fakeStage struct {
	ready  chan struct{}
	secret string
}

func (f *fakeStage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		select {
		case <-f.ready:
		default:
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+f.secret {
		http.Error(w, `{"error":{"message":"Unauthorized"}}`, http.StatusUnauthorized)
		return
	}
	if r.URL.Path == "/v1/models" {
		io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	http.NotFound(w, r)
}

// serve's /health is ready only when every stage is: with every stage
// worker of the plan but the Talker ready, it is 503 and names the Talker;
// once the Talker is ready too, 200. (Readiness covers every stage's
// instances, those at endpoints serve did not start included: serve adds
// each to its readiness targets, internal/cli/serve.go.)
func TestPlanTalkerPipelineHealthWaitsForEveryStage(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	// Four instances on consecutive ports, each held by its fake from the
	// start, so no other process can answer for them.
	var lns []net.Listener
	for range 50 {
		lns = nil
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, first)
		base := first.Addr().(*net.TCPAddr).Port
		for i := 1; i < 4; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) == 4 {
			break
		}
		for _, ln := range lns {
			ln.Close()
		}
	}
	if len(lns) != 4 {
		t.Fatal("no 4 consecutive free ports")
	}
	base := lns[0].Addr().(*net.TCPAddr).Port
	p, _ := vllmPlanServe(t, fixtures+"qwen3_omni_moe.yaml", configFlags{pd: true, connector: kvconnector.NixlConnector}, vllmplan.VLLMOptions{BasePort: base})
	secret, err := os.ReadFile(filepath.Join(p.dir, vllmplan.VLLMSecretFile))
	if err != nil {
		t.Fatal(err)
	}
	stages := make([]*fakeStage, 4) // prefill, decode, Talker, Code2Wav, in port order
	for i, ln := range lns {
		stages[i] = &fakeStage{ready: make(chan struct{}), secret: strings.TrimSpace(string(secret))}
		srv := &http.Server{Handler: stages[i]}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	for _, i := range []int{0, 1, 3} {
		close(stages[i].ready)
	}
	url, _ := p.start(t)

	// The Thinker's halves and Code2Wav are ready, the Talker is loading.
	status, body := getHealth(t, url)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "stage 2 (talker)") || strings.Contains(body, "code2wav") {
		t.Fatalf("/health with the Talker loading = %d %q; want 503 naming only the Talker", status, body)
	}
	close(stages[2].ready)
	// serve reuses a readiness answer for a second (stageclient.DefaultReadyTTL).
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if status, body = getHealth(t, url); status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health with every stage ready = %d %q; want 200", status, body)
		}
	}
}

// A Thinker the plan leaves colocated runs at its endpoints as one stage,
// which serve, splitting a Thinker by default, must be told to keep: the
// serve command the plans give says --pd=false, for thinker-only pipelines
// as for those with a Talker.
func TestPlanColocatedThinkerIsServedAsPrinted(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	p, _ := vllmPlanServe(t, fixtures+"qwen3_omni_moe_thinking.yaml", configFlags{}, vllmplan.VLLMOptions{BasePort: freePort(t)})
	if !slices.Contains(p.args, "--pd=false") {
		t.Errorf("serve command %q: want --pd=false", p.args)
	}
	p.start(t)
	kopts := kube.Options{Namespace: kube.DefaultNamespace, NamePrefix: kube.DefaultNamePrefix, Workload: kube.WorkloadDeployment}
	k, _ := kubePlanServe(t, fixtures+"qwen3_omni_moe_thinking.yaml", configFlags{}, kopts)
	k.start(t)
}

// stageWorkerPython is the python3 that runs omnipd's stage worker in
// tests: OMNIPD_PYTHON (scripts/test.sh sets it), else the system's.
func stageWorkerPython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("OMNIPD_PYTHON"), "/usr/bin/python3"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("python3"); err == nil {
		return p
	}
	t.Fatal("no python3 (OMNIPD_PYTHON, /usr/bin/python3 or on PATH): the vllm-omni stage worker is Python; install it and run the test again")
	return ""
}

// The whole route as an operator takes it, on omnipd's real stage worker
// over its stand-in for vllm-omni: plan a spoken pipeline, run the script
// (which writes the worker and its vllm-omni deploy config and starts the
// four stage workers), run the serve command it prints, and get a spoken
// answer — text from the Thinker's decode, a WAV through the Talker and
// Code2Wav.
func TestPlannedStageWorkersServeASpokenAnswer(t *testing.T) {
	t.Setenv("OMNIPD_SECRET", "")
	t.Setenv("OMNIPD_API_KEY", "")
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// Free ports for the four instances and for NIXL's side channels.
	var ports []int
	for range 6 {
		ports = append(ports, freePort(t))
	}
	cfg := filepath.Join(dir, "deploy.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "base_config: %s\npd:\n  connector: NixlConnector\n  prefill:\n    kv_port: %d\n  decode:\n    kv_port: %d\n",
		filepath.Join(repo, "deploy/testdata/fixtures/vllm-omni/qwen3_omni_moe.yaml"), ports[4], ports[5]), 0o600); err != nil {
		t.Fatal(err)
	}
	base := freePortRunCLI(t, 4)
	var script, errOut bytes.Buffer
	if err := runPlan(cfg, configFlags{}, vllmplan.VLLMOptions{Model: "standin-model", BasePort: base}, &script, &errOut); err != nil {
		t.Fatalf("plan: %v\n%s", err, errOut.String())
	}
	line := runLaunchScript(t, repo, dir, script.Bytes(), base, 4)
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != "omnipd" {
		t.Fatalf("launch.sh printed %q to run next", line)
	}
	p := plannedServe{dir: dir}
	for i := 1; i < len(fields); i++ {
		p.args = append(p.args, fields[i])
		if fields[i] == "--config" || fields[i] == "--secret-file" {
			p.args = append(p.args, filepath.Join(dir, fields[i+1]))
			i++
		}
	}
	url, _ := p.start(t)
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"standin-model","messages":[{"role":"user","content":"Hello!"}],"max_tokens":8}`))
	if err != nil {
		t.Fatal(err)
	}
	status, body := roundTrip(t, req)
	var answer struct {
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
				Audio   *struct {
					Data string `json:"data"`
				} `json:"audio"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &answer); status != http.StatusOK || err != nil {
		t.Fatalf("chat completion: %d %v\n%.600s", status, err, body)
	}
	var text, wav bool
	for _, c := range answer.Choices {
		text = text || c.Message.Content != nil && *c.Message.Content != ""
		wav = wav || c.Message.Audio != nil && strings.HasPrefix(c.Message.Audio.Data, "UklGR") // "RIFF"
	}
	if !text || !wav {
		t.Errorf("the answer has text %v and a WAV %v; want both:\n%.600s", text, wav, body)
	}
}

// freePortRunCLI is a port p with p..p+n-1 free, for a plan of n instances.
func freePortRunCLI(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		var held []net.Listener
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, first)
		p := first.Addr().(*net.TCPAddr).Port
		for i := 1; i < n; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
			if err != nil {
				break
			}
			held = append(held, ln)
		}
		for _, ln := range held {
			ln.Close()
		}
		if len(held) == n {
			return p
		}
	}
	t.Fatalf("no %d adjacent free ports", n)
	return 0
}
