package topology

import (
	"strings"
	"testing"
)

const storeField = "ec_transfer_config.ec_connector_extra_config.shared_storage_path"

// validEPD is the basic TP=1 E/P/D Qwen3-Omni layout: encoder on device 0,
// prefill on 1, decode on 2, Talker and Code2Wav sharing 3; Mooncake
// between prefill and decode, ECExampleConnector between encoder and
// prefill.
func validEPD() *Topology {
	tp := validPD()
	for i := range tp.Stages {
		s := &tp.Stages[i]
		s.ID++
		for k := range s.InputSources {
			s.InputSources[k]++
		}
		for _, m := range []*map[int]string{&s.InputConnectors, &s.OutputConnectors} {
			if *m == nil {
				continue
			}
			shifted := map[int]string{}
			for id, name := range *m {
				shifted[id+1] = name
			}
			*m = shifted
		}
		setDevices(s, s.Devices[0]+1)
	}
	tp.Stages[0].InputSources = []int{0}
	tp.Stages[0].EC = &ECTransfer{Connector: "ECExampleConnector", Role: ECConsumer, Store: "/tmp/ec_cache", StoreField: storeField}
	enc := Stage{
		ID: 0, ModelStage: "thinker", Role: RoleEncoder, InputSources: []int{},
		TensorParallelSize: 1, NumReplicas: 1, Devices: []int{0},
		Replicas:              []Replica{{Devices: []int{0}, EngineID: "thinker-encoder"}},
		EC:                    &ECTransfer{Connector: "ECExampleConnector", Role: ECProducer, EngineID: "thinker-encoder", Store: "/tmp/ec_cache", StoreField: storeField},
		DisaggregationCapable: true,
	}
	tp.Stages = append([]Stage{enc}, tp.Stages...)
	return tp
}

// validEColocated is an encoder in front of a Thinker that is not split:
// every check passes but the one that needs the split.
func validEColocated() *Topology {
	tp := validColocated()
	for i := range tp.Stages {
		s := &tp.Stages[i]
		s.ID++
		for k := range s.InputSources {
			s.InputSources[k]++
		}
		shifted := map[int]string{}
		for id, name := range s.InputConnectors {
			shifted[id+1] = name
		}
		if len(shifted) > 0 {
			s.InputConnectors = shifted
		}
		setDevices(s, s.Devices[0]+1)
	}
	enc := validEPD().Stages[0]
	tp.Stages = append([]Stage{enc}, tp.Stages...)
	return tp
}

func TestEPDFixturesAreWhatTheySay(t *testing.T) {
	tp := validEPD()
	e, ok := tp.EncoderStage()
	if !ok || e != 0 || tp.Stages[e].Role.String() != "encoder" {
		t.Fatalf("EncoderStage = %d, %v; want 0 (role encoder)", e, ok)
	}
	if p, d, ok := tp.PDPair(); !ok || p != 1 || d != 2 {
		t.Fatalf("PDPair = %d, %d, %v; want 1, 2", p, d, ok)
	}
	if _, ok := validPD().EncoderStage(); ok {
		t.Error("validPD has an encoder stage")
	}
	two := validEPD()
	two.Stages[1].Role = RoleEncoder
	if _, ok := two.EncoderStage(); ok {
		t.Error("EncoderStage is ok with two encoder stages")
	}
}

