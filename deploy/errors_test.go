package deploy_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
)

// The configs in this file are written the way users write them. In every
// inline config, line 1 is the line right after the opening backtick (inline
// drops that first newline), and columns count from 1, so a position can be
// checked by eye: in
//
//	    devices: "0"
//
// the key is at column 5 and the value at column 14.

// inline turns an inline config into the bytes a user would have in deploy.yaml.
func inline(cfg string) []byte { return []byte(strings.TrimPrefix(cfg, "\n")) }

// numberLines prints a config with line numbers, for failure messages.
func numberLines(cfg string) string {
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimPrefix(cfg, "\n"), "\n") {
		fmt.Fprintf(&b, "%3d| %s\n", i+1, line)
	}
	return b.String()
}

// memFS serves base_config files from memory; any other name does not exist.
func memFS(files map[string]string) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		if data, ok := files[name]; ok {
			return inline(data), nil
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
}

// loadInline loads cfg as deploy.yaml and returns the errors it reports.
func loadInline(t *testing.T, cfg string, opts deploy.Options) (*deploy.Document, []deploy.Warning, deploy.Errors) {
	t.Helper()
	if opts.ReadFile == nil {
		opts.ReadFile = memFS(nil)
	}
	doc, warnings, err := deploy.Load("deploy.yaml", inline(cfg), opts)
	if err == nil {
		if doc == nil {
			t.Fatal("Load returned neither a document nor an error")
		}
		return doc, warnings, nil
	}
	var es deploy.Errors
	if !errors.As(err, &es) {
		t.Fatalf("Load error is %T, want deploy.Errors: %v", err, err)
	}
	if doc != nil {
		t.Errorf("Load returned a document together with errors")
	}
	if len(es) == 0 {
		t.Fatalf("Load returned an empty deploy.Errors")
	}
	return nil, warnings, es
}

// validPDConfig is the basic TP=1 disaggregated Qwen3-Omni layout (the legacy PD
// fixture in the stages: schema): prefill on device 0, decode on 1, Talker
// and Code2Wav sharing 2, Mooncake between prefill and decode.
const validPDConfig = `
async_chunk: false
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    tensor_parallel_size: 1
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      kv_connector_extra_config:
        mooncake_bootstrap_port: 25201
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    tensor_parallel_size: 1
    input_sources: [0]
    final_output: true
    final_output_type: text
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
      kv_connector_extra_config:
        mooncake_bootstrap_port: 25202
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
    input_connectors:
      from_stage_1: shm
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
    default_sampling_params:
      temperature: 0.0
`

// valid3Config is the colocated three-stage pipeline, stages matched by id.
const valid3Config = `
stages:
  - stage_id: 0
    devices: "0"
  - stage_id: 1
    devices: "1"
  - stage_id: 2
    devices: "1"
`

func TestLoadValidConfigs(t *testing.T) {
	t.Run("pd", func(t *testing.T) {
		doc, warnings, errs := loadInline(t, validPDConfig, deploy.Options{})
		if errs != nil || len(warnings) > 0 {
			t.Fatalf("errors %v, warnings %v", errs, warnings)
		}
		wantStages(t, doc, []stageWant{
			{0, "thinker", topology.RolePrefill, nil, "0", "MooncakeConnector", "kv_producer"},
			{1, "thinker", topology.RoleDecode, []int{0}, "1", "MooncakeConnector", "kv_consumer"},
			{2, "talker", topology.RoleFull, []int{1}, "2", "", ""},
			{3, "code2wav", topology.RoleFull, []int{2}, "2", "", ""},
		})
		if doc.PD == nil || doc.PD.Connector != "MooncakeConnector" {
			t.Errorf("PD = %+v, want MooncakeConnector", doc.PD)
		}
		if got := doc.Stages[0].Replicas[0].KVPort; got != 25201 {
			t.Errorf("prefill kv port %d, want the bootstrap port 25201", got)
		}
	})
	t.Run("pd requested again with the same connector", func(t *testing.T) {
		doc, _, errs := loadInline(t, validPDConfig, deploy.Options{PD: true, Connector: "MooncakeConnector"})
		if errs != nil {
			t.Fatal(errs)
		}
		if len(doc.Stages) != 4 {
			t.Errorf("%d stages, want the 4 already there", len(doc.Stages))
		}
	})
	t.Run("three stages", func(t *testing.T) {
		doc, warnings, errs := loadInline(t, valid3Config, deploy.Options{})
		if errs != nil || len(warnings) > 0 {
			t.Fatalf("errors %v, warnings %v", errs, warnings)
		}
		wantStages(t, doc, []stageWant{
			{0, "thinker", topology.RoleFull, nil, "0", "", ""},
			{1, "talker", topology.RoleFull, []int{0}, "1", "", ""},
			{2, "code2wav", topology.RoleFull, []int{1}, "1", "", ""},
		})
		if doc.PD != nil {
			t.Errorf("PD = %+v, want nil", doc.PD)
		}
	})
	t.Run("three stages expanded with --pd", func(t *testing.T) {
		doc, _, errs := loadInline(t, valid3Config, deploy.Options{PD: true, Connector: "MooncakeConnector"})
		if errs != nil {
			t.Fatal(errs)
		}
		wantStages(t, doc, []stageWant{
			{0, "thinker", topology.RolePrefill, nil, "0", "MooncakeConnector", "kv_producer"},
			{1, "thinker", topology.RoleDecode, []int{0}, "1", "MooncakeConnector", "kv_consumer"},
			{2, "talker", topology.RoleFull, []int{1}, "2", "", ""},
			{3, "code2wav", topology.RoleFull, []int{2}, "2", "", ""},
		})
	})
}

type stageWant struct {
	id      int
	model   string
	role    topology.Role
	inputs  []int
	devices string
	kvConn  string
	kvRole  string
}

