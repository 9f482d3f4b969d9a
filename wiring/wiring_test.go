package wiring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omnipd/omnipd/audio"
	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/orchestrator"
	"github.com/omnipd/omnipd/topology"
)

func load(t *testing.T, config string) *deploy.Document {
	t.Helper()
	doc, _, err := deploy.Load("deploy.yaml", []byte(config), deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// fakeLauncher "starts" each replica at a URL of its pool's name, with a
// KV port of 9000 plus the number of replicas launched before it.
type fakeLauncher struct{ launched []string }

func (f *fakeLauncher) Launch(_ context.Context, r Replica) (Address, error) {
	name := fmt.Sprintf("%s-%d", r.Pool, r.Index)
	f.launched = append(f.launched, name)
	return Address{URL: "http://" + name + ":80", KVPort: 9000 + len(f.launched) - 1}, nil
}

var _ Launcher = (*fakeLauncher)(nil)

// wired is what a test compares of a runtime: each role's pool as
// "name: instance HTTP addresses", and the settings read from the config.
type wired struct {
	decode, prefill, encoder string
	contract                 string
	retries, minPrefill      int
	fallbackLocal            bool
	omni                     *orchestrator.Omni // pools left out
	ready                    []string
}

func describePool(p *orchestrator.Pool) string {
	if p == nil {
		return ""
	}
	var addrs []string
	for _, in := range p.Instances {
		addrs = append(addrs, in.Peer.HTTPAddr)
	}
	return p.Name + ": " + strings.Join(addrs, " ")
}

func summarize(rt *Runtime) wired {
	c := rt.Config
	w := wired{decode: describePool(c.Decode), prefill: describePool(c.Prefill), encoder: describePool(c.Encoder),
		retries: c.PrefillRetries, minPrefill: c.MinPrefillTokens, fallbackLocal: c.FallbackLocal}
	if c.Contract != nil {
		w.contract = c.Contract.Name()
	}
	if c.Omni != nil {
		om := *c.Omni
		om.Talker, om.Code2Wav = nil, nil
		w.omni = &om
	}
	for _, r := range rt.Readiness.Targets {
		w.ready = append(w.ready, r.Stage)
	}
	return w
}

func TestBuildTranslatesTheConfig(t *testing.T) {
	for _, tt := range []struct {
		name, config string
		want         wired
		launched     []string
	}{{
		name: "a colocated Thinker at an endpoint",
		config: `pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    endpoints: ["http://thinker.example:8000"]
`,
		want: wired{decode: "thinker: thinker.example:8000", ready: []string{"stage 0 (thinker)"}},
	}, {
		name: "PD over Mooncake at endpoints",
		config: `pipeline: qwen3_omni_moe_thinker
pd:
  min_prefill_tokens: 32
  prefill_retries: 2
  fallback: local
stages:
  - stage_id: 0
    is_prefill_only: true
    endpoints: ["http://p0.example:8100", "http://p1.example:8100"]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      kv_connector_extra_config:
        mooncake_bootstrap_port: 8998
  - stage_id: 1
    is_decode_only: true
    endpoints: ["http://d0.example:8200"]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
`,
		want: wired{prefill: "thinker-prefill: p0.example:8100 p1.example:8100", decode: "thinker-decode: d0.example:8200",
			contract: "MooncakeConnector", retries: 2, minPrefill: 32, fallbackLocal: true,
			ready: []string{"stage 0 (thinker-prefill)", "stage 0 (thinker-prefill)", "stage 1 (thinker-decode)"}},
	}, {
		name: "the spoken pipeline, launched, with the audio stages' settings",
		config: `pipeline: qwen3_omni_moe
async_chunk: true
connectors:
  stage_shm:
    name: SharedMemoryConnector
    extra:
      initial_codec_chunk_frames: 4
      codec_chunk_frames: 25
      codec_left_context_frames: 10
pd:
  connector: ReferenceConnector
stages:
  - stage_id: 0
    engine_args:
      accept_hidden_layer: 3
  - stage_id: 1
    input_connectors:
      from_stage_0: stage_shm
    default_sampling_params:
      temperature: 0.7
      top_k: 20
      max_tokens: 300
  - stage_id: 2
    input_connectors:
      from_stage_1: stage_shm
`,
		want: wired{prefill: "thinker-prefill: thinker-prefill-0:80", decode: "thinker-decode: thinker-decode-0:80",
			contract: "ReferenceConnector", retries: 1,
			omni: &orchestrator.Omni{ConditioningLayer: 3, Temperature: 0.7, TopK: 20, MaxFrames: 300, AsyncChunk: true,
				Chunking: audio.Chunker{Initial: 4, Size: 25, LeftContext: 10}},
			ready: []string{"stage 0 (thinker-prefill)", "stage 1 (thinker-decode)", "stage 2 (talker)", "stage 3 (code2wav)"}},
		launched: []string{"thinker-prefill-0", "thinker-decode-0", "talker-0", "code2wav-0"},
	}, {
		name: "the spoken pipeline without settings: the reference Talker's layer, batch hand-off",
		config: `pipeline: qwen3_omni_moe
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		want: wired{decode: "thinker: thinker-0:80",
			omni:  &orchestrator.Omni{ConditioningLayer: referenceConditioningLayer},
			ready: []string{"stage 0 (thinker)", "stage 1 (talker)", "stage 2 (code2wav)"}},
		launched: []string{"thinker-0", "talker-0", "code2wav-0"},
	}, {
		name: "E/P/D with two encoders",
		config: `pipeline: qwen3_omni_moe_thinker
pd:
  connector: ReferenceConnector
  prefill_retries: 0
  encoder:
    num_replicas: 2
stages:
  - stage_id: 0
`,
		want: wired{encoder: "thinker-encoder: thinker-encoder-0:80 thinker-encoder-1:80",
			prefill: "thinker-prefill: thinker-prefill-0:80", decode: "thinker-decode: thinker-decode-0:80",
			contract: "ReferenceConnector",
			ready:    []string{"stage 0 (thinker-encoder)", "stage 0 (thinker-encoder)", "stage 1 (thinker-prefill)", "stage 2 (thinker-decode)"}},
		launched: []string{"thinker-encoder-0", "thinker-encoder-1", "thinker-prefill-0", "thinker-decode-0"},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			launcher := &fakeLauncher{}
			rt, err := Build(t.Context(), load(t, tt.config), Options{Launcher: launcher, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			got := summarize(rt)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("wired\n %+v (omni %+v)\nwant\n %+v (omni %+v)", got, got.omni, tt.want, tt.want.omni)
			}
			if !slices.Equal(launcher.launched, tt.launched) {
				t.Errorf("launched %q, want %q", launcher.launched, tt.launched)
			}
			if rt.Orchestrator == nil {
				t.Error("no orchestrator")
			}
		})
	}
}

// A launched Thinker's peer names the KV port its Launcher reports, not
// the config's, and every instance's client carries the secret.
func TestBuildGivesLaunchedPeersTheirKVPort(t *testing.T) {
	doc := load(t, "pipeline: qwen3_omni_moe_thinker\npd:\n  connector: ReferenceConnector\nstages:\n  - stage_id: 0\n")
	rt, err := Build(t.Context(), doc, Options{Launcher: &fakeLauncher{}, Secret: "s3cret", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	prefill, decode := rt.Config.Prefill.Instances[0].Peer, rt.Config.Decode.Instances[0].Peer
	if prefill.KVPort != 9000 || decode.KVPort != 9001 {
		t.Errorf("KV ports %d, %d; want the launched 9000, 9001 (the config's: %d, %d)",
			prefill.KVPort, decode.KVPort, doc.Stages[0].Replicas[0].KVPort, doc.Stages[1].Replicas[0].KVPort)
	}
	if prefill.EngineID != doc.Stages[0].Replicas[0].EngineID || prefill.KVHost != "127.0.0.1" {
		t.Errorf("prefill peer %+v: want the config's engine id %q on 127.0.0.1", prefill, doc.Stages[0].Replicas[0].EngineID)
	}
}

func TestBuildOptions(t *testing.T) {
	doc := load(t, "pipeline: qwen3_omni_moe\npd:\n  connector: ReferenceConnector\nstages:\n  - stage_id: 0\n  - stage_id: 1\n  - stage_id: 2\n")
	launcher := &fakeLauncher{}
	rt, err := Build(t.Context(), doc, Options{
		Launcher: launcher, MaxStageQueue: 7, StageIdleTimeout: -1, PrefillTimeout: 3 * time.Second,
		PoolName: func(s *deploy.Stage) string { return "p" + fmt.Sprint(s.ID) },
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if rt.Config.StageIdleTimeout != -1 || rt.Config.PrefillTimeout != 3*time.Second {
		t.Errorf("timeouts %v, %v; want -1, 3s", rt.Config.StageIdleTimeout, rt.Config.PrefillTimeout)
	}
	var names []string
	for _, p := range rt.Pools {
		names = append(names, p.Name)
		if p.MaxQueue != 7 {
			t.Errorf("pool %s: MaxQueue %d, want 7", p.Name, p.MaxQueue)
		}
	}
	if want := []string{"p0", "p1", "p2", "p3"}; !slices.Equal(names, want) || !slices.Equal(launcher.launched, []string{"p0-0", "p1-0", "p2-0", "p3-0"}) {
		t.Errorf("pools %q, launched %q; want %q", names, launcher.launched, want)
	}
	if rt.Config.Metrics == nil {
		t.Error("no metrics registry")
	}
}

// An engine at an endpoint whose config names no KV port is named at its
// connector's default port, and the operator is told so.
func TestBuildSaysWhichKVPortItChose(t *testing.T) {
	doc := load(t, `pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    is_prefill_only: true
    endpoints: ["http://p0.example:8100"]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    is_decode_only: true
    endpoints: ["http://d0.example:8200"]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
`)
	if doc.Stages[0].Replicas[0].KVPort != 0 {
		t.Fatalf("the config resolves a KV port (%d): nothing is left to choose", doc.Stages[0].Replicas[0].KVPort)
	}
	var out bytes.Buffer
	rt, err := Build(t.Context(), doc, Options{Out: &out, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	port := rt.Config.Prefill.Instances[0].Peer.KVPort
	if port == 0 || !strings.Contains(out.String(), fmt.Sprintf("stage 0 (thinker-prefill): http://p0.example:8100 names no KV port; using MooncakeConnector's default, %d", port)) {
		t.Errorf("KV port %d; said %q", port, out.String())
	}
}

func TestBuildRefuses(t *testing.T) {
	failing := LauncherFunc(func(context.Context, Replica) (Address, error) { return Address{}, errors.New("no room") })
	for _, tt := range []struct {
		name string
		doc  *deploy.Document
		o    Options
		want string
	}{
		{"a replica nothing starts", load(t, "pipeline: qwen3_omni_moe_thinker\nstages:\n  - stage_id: 0\n"), Options{},
			"stage 0 (thinker): replica 0 has no endpoint, and nothing starts it"},
		{"a launch that fails", load(t, "pipeline: qwen3_omni_moe_thinker\nstages:\n  - stage_id: 0\n"), Options{Launcher: failing},
			"no room"},
		{"a model stage omnipd cannot serve", &deploy.Document{Stages: []*deploy.Stage{{ID: 3, ModelStage: "vae", Role: topology.RoleFull}}}, Options{},
			`stage 3: omnipd cannot serve model stage "vae"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Build(t.Context(), tt.doc, tt.o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestWorkerKVConfig(t *testing.T) {
	doc := load(t, `pipeline: qwen3_omni_moe_thinker
pd:
  connector: ReferenceConnector
  kv_connector_extra_config:
    handshake: push
    lease_seconds: 1.5
    shared_memory: false
stages:
  - stage_id: 0
`)
	s := doc.Stages[0]
	got, err := WorkerKVConfig(s, topology.Replica{EngineID: "p-0", KVPort: 4242})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"engine_id":"p-0","kv_connector":"ReferenceConnector","kv_connector_extra_config":{"handshake":"push","lease_seconds":1.5,"shared_memory":false},"kv_ip":"127.0.0.1","kv_port":4242,"kv_role":"kv_producer"}`
	if got != want {
		t.Errorf("kv config\n %s\nwant\n %s", got, want)
	}
	if got, err := WorkerKVConfig(&deploy.Stage{ModelStage: "talker"}, topology.Replica{}); got != "" || err != nil {
		t.Errorf("a stage without KV: %q, %v", got, err)
	}
	nixl := &deploy.Stage{ID: 1, KV: &deploy.KVConfig{Connector: "MooncakeConnector", Role: "kv_producer"}}
	if _, err := WorkerKVConfig(nixl, topology.Replica{}); err == nil || !strings.Contains(err.Error(), "reference workers cannot run") {
		t.Errorf("NIXL on a reference worker: %v", err)
	}
}