func TestValidateAcceptsValidEPD(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Topology)
	}{
		{"1E1P1D", nil},
		{"two encoder instances", func(tp *Topology) {
			e := &tp.Stages[0]
			e.NumReplicas = 2
			e.Devices = []int{0, 5}
			e.Replicas = []Replica{{Devices: []int{0}, EngineID: "thinker-encoder-0"}, {Devices: []int{5}, EngineID: "thinker-encoder-1"}}
		}},
		{"ec_both on the prefill", func(tp *Topology) { tp.Stages[1].EC.Role = ECBoth }},
		{"encoder tp differs from the prefill's", func(tp *Topology) {
			tp.Stages[0].TensorParallelSize = 2
			setDevices(&tp.Stages[0], 0, 5)
		}},
		{"reference EC connector without a store", func(tp *Topology) {
			for _, i := range []int{0, 1} {
				tp.Stages[i].EC.Connector, tp.Stages[i].EC.Store, tp.Stages[i].EC.StoreField = "ReferenceECConnector", "", ""
			}
		}},
		{"encoder shares its devices with the downstream stages", func(tp *Topology) { setDevices(&tp.Stages[0], 3) }},
		{"thinker only", func(tp *Topology) { tp.Stages = tp.Stages[:3] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := validEPD()
			if tt.mutate != nil {
				tt.mutate(tp)
			}
			if got := Validate(tp); len(got) != 0 {
				t.Errorf("Validate = %v, want no violations", got)
			}
		})
	}
}