func wantStages(t *testing.T, doc *deploy.Document, want []stageWant) {
	t.Helper()
	if len(doc.Stages) != len(want) {
		t.Fatalf("%d stages, want %d:\n%s", len(doc.Stages), len(want), doc.Summary())
	}
	for i, w := range want {
		s := doc.Stages[i]
		var kvConn, kvRole string
		if s.KV != nil {
			kvConn, kvRole = s.KV.Connector, s.KV.Role
		}
		if s.ID != w.id || s.ModelStage != w.model || s.Role != w.role || !slices.Equal(s.InputSources, w.inputs) && len(s.InputSources)+len(w.inputs) > 0 ||
			topology.FormatDevices(s.Devices) != w.devices || kvConn != w.kvConn || kvRole != w.kvRole {
			t.Errorf("stages[%d] = {%d %s %s inputs %v devices %q kv %q %q}, want %+v",
				i, s.ID, s.ModelStage, s.Role, s.InputSources, topology.FormatDevices(s.Devices), kvConn, kvRole, w)
		}
	}
}

// errorCase is a config with exactly one mistake and the one error it must
// produce.
type errorCase struct {
	name string
	cfg  string
	opts deploy.Options
	// files are base_config files, by the name Options.ReadFile is asked for.
	files map[string]string

	// file is the file of the error's position; deploy.yaml when empty.
	file string
	// line and col are the expected position; 0, 0 for command-line flags,
	// which have no place in a file.
	line, col int
	path      string
	// code is the topology violation code; empty for the loader's own errors.
	code string
	// msg is a fragment the message must contain.
	msg string
}

