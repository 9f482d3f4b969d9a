package deploy_test

import (
	"bytes"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
)

// validEPDConfig is thinker-only E/P/D written out: encoder on device 0,
// prefill on 1, decode on 2; ECExampleConnector from the encoder to the
// prefill, Mooncake from the prefill to the decode.
const validEPDConfig = `
pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    is_encoder_only: true
    devices: "0"
    ec_transfer_config:
      ec_connector: ECExampleConnector
      ec_role: ec_producer
  - stage_id: 1
    is_prefill_only: true
    devices: "1"
    ec_transfer_config:
      ec_connector: ECExampleConnector
      ec_role: ec_consumer
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 2
    is_decode_only: true
    devices: "2"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
`

// epd returns validEPDConfig with each old string replaced by its new one
// (pairs), failing loudly when one is not there.
func epd(pairs ...string) string {
	cfg := validEPDConfig
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(cfg, pairs[i]) {
			panic("epd: no " + pairs[i])
		}
		cfg = strings.Replace(cfg, pairs[i], pairs[i+1], 1)
	}
	return cfg
}

// encoderTopologyCases reach every encoder violation code from a config;
// TestViolationCodesCovered counts them with topologyCases.
var encoderTopologyCases = []errorCase{
	{
		name: "unknown ec_role",
		cfg:  epd("ec_role: ec_consumer", "ec_role: bogus"),
		line: 14, col: 16, path: "stages[1].ec_transfer_config.ec_role", code: topology.CodeECRoleInvalid, msg: `"bogus" is unknown`,
	},
	{
		name: "ec_transfer_config without ec_connector",
		cfg:  epd("    ec_transfer_config:\n      ec_connector: ECExampleConnector\n      ec_role: ec_consumer", "    ec_transfer_config:\n      ec_role: ec_consumer"),
		line: 13, col: 7, path: "stages[1].ec_transfer_config.ec_connector", code: topology.CodeECConnectorMissing, msg: "needs an ec_connector",
	},
	{
		name: "encoder in front of a Thinker that is not split",
		cfg: `
pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    is_encoder_only: true
    devices: "0"
    ec_transfer_config:
      ec_connector: ECExampleConnector
      ec_role: ec_producer
  - stage_id: 1
    model_stage: thinker
    devices: "1"
`,
		line: 4, col: 22, path: "stages[0].is_encoder_only", code: topology.CodeEncoderWithoutPD, msg: "split the Thinker into prefill and decode",
	},
	{
		name: "two encoder stages",
		cfg: epd("  - stage_id: 1\n    is_prefill_only: true\n", `  - stage_id: 5
    is_encoder_only: true
    devices: "5"
    ec_transfer_config:
      ec_connector: ECExampleConnector
      ec_role: ec_producer
  - stage_id: 1
    is_prefill_only: true
    input_sources: [0]
`),
		line: 10, col: 22, path: "stages[1].is_encoder_only", code: topology.CodeEncoderDuplicate, msg: "stage 0 is already the encoder stage",
	},
	{
		name: "is_encoder_only on the talker",
		cfg:  strings.Replace(validPDConfig, "    model_stage: talker\n", "    model_stage: talker\n    is_encoder_only: true\n", 1),
		line: 31, col: 22, path: "stages[2].is_encoder_only", code: topology.CodeEncoderNotCapable, msg: "stage 2 (talker) cannot be an encoder stage",
	},
	{
		name: "encoder reads from a stage",
		cfg: `
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
    is_encoder_only: true
    devices: "0"
    input_sources: [3]
    ec_transfer_config:
      ec_connector: ReferenceECConnector
      ec_role: ec_producer
  - stage_id: 1
    is_prefill_only: true
    devices: "1"
    ec_transfer_config:
      ec_connector: ReferenceECConnector
      ec_role: ec_consumer
    kv_transfer_config:
      kv_connector: ReferenceConnector
      kv_role: kv_producer
  - stage_id: 2
    is_decode_only: true
    devices: "2"
    kv_transfer_config:
      kv_connector: ReferenceConnector
      kv_role: kv_consumer
  - stage_id: 3
    model_stage: talker
    devices: "3"
    input_sources: []
  - stage_id: 4
    model_stage: code2wav
    devices: "3"
    input_sources: [3]
`,
		line: 8, col: 20, path: "stages[0].input_sources", code: topology.CodeEncoderHasInputs, msg: "reads from no stage",
	},
	{
		name: "encoder is a final output",
		cfg:  epd(`    devices: "0"`, "    devices: \"0\"\n    final_output: true\n    final_output_type: text"),
		line: 6, col: 19, path: "stages[0].final_output", code: topology.CodeEncoderFinalOutput, msg: "make the decode stage final instead",
	},
	{
		name: "the prefill does not read from the encoder",
		cfg:  epd(`    devices: "1"`, "    devices: \"1\"\n    input_sources: []"),
		line: 3, col: 5, path: "stages[0]", code: topology.CodeEncoderFeedsNothing, msg: "list 0 in the prefill's input_sources",
	},
	{
		name: "the decode reads from the encoder",
		cfg:  epd(`    devices: "2"`, "    devices: \"2\"\n    input_sources: [1, 0]"),
		line: 21, col: 24, path: "stages[2].input_sources[1]", code: topology.CodeEncoderFeedsNonPrefill, msg: "the decode reads from the prefill alone",
	},
	{
		name: "encoder without ec_transfer_config",
		cfg:  epd("    devices: \"0\"\n    ec_transfer_config:\n      ec_connector: ECExampleConnector\n      ec_role: ec_producer\n", "    devices: \"0\"\n"),
		line: 4, col: 22, path: "stages[0].ec_transfer_config", code: topology.CodeEncoderECMissing, msg: "ec_role ec_producer",
	},
	{
		name: "encoder is an ec_consumer",
		cfg:  epd("ec_role: ec_producer", "ec_role: ec_consumer"),
		line: 8, col: 16, path: "stages[0].ec_transfer_config.ec_role", code: topology.CodeEncoderECRole, msg: `"ec_consumer" on an encoder stage; want ec_producer`,
	},
	{
		name: "EC connector omnipd cannot run",
		cfg:  epd("ec_connector: ECExampleConnector", "ec_connector: SHMConnector", "ec_connector: ECExampleConnector", "ec_connector: SHMConnector"),
		line: 7, col: 21, path: "stages[0].ec_transfer_config.ec_connector", code: topology.CodeEncoderECConnectorUnknown, msg: `"SHMConnector"`,
	},
	{
		name: "prefill without ec_transfer_config",
		cfg:  epd("    ec_transfer_config:\n      ec_connector: ECExampleConnector\n      ec_role: ec_consumer\n", ""),
		line: 10, col: 22, path: "stages[1].ec_transfer_config", code: topology.CodeEncoderPrefillECMissing, msg: "ec_role ec_consumer",
	},
	{
		name: "prefill is an ec_producer",
		cfg:  epd("ec_role: ec_consumer", "ec_role: ec_producer"),
		line: 14, col: 16, path: "stages[1].ec_transfer_config.ec_role", code: topology.CodeEncoderPrefillECRole, msg: "want ec_consumer or ec_both",
	},
	{
		name: "encoder and prefill EC connectors differ",
		cfg:  epd("ec_connector: ECExampleConnector\n      ec_role: ec_consumer", "ec_connector: ReferenceECConnector\n      ec_role: ec_consumer"),
		line: 13, col: 21, path: "stages[1].ec_transfer_config.ec_connector", code: topology.CodeEncoderECConnectorMismatch, msg: `"ReferenceECConnector" differs from the encoder's "ECExampleConnector"`,
	},
	{
		name: "encoder and prefill name different shared storage",
		cfg:  epd("ec_role: ec_producer", "ec_role: ec_producer\n      ec_connector_extra_config:\n        shared_storage_path: /mnt/ec"),
		line: 15, col: 7, path: "stages[1].ec_transfer_config.ec_connector_extra_config.shared_storage_path", code: topology.CodeEncoderECStoreMismatch,
		msg: `"/tmp" differs from the encoder's "/mnt/ec"`,
	},
	{
		name: "encoder on the prefill's device",
		cfg:  epd(`    devices: "0"`, `    devices: "1"`),
		line: 5, col: 14, path: "stages[0].devices", code: topology.CodeEncoderDevicesOverlap, msg: "the encoder and the prefill both use device 1",
	},
	{
		name: "encoder replica without an engine id",
		cfg:  epd(`    devices: "0"`, "    replicas:\n      - devices: \"0\""),
		line: 6, col: 9, path: "stages[0].replicas[0].engine_id", code: topology.CodeEncoderEngineIDMissing, msg: "needs an engine_id",
	},
	{
		name: "encoder takes the prefill's engine id",
		cfg:  epd("ec_role: ec_producer", "ec_role: ec_producer\n      engine_id: thinker-prefill"),
		line: 9, col: 18, path: "stages[0].ec_transfer_config.engine_id", code: topology.CodeEncoderEngineIDDuplicate, msg: `"thinker-prefill" is already used by the prefill's replicas[0]`,
	},
}

