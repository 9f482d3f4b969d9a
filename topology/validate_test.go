package topology

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// testSupport are the connectors the test topologies may name, as a
// caller would give them (package deploy gives kvconnector's entries).
func testSupport() ConnectorSupport {
	return ConnectorSupport{
		KV: []KVConnectorSupport{
			{Name: "MooncakeConnector"}, {Name: "NixlConnector", DataParallel: true}, {Name: "P2pNcclConnector"},
			{Name: "LMCacheConnectorV1"}, {Name: "MoRIIOConnector"}, {Name: "ReferenceConnector"},
		},
		EC: []string{"ECExampleConnector", "ReferenceECConnector"},
	}
}

// validPD is the basic TP=1 disaggregated Qwen3-Omni layout: prefill on
// device 0, decode on 1, Talker and Code2Wav sharing 2.
func validPD() *Topology {
	return &Topology{
		Supported:  testSupport(),
		Connectors: []string{"shm"},
		Stages: []Stage{
			{
				ID: 0, ModelStage: "thinker", Role: RolePrefill,
				TensorParallelSize: 1, NumReplicas: 1, Devices: []int{0},
				Replicas:              []Replica{{Devices: []int{0}, EngineID: "thinker-prefill", KVPort: 25201}},
				KV:                    &KVTransfer{Connector: "MooncakeConnector", Role: KVProducer, EngineID: "thinker-prefill"},
				DisaggregationCapable: true,
			},
			{
				ID: 1, ModelStage: "thinker", Role: RoleDecode, InputSources: []int{0},
				FinalOutput: true, FinalOutputType: OutputText,
				TensorParallelSize: 1, NumReplicas: 1, Devices: []int{1},
				Replicas:              []Replica{{Devices: []int{1}, EngineID: "thinker-decode", KVPort: 25202}},
				KV:                    &KVTransfer{Connector: "MooncakeConnector", Role: KVConsumer, EngineID: "thinker-decode"},
				DisaggregationCapable: true,
			},
			{
				ID: 2, ModelStage: "talker", InputSources: []int{1},
				TensorParallelSize: 1, NumReplicas: 1, Devices: []int{2},
				Replicas:        []Replica{{Devices: []int{2}}},
				InputConnectors: map[int]string{1: "shm"},
			},
			{
				ID: 3, ModelStage: "code2wav", InputSources: []int{2},
				FinalOutput: true, FinalOutputType: OutputAudio,
				TensorParallelSize: 1, NumReplicas: 1, Devices: []int{2},
				Replicas:        []Replica{{Devices: []int{2}}},
				InputConnectors: map[int]string{2: "shm"},
			},
		},
	}
}

// validColocated is the default 3-stage deploy: Thinker on device 0, Talker
// and Code2Wav sharing device 1.
func validColocated() *Topology {
	return &Topology{
		Supported:  testSupport(),
		Connectors: []string{"shm"},
		Stages: []Stage{
			{
				ID: 0, ModelStage: "thinker", FinalOutput: true, FinalOutputType: OutputText,
				TensorParallelSize: 1, NumReplicas: 1, Devices: []int{0},
				Replicas: []Replica{{Devices: []int{0}}}, DisaggregationCapable: true,
			},
			{
				ID: 1, ModelStage: "talker", InputSources: []int{0},
				TensorParallelSize: 1, NumReplicas: 1, Devices: []int{1},
				Replicas: []Replica{{Devices: []int{1}}}, InputConnectors: map[int]string{0: "shm"},
			},
			{
				ID: 2, ModelStage: "code2wav", InputSources: []int{1},
				FinalOutput: true, FinalOutputType: OutputAudio,
				TensorParallelSize: 1, NumReplicas: 1, Devices: []int{1},
				Replicas: []Replica{{Devices: []int{1}}}, InputConnectors: map[int]string{1: "shm"},
			},
		},
	}
}

// setDevices gives a one-replica stage a device set, keeping the stage-level
// union consistent so that only the intended violation fires.
func setDevices(s *Stage, ds ...int) {
	s.Devices = ds
	s.Replicas[0].Devices = ds
}