// topologyCases reach each topology violation code from a config, in the
// order validate.go declares the codes. Codes the loader stops before the
// topology sees them are listed in unreachableCodes instead.
var topologyCases = []errorCase{
	{
		name: "no final output",
		cfg: `
stages:
  - stage_id: 0
    final_output: false
  - stage_id: 1
  - stage_id: 2
    final_output: false
`,
		line: 1, col: 1, path: "stages", code: topology.CodeNoFinalOutput, msg: "no stage has final_output: true",
	},
	{
		name: "input source names no stage",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    input_sources: [7]
  - stage_id: 2
`,
		line: 4, col: 21, path: "stages[1].input_sources[0]", code: topology.CodeInputSourceUnknown, msg: "input source 7 names no stage",
	},
	{
		name: "stage reads from itself",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    input_sources: [1]
  - stage_id: 2
`,
		line: 4, col: 21, path: "stages[1].input_sources[0]", code: topology.CodeInputSourceSelf, msg: "lists itself",
	},
	{
		name: "input source listed twice",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    input_sources: [0, 0]
  - stage_id: 2
`,
		line: 4, col: 24, path: "stages[1].input_sources[1]", code: topology.CodeInputSourceDuplicate, msg: "listed twice",
	},
	{
		name: "input cycle",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    input_sources: [2]
  - stage_id: 2
`,
		line: 4, col: 20, path: "stages[1].input_sources", code: topology.CodeInputCycle, msg: "1 -> 2 -> 1",
	},
	{
		// The Talker has no output type of its own to fall back on.
		name: "final output without a type",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    final_output: true
  - stage_id: 2
`,
		line: 3, col: 5, path: "stages[1].final_output_type", code: topology.CodeFinalOutputTypeMissing, msg: "needs final_output_type",
	},
	{
		name: "unknown final output type",
		cfg: `
stages:
  - stage_id: 0
    final_output_type: video
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 24, path: "stages[0].final_output_type", code: topology.CodeFinalOutputTypeUnknown, msg: `"video" is unknown`,
	},
	{
		name: "empty replicas list",
		cfg: `
stages:
  - stage_id: 0
    replicas: []
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 15, path: "stages[0].replicas", code: topology.CodeNumReplicasInvalid, msg: "below 1",
	},
	{
		name: "devices do not match tensor_parallel_size",
		cfg: `
stages:
  - stage_id: 0
    devices: "0,1"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 14, path: "stages[0].devices", code: topology.CodeDevicesCountMismatch, msg: "tensor_parallel_size 1",
	},
	{
		name: "replicas share a device",
		cfg: `
stages:
  - stage_id: 0
    replicas:
      - devices: "0"
      - devices: "0"
  - stage_id: 1
  - stage_id: 2
`,
		line: 5, col: 18, path: "stages[0].replicas[1].devices", code: topology.CodeDeviceSharedByReplicas, msg: "shares device 0 with replicas[0]",
	},
	{
		name: "two replicas on one device list",
		cfg: `
stages:
  - stage_id: 0
    devices: "0"
    num_replicas: 2
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 14, path: "stages[0].devices", code: topology.CodeDeviceSharedByReplicas, msg: "shares device 0",
	},
	{
		name: "stage devices disagree with its replicas",
		cfg: `
stages:
  - stage_id: 0
    devices: "0"
    replicas:
      - devices: "3"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 14, path: "stages[0].devices", code: topology.CodeDevicesReplicasMismatch, msg: "replicas use device 3",
	},
	{
		name: "input connector for a stage that is not an input",
		cfg: `
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
  - stage_id: 1
    input_connectors:
      from_stage_2: shm
  - stage_id: 2
`,
		line: 8, col: 21, path: "stages[1].input_connectors.from_stage_2", code: topology.CodeInputConnectorNotInput, msg: "not among input_sources [0]",
	},
	{
		name: "output connector to a stage that does not exist",
		cfg: `
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
    output_connectors:
      to_stage_9: shm
  - stage_id: 1
  - stage_id: 2
`,
		line: 7, col: 19, path: "stages[0].output_connectors.to_stage_9", code: topology.CodeOutputConnectorUnknownStage, msg: "stage 9 does not exist",
	},
	{
		name: "output connector to a stage that does not read from it",
		cfg: `
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
    output_connectors:
      to_stage_2: shm
  - stage_id: 1
  - stage_id: 2
`,
		line: 7, col: 19, path: "stages[0].output_connectors.to_stage_2", code: topology.CodeOutputConnectorNotInput, msg: "does not list stage 0",
	},
	{
		name: "undefined stage connector",
		cfg: `
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
  - stage_id: 1
    input_connectors:
      from_stage_0: shn
  - stage_id: 2
`,
		line: 8, col: 21, path: "stages[1].input_connectors.from_stage_0", code: topology.CodeConnectorUndefined, msg: `"shn" is not defined`,
	},
	{
		name: "unknown kv_role",
		cfg: `
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_sender
  - stage_id: 1
  - stage_id: 2
`,
		line: 5, col: 16, path: "stages[0].kv_transfer_config.kv_role", code: topology.CodeKVRoleInvalid, msg: `"kv_sender" is unknown`,
	},
	{
		// The field is absent, so the error points at the mapping it belongs in.
		name: "kv_transfer_config without kv_connector",
		cfg: `
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_role: kv_both
  - stage_id: 1
  - stage_id: 2
`,
		line: 4, col: 7, path: "stages[0].kv_transfer_config.kv_connector", code: topology.CodeKVConnectorMissing, msg: "needs a kv_connector",
	},
	{
		// The loader accepts 65535, but the second replica counts up past it.
		name: "kv port counted past 65535",
		cfg: `
stages:
  - stage_id: 0
    num_replicas: 2
    devices: "0,1"
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_port: 65535
  - stage_id: 1
  - stage_id: 2
`,
		line: 8, col: 16, path: "stages[0].kv_transfer_config.kv_port", code: topology.CodeKVPortInvalid, msg: "kv_port 65536 is not a TCP port",
	},
	{
		name: "mooncake bootstrap port out of range",
		cfg: `
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_both
      kv_connector_extra_config:
        mooncake_bootstrap_port: 70000
  - stage_id: 1
  - stage_id: 2
`,
		line: 7, col: 34, path: "stages[0].kv_transfer_config.kv_connector_extra_config.mooncake_bootstrap_port", code: topology.CodeKVPortInvalid, msg: "kv_port 70000 is not a TCP port",
	},
	{
		name: "prefill and decode share a kv port",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: P2pNcclConnector
      kv_role: kv_producer
      kv_port: 9000
  - stage_id: 1
    is_decode_only: true
    devices: "1"
    kv_transfer_config:
      kv_connector: P2pNcclConnector
      kv_role: kv_consumer
      kv_port: 9000
  - stage_id: 2
  - stage_id: 3
`,
		line: 15, col: 16, path: "stages[1].kv_transfer_config.kv_port", code: topology.CodeKVPortDuplicate, msg: "kv_port 9000 is already used by the prefill's replicas[0]",
	},
	{
		name: "decode without prefill",
		cfg: `
stages:
  - stage_id: 0
    is_decode_only: true
    input_sources: []
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 21, path: "stages[0].is_decode_only", code: topology.CodePDPrefillMissing, msg: "needs a prefill stage",
	},
	{
		// As above, but leaving input_sources to the loader, as users do.
		name: "decode without prefill, default input sources",
		cfg: `
stages:
  - stage_id: 0
    is_decode_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 21, path: "stages[0].is_decode_only", code: topology.CodePDPrefillMissing, msg: "needs a prefill stage",
	},
	{
		name: "prefill without decode",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 22, path: "stages[0].is_prefill_only", code: topology.CodePDDecodeMissing, msg: "needs a decode stage",
	},
	{
		name: "two prefill stages",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      engine_id: prefill-a
  - stage_id: 1
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 2
    is_decode_only: true
    input_sources: [0, 1]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 3
  - stage_id: 4
`,
		line: 9, col: 22, path: "stages[1].is_prefill_only", code: topology.CodePDPrefillDuplicate, msg: "stage 0 is already the prefill stage",
	},
	{
		name: "two decode stages",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    is_decode_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
      engine_id: decode-a
  - stage_id: 2
    is_decode_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 3
  - stage_id: 4
`,
		line: 14, col: 21, path: "stages[2].is_decode_only", code: topology.CodePDDecodeDuplicate, msg: "stage 1 is already the decode stage",
	},
	{
		name: "prefill flag on the Talker",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    model_stage: talker
    is_prefill_only: true
  - stage_id: 2
`,
		line: 5, col: 22, path: "stages[1].is_prefill_only", code: topology.CodePDNotCapable, msg: "cannot be split into prefill and decode",
	},
	{
		// The replica names its engine so that only the missing
		// kv_transfer_config is wrong.
		name: "decode without kv_transfer_config",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    is_decode_only: true
    replicas:
      - engine_id: thinker-decode
  - stage_id: 2
  - stage_id: 3
`,
		line: 7, col: 5, path: "stages[1].kv_transfer_config", code: topology.CodePDKVMissing, msg: "decode stage needs a kv_transfer_config",
	},
	{
		name: "decode without kv_transfer_config, default replicas",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    is_decode_only: true
  - stage_id: 2
  - stage_id: 3
`,
		line: 7, col: 5, path: "stages[1].kv_transfer_config", code: topology.CodePDKVMissing, msg: "decode stage needs a kv_transfer_config",
	},
	{
		name: "prefill consumes KV",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 8, col: 16, path: "stages[0].kv_transfer_config.kv_role", code: topology.CodePDPrefillKVRole, msg: `"kv_consumer" on a prefill stage`,
	},
	{
		name: "decode produces KV",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 16, col: 16, path: "stages[1].kv_transfer_config.kv_role", code: topology.CodePDDecodeKVRole, msg: `"kv_producer" on a decode stage`,
	},
	{
		name: "prefill and decode use different connectors",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 15, col: 21, path: "stages[1].kv_transfer_config.kv_connector", code: topology.CodePDKVConnectorMismatch, msg: `"NixlConnector" differs from the prefill's "MooncakeConnector"`,
	},
	{
		// Reported once, at the first stage that names it.
		name: "kv connector without router support",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: FooConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: FooConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 7, col: 21, path: "stages[0].kv_transfer_config.kv_connector", code: topology.CodePDKVConnectorUnknown, msg: `"FooConnector" has no router-side support`,
	},
	{
		name: "kv buffer devices differ",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_buffer_device: cuda
  - stage_id: 1
    is_decode_only: true
    devices: "1"
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_buffer_device: cpu
  - stage_id: 2
  - stage_id: 3
`,
		line: 15, col: 25, path: "stages[1].kv_transfer_config.kv_buffer_device", code: topology.CodePDKVBufferDeviceMismatch, msg: `"cpu" differs from the prefill's "cuda"`,
	},
	{
		name: "kv buffer sizes differ",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_buffer_size: 1e9
  - stage_id: 1
    is_decode_only: true
    devices: "1"
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_buffer_size: 2e9
  - stage_id: 2
  - stage_id: 3
`,
		line: 15, col: 23, path: "stages[1].kv_transfer_config.kv_buffer_size", code: topology.CodePDKVBufferSizeMismatch, msg: "differs from the prefill's",
	},
	{
		// LMCache finds the KV by content on whichever rank the decode
		// runs, but omnipd has no DP routing for it: refused where the size
		// is written.
		name: "data parallel PD stage over a connector without DP routing",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: LMCacheConnectorV1
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1,3"
    engine_args:
      data_parallel_size: 2
    input_sources: [0]
    kv_transfer_config:
      kv_connector: LMCacheConnectorV1
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 14, col: 27, path: "stages[1].engine_args.data_parallel_size", code: topology.CodePDDataParallelUnroutable, msg: "data_parallel_size 2 on a decode stage over LMCacheConnectorV1",
	},
	{
		name: "prefill and decode tensor parallel sizes differ",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1,3"
    tensor_parallel_size: 2
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 13, col: 27, path: "stages[1].tensor_parallel_size", code: topology.CodePDTensorParallelMismatch, msg: "tensor_parallel_size 2 differs from the prefill's 1",
	},
	{
		name: "prefill and decode share a device",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "0"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 12, col: 14, path: "stages[1].devices", code: topology.CodePDDevicesOverlap, msg: "prefill and decode both use device 0",
	},
	{
		name: "decode does not read from the prefill",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: []
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 13, col: 20, path: "stages[1].input_sources", code: topology.CodePDDecodeInputMissing, msg: "must list the prefill stage 0",
	},
	{
		name: "prefill replica with an empty engine_id",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    replicas:
      - devices: "0"
        engine_id: ""
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 7, col: 20, path: "stages[0].replicas[0].engine_id", code: topology.CodePDEngineIDMissing, msg: "prefill replica needs an engine_id",
	},
	{
		name: "prefill replica without engine_id",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    replicas:
      - devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 6, col: 9, path: "stages[0].replicas[0].engine_id", code: topology.CodePDEngineIDMissing, msg: "prefill replica needs an engine_id",
	},
	{
		name: "prefill and decode share an engine_id",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
      engine_id: thinker
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
      engine_id: thinker
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 18, col: 18, path: "stages[1].kv_transfer_config.engine_id", code: topology.CodePDEngineIDDuplicate, msg: `engine_id "thinker" is already used by the prefill's replicas[0]`,
	},
	{
		name: "prefill marked as a final output",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    final_output: true
    final_output_type: text
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 6, col: 19, path: "stages[0].final_output", code: topology.CodePDPrefillFinalOutput, msg: "cannot be a final output",
	},
	{
		name: "talker reads from the prefill",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [0]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 20, col: 21, path: "stages[2].input_sources[0]", code: topology.CodePDPrefillFeedsNonDecode, msg: "reads from prefill stage 0",
	},
}

