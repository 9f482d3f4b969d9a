package deploy_test

import "github.com/omnipd/omnipd/deploy"

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