// addStage appends a copy of stage i with a new id, engine id, port and device.
func addStage(t *Topology, i, id int, engineID string, port, device int) *Stage {
	s := t.Stages[i]
	s.ID = id
	kv := *s.KV
	kv.EngineID = engineID
	s.KV = &kv
	s.Replicas = []Replica{{Devices: []int{device}, EngineID: engineID, KVPort: port}}
	s.Devices = []int{device}
	t.Stages = append(t.Stages, s)
	return &t.Stages[len(t.Stages)-1]
}

func TestValidateAcceptsValidTopologies(t *testing.T) {
	tests := []struct {
		name   string
		build  func() *Topology
		mutate func(*Topology)
	}{
		{"pd", validPD, nil},
		{"colocated", validColocated, nil},
		{"thinker only", func() *Topology {
			tp := validColocated()
			tp.Stages = tp.Stages[:1]
			return tp
		}, nil},
		// Talker and Code2Wav share a device in both layouts above; two
		// different non-PD stages may always do so.
		{"kv_both on prefill and decode", validPD, func(tp *Topology) {
			tp.Stages[0].KV.Role = KVBoth
			tp.Stages[1].KV.Role = KVBoth
		}},
		{"kv on a full stage for offloading", validColocated, func(tp *Topology) {
			tp.Stages[0].KV = &KVTransfer{Connector: "LMCacheConnectorV1", Role: KVBoth}
		}},
		{"final_output_type on a non-final stage", validPD, func(tp *Topology) {
			tp.Stages[2].FinalOutputType = "whatever"
		}},
		{"buffer sizes equal in value", validPD, func(tp *Topology) {
			tp.Stages[0].KV.BufferSize = "1e9"
			tp.Stages[1].KV.BufferSize = "1000000000"
		}},
		{"buffer settings on one side only", validPD, func(tp *Topology) {
			tp.Stages[0].KV.BufferDevice = "cuda"
			tp.Stages[1].KV.BufferSize = "5e9"
		}},
		{"output connector to a consumer", validPD, func(tp *Topology) {
			tp.Stages[2].OutputConnectors = map[int]string{3: "shm"}
		}},
		{"tp2 pd", validPD, func(tp *Topology) {
			for i, ds := range [][]int{{0, 1}, {2, 3}} {
				tp.Stages[i].TensorParallelSize = 2
				setDevices(&tp.Stages[i], ds...)
			}
		}},
		{"two decode replicas", validPD, func(tp *Topology) {
			d := &tp.Stages[1]
			d.NumReplicas = 2
			d.Devices = []int{1, 3}
			d.Replicas = []Replica{
				{Devices: []int{1}, EngineID: "thinker-decode-0", KVPort: 25202},
				{Devices: []int{3}, EngineID: "thinker-decode-1", KVPort: 25203},
			}
		}},
		{"stage devices without a per-replica split", validPD, func(tp *Topology) {
			tp.Stages[2].Replicas[0].Devices = nil
		}},
		{"no devices at all", validColocated, func(tp *Topology) {
			for i := range tp.Stages {
				tp.Stages[i].Devices = nil
				tp.Stages[i].Replicas[0].Devices = nil
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := tt.build()
			if tt.mutate != nil {
				tt.mutate(tp)
			}
			if got := Validate(tp); len(got) != 0 {
				t.Errorf("Validate = %v, want no violations", got)
			}
		})
	}
}

func TestValidateReportsEachViolation(t *testing.T) {
	tests := []struct {
		name   string
		build  func() *Topology // validPD when nil
		mutate func(*Topology)
		code   string
		stage  int
		field  string
		msg    string // a substring the message must contain, when set
	}{
		{name: "no stages", mutate: func(tp *Topology) { tp.Stages = nil },
			code: "no-stages", stage: -1, field: "stages"},
		{name: "no final output", mutate: func(tp *Topology) {
			tp.Stages[1].FinalOutput = false
			tp.Stages[3].FinalOutput = false
		}, code: "no-final-output", stage: -1, field: ""},
		{name: "negative stage id", mutate: func(tp *Topology) { tp.Stages[3].ID = -1 },
			code: "stage-id-negative", stage: 3, field: "stage_id"},
		{name: "duplicate stage id", mutate: func(tp *Topology) { tp.Stages[3].ID = 0 },
			code: "stage-id-duplicate", stage: 3, field: "stage_id", msg: "stages[0]"},
		{name: "unknown role", mutate: func(tp *Topology) { tp.Stages[2].Role = Role(7) },
			code: "role-unknown", stage: 2, field: ""},
		{name: "unknown input source", mutate: func(tp *Topology) { tp.Stages[2].InputSources = []int{1, 9} },
			code: "input-source-unknown", stage: 2, field: "input_sources[1]", msg: "0,1,2,3"},
		{name: "self input source", mutate: func(tp *Topology) { tp.Stages[3].InputSources = []int{2, 3} },
			code: "input-source-self", stage: 3, field: "input_sources[1]"},
		{name: "duplicate input source", mutate: func(tp *Topology) { tp.Stages[3].InputSources = []int{2, 2} },
			code: "input-source-duplicate", stage: 3, field: "input_sources[1]"},
		{name: "cycle", mutate: func(tp *Topology) { tp.Stages[2].InputSources = []int{1, 3} },
			code: "input-cycle", stage: 2, field: "input_sources", msg: "2 -> 3 -> 2"},
		{name: "final output without type", mutate: func(tp *Topology) { tp.Stages[3].FinalOutputType = "" },
			code: "final-output-type-missing", stage: 3, field: "final_output_type"},
		{name: "final output of unknown type", mutate: func(tp *Topology) { tp.Stages[3].FinalOutputType = "video" },
			code: "final-output-type-unknown", stage: 3, field: "final_output_type", msg: `"video"`},
		{name: "tensor parallel size zero", mutate: func(tp *Topology) { tp.Stages[2].TensorParallelSize = 0 },
			code: "tensor-parallel-size-invalid", stage: 2, field: "tensor_parallel_size"},
		{name: "num replicas zero", mutate: func(tp *Topology) { tp.Stages[2].NumReplicas = 0 },
			code: "num-replicas-invalid", stage: 2, field: "num_replicas"},
		{name: "replicas not resolved", mutate: func(tp *Topology) { tp.Stages[2].NumReplicas = 2 },
			code: "replica-count-mismatch", stage: 2, field: "num_replicas"},
		{name: "replica devices do not match tp", mutate: func(tp *Topology) { setDevices(&tp.Stages[2], 2, 3) },
			code: "devices-count-mismatch", stage: 2, field: "replicas[0].devices", msg: "2,3"},
		{name: "stage devices do not match tp", mutate: func(tp *Topology) {
			tp.Stages[2].Replicas[0].Devices = nil
			tp.Stages[2].Devices = []int{2, 3}
		}, code: "devices-count-mismatch", stage: 2, field: "devices"},
		{name: "negative device", mutate: func(tp *Topology) { setDevices(&tp.Stages[2], -2) },
			code: "device-invalid", stage: 2, field: "replicas[0].devices", msg: "-2"},
		{name: "device listed twice", mutate: func(tp *Topology) {
			tp.Stages[2].TensorParallelSize = 2
			setDevices(&tp.Stages[2], 2, 2)
		}, code: "device-listed-twice", stage: 2, field: "replicas[0].devices"},
		{name: "replicas share a device", mutate: func(tp *Topology) {
			tp.Stages[2].NumReplicas = 2
			tp.Stages[2].Replicas = []Replica{{Devices: []int{2}}, {Devices: []int{2}}}
		}, code: "device-shared-by-replicas", stage: 2, field: "replicas[1].devices", msg: "replicas[0]"},
		{name: "stage devices differ from replicas", mutate: func(tp *Topology) { tp.Stages[2].Devices = []int{5} },
			code: "devices-replicas-mismatch", stage: 2, field: "devices"},
		{name: "input connector for a non-input", mutate: func(tp *Topology) { tp.Stages[2].InputConnectors[0] = "shm" },
			code: "input-connector-not-input", stage: 2, field: "input_connectors.from_stage_0"},
		{name: "undefined connector", mutate: func(tp *Topology) { tp.Stages[3].InputConnectors[2] = "nope" },
			code: "connector-undefined", stage: 3, field: "input_connectors.from_stage_2", msg: "shm"},
		{name: "output connector to a missing stage", mutate: func(tp *Topology) { tp.Stages[2].OutputConnectors = map[int]string{9: "shm"} },
			code: "output-connector-unknown-stage", stage: 2, field: "output_connectors.to_stage_9"},
		{name: "output connector to a non-consumer", mutate: func(tp *Topology) { tp.Stages[1].OutputConnectors = map[int]string{3: "shm"} },
			code: "output-connector-not-input", stage: 1, field: "output_connectors.to_stage_3"},
		{name: "invalid kv role on decode", mutate: func(tp *Topology) { tp.Stages[1].KV.Role = "kv_bogus" },
			code: "kv-role-invalid", stage: 1, field: "kv_transfer_config.kv_role", msg: `"kv_bogus"`},
		{name: "invalid kv role on a full stage", mutate: func(tp *Topology) {
			tp.Stages[2].KV = &KVTransfer{Connector: "LMCacheConnectorV1"}
		}, code: "kv-role-invalid", stage: 2, field: "kv_transfer_config.kv_role"},
		{name: "kv connector missing", mutate: func(tp *Topology) { tp.Stages[2].KV = &KVTransfer{Role: KVBoth} },
			code: "kv-connector-missing", stage: 2, field: "kv_transfer_config.kv_connector"},
		{name: "kv port out of range", mutate: func(tp *Topology) { tp.Stages[2].Replicas[0].KVPort = 70000 },
			code: "kv-port-invalid", stage: 2, field: "replicas[0].kv_port"},
		{name: "kv port clash", mutate: func(tp *Topology) { tp.Stages[1].Replicas[0].KVPort = 25201 },
			code: "kv-port-duplicate", stage: 1, field: "replicas[0].kv_port", msg: "used by the prefill's replicas[0]"},
		{name: "decode without prefill", mutate: func(tp *Topology) { tp.Stages[0].Role = RoleFull },
			code: "pd-prefill-missing", stage: 1, field: "is_decode_only"},
		{name: "prefill without decode", mutate: func(tp *Topology) {
			tp.Stages[1].Role = RoleFull
			tp.Stages[1].InputSources = nil
		}, code: "pd-decode-missing", stage: 0, field: "is_prefill_only"},
		{name: "two prefills", mutate: func(tp *Topology) { addStage(tp, 0, 4, "thinker-prefill-2", 25203, 3) },
			code: "pd-prefill-duplicate", stage: 4, field: "is_prefill_only"},
		{name: "two decodes", mutate: func(tp *Topology) { addStage(tp, 1, 4, "thinker-decode-2", 25204, 4) },
			code: "pd-decode-duplicate", stage: 4, field: "is_decode_only"},
		{name: "decode not capable", mutate: func(tp *Topology) { tp.Stages[1].DisaggregationCapable = false },
			code: "pd-not-capable", stage: 1, field: "is_decode_only"},
		{name: "prefill not capable", mutate: func(tp *Topology) { tp.Stages[0].DisaggregationCapable = false },
			code: "pd-not-capable", stage: 0, field: "is_prefill_only"},
		{name: "decode without kv", mutate: func(tp *Topology) { tp.Stages[1].KV = nil },
			code: "pd-kv-missing", stage: 1, field: "kv_transfer_config"},
		{name: "prefill consumes", mutate: func(tp *Topology) { tp.Stages[0].KV.Role = KVConsumer },
			code: "pd-prefill-kv-role", stage: 0, field: "kv_transfer_config.kv_role", msg: `"kv_consumer" on a prefill stage`},
		{name: "decode produces", mutate: func(tp *Topology) { tp.Stages[1].KV.Role = KVProducer },
			code: "pd-decode-kv-role", stage: 1, field: "kv_transfer_config.kv_role", msg: `"kv_producer" on a decode stage; want kv_consumer or kv_both`},
		{name: "connector mismatch", mutate: func(tp *Topology) { tp.Stages[1].KV.Connector = "NixlConnector" },
			code: "pd-kv-connector-mismatch", stage: 1, field: "kv_transfer_config.kv_connector"},
		{name: "unknown kv connector", mutate: func(tp *Topology) {
			tp.Stages[0].KV.Connector = "FooConnector"
			tp.Stages[1].KV.Connector = "FooConnector"
		}, code: "pd-kv-connector-unknown", stage: 0, field: "kv_transfer_config.kv_connector", msg: "MooncakeConnector, NixlConnector"},
		{name: "buffer device mismatch", mutate: func(tp *Topology) {
			tp.Stages[0].KV.BufferDevice = "cuda"
			tp.Stages[1].KV.BufferDevice = "cpu"
		}, code: "pd-kv-buffer-device-mismatch", stage: 1, field: "kv_transfer_config.kv_buffer_device"},
		{name: "buffer size mismatch", mutate: func(tp *Topology) {
			tp.Stages[0].KV.BufferSize = "1e9"
			tp.Stages[1].KV.BufferSize = "2e9"
		}, code: "pd-kv-buffer-size-mismatch", stage: 1, field: "kv_transfer_config.kv_buffer_size"},
		{name: "tensor parallel mismatch", mutate: func(tp *Topology) {
			tp.Stages[1].TensorParallelSize = 2
			setDevices(&tp.Stages[1], 1, 4)
		}, code: "pd-tensor-parallel-mismatch", stage: 1, field: "tensor_parallel_size"},
		{name: "prefill and decode share a device", mutate: func(tp *Topology) { setDevices(&tp.Stages[1], 0) },
			code: "pd-devices-overlap", stage: 1, field: "devices", msg: "both use device 0;"},
		{name: "decode does not read the prefill", mutate: func(tp *Topology) { tp.Stages[1].InputSources = nil },
			code: "pd-decode-input-missing", stage: 1, field: "input_sources"},
		{name: "engine id missing", mutate: func(tp *Topology) { tp.Stages[1].Replicas[0].EngineID = "" },
			code: "pd-engine-id-missing", stage: 1, field: "replicas[0].engine_id"},
		{name: "engine id shared", mutate: func(tp *Topology) { tp.Stages[1].Replicas[0].EngineID = "thinker-prefill" },
			code: "pd-engine-id-duplicate", stage: 1, field: "replicas[0].engine_id"},
		{name: "prefill is final", mutate: func(tp *Topology) {
			tp.Stages[0].FinalOutput = true
			tp.Stages[0].FinalOutputType = OutputText
		}, code: "pd-prefill-final-output", stage: 0, field: "final_output"},
		{name: "talker reads the prefill", mutate: func(tp *Topology) { tp.Stages[2].InputSources = []int{1, 0} },
			code: "pd-prefill-feeds-non-decode", stage: 2, field: "input_sources[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			build := tt.build
			if build == nil {
				build = validPD
			}
			tp := build()
			tt.mutate(tp)
			got := Validate(tp)
			if len(got) != 1 {
				t.Fatalf("Validate = %d violations, want 1:\n%s", len(got), lines(got))
			}
			v := got[0]
			if v.Code != tt.code || v.Stage != tt.stage || v.Field != tt.field {
				t.Errorf("Validate = {stage %d, field %q, code %q}, want {stage %d, field %q, code %q}\n%s",
					v.Stage, v.Field, v.Code, tt.stage, tt.field, tt.code, v)
			}
			if !strings.Contains(v.Msg, tt.msg) {
				t.Errorf("message %q does not contain %q", v.Msg, tt.msg)
			}
		})
	}
}

