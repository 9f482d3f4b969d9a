package topology

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Violation is one broken invariant.
type Violation struct {
	// Stage is an index into Topology.Stages, or -1 when the violation
	// concerns the whole topology.
	Stage int
	// Field is the path relative to the stage as the deploy YAML spells it,
	// e.g. "kv_transfer_config.kv_role", "input_sources[1]", "devices",
	// "input_connectors.from_stage_3"; "" for the stage itself. For Stage -1
	// it is a top-level path or "".
	Field string
	// Code is a stable kebab-case identifier, one per kind of violation.
	Code string
	// Msg is one sentence for a person: what is wrong and what to do.
	Msg string
}

// String formats v as "stages[<i>].<field>: <msg>", the shape config errors
// take once the loader prefixes a file position.
func (v Violation) String() string {
	var path string
	switch {
	case v.Stage >= 0 && v.Field != "":
		path = fmt.Sprintf("stages[%d].%s", v.Stage, v.Field)
	case v.Stage >= 0:
		path = fmt.Sprintf("stages[%d]", v.Stage)
	default:
		path = v.Field
	}
	if path == "" {
		return v.Msg
	}
	return path + ": " + v.Msg
}

// Violation codes. They are part of omnipd's interface (tests, scripts and
// the CLI match on them), so a code never changes meaning once released.
const (
	// CodeNoStages: the topology has no stages at all.
	CodeNoStages = "no-stages"
	// CodeNoFinalOutput: no stage is a final output, so a request would produce nothing.
	CodeNoFinalOutput = "no-final-output"

	// CodeStageIDNegative: a stage_id below zero.
	CodeStageIDNegative = "stage-id-negative"
	// CodeStageIDDuplicate: a stage_id already used by an earlier stage.
	CodeStageIDDuplicate = "stage-id-duplicate"
	// CodeRoleUnknown: a Role value outside full, prefill and decode.
	CodeRoleUnknown = "role-unknown"

	// CodeInputSourceUnknown: an input source names no stage.
	CodeInputSourceUnknown = "input-source-unknown"
	// CodeInputSourceSelf: a stage lists itself as an input source.
	CodeInputSourceSelf = "input-source-self"
	// CodeInputSourceDuplicate: a stage lists the same input source twice.
	CodeInputSourceDuplicate = "input-source-duplicate"
	// CodeInputCycle: input sources form a cycle through several stages.
	CodeInputCycle = "input-cycle"

	// CodeFinalOutputTypeMissing: a final output stage without final_output_type.
	CodeFinalOutputTypeMissing = "final-output-type-missing"
	// CodeFinalOutputTypeUnknown: final_output_type outside text, audio and image.
	CodeFinalOutputTypeUnknown = "final-output-type-unknown"

	// CodeTensorParallelSizeInvalid: tensor_parallel_size below one.
	CodeTensorParallelSizeInvalid = "tensor-parallel-size-invalid"
	// CodeDataParallelSizeInvalid: data_parallel_size below zero (0 means 1).
	CodeDataParallelSizeInvalid = "data-parallel-size-invalid"
	// CodeNumReplicasInvalid: num_replicas below one.
	CodeNumReplicasInvalid = "num-replicas-invalid"
	// CodeReplicaCountMismatch: the number of resolved replicas differs from num_replicas.
	CodeReplicaCountMismatch = "replica-count-mismatch"

	// CodeDevicesCountMismatch: a replica's device count differs from tensor_parallel_size.
	CodeDevicesCountMismatch = "devices-count-mismatch"
	// CodeDeviceInvalid: a negative device id.
	CodeDeviceInvalid = "device-invalid"
	// CodeDeviceListedTwice: one replica lists the same device twice.
	CodeDeviceListedTwice = "device-listed-twice"
	// CodeDeviceSharedByReplicas: two replicas of one stage use the same device.
	CodeDeviceSharedByReplicas = "device-shared-by-replicas"
	// CodeDevicesReplicasMismatch: the stage's devices are not the union of its replicas' devices.
	CodeDevicesReplicasMismatch = "devices-replicas-mismatch"

	// CodeInputConnectorNotInput: an input connector for a stage that is not an input source.
	CodeInputConnectorNotInput = "input-connector-not-input"
	// CodeOutputConnectorUnknownStage: an output connector to a stage that does not exist.
	CodeOutputConnectorUnknownStage = "output-connector-unknown-stage"
	// CodeOutputConnectorNotInput: an output connector to a stage that does not read from this one.
	CodeOutputConnectorNotInput = "output-connector-not-input"
	// CodeConnectorUndefined: a stage connector name missing from the top-level connectors.
	CodeConnectorUndefined = "connector-undefined"

	// CodeKVRoleInvalid: kv_role outside kv_producer, kv_consumer and kv_both.
	CodeKVRoleInvalid = "kv-role-invalid"
	// CodeKVConnectorMissing: kv_transfer_config without kv_connector.
	CodeKVConnectorMissing = "kv-connector-missing"
	// CodeKVPortInvalid: a KV port outside 0..65535.
	CodeKVPortInvalid = "kv-port-invalid"
	// CodeKVPortDuplicate: two prefill or decode replicas share a KV port.
	CodeKVPortDuplicate = "kv-port-duplicate"

	// CodePDPrefillMissing: a decode stage without a prefill stage.
	CodePDPrefillMissing = "pd-prefill-missing"
	// CodePDDecodeMissing: a prefill stage without a decode stage.
	CodePDDecodeMissing = "pd-decode-missing"
	// CodePDPrefillDuplicate: more than one prefill stage.
	CodePDPrefillDuplicate = "pd-prefill-duplicate"
	// CodePDDecodeDuplicate: more than one decode stage.
	CodePDDecodeDuplicate = "pd-decode-duplicate"
	// CodePDNotCapable: a prefill or decode role on a stage that cannot be disaggregated.
	CodePDNotCapable = "pd-not-capable"
	// CodePDKVMissing: a prefill or decode stage without kv_transfer_config.
	CodePDKVMissing = "pd-kv-missing"
	// CodePDPrefillKVRole: a prefill whose kv_role cannot produce KV.
	CodePDPrefillKVRole = "pd-prefill-kv-role"
	// CodePDDecodeKVRole: a decode whose kv_role cannot consume KV.
	CodePDDecodeKVRole = "pd-decode-kv-role"
	// CodePDKVConnectorMismatch: prefill and decode use different KV connectors.
	CodePDKVConnectorMismatch = "pd-kv-connector-mismatch"
	// CodePDKVConnectorUnknown: a PD stage uses a KV connector omnipd cannot route for.
	CodePDKVConnectorUnknown = "pd-kv-connector-unknown"
	// CodePDKVBufferDeviceMismatch: prefill and decode set different kv_buffer_device.
	CodePDKVBufferDeviceMismatch = "pd-kv-buffer-device-mismatch"
	// CodePDKVBufferSizeMismatch: prefill and decode set different kv_buffer_size.
	CodePDKVBufferSizeMismatch = "pd-kv-buffer-size-mismatch"
	// CodePDDataParallelUnroutable: a prefill or decode stage runs
	// data_parallel_size > 1 over a KV connector omnipd cannot route DP ranks for.
	CodePDDataParallelUnroutable = "pd-data-parallel-unroutable"
	// CodePDTensorParallelMismatch: prefill and decode differ in tensor_parallel_size.
	CodePDTensorParallelMismatch = "pd-tensor-parallel-mismatch"
	// CodePDDevicesOverlap: prefill and decode share devices.
	CodePDDevicesOverlap = "pd-devices-overlap"
	// CodePDDecodeInputMissing: the decode does not list the prefill as an input source.
	CodePDDecodeInputMissing = "pd-decode-input-missing"
	// CodePDEngineIDMissing: a prefill or decode replica without an engine id.
	CodePDEngineIDMissing = "pd-engine-id-missing"
	// CodePDEngineIDDuplicate: two prefill or decode replicas share an engine id.
	CodePDEngineIDDuplicate = "pd-engine-id-duplicate"
	// CodePDPrefillFinalOutput: the prefill is marked as a final output.
	CodePDPrefillFinalOutput = "pd-prefill-final-output"
	// CodePDPrefillFeedsNonDecode: a stage other than the decode reads from the prefill.
	CodePDPrefillFeedsNonDecode = "pd-prefill-feeds-non-decode"

	// CodeECRoleInvalid: ec_role outside ec_producer, ec_consumer and ec_both.
	CodeECRoleInvalid = "ec-role-invalid"
	// CodeECConnectorMissing: ec_transfer_config without ec_connector.
	CodeECConnectorMissing = "ec-connector-missing"

	// CodeEncoderWithoutPD: an encoder stage in a topology without a prefill stage.
	CodeEncoderWithoutPD = "encoder-without-pd"
	// CodeEncoderDuplicate: more than one encoder stage.
	CodeEncoderDuplicate = "encoder-duplicate"
	// CodeEncoderNotCapable: the encoder role on a stage whose model cannot be split.
	CodeEncoderNotCapable = "encoder-not-capable"
	// CodeEncoderHasInputs: the encoder reads from another stage.
	CodeEncoderHasInputs = "encoder-has-inputs"
	// CodeEncoderFinalOutput: the encoder is marked as a final output.
	CodeEncoderFinalOutput = "encoder-final-output"
	// CodeEncoderFeedsNothing: no stage reads from the encoder.
	CodeEncoderFeedsNothing = "encoder-feeds-nothing"
	// CodeEncoderFeedsNonPrefill: a stage other than the prefill reads from the encoder.
	CodeEncoderFeedsNonPrefill = "encoder-feeds-non-prefill"
	// CodeEncoderECMissing: an encoder stage without ec_transfer_config.
	CodeEncoderECMissing = "encoder-ec-missing"
	// CodeEncoderECRole: an encoder whose ec_role is not ec_producer.
	CodeEncoderECRole = "encoder-ec-role"
	// CodeEncoderECConnectorUnknown: an encoder over an EC connector omnipd cannot run.
	CodeEncoderECConnectorUnknown = "encoder-ec-connector-unknown"
	// CodeEncoderPrefillECMissing: the prefill reads from the encoder without ec_transfer_config.
	CodeEncoderPrefillECMissing = "encoder-prefill-ec-missing"
	// CodeEncoderPrefillECRole: the prefill reads from the encoder with an ec_role that cannot consume.
	CodeEncoderPrefillECRole = "encoder-prefill-ec-role"
	// CodeEncoderECConnectorMismatch: encoder and prefill use different EC connectors.
	CodeEncoderECConnectorMismatch = "encoder-ec-connector-mismatch"
	// CodeEncoderECStoreMismatch: encoder and prefill name different places
	// for the encoder outputs (ECExampleConnector's shared_storage_path).
	CodeEncoderECStoreMismatch = "encoder-ec-store-mismatch"
	// CodeEncoderDevicesOverlap: the encoder shares devices with the prefill or the decode.
	CodeEncoderDevicesOverlap = "encoder-devices-overlap"
	// CodeEncoderEngineIDMissing: an encoder replica without an engine id.
	CodeEncoderEngineIDMissing = "encoder-engine-id-missing"
	// CodeEncoderEngineIDDuplicate: an encoder replica's engine id is already
	// used by another encoder, prefill or decode replica.
	CodeEncoderEngineIDDuplicate = "encoder-engine-id-duplicate"
)

