package deploy_test

import "github.com/omnipd/omnipd/topology"

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