func lines(vs []Violation) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "\t%s [%s]\n", v, v.Code)
	}
	return b.String()
}

func TestValidateReportsEverything(t *testing.T) {
	tp := validPD()
	tp.Stages[1].KV.Role = KVProducer           // pd-decode-kv-role
	tp.Stages[1].KV.Connector = "NixlConnector" // pd-kv-connector-mismatch
	setDevices(&tp.Stages[1], 0)                // pd-devices-overlap
	tp.Stages[3].FinalOutputType = "video"      // final-output-type-unknown
	tp.Stages[3].InputConnectors[2] = "nope"    // connector-undefined
	tp.Stages[2].TensorParallelSize = 0         // tensor-parallel-size-invalid
	tp.Stages[2].InputSources = []int{1, 3}     // input-cycle

	got := Validate(tp)
	want := []struct {
		stage       int
		field, code string
	}{
		{1, "devices", "pd-devices-overlap"},
		{1, "kv_transfer_config.kv_connector", "pd-kv-connector-mismatch"},
		{1, "kv_transfer_config.kv_role", "pd-decode-kv-role"},
		{2, "input_sources", "input-cycle"},
		{2, "tensor_parallel_size", "tensor-parallel-size-invalid"},
		{3, "final_output_type", "final-output-type-unknown"},
		{3, "input_connectors.from_stage_2", "connector-undefined"},
	}
	if len(got) != len(want) {
		t.Fatalf("Validate = %d violations, want %d:\n%s", len(got), len(want), lines(got))
	}
	for i, w := range want {
		if g := got[i]; g.Stage != w.stage || g.Field != w.field || g.Code != w.code {
			t.Errorf("violation %d = {%d %q %q}, want {%d %q %q}", i, g.Stage, g.Field, g.Code, w.stage, w.field, w.code)
		}
	}
}