// Validate returns every violation in t, in a deterministic order (stage
// order, then field). Empty means valid. It never stops at the first problem
// because a user fixing a config wants the whole list at once, and it accepts
// any value, however malformed, without panicking.
func Validate(t *Topology) []Violation {
	if t == nil || len(t.Stages) == 0 {
		return []Violation{{Stage: -1, Field: "stages", Code: CodeNoStages,
			Msg: "the topology has no stages; define at least one stage"}}
	}
	v := &validator{t: t, byID: make(map[int]int, len(t.Stages))}
	v.stageIDs()
	for i := range t.Stages {
		v.stage(i)
	}
	v.cycles()
	v.finalOutput()
	v.disaggregation()
	v.encoders()
	slices.SortStableFunc(v.out, func(a, b Violation) int {
		if c := cmp.Compare(max(a.Stage, -1), max(b.Stage, -1)); c != 0 {
			return c
		}
		return compareField(a.Field, b.Field)
	})
	return v.out
}

type validator struct {
	t *Topology
	// byID maps a stage id to the index of its first occurrence, so that a
	// duplicated id does not also make every reference to it look broken.
	byID map[int]int
	out  []Violation
}

func (v *validator) add(stage int, field, code, format string, args ...any) {
	v.out = append(v.out, Violation{Stage: stage, Field: field, Code: code, Msg: fmt.Sprintf(format, args...)})
}