func TestValidateReportsEachEncoderViolation(t *testing.T) {
	tests := []struct {
		name   string
		build  func() *Topology // validEPD when nil
		mutate func(*Topology)
		code   string
		stage  int
		field  string
		msg    string
	}{
		{name: "unknown ec role", mutate: func(tp *Topology) { tp.Stages[1].EC.Role = "bogus" },
			code: CodeECRoleInvalid, stage: 1, field: "ec_transfer_config.ec_role", msg: `"bogus"`},
		{name: "no ec connector", mutate: func(tp *Topology) { tp.Stages[1].EC.Connector = "" },
			code: CodeECConnectorMissing, stage: 1, field: "ec_transfer_config.ec_connector"},
		{name: "encoder without pd", build: validEColocated, mutate: func(*Topology) {},
			code: CodeEncoderWithoutPD, stage: 0, field: "is_encoder_only", msg: "split the Thinker"},
		{name: "two encoder stages", mutate: func(tp *Topology) {
			second := tp.Stages[0]
			second.ID = 9
			second.Replicas = []Replica{{Devices: []int{7}, EngineID: "thinker-encoder-b"}}
			second.Devices = []int{7}
			tp.Stages = append(tp.Stages, second)
		}, code: CodeEncoderDuplicate, stage: 5, field: "is_encoder_only", msg: "stage 0 is already the encoder stage"},
		{name: "encoder role on the talker", mutate: func(tp *Topology) {
			tp.Stages[0].DisaggregationCapable = false
			tp.Stages[0].ModelStage = "talker"
		}, code: CodeEncoderNotCapable, stage: 0, field: "is_encoder_only", msg: "talker"},
		{name: "encoder reads from a stage", mutate: func(tp *Topology) {
			tp.Stages = tp.Stages[:3]
			tp.Stages = append(tp.Stages, Stage{ID: 3, ModelStage: "talker", InputSources: []int{}, TensorParallelSize: 1, NumReplicas: 1,
				Devices: []int{3}, Replicas: []Replica{{Devices: []int{3}}}})
			tp.Stages[0].InputSources = []int{3}
		}, code: CodeEncoderHasInputs, stage: 0, field: "input_sources"},
		{name: "encoder is a final output", mutate: func(tp *Topology) {
			tp.Stages[0].FinalOutput, tp.Stages[0].FinalOutputType = true, OutputText
		}, code: CodeEncoderFinalOutput, stage: 0, field: "final_output"},
		{name: "nothing reads from the encoder", mutate: func(tp *Topology) { tp.Stages[1].InputSources = []int{} },
			code: CodeEncoderFeedsNothing, stage: 0, field: "", msg: "input_sources"},
		{name: "the talker reads from the encoder", mutate: func(tp *Topology) { tp.Stages[3].InputSources = []int{2, 0} },
			code: CodeEncoderFeedsNonPrefill, stage: 3, field: "input_sources[1]", msg: "only the prefill"},
		{name: "encoder without ec_transfer_config", mutate: func(tp *Topology) { tp.Stages[0].EC = nil },
			code: CodeEncoderECMissing, stage: 0, field: "ec_transfer_config", msg: "ec_producer"},
		{name: "encoder is an ec_consumer", mutate: func(tp *Topology) { tp.Stages[0].EC.Role = ECConsumer },
			code: CodeEncoderECRole, stage: 0, field: "ec_transfer_config.ec_role", msg: `"ec_consumer"`},
		{name: "encoder is ec_both", mutate: func(tp *Topology) { tp.Stages[0].EC.Role = ECBoth },
			code: CodeEncoderECRole, stage: 0, field: "ec_transfer_config.ec_role", msg: "KV cache"},
		{name: "unknown ec connector", mutate: func(tp *Topology) {
			for _, i := range []int{0, 1} {
				tp.Stages[i].EC.Connector, tp.Stages[i].EC.Store = "SHMConnector", ""
			}
		}, code: CodeEncoderECConnectorUnknown, stage: 0, field: "ec_transfer_config.ec_connector", msg: "ECExampleConnector, ReferenceECConnector"},
		{name: "prefill without ec_transfer_config", mutate: func(tp *Topology) { tp.Stages[1].EC = nil },
			code: CodeEncoderPrefillECMissing, stage: 1, field: "ec_transfer_config", msg: "ec_consumer"},
		{name: "prefill is an ec_producer", mutate: func(tp *Topology) { tp.Stages[1].EC.Role = ECProducer },
			code: CodeEncoderPrefillECRole, stage: 1, field: "ec_transfer_config.ec_role", msg: "want ec_consumer or ec_both"},
		{name: "ec connectors differ", mutate: func(tp *Topology) {
			tp.Stages[1].EC.Connector, tp.Stages[1].EC.Store, tp.Stages[1].EC.StoreField = "ReferenceECConnector", "", ""
		}, code: CodeEncoderECConnectorMismatch, stage: 1, field: "ec_transfer_config.ec_connector", msg: `"ECExampleConnector"`},
		{name: "shared storage paths differ", mutate: func(tp *Topology) { tp.Stages[1].EC.Store = "/mnt/ec" },
			code: CodeEncoderECStoreMismatch, stage: 1, field: storeField, msg: `"/mnt/ec" differs from the encoder's "/tmp/ec_cache"`},
		{name: "encoder on the prefill's device", mutate: func(tp *Topology) { setDevices(&tp.Stages[0], 1) },
			code: CodeEncoderDevicesOverlap, stage: 0, field: "devices", msg: "the encoder and the prefill both use device 1"},
		{name: "encoder on the decode's device", mutate: func(tp *Topology) { setDevices(&tp.Stages[0], 2) },
			code: CodeEncoderDevicesOverlap, stage: 0, field: "devices", msg: "the encoder and the decode both use device 2"},
		{name: "encoder replica without an engine id", mutate: func(tp *Topology) { tp.Stages[0].Replicas[0].EngineID = "" },
			code: CodeEncoderEngineIDMissing, stage: 0, field: "replicas[0].engine_id"},
		{name: "encoder takes the prefill's engine id", mutate: func(tp *Topology) { tp.Stages[0].Replicas[0].EngineID = "thinker-prefill" },
			code: CodeEncoderEngineIDDuplicate, stage: 0, field: "replicas[0].engine_id", msg: "used by the prefill's replicas[0]"},
		{name: "two encoder replicas share an engine id", mutate: func(tp *Topology) {
			e := &tp.Stages[0]
			e.NumReplicas = 2
			e.Devices = []int{0, 5}
			e.Replicas = []Replica{{Devices: []int{0}, EngineID: "enc"}, {Devices: []int{5}, EngineID: "enc"}}
		}, code: CodeEncoderEngineIDDuplicate, stage: 0, field: "replicas[1].engine_id", msg: "used by the encoder's replicas[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			build := tt.build
			if build == nil {
				build = validEPD
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