// encoderLoaderCases are the loader's own errors about encoder settings.
var encoderLoaderCases = []errorCase{
	{
		name: "pd.encoder unknown key",
		cfg: `
pd:
  encoder:
    num_replica: 2
stages:
  - stage_id: 0
`,
		line: 3, col: 5, path: "pd.encoder.num_replica", msg: `did you mean "num_replicas"?`,
	},
	{
		name: "pd.encoder unknown EC connector",
		cfg: `
pd:
  encoder:
    ec_connector: ECSharedStorageConnector
stages:
  - stage_id: 0
`,
		line: 3, col: 19, path: "pd.encoder.ec_connector", msg: `unknown EC connector "ECSharedStorageConnector"; omnipd can configure "ECExampleConnector", "ReferenceECConnector"`,
	},
	{
		name: "pd.encoder is not a mapping",
		cfg: `
pd:
  encoder: 2
stages:
  - stage_id: 0
`,
		line: 2, col: 12, path: "pd.encoder", msg: "want a mapping",
	},
	{
		name: "pd.encoder with pd disabled",
		cfg: `
pd:
  enabled: false
  encoder:
    num_replicas: 1
stages:
  - stage_id: 0
`,
		line: 4, col: 5, path: "pd.encoder", msg: "needs the prefill/decode split",
	},
	{
		name: "pd.encoder on stages already split without an encoder",
		cfg:  "\npd:\n  encoder: {}\n" + strings.TrimPrefix(validPDConfig, "\n"),
		line: 2, col: 12, path: "pd.encoder", msg: "without an encoder stage, so omnipd cannot add one",
	},
	{
		name: "pd.encoder.ec_connector conflicts with the encoder stage",
		cfg:  "\npd:\n  encoder:\n    ec_connector: ReferenceECConnector\n" + strings.TrimPrefix(validEPDConfig, "\n"),
		line: 3, col: 19, path: "pd.encoder.ec_connector", msg: "already uses ECExampleConnector; ReferenceECConnector conflicts",
	},
	{
		name: "pd: beside a hand-written encoder and an unsplit Thinker",
		cfg: `
pd:
  connector: NixlConnector
pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    is_encoder_only: true
    ec_transfer_config:
      ec_connector: ECExampleConnector
      ec_role: ec_producer
  - stage_id: 1
    model_stage: thinker
`,
		line: 2, col: 3, path: "pd", msg: "splits the Thinker only as a whole",
	},
	{
		name: "is_encoder_only and is_prefill_only",
		cfg:  epd("    is_prefill_only: true\n", "    is_prefill_only: true\n    is_encoder_only: true\n"),
		line: 11, col: 22, path: "stages[1].is_encoder_only", msg: "cannot be both is_encoder_only and is_prefill_only",
	},
	{
		name: "ec_port out of range",
		cfg:  epd("ec_role: ec_producer", "ec_role: ec_producer\n      ec_port: 70000"),
		line: 9, col: 16, path: "stages[0].ec_transfer_config.ec_port", msg: "port 70000 is outside 1-65535",
	},
	{
		name: "ec_transfer_config is not a mapping",
		cfg:  epd("    ec_transfer_config:\n      ec_connector: ECExampleConnector\n      ec_role: ec_producer\n", "    ec_transfer_config: ECExampleConnector\n"),
		line: 6, col: 25, path: "stages[0].ec_transfer_config", msg: "want a mapping",
	},
}