// instance names replica r of stage i in a message: by its stage's role
// when that is the one stage of it ("the prefill's replicas[0]"), else by
// stage id. Stage ids made by PD expansion are not the ones the user
// wrote; a role is the same in both.
func (v *validator) instance(i, r int) string {
	s := &v.t.Stages[i]
	n := 0
	for _, o := range v.t.Stages {
		if o.Role == s.Role {
			n++
		}
	}
	if s.Role != RoleFull && n == 1 {
		return fmt.Sprintf("the %s's replicas[%d]", s.Role, r)
	}
	return fmt.Sprintf("stage %d's replicas[%d]", s.ID, r)
}

func (v *validator) stageIDs() {
	for i, s := range v.t.Stages {
		if s.ID < 0 {
			v.add(i, "stage_id", CodeStageIDNegative, "stage_id %d is negative; use 0 or more", s.ID)
		}
		if first, ok := v.byID[s.ID]; ok {
			v.add(i, "stage_id", CodeStageIDDuplicate, "stage_id %d is already used by stages[%d]; give every stage its own id", s.ID, first)
			continue
		}
		v.byID[s.ID] = i
	}
}

func (v *validator) stage(i int) {
	s := &v.t.Stages[i]
	if s.Role < RoleFull || s.Role > RoleEncoder {
		v.add(i, "", CodeRoleUnknown, "role %d is not full, prefill, decode or encoder", int(s.Role))
	}
	v.inputSources(i, s)
	if s.FinalOutput {
		switch s.FinalOutputType {
		case OutputText, OutputAudio, OutputImage:
		case "":
			v.add(i, "final_output_type", CodeFinalOutputTypeMissing, "a final output stage needs final_output_type; want text, audio or image")
		default:
			v.add(i, "final_output_type", CodeFinalOutputTypeUnknown, "final_output_type %q is unknown; want text, audio or image", s.FinalOutputType)
		}
	}
	if s.TensorParallelSize < 1 {
		v.add(i, "tensor_parallel_size", CodeTensorParallelSizeInvalid, "tensor_parallel_size %d is below 1", s.TensorParallelSize)
	}
	if s.DataParallelSize < 0 {
		v.add(i, "data_parallel_size", CodeDataParallelSizeInvalid, "data_parallel_size %d is below 1", s.DataParallelSize)
	}
	if s.NumReplicas < 1 {
		v.add(i, "num_replicas", CodeNumReplicasInvalid, "num_replicas %d is below 1", s.NumReplicas)
	} else if len(s.Replicas) != s.NumReplicas {
		v.add(i, "num_replicas", CodeReplicaCountMismatch, "num_replicas is %d but %d replicas were resolved", s.NumReplicas, len(s.Replicas))
	}
	v.devices(i, s)
	if s.KV != nil {
		switch s.KV.Role {
		case KVProducer, KVConsumer, KVBoth:
		default:
			v.add(i, "kv_transfer_config.kv_role", CodeKVRoleInvalid, "kv_role %q is unknown; want kv_producer, kv_consumer or kv_both", s.KV.Role)
		}
		if strings.TrimSpace(s.KV.Connector) == "" {
			v.add(i, "kv_transfer_config.kv_connector", CodeKVConnectorMissing, "kv_transfer_config needs a kv_connector naming the vLLM KV connector class, e.g. MooncakeConnector")
		}
	}
	if s.EC != nil {
		if !validECRole(s.EC.Role) {
			v.add(i, "ec_transfer_config.ec_role", CodeECRoleInvalid, "ec_role %q is unknown; want ec_producer, ec_consumer or ec_both", s.EC.Role)
		}
		if strings.TrimSpace(s.EC.Connector) == "" {
			v.add(i, "ec_transfer_config.ec_connector", CodeECConnectorMissing, "ec_transfer_config needs an ec_connector naming the EC connector, e.g. ECExampleConnector")
		}
	}
	for r, rep := range s.Replicas {
		if rep.KVPort < 0 || rep.KVPort > 65535 {
			v.add(i, fmt.Sprintf("replicas[%d].kv_port", r), CodeKVPortInvalid, "kv_port %d is not a TCP port; want 1 to 65535, or 0 for none", rep.KVPort)
		}
	}
	v.connectors(i, s)
}