// unreachableCodes are the topology codes no config can produce, because the
// loader rejects the input first with an error of its own, and the case in
// loaderCases that pins that error.
var unreachableCodes = map[string]struct{ why, loaderCase string }{
	topology.CodeNoStages: {
		"a missing or empty stages: is the loader's error; the topology is never built", "stages is an empty list"},
	topology.CodeStageIDNegative: {
		"the loader rejects a negative stage_id and drops the stage", "stage_id negative"},
	topology.CodeStageIDDuplicate: {
		"the loader reports the second definition and drops it", "stage_id duplicated"},
	topology.CodeRoleUnknown: {
		"roles come only from the boolean is_prefill_only/is_decode_only and kv_role, so no value maps outside full/prefill/decode",
		"is_prefill_only is not a boolean"},
	topology.CodeTensorParallelSizeInvalid: {
		"the loader rejects tensor_parallel_size < 1 and resolves the stage with 1", "tensor_parallel_size 0"},
	topology.CodeDataParallelSizeInvalid: {
		"the loader rejects data_parallel_size < 1 and resolves the stage with 1", "data_parallel_size 0"},
	topology.CodeReplicaCountMismatch: {
		"the loader checks replicas: against num_replicas itself; and resolves num_replicas to the list it has, so the topology never sees a mismatch",
		"replicas list shorter than num_replicas"},
	topology.CodeDeviceInvalid: {
		"device lists are parsed by the loader, which rejects negative ids", "negative device"},
	topology.CodeDeviceListedTwice: {
		"device lists are parsed by the loader, which rejects repeated devices", "device listed twice"},
}