func TestViolationString(t *testing.T) {
	tests := []struct {
		v    Violation
		want string
	}{
		{Violation{Stage: 1, Field: "kv_transfer_config.kv_role", Msg: "bad"}, "stages[1].kv_transfer_config.kv_role: bad"},
		{Violation{Stage: 2, Msg: "bad"}, "stages[2]: bad"},
		{Violation{Stage: -1, Field: "stages", Msg: "bad"}, "stages: bad"},
		{Violation{Stage: -1, Msg: "bad"}, "bad"},
	}
	for _, tt := range tests {
		if got := tt.v.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestCompareFieldOrdersNumbersByValue(t *testing.T) {
	fields := []string{"input_sources[10]", "input_sources", "devices", "input_sources[2]", "input_sources[02]", "replicas[1].devices", "replicas[0].kv_port"}
	slices.SortFunc(fields, compareField)
	want := []string{"devices", "input_sources", "input_sources[2]", "input_sources[02]", "input_sources[10]", "replicas[0].kv_port", "replicas[1].devices"}
	if !slices.Equal(fields, want) {
		t.Errorf("sorted = %q, want %q", fields, want)
	}
}

func TestValidateCycleNamedOnce(t *testing.T) {
	// Stages 1, 2 and 3 feed each other in a ring, with an extra chord 3 -> 2;
	// one group of mutually dependent stages yields one violation.
	tp := validColocated()
	tp.Stages = append(tp.Stages, Stage{ID: 3, InputSources: []int{2}, TensorParallelSize: 1, NumReplicas: 1, Replicas: []Replica{{}}})
	tp.Stages[1].InputSources = []int{0, 3}
	tp.Stages[2].InputSources = []int{1, 3}
	tp.Stages[3].InputSources = []int{2}
	var cycles []Violation
	for _, v := range Validate(tp) {
		if v.Code == CodeInputCycle {
			cycles = append(cycles, v)
		}
	}
	if len(cycles) != 1 {
		t.Fatalf("got %d cycle violations, want 1:\n%s", len(cycles), lines(cycles))
	}
	if !strings.Contains(cycles[0].Msg, "1 -> 2 -> 3 -> 1") || cycles[0].Stage != 1 {
		t.Errorf("cycle = %s, want it at stages[1] naming 1 -> 2 -> 3 -> 1", cycles[0])
	}
}

func TestValidateNeverPanics(t *testing.T) {
	for _, tp := range []*Topology{nil, {}, {Stages: []Stage{{}}}, {Stages: make([]Stage, 3)}} {
		got := Validate(tp) // must not panic
		if len(got) == 0 {
			t.Errorf("Validate(%+v) = no violations, want some", tp)
		}
	}

	known := map[string]bool{}
	for _, c := range allTestedCodes() {
		known[c] = true
	}
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 3000 {
		tp := junk(r)
		got := Validate(tp)
		if again := Validate(tp); !reflect.DeepEqual(got, again) {
			t.Fatalf("junk %d: Validate is not deterministic:\n%s\nvs\n%s", n, lines(got), lines(again))
		}
		for _, v := range got {
			if v.Stage < -1 || v.Stage >= len(tp.Stages) || v.Code == "" || v.Msg == "" {
				t.Fatalf("junk %d: malformed violation %+v", n, v)
			}
			if !known[v.Code] {
				t.Errorf("junk %d: code %q has no case in TestValidateReportsEachViolation", n, v.Code)
			}
		}
	}
}

// allTestedCodes lists the codes TestValidateReportsEachViolation pins, so
// the junk test can catch a code that slipped in without a case.
func allTestedCodes() []string {
	return []string{
		"no-stages", "no-final-output", "stage-id-negative", "stage-id-duplicate", "role-unknown",
		"input-source-unknown", "input-source-self", "input-source-duplicate", "input-cycle",
		"final-output-type-missing", "final-output-type-unknown", "tensor-parallel-size-invalid",
		"num-replicas-invalid", "replica-count-mismatch", "devices-count-mismatch", "device-invalid",
		"device-listed-twice", "device-shared-by-replicas", "devices-replicas-mismatch",
		"input-connector-not-input", "output-connector-unknown-stage", "output-connector-not-input",
		"connector-undefined", "kv-role-invalid", "kv-connector-missing", "kv-port-invalid",
		"kv-port-duplicate", "pd-prefill-missing", "pd-decode-missing", "pd-prefill-duplicate",
		"pd-decode-duplicate", "pd-not-capable", "pd-kv-missing", "pd-prefill-kv-role",
		"pd-decode-kv-role", "pd-kv-connector-mismatch", "pd-kv-connector-unknown",
		"pd-kv-buffer-device-mismatch", "pd-kv-buffer-size-mismatch", "pd-tensor-parallel-mismatch",
		"pd-devices-overlap", "pd-decode-input-missing", "pd-engine-id-missing",
		"pd-engine-id-duplicate", "pd-prefill-final-output", "pd-prefill-feeds-non-decode",
		// TestValidateReportsEachEncoderViolation pins these.
		CodeECRoleInvalid, CodeECConnectorMissing, CodeEncoderWithoutPD, CodeEncoderDuplicate,
		CodeEncoderNotCapable, CodeEncoderHasInputs, CodeEncoderFinalOutput, CodeEncoderFeedsNothing,
		CodeEncoderFeedsNonPrefill, CodeEncoderECMissing, CodeEncoderECRole, CodeEncoderECConnectorUnknown,
		CodeEncoderPrefillECMissing, CodeEncoderPrefillECRole, CodeEncoderECConnectorMismatch,
		CodeEncoderECStoreMismatch, CodeEncoderDevicesOverlap, CodeEncoderEngineIDMissing,
		CodeEncoderEngineIDDuplicate,
	}
}

// junk builds a random, mostly broken topology from small value ranges so
// that collisions (duplicate ids, shared devices, cycles) are common.
func junk(r *rand.Rand) *Topology {
	small := func() int { return r.IntN(8) - 2 }
	ints := func() []int {
		if r.IntN(4) == 0 {
			return nil
		}
		out := make([]int, r.IntN(4))
		for i := range out {
			out[i] = small()
		}
		return out
	}
	pick := func(ss ...string) string { return ss[r.IntN(len(ss))] }
	conns := func() map[int]string {
		if r.IntN(3) == 0 {
			return nil
		}
		m := map[int]string{}
		for range r.IntN(3) {
			m[small()] = pick("", "shm", "nope")
		}
		return m
	}
	tp := &Topology{}
	if r.IntN(2) == 0 {
		tp.Connectors = []string{"shm"}
	}
	for range r.IntN(6) {
		s := Stage{
			ID:                    small(),
			Role:                  Role(r.IntN(6) - 1),
			InputSources:          ints(),
			FinalOutput:           r.IntN(2) == 0,
			FinalOutputType:       pick("", "text", "audio", "image", "video"),
			TensorParallelSize:    small(),
			NumReplicas:           small(),
			Devices:               ints(),
			InputConnectors:       conns(),
			OutputConnectors:      conns(),
			DisaggregationCapable: r.IntN(2) == 0,
		}
		for range r.IntN(4) {
			s.Replicas = append(s.Replicas, Replica{
				Devices:  ints(),
				EngineID: pick("", "a", "b"),
				KVPort:   []int{0, 1, 1, -5, 70000}[r.IntN(5)],
			})
		}
		if r.IntN(3) > 0 {
			s.KV = &KVTransfer{
				Connector:    pick("", "MooncakeConnector", "NixlConnector", "Foo"),
				Role:         pick("", KVProducer, KVConsumer, KVBoth, "bogus"),
				BufferDevice: pick("", "cuda", "cpu"),
				BufferSize:   pick("", "1e9", "1000000000", "x"),
			}
		}
		if r.IntN(3) == 0 {
			s.EC = &ECTransfer{
				Connector: pick("", "ECExampleConnector", "ReferenceECConnector", "Foo"),
				Role:      pick("", ECProducer, ECConsumer, ECBoth, "bogus"),
				Store:     pick("", "/tmp", "/mnt"),
			}
		}
		tp.Stages = append(tp.Stages, s)
	}
	return tp
}
