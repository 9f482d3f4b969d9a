// Package topology owns the resolved, immutable stage graph of an omni
// pipeline: stage ids, model stages, prefill/decode (and encoder) roles,
// input sources, stage connectors, final outputs, device sets and replicas.
// It detects the prefill/decode pair and the encoder stage, allocates
// devices, and checks every invariant a topology must hold before anything
// is served.
//
// The package is pure: it does no IO, starts no goroutines and knows nothing
// about files. Violations name a stage and a field path relative to it; the
// loader that built the topology maps them back to file positions.
package topology

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Role says which part of the Thinker's work a stage does.
type Role int

const (
	// RoleFull is a stage that is not disaggregated: it prefills and decodes.
	RoleFull Role = iota
	// RolePrefill builds the prompt's KV cache and hands it to the decode stage.
	RolePrefill
	// RoleDecode imports the prompt's KV cache and generates.
	RoleDecode
	// RoleEncoder runs the Thinker's multimodal encoders only (encoder
	// disaggregation, E/P/D): it encodes each media item of a request and
	// hands the outputs, keyed by the item's content hash, to the prefill
	// stage, which then encodes nothing itself.
	RoleEncoder
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	case RoleEncoder:
		return "encoder"
	default:
		return "full"
	}
}

// KV roles as vLLM's KVTransferConfig spells them.
const (
	KVProducer = "kv_producer"
	KVConsumer = "kv_consumer"
	KVBoth     = "kv_both"
)

// EC roles as vLLM's ECTransferConfig spells them (vllm/config/ec_transfer.py).
// ECBoth is accepted by the vLLM releases that have it; an instance with it
// both loads and saves encoder outputs, so it is not encoder-only.
const (
	ECProducer = "ec_producer"
	ECConsumer = "ec_consumer"
	ECBoth     = "ec_both"
)

// Output types a final stage can produce.
const (
	OutputText  = "text"
	OutputAudio = "audio"
	OutputImage = "image"
)

// KVTransfer is the part of a stage's vLLM KVTransferConfig that the topology
// reasons about. Connector-specific settings stay with the loader.
type KVTransfer struct {
	Connector    string
	Role         string
	EngineID     string
	BufferDevice string
	// BufferSize is kept as written ("1e9", 5e9, ...) so that equal settings
	// compare equal whatever their spelling of the number.
	BufferSize string
}

// ECTransfer is the part of a stage's vLLM ECTransferConfig (encoder cache
// transfer) that the topology reasons about. Connector-specific settings
// stay with the loader, which fills in Store for the connectors whose two
// ends must name the same place.
type ECTransfer struct {
	Connector string
	Role      string
	EngineID  string
	// Store is where the connector keeps encoder outputs for the other end
	// to read, when the two ends must agree on it (ECExampleConnector's
	// shared_storage_path, with vLLM's default filled in); empty when the
	// connector has no such setting.
	Store string
	// StoreField is where Store is written, relative to the stage
	// (e.g. "ec_transfer_config.ec_connector_extra_config.shared_storage_path").
	StoreField string
}

// DevicesPerInstance is how many accelerators one instance of s uses: its
// TP ranks times its DP ranks.
func (s *Stage) DevicesPerInstance() int {
	return s.TensorParallelSize * max(1, s.DataParallelSize)
}

// Replica is one running instance of a stage.
type Replica struct {
	// Devices are the accelerator ids this instance uses; len == TensorParallelSize.
	Devices []int
	// EngineID is the instance's KV engine id (empty for stages without KV transfer).
	EngineID string
	// KVPort is the instance's KV side-channel port (Mooncake bootstrap, NIXL
	// side channel, reference connector listener); 0 when the connector has none.
	KVPort int
	// Endpoint is the base URL of an already-running engine; empty when omnipd starts it.
	Endpoint string
}

// Stage is one node of the pipeline graph.
type Stage struct {
	ID         int
	ModelStage string
	Role       Role
	// InputSources are the ids of the stages whose output this stage consumes.
	InputSources []int
	FinalOutput  bool
	// FinalOutputType is "text", "audio" or "image" when FinalOutput is set.
	FinalOutputType    string
	TensorParallelSize int
	// DataParallelSize is engine_args.data_parallel_size: the DP ranks one
	// instance runs behind its one API server. 0 means 1.
	DataParallelSize int
	NumReplicas      int
	// Devices is the union of the replicas' devices, in order.
	Devices  []int
	Replicas []Replica
	// KV is nil for stages that take part in no KV transfer.
	KV *KVTransfer
	// EC is nil for stages that take part in no encoder cache transfer: in
	// E/P/D the encoder produces, the prefill consumes, the decode has none.
	EC *ECTransfer
	// InputConnectors maps a source stage id to a connector name.
	InputConnectors map[int]string
	// OutputConnectors maps a destination stage id to a connector name.
	OutputConnectors map[int]string
	// DisaggregationCapable is true for stages that may be split into
	// prefill and decode (the pipeline's autoregressive, tokenizer-owning LLM).
	DisaggregationCapable bool
}