// loaderCases are mistakes the loader reports itself, before or instead of
// the topology check.
var loaderCases = []errorCase{
	{
		name: "MoRIIO read_mode differs",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MoRIIOConnector
      kv_role: kv_producer
      kv_connector_extra_config:
        read_mode: true
  - stage_id: 1
    is_decode_only: true
    devices: "1"
    kv_transfer_config:
      kv_connector: MoRIIOConnector
      kv_role: kv_consumer
      kv_connector_extra_config:
        read_mode: "False"
  - stage_id: 2
  - stage_id: 3
`,
		line: 17, col: 20, path: "stages[1].kv_transfer_config.kv_connector_extra_config.read_mode", msg: `read_mode "False" (WRITE) differs from the prefill's true (READ)`,
	},
	{
		name: "MoRIIO read_mode only on the prefill",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MoRIIOConnector
      kv_role: kv_producer
      kv_connector_extra_config:
        read_mode: 1
  - stage_id: 1
    is_decode_only: true
    devices: "1"
    kv_transfer_config:
      kv_connector: MoRIIOConnector
      kv_role: kv_consumer
  - stage_id: 2
  - stage_id: 3
`,
		line: 9, col: 20, path: "stages[0].kv_transfer_config.kv_connector_extra_config.read_mode", msg: `read_mode 1 (READ) differs from the decode's unset (WRITE)`,
	},
	{
		name: "YAML syntax error",
		cfg: `
stages:
  - stage_id: 0
   devices: "0"
  - stage_id: 1
`,
		line: 3, col: 4, path: "", msg: "invalid YAML",
	},
	{
		name: "YAML unterminated quoted string",
		cfg: `
stages:
  - stage_id: 0
    devices: "0
  - stage_id: 1
`,
		line: 3, col: 14, path: "", msg: "invalid YAML",
	},
	{
		name: "duplicate key",
		cfg: `
stages:
  - stage_id: 0
    devices: "0"
    devices: "1"
  - stage_id: 1
  - stage_id: 2
`,
		line: 4, col: 5, path: "stages[0].devices", msg: `"devices" is defined twice`,
	},
	{
		name: "integer field given a word",
		cfg: `
stages:
  - stage_id: 0
    tensor_parallel_size: two
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 27, path: "stages[0].tensor_parallel_size", msg: `want an integer, got string "two"`,
	},
	{
		name: "stage_id given a word",
		cfg: `
stages:
  - stage_id: zero
  - stage_id: 1
  - stage_id: 2
`,
		line: 2, col: 15, path: "stages[0].stage_id", msg: `want an integer, got string "zero"`,
	},
	{
		name: "boolean field given a number",
		cfg: `
async_chunk: 1
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 1, col: 14, path: "async_chunk", msg: `want true or false, got integer "1"`,
	},
	{
		// YAML 1.2: a quoted "yes" is a string, not a boolean.
		name: "is_prefill_only is not a boolean",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: "yes"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 22, path: "stages[0].is_prefill_only", msg: `want true or false, got string "yes"`,
	},
	{
		name: "string field given a list",
		cfg: `
stages:
  - stage_id: 0
    model_stage: [thinker]
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 18, path: "stages[0].model_stage", msg: "want a string, got a list",
	},
	{
		name: "mapping field given a string",
		cfg: `
stages:
  - stage_id: 0
    kv_transfer_config: MooncakeConnector
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 25, path: "stages[0].kv_transfer_config", msg: `want a mapping, got string "MooncakeConnector"`,
	},
	{
		name: "list field given a word",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    input_sources: zero
  - stage_id: 2
`,
		line: 4, col: 20, path: "stages[1].input_sources", msg: `want a list of stage ids, got string "zero"`,
	},
	{
		name: "replicas given a string",
		cfg: `
stages:
  - stage_id: 0
    replicas: "0"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 15, path: "stages[0].replicas", msg: "want a list of replicas",
	},
	{
		name: "stages given a mapping",
		cfg: `
stages:
  stage_id: 0
`,
		line: 2, col: 3, path: "stages", msg: "want a non-empty list of stages, got a mapping",
	},
	{
		name: "unknown pipeline",
		cfg: `
pipeline: qwen3_omni
stages:
  - stage_id: 0
`,
		line: 1, col: 11, path: "pipeline", msg: `unknown pipeline "qwen3_omni"`,
	},
	{
		name: "stages missing",
		cfg: `
async_chunk: false
`,
		line: 1, col: 1, path: "stages", msg: "missing: a deploy config needs a stages: list",
	},
	{
		name: "stages is an empty list",
		cfg: `
stages: []
`,
		line: 1, col: 9, path: "stages", msg: "want a non-empty list of stages",
	},
	{
		name: "empty document",
		cfg:  ``,
		line: 1, col: 1, path: "", msg: "the deploy config is empty",
	},
	{
		name: "stage_id missing on the first stage",
		cfg: `
stages:
  - devices: "0"
  - stage_id: 1
  - stage_id: 2
`,
		line: 2, col: 5, path: "stages[0].stage_id", msg: "missing: every stage needs a stage_id",
	},
	{
		name: "stage_id missing on a later stage",
		cfg: `
stages:
  - stage_id: 0
  - devices: "1"
  - stage_id: 2
`,
		line: 3, col: 5, path: "stages[1].stage_id", msg: "missing: every stage needs a stage_id",
	},
	{
		name: "stage_id duplicated",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 1
  - stage_id: 2
`,
		line: 4, col: 15, path: "stages[2].stage_id", msg: "stage 1 is defined twice (first at deploy.yaml:3:5)",
	},
	{
		name: "stage_id negative",
		cfg: `
stages:
  - stage_id: -1
  - stage_id: 1
  - stage_id: 2
`,
		line: 2, col: 15, path: "stages[0].stage_id", msg: "want a non-negative integer, got -1",
	},
	{
		name: "unknown model_stage",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    model_stage: speaker
  - stage_id: 2
`,
		line: 4, col: 18, path: "stages[1].model_stage", msg: `no model stage "speaker"`,
	},
	{
		name: "stage id that maps to no pipeline stage",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 3
`,
		line: 4, col: 15, path: "stages[2].stage_id", msg: "pipeline qwen3_omni_moe has no stage 3",
	},
	{
		name: "both is_prefill_only and is_decode_only",
		cfg: `
stages:
  - stage_id: 0
    is_prefill_only: true
    is_decode_only: true
  - stage_id: 1
  - stage_id: 2
`,
		line: 4, col: 21, path: "stages[0].is_decode_only", msg: "cannot be both is_prefill_only and is_decode_only",
	},
	{
		name: "device that is not a number",
		cfg: `
stages:
  - stage_id: 0
    devices: "0,x"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 14, path: "stages[0].devices", msg: `device "x" is not a non-negative integer`,
	},
	{
		name: "device range backwards",
		cfg: `
stages:
  - stage_id: 0
    devices: "3-1"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 14, path: "stages[0].devices", msg: `device range "3-1" is not of the form LOW-HIGH`,
	},
	{
		name: "device listed twice",
		cfg: `
stages:
  - stage_id: 0
    devices: "0,0"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 14, path: "stages[0].devices", msg: "device 0 listed twice",
	},
	{
		name: "negative device",
		cfg: `
stages:
  - stage_id: 0
    devices: [-1]
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 15, path: "stages[0].devices[0]", msg: "want a non-negative integer, got -1",
	},
	{
		// A config of a few bytes must not hang validate or exhaust memory:
		// ranges and counts far beyond any machine need a bound.
		name: "device range of a billion devices",
		cfg: `
stages:
  - stage_id: 0
    devices: "0-999999999"
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 14, path: "stages[0].devices",
	},
	{
		name: "num_replicas of two hundred million",
		cfg: `
stages:
  - stage_id: 0
    num_replicas: 200000000
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 19, path: "stages[0].num_replicas",
	},
	{
		name: "pd prefill replicas of a hundred million",
		cfg: `
pd:
  prefill:
    num_replicas: 100000000
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 19, path: "pd.prefill.num_replicas",
	},
	{
		name: "tensor_parallel_size 0",
		cfg: `
stages:
  - stage_id: 0
    tensor_parallel_size: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 27, path: "stages[0].tensor_parallel_size", msg: "want at least 1, got 0",
	},
	{
		name: "data_parallel_size 0",
		cfg: `
stages:
  - stage_id: 0
    engine_args:
      data_parallel_size: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 4, col: 27, path: "stages[0].engine_args.data_parallel_size", msg: "want at least 1, got 0",
	},
	{
		name: "num_replicas 0",
		cfg: `
stages:
  - stage_id: 0
    num_replicas: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 19, path: "stages[0].num_replicas", msg: "want at least 1, got 0",
	},
	{
		name: "replicas list shorter than num_replicas",
		cfg: `
stages:
  - stage_id: 0
    num_replicas: 2
    replicas:
      - devices: "0"
  - stage_id: 1
  - stage_id: 2
`,
		line: 5, col: 7, path: "stages[0].replicas", msg: "lists 1 replicas but num_replicas is 2",
	},
	{
		name: "fewer endpoints than replicas",
		cfg: `
stages:
  - stage_id: 0
    num_replicas: 3
    devices: "0,1,3"
    endpoints: ["http://a:8000", "http://b:8000"]
  - stage_id: 1
  - stage_id: 2
`,
		line: 5, col: 16, path: "stages[0].endpoints", msg: "lists 2 endpoints for 3 replicas",
	},
	{
		name: "unknown kv_load_failure_policy",
		cfg: `
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_load_failure_policy: retry
  - stage_id: 1
  - stage_id: 2
`,
		line: 6, col: 31, path: "stages[0].kv_transfer_config.kv_load_failure_policy", msg: `want fail or recompute, got "retry"`,
	},
	{
		name: "kv_port out of range",
		cfg: `
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_both
      kv_port: 70000
  - stage_id: 1
  - stage_id: 2
`,
		line: 6, col: 16, path: "stages[0].kv_transfer_config.kv_port", msg: "port 70000 is outside 0-65535",
	},
	{
		name: "replica kv_port out of range",
		cfg: `
stages:
  - stage_id: 0
    replicas:
      - devices: "0"
        kv_port: 70000
  - stage_id: 1
  - stage_id: 2
`,
		line: 5, col: 18, path: "stages[0].replicas[0].kv_port", msg: "port 70000 is outside 0-65535",
	},
	{
		name: "pd kv_port 0",
		cfg: `
pd:
  kv_port: 0
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 2, col: 12, path: "pd.kv_port", msg: "port 0 is outside 1-65535",
	},
	{
		// The mapping is where the missing name belongs.
		name: "connector without name",
		cfg: `
connectors:
  shm:
    extra:
      codec_chunk_frames: 25
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 3, col: 5, path: "connectors.shm.name", msg: "missing: the connector class",
	},
	{
		name: "unknown key in pd",
		cfg: `
pd:
  conector: MooncakeConnector
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 2, col: 3, path: "pd.conector", msg: `unknown key "conector"; did you mean "connector"?`,
	},
	{
		name: "unknown pd.connector",
		cfg: `
pd:
  connector: FooConnector
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 2, col: 14, path: "pd.connector", msg: `unknown KV connector "FooConnector"`,
	},
	{
		name: "unknown --connector",
		cfg:  valid3Config,
		opts: deploy.Options{PD: true, Connector: "FooConnector"},
		path: "--connector", msg: `unknown KV connector "FooConnector"`,
	},
	{
		// A bad --devices is reported without --pd; a bad --connector
		// should be too.
		name: "unknown --connector without --pd",
		cfg:  valid3Config,
		opts: deploy.Options{Connector: "FooConnector"},
		path: "--connector", msg: `unknown KV connector "FooConnector"`,
	},
	{
		name: "--devices pool too small",
		cfg:  valid3Config,
		opts: deploy.Options{PD: true, Devices: "0,1"},
		path: "--devices", msg: "need 3 devices (prefill 1x1, decode 1x1, downstream 1), have 2: 0,1",
	},
	{
		name: "pd.devices pool too small",
		cfg: `
pd:
  devices: "0,1"
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 2, col: 12, path: "pd.devices", msg: "need 3 devices",
	},
	{
		name: "--platform naming a missing platform",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
platforms:
  npu:
    stages:
      - stage_id: 0
        devices: "0,1"
`,
		opts: deploy.Options{Platform: "tpu"},
		line: 6, col: 3, path: "platforms", msg: `--platform tpu: no such platform section; the config has "npu"`,
	},
	{
		name: "--platform without platforms section",
		cfg:  valid3Config,
		opts: deploy.Options{Platform: "tpu"},
		line: 1, col: 1, path: "platforms", msg: "--platform tpu: the config has no platforms: section",
	},
	{
		name: "platform section naming a missing stage",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
platforms:
  npu:
    stages:
      - stage_id: 5
        devices: "0,1"
`,
		opts: deploy.Options{Platform: "npu"},
		line: 8, col: 19, path: "platforms.npu.stages[0].stage_id", msg: "no stage 5 to override",
	},
	{
		name: "base_config file missing",
		cfg: `
base_config: base.yaml
stages:
  - stage_id: 0
`,
		line: 1, col: 14, path: "base_config", msg: `cannot read "base.yaml"`,
	},
	{
		name: "base_config cycle",
		cfg: `
base_config: a.yaml
stages:
  - stage_id: 0
`,
		files: map[string]string{
			"a.yaml": `
base_config: b.yaml
`,
			"b.yaml": `
base_config: a.yaml
stages:
  - stage_id: 1
`,
		},
		file: "b.yaml", line: 1, col: 14, path: "base_config", msg: `"a.yaml" is already on the base_config chain`,
	},
	{
		name: "legacy stage_args together with stages",
		cfg: `
stage_args:
  - stage_id: 0
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		line: 1, col: 1, path: "stage_args", msg: "both stage_args: (the removed legacy schema) and stages: are set",
	},
	{
		name: "Thinker twice, one copy without a role",
		cfg: `
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
  - stage_id: 2
  - stage_id: 3
`,
		line: 8, col: 5, path: "stages[1]", msg: "the Thinker appears 2 times but this copy is neither a prefill nor a decode",
	},
	{
		name: "pd.connector conflicts with an already disaggregated config",
		cfg: `
pd:
  connector: NixlConnector
stages:
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_producer
  - stage_id: 1
    model_stage: thinker
    is_decode_only: true
    devices: "1"
    input_sources: [0]
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    model_stage: talker
    devices: "2"
    input_sources: [1]
  - stage_id: 3
    model_stage: code2wav
    devices: "2"
    input_sources: [2]
`,
		line: 2, col: 14, path: "pd.connector", msg: "already disaggregated with MooncakeConnector; NixlConnector conflicts",
	},
	{
		name: "--pd --connector conflicts with an already disaggregated config",
		cfg:  validPDConfig,
		opts: deploy.Options{PD: true, Connector: "NixlConnector"},
		path: "--connector", msg: "already disaggregated with MooncakeConnector; NixlConnector conflicts",
	},
}

func TestLoadErrors(t *testing.T) {
	for _, group := range []struct {
		name  string
		cases []errorCase
	}{{"topology", topologyCases}, {"loader", loaderCases}} {
		t.Run(group.name, func(t *testing.T) {
			for _, c := range group.cases {
				t.Run(c.name, func(t *testing.T) {
					checkOneError(t, c)
				})
			}
		})
	}
}

func checkOneError(t *testing.T, c errorCase) {
	t.Helper()
	opts := c.opts
	opts.ReadFile = memFS(c.files)
	_, _, errs := loadInline(t, c.cfg, opts)
	if len(errs) != 1 {
		t.Fatalf("got %d errors, want exactly one:\n%v\nconfig:\n%s", len(errs), errs, numberLines(c.cfg))
	}
	e := errs[0]
	want := deploy.Pos{}
	if c.line != 0 {
		want = deploy.Pos{File: "deploy.yaml", Line: c.line, Col: c.col}
		if c.file != "" {
			want.File = c.file
		}
	}
	if e.Pos != want {
		t.Errorf("position %s, want %s\nconfig:\n%s", e.Pos, want, numberLines(c.cfg))
	}
	if e.Path != c.path {
		t.Errorf("path %q, want %q", e.Path, c.path)
	}
	if e.Code != c.code {
		t.Errorf("code %q, want %q", e.Code, c.code)
	}
	if !strings.Contains(e.Msg, c.msg) {
		t.Errorf("message %q does not contain %q", e.Msg, c.msg)
	}
	if t.Failed() {
		t.Logf("error: %v", e)
	}
}

// TestViolationCodesCovered walks the codes declared in topology/validate.go
// so that a new code cannot be added without a config that reaches it (or a
// reason why none can).
func TestViolationCodesCovered(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../topology/validate.go", nil, 0)
	if err != nil {
		t.Fatalf("read the violation codes: %v", err)
	}
	var codes []string
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					code, _ := strconv.Unquote(lit.Value)
					codes = append(codes, code)
				}
			}
		}
	}
	if len(codes) < 40 {
		t.Fatalf("found only %d codes in validate.go; has the file moved?", len(codes))
	}
	reached := map[string]bool{}
	for _, c := range slices.Concat(topologyCases, encoderTopologyCases) {
		reached[c.code] = true
	}
	loaderNames := map[string]bool{}
	for _, c := range slices.Concat(loaderCases, encoderLoaderCases) {
		loaderNames[c.name] = true
	}
	for _, code := range codes {
		u, unreachable := unreachableCodes[code]
		switch {
		case reached[code] && unreachable:
			t.Errorf("%s is reached by a case but listed as unreachable", code)
		case !reached[code] && !unreachable:
			t.Errorf("%s has no case that reaches it and no reason why it cannot be reached", code)
		case unreachable && !loaderNames[u.loaderCase]:
			t.Errorf("%s: loader case %q does not exist", code, u.loaderCase)
		}
	}
	for code := range reached {
		if !slices.Contains(codes, code) {
			t.Errorf("a case expects code %q, which validate.go does not declare", code)
		}
	}
}

// Each copy of the Thinker that has no role is its own mistake, so each is
// reported, and nothing else is.
func TestLoadThinkerTwiceWithoutRoles(t *testing.T) {
	const cfg = `
stages:
  - stage_id: 0
    model_stage: thinker
  - stage_id: 1
    model_stage: thinker
  - stage_id: 2
  - stage_id: 3
`
	_, _, errs := loadInline(t, cfg, deploy.Options{})
	want := []string{
		"deploy.yaml:2:5: stages[0]: the Thinker appears 2 times",
		"deploy.yaml:4:5: stages[1]: the Thinker appears 2 times",
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(want), errs)
	}
	for i, e := range errs {
		if !strings.HasPrefix(e.Error(), want[i]) {
			t.Errorf("error %d = %q, want prefix %q", i, e, want[i])
		}
	}
}

// multiMistake has five unrelated mistakes: a PD role error, overlapping
// prefill/decode devices, an input source that names no stage, an
// undefined stage connector and a type error. One Load must report them all,
// in file order.
const multiMistake = `
connectors:
  shm:
    name: SharedMemoryConnector
stages:
  - stage_id: 0
    is_prefill_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 1
    is_decode_only: true
    devices: "0"
    kv_transfer_config:
      kv_connector: MooncakeConnector
      kv_role: kv_consumer
  - stage_id: 2
    devices: "1"
    input_sources: [9]
  - stage_id: 3
    devices: "1"
    tensor_parallel_size: two
    input_connectors:
      from_stage_2: shn
`

func TestLoadReportsEveryMistake(t *testing.T) {
	_, _, errs := loadInline(t, multiMistake, deploy.Options{})
	want := []struct {
		line, col  int
		path, code string
	}{
		{10, 16, "stages[0].kv_transfer_config.kv_role", topology.CodePDPrefillKVRole},
		{13, 14, "stages[1].devices", topology.CodePDDevicesOverlap},
		{19, 21, "stages[2].input_sources[0]", topology.CodeInputSourceUnknown},
		{22, 27, "stages[3].tensor_parallel_size", ""},
		{24, 21, "stages[3].input_connectors.from_stage_2", topology.CodeConnectorUndefined},
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v\nconfig:\n%s", len(errs), len(want), errs, numberLines(multiMistake))
	}
	for i, w := range want {
		e := errs[i]
		if e.Pos != (deploy.Pos{File: "deploy.yaml", Line: w.line, Col: w.col}) || e.Path != w.path || e.Code != w.code {
			t.Errorf("error %d = %v [%s], want %d:%d %s [%s]", i, e, e.Code, w.line, w.col, w.path, w.code)
		}
	}
	if !slices.IsSortedFunc(errs, func(a, b deploy.Error) int {
		if a.Pos.Line != b.Pos.Line {
			return a.Pos.Line - b.Pos.Line
		}
		return a.Pos.Col - b.Pos.Col
	}) {
		t.Errorf("errors are not sorted by position:\n%v", errs)
	}
}

func TestLoadWarnings(t *testing.T) {
	t.Run("legacy stage_args migrated", func(t *testing.T) {
		const cfg = `
async_chunk: false
stage_args:
  - stage_id: 0
    runtime:
      devices: "0"
    engine_args:
      model_stage: thinker
  - stage_id: 1
    runtime:
      devices: "1"
  - stage_id: 2
    runtime:
      devices: "1"
`
		doc, warnings, errs := loadInline(t, cfg, deploy.Options{})
		if errs != nil {
			t.Fatal(errs)
		}
		if len(doc.Stages) != 3 {
			t.Errorf("%d stages, want 3", len(doc.Stages))
		}
		if len(warnings) != 1 {
			t.Fatalf("got %d warnings, want 1: %v", len(warnings), warnings)
		}
		w := warnings[0]
		if w.Pos != (deploy.Pos{File: "deploy.yaml", Line: 2, Col: 1}) || w.Path != "stage_args" ||
			!strings.Contains(w.Msg, "legacy stage_args: schema was removed") {
			t.Errorf("warning = %s", w)
		}
	})
	t.Run("near-miss stage key", func(t *testing.T) {
		const cfg = `
stages:
  - stage_id: 0
    devices: "0"
    tensor_paralel_size: 1
  - stage_id: 1
  - stage_id: 2
`
		doc, warnings, errs := loadInline(t, cfg, deploy.Options{})
		if errs != nil {
			t.Fatal(errs)
		}
		if len(warnings) != 1 {
			t.Fatalf("got %d warnings, want 1: %v", len(warnings), warnings)
		}
		want := `warning: deploy.yaml:4:5: stages[0].tensor_paralel_size: unknown key "tensor_paralel_size" is passed to the engine as an argument; did you mean "tensor_parallel_size"?`
		if got := warnings[0].String(); got != want {
			t.Errorf("warning\n got %s\nwant %s", got, want)
		}
		// Unknown stage keys are engine arguments, passed on as written.
		if doc.Stages[0].EngineArgs.Get("tensor_paralel_size") == nil {
			t.Errorf("tensor_paralel_size was not kept as an engine argument")
		}
	})
}

var errorLine = regexp.MustCompile(`^deploy\.yaml:\d+:\d+: stages\[\d+\][a-z_.\[\]0-9]*: \S.*$`)

func TestErrorStrings(t *testing.T) {
	// The form STYLE.md gives: file:line:col: path: message.
	var decode errorCase
	for _, c := range topologyCases {
		if c.code == topology.CodePDDecodeKVRole {
			decode = c
		}
	}
	_, _, errs := loadInline(t, decode.cfg, deploy.Options{})
	want := `deploy.yaml:16:16: stages[1].kv_transfer_config.kv_role: "kv_producer" on a decode stage; want kv_consumer or kv_both`
	if errs.Error() != want {
		t.Errorf("Error()\n got %s\nwant %s", errs.Error(), want)
	}

	// Several errors: one line each, in the same form, and each reachable
	// with errors.As.
	doc, _, err := deploy.Load("deploy.yaml", inline(multiMistake), deploy.Options{ReadFile: memFS(nil)})
	if doc != nil || err == nil {
		t.Fatalf("Load = %v, %v; want errors", doc, err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 5 {
		t.Errorf("Error() has %d lines, want 5:\n%s", len(lines), err)
	}
	for _, l := range lines {
		if !errorLine.MatchString(l) {
			t.Errorf("error line %q is not deploy.yaml:LINE:COL: PATH: message", l)
		}
	}
	var one deploy.Error
	if !errors.As(err, &one) || one.Pos.Line != 10 {
		t.Errorf("errors.As(err, *deploy.Error) = %v, want the first error (line 10)", one)
	}

	// A flag has no place in a file: the path alone names it.
	_, _, errs = loadInline(t, valid3Config, deploy.Options{PD: true, Devices: "0,1"})
	if got := errs.Error(); !strings.HasPrefix(got, "--devices: need 3 devices") {
		t.Errorf("flag error = %q, want it to start with the flag name", got)
	}
}