func TestLoadEncoderErrors(t *testing.T) {
	for _, group := range []struct {
		name  string
		cases []errorCase
	}{{"topology", encoderTopologyCases}, {"loader", encoderLoaderCases}} {
		t.Run(group.name, func(t *testing.T) {
			for _, c := range group.cases {
				t.Run(c.name, func(t *testing.T) { checkOneError(t, c) })
			}
		})
	}
}

func TestLoadValidEPD(t *testing.T) {
	doc, warnings, errs := loadInline(t, validEPDConfig, deploy.Options{})
	if errs != nil {
		t.Fatalf("valid E/P/D config: %v", errs)
	}
	// Written by hand without the encoder's required engine arguments.
	var paths []string
	for _, w := range warnings {
		paths = append(paths, w.Path)
	}
	if want := []string{"stages[0].enforce_eager", "stages[0].enable_prefix_caching"}; !slices.Equal(paths, want) {
		t.Errorf("warnings at %v, want %v", paths, want)
	}
	e := doc.EncoderStage()
	if e == nil || e.ID != 0 || e.Role != topology.RoleEncoder {
		t.Fatalf("EncoderStage = %+v, want stage 0 with role encoder", e)
	}
	if doc.PD == nil || doc.PD.ECConnector != "ECExampleConnector" || doc.PD.Connector != "MooncakeConnector" {
		t.Errorf("PD = %+v, want Mooncake with ECExampleConnector", doc.PD)
	}
	if got := doc.Stages[1].InputSources; !slices.Equal(got, []int{0}) {
		t.Errorf("the prefill reads from %v, want [0] (the encoder, by default)", got)
	}
	if got := e.Replicas[0].EngineID; got != "thinker-encoder" {
		t.Errorf("encoder engine id %q, want thinker-encoder", got)
	}
	if dir, ok := deploy.ECSharedStorage(e); !ok || dir != "/tmp" {
		t.Errorf("ECSharedStorage = %q, %v; want vLLM's default /tmp", dir, ok)
	}
}