// Topology is the resolved stage graph.
type Topology struct {
	Stages []Stage
	// Connectors are the names of the stage connectors the deploy config defines.
	Connectors []string
	// Supported are the KV and EC connectors the stages may name: facts
	// about omnipd, not about the config, given as data by whoever builds
	// the topology (package deploy gives kvconnector's entries) so that
	// this package knows no connector of its own. The zero value supports
	// none.
	Supported ConnectorSupport
}

// ConnectorSupport is what validation knows of the transfer connectors.
type ConnectorSupport struct {
	// KV are the KV connectors omnipd has a router-side contract for, in
	// the order errors list them.
	KV []KVConnectorSupport
	// EC are the EC (encoder cache) connectors omnipd can run an encoder
	// stage over, in the order errors list them.
	EC []string
}

// KVConnectorSupport is what validation knows of one KV connector.
type KVConnectorSupport struct {
	Name string
	// DataParallel: omnipd routes a data-parallel PD stage over it.
	// Routing one means pinning each leg to a DP rank
	// (X-data-parallel-rank) and addressing the prefill rank's engine id
	// (<engine_id>_dp<rank>) and ports, which takes a handoff built from
	// the prefill rank's answer; a PD stage with data_parallel_size > 1
	// over another connector is refused rather than served with handoffs
	// that name an engine id no rank answers to.
	DataParallel bool
}

// kvNames are the names of the KV connectors of c that satisfy keep.
func (c ConnectorSupport) kvNames(keep func(KVConnectorSupport) bool) []string {
	var names []string
	for _, k := range c.KV {
		if keep(k) {
			names = append(names, k.Name)
		}
	}
	return names
}

// StageIndex returns the position in t.Stages of the stage with the given id, or -1.
func (t *Topology) StageIndex(id int) int {
	return slices.IndexFunc(t.Stages, func(s Stage) bool { return s.ID == id })
}

// PDPair returns the indices in t.Stages of the prefill and decode stages.
// ok is false unless there is exactly one of each.
func (t *Topology) PDPair() (prefill, decode int, ok bool) {
	prefill, decode = -1, -1
	np, nd := 0, 0
	for i, s := range t.Stages {
		switch s.Role {
		case RolePrefill:
			prefill = i
			np++
		case RoleDecode:
			decode = i
			nd++
		}
	}
	return prefill, decode, np == 1 && nd == 1
}

// EncoderStage returns the index in t.Stages of the encoder stage. ok is
// false unless there is exactly one.
func (t *Topology) EncoderStage() (encoder int, ok bool) {
	encoder, n := -1, 0
	for i, s := range t.Stages {
		if s.Role == RoleEncoder {
			encoder = i
			n++
		}
	}
	return encoder, n == 1
}

// Disaggregated reports whether any stage has a prefill, decode or encoder role.
func (t *Topology) Disaggregated() bool {
	for _, s := range t.Stages {
		if s.Role != RoleFull {
			return true
		}
	}
	return false
}

// Bounds on device sets: far above any real node, low enough that a typo
// such as "0-99999999" is an error rather than an allocation.
const (
	MaxDeviceID = 1<<16 - 1
	MaxDevices  = 4096
)

// ParseDevices parses a device list as deploy configs write it: "0,1",
// "0-3", "2" (ranges inclusive). An empty string is an empty set.
func ParseDevices(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(strings.TrimSpace(lo))
		if err != nil || a < 0 {
			return nil, fmt.Errorf("device %q is not a non-negative integer", part)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(strings.TrimSpace(hi))
			if err != nil || b < a {
				return nil, fmt.Errorf("device range %q is not of the form LOW-HIGH", part)
			}
		}
		if b > MaxDeviceID {
			return nil, fmt.Errorf("device %d is above the largest device id omnipd accepts (%d)", b, MaxDeviceID)
		}
		if len(out)+b-a+1 > MaxDevices {
			return nil, fmt.Errorf("%q names more than %d devices", s, MaxDevices)
		}
		for d := a; d <= b; d++ {
			if seen[d] {
				return nil, fmt.Errorf("device %d listed twice", d)
			}
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}

// FormatDevices writes a device set the way deploy configs do: "0,1,2".
func FormatDevices(devices []int) string {
	parts := make([]string, len(devices))
	for i, d := range devices {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, ",")
}