func (v *validator) inputSources(i int, s *Stage) {
	seen := make(map[int]bool, len(s.InputSources))
	for k, src := range s.InputSources {
		field := fmt.Sprintf("input_sources[%d]", k)
		_, exists := v.byID[src]
		switch {
		case src == s.ID:
			v.add(i, field, CodeInputSourceSelf, "stage %d lists itself as an input source; a stage cannot consume its own output", s.ID)
		case !exists:
			v.add(i, field, CodeInputSourceUnknown, "input source %d names no stage; stage ids are %s", src, v.idList())
		case seen[src]:
			v.add(i, field, CodeInputSourceDuplicate, "input source %d is listed twice; list each source once", src)
		}
		seen[src] = true
	}
}

// idList names the stage ids in ascending order, for messages that must say
// which references would have been valid.
func (v *validator) idList() string {
	return joinInts(slices.Sorted(maps.Keys(v.byID)))
}

// replicaDevices returns whether any replica of s carries devices; when none
// does, the stage-level list is the only device information there is.
func replicaDevices(s *Stage) bool {
	return slices.ContainsFunc(s.Replicas, func(r Replica) bool { return len(r.Devices) > 0 })
}

// stageDevices returns every device s uses, deduplicated, in first-use order.
func stageDevices(s *Stage) []int {
	if !replicaDevices(s) {
		return uniq(s.Devices)
	}
	var all []int
	for _, r := range s.Replicas {
		all = append(all, r.Devices...)
	}
	return uniq(all)
}

