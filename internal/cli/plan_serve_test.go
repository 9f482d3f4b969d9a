package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kube"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/launch"
	"github.com/omnipd/omnipd/topology"
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
			opts := launch.VLLMOptions{BasePort: freePort(t)}
			if err := runPlan(fixtures+"qwen3_omni_moe_thinking.yaml", flags, opts, &script, &errOut); err != nil {
				t.Fatalf("plan --target vllm --pd --connector %s: %v\n%s", connector, err, errOut.String())
			}
			cfg, ok := heredoc(script.String(), launch.VLLMConfigFile)
			if !ok {
				t.Fatalf("the plan writes no %s:\n%s", launch.VLLMConfigFile, script.String())
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
		{"../../launch/testdata/thinking_epd_nixl.yaml", kvconnector.NixlConnector},
		{"../../launch/testdata/thinking_2e2p1d_mooncake.yaml", kvconnector.MooncakeConnector},
	} {
		t.Run(filepath.Base(c.config), func(t *testing.T) {
			var script, errOut bytes.Buffer
			if err := runPlan(c.config, configFlags{}, launch.VLLMOptions{BasePort: freePort(t)}, &script, &errOut); err != nil {
				t.Fatalf("plan --target vllm: %v\n%s", err, errOut.String())
			}
			if !strings.Contains(script.String(), "--ec-transfer-config") {
				t.Fatalf("the plan starts no encoder:\n%s", script.String())
			}
			cfg, ok := heredoc(script.String(), launch.VLLMConfigFile)
			if !ok {
				t.Fatalf("the plan writes no %s:\n%s", launch.VLLMConfigFile, script.String())
			}
			out := wantServed(t, c.connector, cfg)
			if !strings.Contains(out, "encoder over ECExampleConnector") {
				t.Errorf("serve does not say it routes through the encoder:\n%s", out)
			}

			var objects bytes.Buffer
			errOut.Reset()
			kopts := kube.Options{Namespace: kube.DefaultNamespace, NamePrefix: kube.DefaultNamePrefix,
				Image: defaultImage(), VLLMImage: kube.DefaultVLLMImage, Workload: kube.WorkloadDisaggregatedSet,
				Model: launch.DefaultVLLMModel}
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
	opts := launch.VLLMOptions{BasePort: freePort(t)}
	if err := runPlan("../../launch/testdata/dp_nixl.yaml", configFlags{}, opts, &script, &errOut); err != nil {
		t.Fatalf("plan --target vllm of a DP NIXL config: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(script.String(), "--data-parallel-size 2") {
		t.Fatalf("the plan starts no DP instance:\n%s", script.String())
	}
	cfg, ok := heredoc(script.String(), launch.VLLMConfigFile)
	if !ok {
		t.Fatalf("the plan writes no %s:\n%s", launch.VLLMConfigFile, script.String())
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
	opts := launch.VLLMOptions{BasePort: freePort(t)}
	if err := runPlan(deployCfg, configFlags{pd: true}, opts, &script, &errOut); err != nil {
		t.Fatalf("plan --target vllm: %v\n%s", err, errOut.String())
	}
	cfg, ok := heredoc(script.String(), launch.VLLMConfigFile)
	if !ok {
		t.Fatalf("the plan writes no %s:\n%s", launch.VLLMConfigFile, script.String())
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
				Model: launch.DefaultVLLMModel}
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
	path := filepath.Join(t.TempDir(), launch.VLLMConfigFile)
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
			host: "127.0.0.1", port: 0, drain: time.Second, model: launch.DefaultVLLMModel,
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
