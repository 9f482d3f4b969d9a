package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/omnipd/omnipd/deploy"
)

// noFiles is a ReadFile under which every base_config is missing, so that
// fuzzed input never reads the disk.
func noFiles(string) ([]byte, error) { return nil, os.ErrNotExist }

// fuzzSeeds are small configs that reach the loader's less common paths:
// aliases and merge keys, flow style, legacy schema, platforms, pd:, and
// explicit replicas.
var fuzzSeeds = []string{
	validPDConfig,
	valid3Config,
	validEPDConfig,
	`
pd:
  connector: MooncakeConnector
  prefill: {num_replicas: 2}
  encoder: {num_replicas: 2, tensor_parallel_size: 1, ec_connector_extra_config: {shared_storage_path: /x}, engine_args: {mm_encoder_only: true}}
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
	multiMistake,
	`
pipeline: qwen3_omni_moe_thinker
stages:
  - {stage_id: 0, devices: "0,1", tensor_parallel_size: 2}
`,
	`
defaults: &d
  gpu_memory_utilization: 0.5
  devices: "0"
stages:
  - <<: *d
    stage_id: 0
  - <<: *d
    stage_id: 1
    devices: "1"
  - stage_id: 2
    devices: "1"
`,
	`
pd:
  connector: NixlConnector
  devices: "0-5"
  kv_buffer_size: 1e9
  prefill: {num_replicas: 2}
  decode: {num_replicas: 1, kv_port: 7000}
  min_prefill_tokens: 16
stages:
  - stage_id: 0
    env: {VLLM_LOGGING_LEVEL: DEBUG}
  - stage_id: 1
  - stage_id: 2
platforms:
  npu:
    stages:
      - stage_id: 0
        devices: "0,1"
        tensor_parallel_size: 2
`,
	`
async_chunk: true
stage_args:
  - stage_id: 0
    runtime: {devices: "0", max_batch_size: 8}
    engine_args: {model_stage: thinker, tensor_parallel_size: 1}
  - stage_id: 1
    engine_input_source: [0]
  - stage_id: 2
    engine_input_source: [1]
runtime:
  connectors:
    shm: {name: SharedMemoryConnector}
`,
	`
stages:
  - stage_id: 0
    num_replicas: 2
    replicas:
      - {devices: "0", engine_id: a, kv_port: 9000, endpoint: "http://a:8000"}
      - {devices: "1", engine_id: b, kv_port: 9001, endpoint: "http://b:8000"}
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_buffer_size: 5e9
      future_vllm_key: 1
  - stage_id: 1
    final_output: true
    final_output_type: audio
  - stage_id: 2
`,
}

// FuzzLoad feeds arbitrary bytes to the loader. Load must never panic; when it
// accepts a config, printing the document must give a config that loads back
// to the same printout, and the JSON form must be valid JSON.
func FuzzLoad(f *testing.F) {
	for _, pattern := range []string{"../../shared/fixtures/vllm-omni/*.yaml", "testdata/fixtures/vllm-omni/*.yaml"} {
		paths, _ := filepath.Glob(pattern)
		for _, p := range paths {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	for _, s := range fuzzSeeds {
		f.Add(inline(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, opts := range []deploy.Options{{ReadFile: noFiles}, {ReadFile: noFiles, PD: true}} {
			withWatchdog(t, func() { checkLoadRoundTrip(t, data, opts) })
		}
	})
}

// loadWatchdog turns a Load that never returns into a failure the fuzzer
// records, instead of a fuzzer that silently stops making progress. Seeds
// load in milliseconds; this is a hang detector, not a timing assertion.
const loadWatchdog = 30 * time.Second

func withWatchdog(t *testing.T, check func()) {
	t.Helper()
	done := make(chan struct{})
	var panicked any
	go func() {
		defer close(done)
		defer func() { panicked = recover() }()
		check()
	}()
	select {
	case <-done:
		if panicked != nil {
			panic(panicked)
		}
	case <-time.After(loadWatchdog):
		t.Fatalf("Load did not return within %v", loadWatchdog)
	}
}

// checkLoadRoundTrip loads data; when the loader accepts it, the printed
// document must load back to the same printout.
func checkLoadRoundTrip(t *testing.T, data []byte, opts deploy.Options) {
	doc, _, err := deploy.Load("deploy.yaml", data, opts)
	if err != nil {
		var es deploy.Errors
		if !errors.As(err, &es) || len(es) == 0 {
			t.Fatalf("PD=%v: Load error is %T %v, want a non-empty deploy.Errors", opts.PD, err, err)
		}
		if doc != nil {
			t.Fatalf("PD=%v: Load returned a document together with errors", opts.PD)
		}
		return
	}
	if doc == nil {
		t.Fatalf("PD=%v: Load returned neither a document nor an error", opts.PD)
	}
	printed, err := doc.Node().MarshalYAML()
	if err != nil {
		t.Fatalf("PD=%v: print: %v", opts.PD, err)
	}
	js, err := doc.Node().MarshalJSON()
	if err != nil {
		t.Fatalf("PD=%v: print JSON: %v", opts.PD, err)
	}
	if !json.Valid(js) {
		t.Fatalf("PD=%v: printed JSON is not valid:\n%s", opts.PD, js)
	}
	// The printout is a complete config (its pd: section included), so it
	// reloads without flags. Regressions the fuzzer found here are kept in
	// testdata/fuzz/FuzzLoad: a top-level stage key (stage_id:, replicas:) was
	// copied into every stage's engine_args and did not survive the reload.
	again, _, err := deploy.Load("deploy.yaml", printed, deploy.Options{ReadFile: noFiles})
	if err != nil {
		t.Fatalf("PD=%v: the printed config does not load:\n%v\nprinted:\n%s", opts.PD, err, printed)
	}
	reprinted, err := again.Node().MarshalYAML()
	if err != nil {
		t.Fatalf("PD=%v: print again: %v", opts.PD, err)
	}
	if !bytes.Equal(printed, reprinted) {
		t.Fatalf("PD=%v: printing is not idempotent:\nfirst:\n%s\nsecond:\n%s", opts.PD, printed, reprinted)
	}
}