func uniq(ds []int) []int {
	var out []int
	for _, d := range ds {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

func (v *validator) devices(i int, s *Stage) {
	if !replicaDevices(s) {
		if len(s.Devices) == 0 {
			return
		}
		// Without a per-replica split, the stage list must cover every
		// replica on devices of its own.
		n := max(s.NumReplicas, len(s.Replicas), 1)
		switch per := s.DevicesPerInstance(); {
		case s.TensorParallelSize < 1 || len(s.Devices) == per*n:
		case s.DataParallelSize > 1:
			v.add(i, "devices", CodeDevicesCountMismatch, "%s for %d replica(s) of tensor_parallel_size %d × data_parallel_size %d; want %d devices, one per rank of each replica",
				devs(s.Devices), n, s.TensorParallelSize, s.DataParallelSize, per*n)
		default:
			v.add(i, "devices", CodeDevicesCountMismatch, "%s for %d replica(s) of tensor_parallel_size %d; want %d devices, one per rank of each replica",
				devs(s.Devices), n, s.TensorParallelSize, per*n)
		}
		v.deviceIDs(i, "devices", s.Devices)
		return
	}
	owner := map[int]int{} // device -> first replica using it
	for r, rep := range s.Replicas {
		field := fmt.Sprintf("replicas[%d].devices", r)
		switch per := s.DevicesPerInstance(); {
		case s.TensorParallelSize < 1 || len(rep.Devices) == per:
		case s.DataParallelSize > 1:
			v.add(i, field, CodeDevicesCountMismatch, "%s for tensor_parallel_size %d × data_parallel_size %d; a replica needs exactly one device per rank (%d)",
				devs(rep.Devices), s.TensorParallelSize, s.DataParallelSize, per)
		default:
			v.add(i, field, CodeDevicesCountMismatch, "%s for tensor_parallel_size %d; a replica needs exactly one device per tensor-parallel rank",
				devs(rep.Devices), s.TensorParallelSize)
		}
		v.deviceIDs(i, field, rep.Devices)
		var shared []int
		var others []string
		for _, d := range uniq(rep.Devices) {
			if o, ok := owner[d]; ok {
				shared = append(shared, d)
				if name := fmt.Sprintf("replicas[%d]", o); !slices.Contains(others, name) {
					others = append(others, name)
				}
				continue
			}
			owner[d] = r
		}
		if len(shared) > 0 {
			v.add(i, field, CodeDeviceSharedByReplicas, "shares %s with %s; each replica of a stage needs devices of its own",
				devs(shared), strings.Join(others, ", "))
		}
	}
	if len(s.Devices) > 0 {
		union := stageDevices(s)
		a, b := slices.Sorted(slices.Values(uniq(s.Devices))), slices.Sorted(slices.Values(union))
		if !slices.Equal(a, b) {
			v.add(i, "devices", CodeDevicesReplicasMismatch, "the stage lists %s but its replicas use %s; the two must be the same set",
				devs(s.Devices), devs(union))
		}
	}
}

func (v *validator) deviceIDs(i int, field string, ds []int) {
	var neg, twice []int
	seen := map[int]bool{}
	for _, d := range ds {
		if d < 0 && !slices.Contains(neg, d) {
			neg = append(neg, d)
		}
		if seen[d] && !slices.Contains(twice, d) {
			twice = append(twice, d)
		}
		seen[d] = true
	}
	if len(neg) > 0 {
		v.add(i, field, CodeDeviceInvalid, "negative %s; device ids start at 0", devs(neg))
	}
	if len(twice) > 0 {
		v.add(i, field, CodeDeviceListedTwice, "%s listed more than once; list each device once", devs(twice))
	}
}

func (v *validator) connectors(i int, s *Stage) {
	for _, src := range slices.Sorted(maps.Keys(s.InputConnectors)) {
		field := fmt.Sprintf("input_connectors.from_stage_%d", src)
		if !slices.Contains(s.InputSources, src) {
			v.add(i, field, CodeInputConnectorNotInput, "stage %d is not among input_sources [%s]; add it there or drop the connector", src, joinInts(s.InputSources))
		}
		v.connectorName(i, field, s.InputConnectors[src])
	}
	for _, dst := range slices.Sorted(maps.Keys(s.OutputConnectors)) {
		field := fmt.Sprintf("output_connectors.to_stage_%d", dst)
		if j, ok := v.byID[dst]; !ok {
			v.add(i, field, CodeOutputConnectorUnknownStage, "stage %d does not exist; stage ids are %s", dst, v.idList())
		} else if !slices.Contains(v.t.Stages[j].InputSources, s.ID) {
			v.add(i, field, CodeOutputConnectorNotInput, "stage %d does not list stage %d in its input_sources; add it there or drop the connector", dst, s.ID)
		}
		v.connectorName(i, field, s.OutputConnectors[dst])
	}
}

func (v *validator) connectorName(i int, field, name string) {
	if slices.Contains(v.t.Connectors, name) {
		return
	}
	if len(v.t.Connectors) == 0 {
		v.add(i, field, CodeConnectorUndefined, "connector %q is not defined and the config defines no connectors; add it under connectors", name)
		return
	}
	v.add(i, field, CodeConnectorUndefined, "connector %q is not defined; defined connectors are %s", name, strings.Join(v.t.Connectors, ", "))
}

// cycles reports each group of stages that wait on each other once, with one
// concrete cycle through it: a group can hold many cycles, and listing them
// all would bury the one fix the user needs to make.
func (v *validator) cycles() {
	n := len(v.t.Stages)
	// feeds[j] lists the stages that consume stage j's output.
	feeds := make([][]int, n)
	for i, s := range v.t.Stages {
		for _, src := range s.InputSources {
			if j, ok := v.byID[src]; ok && j != i && src != s.ID && !slices.Contains(feeds[j], i) {
				feeds[j] = append(feeds[j], i)
			}
		}
	}
	for _, comp := range components(feeds) {
		if len(comp) < 2 {
			continue
		}
		start := slices.Min(comp)
		path := cycleThrough(feeds, comp, start)
		ids := make([]string, len(path))
		for k, idx := range path {
			ids[k] = strconv.Itoa(v.t.Stages[idx].ID)
		}
		v.add(start, "input_sources", CodeInputCycle, "input sources form a cycle: %s; remove one of these edges", strings.Join(ids, " -> "))
	}
}

// components returns the strongly connected components of the graph
// (Tarjan's algorithm).
func components(edges [][]int) [][]int {
	n := len(edges)
	index := make([]int, n)
	low := make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int
	var out [][]int
	next := 0
	var visit func(u int)
	visit = func(u int) {
		index[u], low[u] = next, next
		next++
		stack = append(stack, u)
		onStack[u] = true
		for _, w := range edges[u] {
			if index[w] < 0 {
				visit(w)
				low[u] = min(low[u], low[w])
			} else if onStack[w] {
				low[u] = min(low[u], index[w])
			}
		}
		if low[u] == index[u] {
			var comp []int
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp = append(comp, w)
				if w == u {
					break
				}
			}
			out = append(out, comp)
		}
	}
	for u := range n {
		if index[u] < 0 {
			visit(u)
		}
	}
	return out
}

// cycleThrough returns a shortest path start -> ... -> start inside comp,
// found breadth-first so the message names as few stages as possible.
func cycleThrough(edges [][]int, comp []int, start int) []int {
	in := make(map[int]bool, len(comp))
	for _, c := range comp {
		in[c] = true
	}
	prev := map[int]int{start: -1}
	queue := []int{start}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for _, w := range edges[u] {
			if !in[w] {
				continue
			}
			if w == start {
				path := []int{start}
				for x := u; x != -1; x = prev[x] {
					path = append(path, x)
				}
				slices.Reverse(path)
				return path
			}
			if _, seen := prev[w]; !seen {
				prev[w] = u
				queue = append(queue, w)
			}
		}
	}
	return []int{start, start} // unreachable for a real component; keeps callers safe
}