// expandEPD loads the Qwen3-Omni fixture with pd: written over it.
func expandEPD(t *testing.T, pd string, opts deploy.Options) *deploy.Document {
	t.Helper()
	cfg := "\nbase_config: fixture.yaml\npd:\n" + pd
	fixture, err := readFixture("qwen3_omni_moe.yaml")
	if err != nil {
		t.Fatal(err)
	}
	opts.ReadFile = memFS(map[string]string{"fixture.yaml": "\n" + fixture})
	doc, _, errs := loadInline(t, cfg, opts)
	if errs != nil {
		t.Fatalf("load:\n%v\nconfig:\n%s", errs, numberLines(cfg))
	}
	return doc
}

func TestExpandEncoder(t *testing.T) {
	t.Run("1E1P1D on reference workers", func(t *testing.T) {
		doc := expandEPD(t, "  encoder: {}\n", deploy.Options{})
		want := []struct {
			id     int
			model  string
			role   topology.Role
			inputs []int
			devs   []int
		}{
			{0, "thinker", topology.RoleEncoder, []int{}, []int{0}},
			{1, "thinker", topology.RolePrefill, []int{0}, []int{1}},
			{2, "thinker", topology.RoleDecode, []int{1}, []int{2}},
			{3, "talker", topology.RoleFull, []int{2}, []int{3}},
			{4, "code2wav", topology.RoleFull, []int{3}, []int{3}},
		}
		if len(doc.Stages) != len(want) {
			t.Fatalf("%d stages, want %d", len(doc.Stages), len(want))
		}
		for i, w := range want {
			s := doc.Stages[i]
			if s.ID != w.id || s.ModelStage != w.model || s.Role != w.role || !slices.Equal(s.InputSources, w.inputs) || !slices.Equal(s.Devices, w.devs) {
				t.Errorf("stage %d = {%d %s %s inputs %v devices %v}, want {%d %s %s inputs %v devices %v}",
					i, s.ID, s.ModelStage, s.Role, s.InputSources, s.Devices, w.id, w.model, w.role, w.inputs, w.devs)
			}
		}
		e, p, d := doc.Stages[0], doc.Stages[1], doc.Stages[2]
		if e.EC == nil || e.EC.Connector != deploy.DefaultECConnector || e.EC.Role != topology.ECProducer || e.KV != nil {
			t.Errorf("encoder EC %+v KV %+v, want ReferenceECConnector ec_producer and no KV", e.EC, e.KV)
		}
		if p.EC == nil || p.EC.Connector != deploy.DefaultECConnector || p.EC.Role != topology.ECConsumer || p.KV == nil {
			t.Errorf("prefill EC %+v, want ReferenceECConnector ec_consumer beside its KV", p.EC)
		}
		if d.EC != nil {
			t.Errorf("decode EC %+v, want none", d.EC)
		}
		if e.FinalOutput || len(e.DefaultSamplingParams.Keys) != 0 {
			t.Errorf("encoder final %v, sampling %v; want neither", e.FinalOutput, e.DefaultSamplingParams)
		}
		if got := doc.Stages[3].InputConnectors; len(got) != 1 || got[0].Stage != 2 {
			t.Errorf("talker input connectors %v, want from_stage_2", got)
		}
		ids := map[string]bool{}
		for _, s := range doc.Stages[:3] {
			for _, r := range s.Replicas {
				if r.EngineID == "" || ids[r.EngineID] {
					t.Errorf("stage %d: engine id %q empty or repeated", s.ID, r.EngineID)
				}
				ids[r.EngineID] = true
			}
		}
		for key, want := range map[string]string{"enforce_eager": "true", "enable_prefix_caching": "false", "max_num_batched_tokens": "114688"} {
			if v := e.EngineArgs.Get(key); v == nil || v.Value != want {
				t.Errorf("encoder engine arg %s = %v, want %s", key, v, want)
			}
		}
		if v := p.EngineArgs.Get("max_num_batched_tokens"); v == nil || v.Value != "32768" {
			t.Errorf("prefill max_num_batched_tokens = %v, want the Thinker's 32768", v)
		}
	})
	t.Run("vLLM KV connector picks vLLM's EC connector", func(t *testing.T) {
		doc := expandEPD(t, "  connector: NixlConnector\n  encoder:\n    num_replicas: 2\n    tensor_parallel_size: 2\n    engine_id: enc\n", deploy.Options{})
		e := doc.EncoderStage()
		if e.EC.Connector != deploy.VLLMECConnector || doc.PD.ECConnector != deploy.VLLMECConnector {
			t.Errorf("EC connector %q (pd %q), want %s", e.EC.Connector, doc.PD.ECConnector, deploy.VLLMECConnector)
		}
		if dir, ok := deploy.ECSharedStorage(e); !ok || dir != deploy.ECExampleStoragePath {
			t.Errorf("shared storage %q, want %s", dir, deploy.ECExampleStoragePath)
		}
		if dir, _ := deploy.ECSharedStorage(doc.Stages[1]); dir != deploy.ECExampleStoragePath {
			t.Errorf("prefill shared storage %q, want %s", dir, deploy.ECExampleStoragePath)
		}
		var got [][]int
		var names []string
		for _, r := range e.Replicas {
			got = append(got, r.Devices)
			names = append(names, r.EngineID)
		}
		if !reflect.DeepEqual(got, [][]int{{0, 1}, {2, 3}}) || !slices.Equal(names, []string{"enc-0", "enc-1"}) {
			t.Errorf("encoder replicas on %v named %v, want [[0 1] [2 3]] enc-0, enc-1", got, names)
		}
		if p := doc.Stages[1]; !slices.Equal(p.Devices, []int{4}) {
			t.Errorf("prefill devices %v, want [4] after the encoders", p.Devices)
		}
	})
	t.Run("pinned encoder devices and engine arguments", func(t *testing.T) {
		doc := expandEPD(t, "  devices: \"0-3\"\n  encoder:\n    devices: \"7\"\n    engine_args:\n      max_num_batched_tokens: 8192\n      mm_encoder_only: true\n", deploy.Options{})
		printed, err := doc.Node().MarshalYAML()
		if err != nil {
			t.Fatal(err)
		}
		if _, warnings, err := deploy.Load("printed.yaml", printed, deploy.Options{}); err != nil || len(warnings) > 0 {
			t.Errorf("the printed document loads with %v, warnings %v; want neither (mm_encoder_only is vLLM's)", err, warnings)
		}
		e := doc.EncoderStage()
		if !slices.Equal(e.Devices, []int{7}) {
			t.Errorf("encoder devices %v, want [7]", e.Devices)
		}
		if v := e.EngineArgs.Get("max_num_batched_tokens"); v == nil || v.Value != "8192" {
			t.Errorf("max_num_batched_tokens = %v, want pd.encoder.engine_args' 8192", v)
		}
		if v := e.EngineArgs.Get("mm_encoder_only"); v == nil || v.Value != "true" {
			t.Errorf("mm_encoder_only = %v, want true", v)
		}
	})
	t.Run("data-parallel Thinker, encoders of one rank", func(t *testing.T) {
		doc, _, err := deploy.Load("testdata/expand/dp_epd.yaml", []byte("base_config: dp_nixl.yaml\npd:\n  devices: \"0-7\"\n  encoder: {}\n"), deploy.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e, p := doc.Stages[0], doc.Stages[1]
		if e.DataParallelSize != 1 || e.EngineArgs.Get("data_parallel_size") != nil || !slices.Equal(e.Devices, []int{0}) {
			t.Errorf("encoder dp %d (engine arg %v) on %v; want dp 1 on device 0", e.DataParallelSize, e.EngineArgs.Get("data_parallel_size"), e.Devices)
		}
		if p.DataParallelSize != 2 || !slices.Equal(p.Replicas[0].Devices, []int{1, 2}) {
			t.Errorf("prefill dp %d on %v; want dp 2 on devices 1,2", p.DataParallelSize, p.Replicas[0].Devices)
		}
	})
	t.Run("encoder disabled", func(t *testing.T) {
		doc := expandEPD(t, "  encoder:\n    enabled: false\n", deploy.Options{})
		if doc.EncoderStage() != nil || len(doc.Stages) != 4 || doc.PD.ECConnector != "" {
			t.Errorf("%d stages, encoder %v, ec connector %q; want plain PD", len(doc.Stages), doc.EncoderStage(), doc.PD.ECConnector)
		}
	})
	t.Run("served colocated", func(t *testing.T) {
		doc := expandEPD(t, "  encoder: {}\n", deploy.Options{Colocated: true})
		if doc.EncoderStage() != nil || len(doc.Stages) != 3 || doc.PD != nil {
			t.Errorf("%d stages, encoder %v; want the colocated pipeline", len(doc.Stages), doc.EncoderStage())
		}
	})
	t.Run("pool too small", func(t *testing.T) {
		cfg := "\nbase_config: fixture.yaml\npd:\n  devices: \"0-3\"\n  encoder:\n    num_replicas: 2\n"
		fixture, err := readFixture("qwen3_omni_moe.yaml")
		if err != nil {
			t.Fatal(err)
		}
		_, _, errs := loadInline(t, cfg, deploy.Options{ReadFile: memFS(map[string]string{"fixture.yaml": "\n" + fixture})})
		if len(errs) != 1 || errs[0].Path != "pd.devices" || !strings.Contains(errs[0].Msg, "encoder 2x1, prefill 1x1") {
			t.Errorf("errors %v, want one at pd.devices naming the encoders", errs)
		}
	})
}

// TestEPDRoundTrip: an expanded E/P/D document printed and loaded again
// is the same document: the same topology, PD settings and print.
func TestEPDRoundTrip(t *testing.T) {
	for _, pd := range []string{
		"  encoder: {}\n",
		"  connector: MooncakeConnector\n  prefill:\n    num_replicas: 2\n  encoder:\n    num_replicas: 2\n    ec_connector_extra_config:\n      shared_storage_path: /mnt/ec\n",
	} {
		doc := expandEPD(t, pd, deploy.Options{})
		printed, err := doc.Node().MarshalYAML()
		if err != nil {
			t.Fatal(err)
		}
		again, warnings, err := deploy.Load("printed.yaml", printed, deploy.Options{})
		if err != nil {
			t.Fatalf("the printed document does not load: %v\n%s", err, printed)
		}
		if len(warnings) > 0 {
			t.Errorf("the printed document loads with warnings: %v", warnings)
		}
		if a, b := doc.Topology(), again.Topology(); !reflect.DeepEqual(a, b) {
			t.Errorf("topology changed on the round trip:\n%+v\n%+v", a, b)
		}
		if !reflect.DeepEqual(doc.PD, again.PD) {
			t.Errorf("PD settings changed on the round trip: %+v, then %+v", doc.PD, again.PD)
		}
		if second, _ := again.Node().MarshalYAML(); !bytes.Equal(second, printed) {
			t.Errorf("printing the reloaded document differs:\n%s", lineDiff(string(printed), string(second)))
		}
		if doc.Summary() != again.Summary() {
			t.Errorf("summary changed:\n%s\n%s", doc.Summary(), again.Summary())
		}
	}
}

func TestEPDSummary(t *testing.T) {
	doc := expandEPD(t, "  connector: NixlConnector\n  encoder:\n    num_replicas: 2\n", deploy.Options{})
	got := doc.Summary()
	for _, want := range []string{
		"pipeline qwen3_omni_moe: 5 stages, prefill/decode disaggregated over NixlConnector, encoder over ECExampleConnector",
		"[0] thinker encoder  inputs -    devices 0,1      tp 1 x2  ec ECExampleConnector ec_producer [thinker-encoder-0 thinker-encoder-1]\n",
		"[1] thinker prefill  inputs 0    devices 2 ",
		"kv NixlConnector kv_both [thinker-prefill:5600]  ec ECExampleConnector ec_consumer\n",
		"[2] thinker decode   inputs 1 ",
		"streams: [1],[2] -> [3] conditioning rows",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary does not contain %q:\n%s", want, got)
		}
	}
}

func TestECConnectorsMatchTopology(t *testing.T) {
	doc, _, err := deploy.Load(deploy.DefaultConfigName, deploy.DefaultConfig(), deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, known := deploy.ECConnectors(), doc.Topology().Supported.EC; !slices.Equal(got, known) {
		t.Errorf("deploy.ECConnectors() = %v, the EC connectors topology validates against = %v; keep them equal", got, known)
	}
	for _, c := range deploy.ECConnectors() {
		if deploy.IsVLLMECConnector(c) == (c == deploy.DefaultECConnector) {
			t.Errorf("%s: IsVLLMECConnector = %v", c, deploy.IsVLLMECConnector(c))
		}
	}
}

// readFixture reads one of the vllm-omni fixtures.
func readFixture(name string) (string, error) {
	b, err := os.ReadFile(fixtures + name)
	return string(b), err
}