func (v *validator) finalOutput() {
	if !slices.ContainsFunc(v.t.Stages, func(s Stage) bool { return s.FinalOutput }) {
		v.add(-1, "", CodeNoFinalOutput, "no stage has final_output: true, so no request would produce anything; mark the last stage of each output as final")
	}
}

// roleField is where the deploy YAML spells a stage's disaggregated role.
func roleField(s *Stage) string {
	switch s.Role {
	case RoleDecode:
		return "is_decode_only"
	case RoleEncoder:
		return "is_encoder_only"
	}
	return "is_prefill_only"
}

func (v *validator) disaggregation() {
	var prefills, decodes []int
	for i, s := range v.t.Stages {
		switch s.Role {
		case RolePrefill:
			prefills = append(prefills, i)
		case RoleDecode:
			decodes = append(decodes, i)
		}
	}
	if len(prefills)+len(decodes) == 0 {
		return
	}
	stages := v.t.Stages
	capable := func(i int) bool { return stages[i].DisaggregationCapable }
	switch {
	case len(prefills) == 0 && capable(decodes[0]):
		v.add(decodes[0], "is_decode_only", CodePDPrefillMissing, "a decode stage needs a prefill stage to import KV from; add one or drop is_decode_only")
	case len(decodes) == 0 && capable(prefills[0]):
		v.add(prefills[0], "is_prefill_only", CodePDDecodeMissing, "a prefill stage needs a decode stage to hand its KV to; add one or drop is_prefill_only")
	}
	for _, i := range prefills[min(1, len(prefills)):] {
		v.add(i, "is_prefill_only", CodePDPrefillDuplicate, "stage %d is already the prefill stage; a topology has exactly one prefill/decode pair", stages[prefills[0]].ID)
	}
	for _, i := range decodes[min(1, len(decodes)):] {
		v.add(i, "is_decode_only", CodePDDecodeDuplicate, "stage %d is already the decode stage; a topology has exactly one prefill/decode pair", stages[decodes[0]].ID)
	}

	pd := slices.Concat(prefills, decodes)
	known := v.t.Supported.kvNames(func(KVConnectorSupport) bool { return true })
	dataParallel := v.t.Supported.kvNames(func(k KVConnectorSupport) bool { return k.DataParallel })
	seenUnknown := map[string]bool{}
	incapable := false
	for _, i := range pd {
		s := &stages[i]
		if !s.DisaggregationCapable {
			// A role on a stage that cannot have one is the mistake to
			// report about it; checking its KV settings would add noise.
			v.add(i, roleField(s), CodePDNotCapable, "stage %d (%s) cannot be split into prefill and decode; only the pipeline's autoregressive Thinker can",
				s.ID, cmp.Or(s.ModelStage, "unnamed"))
			incapable = true
			continue
		}
		if s.KV == nil {
			v.add(i, "kv_transfer_config", CodePDKVMissing, "a %s stage needs a kv_transfer_config to move the prompt's KV cache", s.Role)
			continue
		}
		switch {
		case s.Role == RolePrefill && s.KV.Role == KVConsumer:
			v.add(i, "kv_transfer_config.kv_role", CodePDPrefillKVRole, "%q on a prefill stage; want kv_producer or kv_both", s.KV.Role)
		case s.Role == RoleDecode && s.KV.Role == KVProducer:
			v.add(i, "kv_transfer_config.kv_role", CodePDDecodeKVRole, "%q on a decode stage; want kv_consumer or kv_both", s.KV.Role)
		}
		if c := s.KV.Connector; s.DataParallelSize > 1 && c != "" && !slices.Contains(dataParallel, c) {
			v.add(i, "data_parallel_size", CodePDDataParallelUnroutable,
				"data_parallel_size %d on a %s stage over %s: omnipd cannot pin its legs to DP ranks for that connector; use one of %s, or run the ranks as replicas (num_replicas) with data_parallel_size 1",
				s.DataParallelSize, s.Role, c, strings.Join(dataParallel, ", "))
		}
		if c := s.KV.Connector; c != "" && !slices.Contains(known, c) && !seenUnknown[c] {
			seenUnknown[c] = true
			v.add(i, "kv_transfer_config.kv_connector", CodePDKVConnectorUnknown, "kv_connector %q has no router-side support in omnipd; use one of %s",
				c, strings.Join(known, ", "))
		}
	}
	if incapable {
		return
	}
	if len(prefills) > 0 {
		v.prefillUse(prefills)
	}
	// A second prefill or decode is its own mistake; the engine id and
	// ports it shares with the first (the role's defaults) follow from it.
	pair := slices.Concat(prefills[:min(1, len(prefills))], decodes[:min(1, len(decodes))])
	v.engineIDs(pair)
	v.kvPorts(pair)
	if len(prefills) == 1 && len(decodes) == 1 {
		v.pair(prefills[0], decodes[0])
	}
}

// prefillUse checks that the prefill's output reaches only the decode: the
// prefill emits a single throwaway token, so anything but the decode reading
// from it would get no useful output.
func (v *validator) prefillUse(prefills []int) {
	stages := v.t.Stages
	for i, s := range stages {
		if s.Role == RolePrefill && s.FinalOutput {
			v.add(i, "final_output", CodePDPrefillFinalOutput, "the prefill stage produces a single throwaway token and cannot be a final output; make the decode stage final instead")
		}
		if s.Role == RoleDecode {
			continue
		}
		for k, src := range s.InputSources {
			j, ok := v.byID[src]
			if ok && j != i && stages[j].Role == RolePrefill {
				v.add(i, fmt.Sprintf("input_sources[%d]", k), CodePDPrefillFeedsNonDecode,
					"stage %d reads from prefill stage %d, which only the decode stage may do; take input from the decode stage instead", s.ID, src)
			}
		}
	}
}

func (v *validator) engineIDs(pd []int) {
	owner := map[string]string{}
	for _, i := range pd {
		if v.t.Stages[i].KV == nil {
			continue // pd-kv-missing says what to add
		}
		for r, rep := range v.t.Stages[i].Replicas {
			field := fmt.Sprintf("replicas[%d].engine_id", r)
			if rep.EngineID == "" {
				v.add(i, field, CodePDEngineIDMissing, "a %s replica needs an engine_id so the decode can address the prefill's KV", v.t.Stages[i].Role)
				continue
			}
			here := v.instance(i, r)
			if o, ok := owner[rep.EngineID]; ok {
				v.add(i, field, CodePDEngineIDDuplicate, "engine_id %q is already used by %s; every prefill and decode instance needs its own", rep.EngineID, o)
				continue
			}
			owner[rep.EngineID] = here
		}
	}
}

// kvPorts checks that no two prefill or decode instances share a KV port.
// An instance of data_parallel_size n holds n ports from its kv_port: each
// DP rank is an engine that listens on kv_port + its DP index (NIXL's
// VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index).
func (v *validator) kvPorts(pd []int) {
	type held struct {
		lo, hi int // inclusive
		owner  string
	}
	var taken []held
	for _, i := range pd {
		n := max(1, v.t.Stages[i].DataParallelSize)
		for r, rep := range v.t.Stages[i].Replicas {
			if rep.KVPort == 0 {
				continue
			}
			h := held{rep.KVPort, rep.KVPort + n - 1, v.instance(i, r)}
			j := slices.IndexFunc(taken, func(o held) bool { return h.lo <= o.hi && o.lo <= h.hi })
			switch {
			case j < 0:
				taken = append(taken, h)
			case h.lo == h.hi && taken[j].lo == taken[j].hi:
				v.add(i, fmt.Sprintf("replicas[%d].kv_port", r), CodeKVPortDuplicate, "kv_port %d is already used by %s; every prefill and decode instance needs its own", rep.KVPort, taken[j].owner)
			default:
				v.add(i, fmt.Sprintf("replicas[%d].kv_port", r), CodeKVPortDuplicate, "kv_port %d: ports %s overlap %s's %s; every DP rank listens on kv_port + its DP index, so each prefill and decode instance needs a range of its own",
					rep.KVPort, portRange(h.lo, h.hi), taken[j].owner, portRange(taken[j].lo, taken[j].hi))
			}
		}
	}
}

func portRange(lo, hi int) string {
	if lo == hi {
		return strconv.Itoa(lo)
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}

func (v *validator) pair(p, d int) {
	ps, ds := &v.t.Stages[p], &v.t.Stages[d]
	if !slices.Contains(ds.InputSources, ps.ID) {
		v.add(d, "input_sources", CodePDDecodeInputMissing, "the decode stage must list the prefill stage %d in input_sources", ps.ID)
	}
	if ps.KV != nil && ds.KV != nil {
		pk, dk := ps.KV, ds.KV
		if pk.Connector != "" && dk.Connector != "" && pk.Connector != dk.Connector {
			v.add(d, "kv_transfer_config.kv_connector", CodePDKVConnectorMismatch, "kv_connector %q differs from the prefill's %q; both ends must use the same connector", dk.Connector, pk.Connector)
		}
		if pk.BufferDevice != "" && dk.BufferDevice != "" && pk.BufferDevice != dk.BufferDevice {
			v.add(d, "kv_transfer_config.kv_buffer_device", CodePDKVBufferDeviceMismatch, "kv_buffer_device %q differs from the prefill's %q; set both the same", dk.BufferDevice, pk.BufferDevice)
		}
		if pk.BufferSize != "" && dk.BufferSize != "" && !sameNumber(pk.BufferSize, dk.BufferSize) {
			v.add(d, "kv_transfer_config.kv_buffer_size", CodePDKVBufferSizeMismatch, "kv_buffer_size %s differs from the prefill's %s; set both the same", dk.BufferSize, pk.BufferSize)
		}
	}
	if ps.TensorParallelSize >= 1 && ds.TensorParallelSize >= 1 && ps.TensorParallelSize != ds.TensorParallelSize {
		v.add(d, "tensor_parallel_size", CodePDTensorParallelMismatch, "tensor_parallel_size %d differs from the prefill's %d; KV connectors need both the same",
			ds.TensorParallelSize, ps.TensorParallelSize)
	}
	pdev := stageDevices(ps)
	var shared []int
	for _, dev := range stageDevices(ds) {
		if slices.Contains(pdev, dev) {
			shared = append(shared, dev)
		}
	}
	if len(shared) > 0 {
		slices.Sort(shared)
		v.add(d, "devices", CodePDDevicesOverlap, "prefill and decode both use %s; give them disjoint devices", devs(shared))
	}
}

// sameNumber compares two buffer sizes by value when both parse, so "1e9"
// and "1000000000" agree, and by spelling otherwise.
func sameNumber(a, b string) bool {
	a, b = strings.TrimSpace(a), strings.TrimSpace(b)
	x, errA := strconv.ParseFloat(a, 64)
	y, errB := strconv.ParseFloat(b, 64)
	if errA == nil && errB == nil {
		return x == y
	}
	return a == b
}

// compareField orders field paths with numbers compared by value, so that
// input_sources[2] comes before input_sources[10].
func compareField(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			na, nb := digitRun(a), digitRun(b)
			ta, tb := strings.TrimLeft(a[:na], "0"), strings.TrimLeft(b[:nb], "0")
			if c := cmp.Compare(len(ta), len(tb)); c != 0 {
				return c
			}
			if c := strings.Compare(ta, tb); c != 0 {
				return c
			}
			a, b = a[na:], b[nb:]
			continue
		}
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

// devs names a device set in a message: "device 2" or "devices 0,1".
func devs(ds []int) string {
	if len(ds) == 1 {
		return "device " + FormatDevices(ds)
	}
	return "devices " + FormatDevices(ds)
}

// joinInts writes ids the way messages list them: "0,1,2".
func joinInts(ns []int) string { return FormatDevices(ns) }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func digitRun(s string) int {
	n := 0
	for n < len(s) && isDigit(s[n]) {
		n++
	}
	return n
}
