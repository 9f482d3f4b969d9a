package deploy

import (
	"github.com/omnipd/omnipd/topology"
)

// Document is a resolved deploy config: pipeline applied, overlays and the
// platform merged, legacy schema migrated, PD expanded. Printing it gives a
// config that loads back to the same Document.
type Document struct {
	// Pipeline is the embedded pipeline the stages follow.
	Pipeline   string
	AsyncChunk bool
	Connectors []Connector
	// PD is nil when the Thinker is not disaggregated.
	PD     *PDSettings
	Stages []*Stage

	// stagesKey is where the stages: list was written, for errors about
	// the topology as a whole.
	stagesKey *Node
}

// Connector is a named stage connector (how one stage's output reaches the next).
type Connector struct {
	Name  string
	Class string
	// Extra is the connector's settings (a mapping), e.g. codec chunk sizes.
	Extra *Node
}

// Stage is one resolved stage.
type Stage struct {
	ID         int
	ModelStage string
	// ExecutionType and EngineOutputType come from the pipeline.
	ExecutionType    string
	EngineOutputType string
	Role             topology.Role
	InputSources     []int
	FinalOutput      bool
	FinalOutputType  string
	// Devices is the union of the replicas' devices.
	Devices            []int
	TensorParallelSize int
	// DataParallelSize is engine_args.data_parallel_size (1 when unset):
	// DP ranks behind one API server, TP × DP devices per instance.
	DataParallelSize int
	NumReplicas      int
	Replicas         []topology.Replica
	// Endpoints are base URLs of already-running engines (one per replica);
	// omnipd does not start a stage that has them.
	Endpoints []string
	// KV is the stage's vLLM KVTransferConfig; nil when it has none.
	KV *KVConfig
	// EC is the stage's vLLM ECTransferConfig (encoder cache transfer);
	// nil when it has none. Under E/P/D the encoder has one with ec_role
	// ec_producer, the prefill one with ec_consumer, the decode none.
	EC               *ECConfig
	InputConnectors  []StageConnector
	OutputConnectors []StageConnector
	// DefaultSamplingParams, Env and EngineArgs are mappings kept as written.
	DefaultSamplingParams *Node
	Env                   *Node
	// AsyncChunk is the stage's own async_chunk, when it sets one: an
	// engine argument of each stage in vllm-omni (OmniEngineArgs.async_chunk,
	// vllm_omni/engine/arg_utils.py), which the pipeline-wide value
	// otherwise supplies. See Document.StreamsConditioning.
	AsyncChunk *bool
	// EngineArgs are keys omnipd does not interpret; they go to the engine.
	EngineArgs *Node

	disaggregatable bool
	// kvPortsDefaulted: PD expansion gave the replicas the connector's
	// default ports; the config chose none (KVPortsChosen).
	kvPortsDefaulted bool
	// roleGuessed: the role was inferred after an error about it; what
	// validation says about the guess would only repeat that error.
	roleGuessed bool
	// unmatched: the stage matches no pipeline stage (reported); it is in
	// the topology only so that references to its id resolve.
	unmatched bool
	// origins are the values of the pd: section a stage made by PD
	// expansion took its fields from (pd.prefill.devices, ...), by field
	// path with indices dropped ("replicas.devices"): errors about those
	// fields belong there, not on the Thinker the stage came from.
	origins map[string]*Node
	// src is the stage node the stage came from, for error positions.
	src *Node
}

// StageConnector names the connector on one edge of a stage.
type StageConnector struct {
	// Stage is the peer stage id: the source for input connectors, the
	// destination for output connectors.
	Stage int
	Name  string
}

// KVConfig is vLLM's KVTransferConfig as a stage's engine receives it.
type KVConfig struct {
	Connector         string
	Role              string
	EngineID          string
	BufferDevice      string
	BufferSize        *Node
	Rank              *int
	ParallelSize      *int
	IP                string
	Port              int
	LoadFailurePolicy string
	// ExtraConfig is kv_connector_extra_config.
	ExtraConfig *Node
	// Other holds keys this version of omnipd does not know; they are passed on.
	Other *Node
}

func (kv *KVConfig) clone() *KVConfig {
	if kv == nil {
		return nil
	}
	c := *kv
	c.BufferSize = kv.BufferSize.Clone()
	c.ExtraConfig = kv.ExtraConfig.Clone()
	c.Other = kv.Other.Clone()
	return &c
}

// ECConfig is vLLM's ECTransferConfig as a stage's engine receives it
// (vllm/config/ec_transfer.py).
type ECConfig struct {
	Connector string
	Role      string
	// EngineID is the config's engine_id; instances take their replica's
	// engine id when this is empty (see ECTransferJSON in package vllmplan).
	EngineID string
	// ExtraConfig is ec_connector_extra_config.
	ExtraConfig *Node
	// Other holds the remaining keys as written (ec_buffer_device, ec_ip,
	// ec_port, ..., and keys this version of omnipd does not know); they
	// are passed on.
	Other *Node
}

func (ec *ECConfig) clone() *ECConfig {
	if ec == nil {
		return nil
	}
	c := *ec
	c.ExtraConfig = ec.ExtraConfig.Clone()
	c.Other = ec.Other.Clone()
	return &c
}

// PDSettings is omnipd's pd: section, resolved.
type PDSettings struct {
	// Connector is the KV connector between prefill and decode.
	Connector string
	// Devices is the device pool expansion laid out (informational once expanded).
	Devices []int
	// MinPrefillTokens: prompts shorter than this skip the prefill stage.
	MinPrefillTokens int
	// PrefillRetries is how many other prefill instances a failed prefill is retried on.
	PrefillRetries int
	// Fallback is what happens when every prefill attempt failed: "" (the
	// client gets the error) or "local" (the decode prefills itself;
	// counted, logged and shown in the x-omnipd-pd-path header).
	Fallback string
	// ECConnector is the EC connector between the encoder and the prefill
	// stage; empty when there is no encoder stage (see EncoderStage).
	ECConnector string
}

// EncoderStage returns d's encoder stage (role topology.RoleEncoder), or
// nil when the Thinker has none. A validated document has at most one; its
// replicas are the encoder instances, and the prefill stage reads from it.
func (d *Document) EncoderStage() *Stage {
	for _, s := range d.Stages {
		if s.Role == topology.RoleEncoder {
			return s
		}
	}
	return nil
}

// Topology returns the pure stage graph of d.
func (d *Document) Topology() *topology.Topology {
	t := &topology.Topology{Supported: connectorSupport()}
	for _, c := range d.Connectors {
		t.Connectors = append(t.Connectors, c.Name)
	}
	for _, s := range d.Stages {
		ts := topology.Stage{
			ID:                    s.ID,
			ModelStage:            s.ModelStage,
			Role:                  s.Role,
			InputSources:          append([]int(nil), s.InputSources...),
			FinalOutput:           s.FinalOutput,
			FinalOutputType:       s.FinalOutputType,
			TensorParallelSize:    s.TensorParallelSize,
			DataParallelSize:      s.DataParallelSize,
			NumReplicas:           s.NumReplicas,
			Devices:               append([]int(nil), s.Devices...),
			DisaggregationCapable: s.disaggregatable,
		}
		for _, r := range s.Replicas {
			r.Devices = append([]int(nil), r.Devices...)
			ts.Replicas = append(ts.Replicas, r)
		}
		if s.KV != nil {
			ts.KV = &topology.KVTransfer{
				Connector:    s.KV.Connector,
				Role:         s.KV.Role,
				EngineID:     s.KV.EngineID,
				BufferDevice: s.KV.BufferDevice,
			}
			if s.KV.BufferSize != nil {
				ts.KV.BufferSize = canonicalNumber(s.KV.BufferSize)
			}
		}
		if s.EC != nil {
			ts.EC = &topology.ECTransfer{Connector: s.EC.Connector, Role: s.EC.Role, EngineID: s.EC.EngineID}
			ts.EC.Store, ts.EC.StoreField = ecStore(s.EC)
		}
		if len(s.InputConnectors) > 0 {
			ts.InputConnectors = map[int]string{}
			for _, c := range s.InputConnectors {
				ts.InputConnectors[c.Stage] = c.Name
			}
		}
		if len(s.OutputConnectors) > 0 {
			ts.OutputConnectors = map[int]string{}
			for _, c := range s.OutputConnectors {
				ts.OutputConnectors[c.Stage] = c.Name
			}
		}
		t.Stages = append(t.Stages, ts)
	}
	return t
}

// StageAsyncChunk is whether stage s runs with async chunking: its own
// async_chunk when it sets one, else the pipeline's.
func (d *Document) StageAsyncChunk(s *Stage) bool {
	if s.AsyncChunk != nil {
		return *s.AsyncChunk
	}
	return d.AsyncChunk
}

// StreamsConditioning is whether the Thinker's conditioning rows reach the
// Talker as they are made: only when both ends of that edge — every Thinker
// stage that makes rows (prefill and decode under PD; an encoder stage
// makes none) and the Talker — run with async chunking. A stage that opts out reads or writes its rows whole, so the
// edge falls back to the batch hand-off; the audio is the same either way.
func (d *Document) StreamsConditioning() bool {
	talker := false
	for _, s := range d.Stages {
		switch s.ModelStage {
		case "thinker":
			if s.Role != topology.RoleEncoder && !d.StageAsyncChunk(s) {
				return false
			}
		case "talker":
			if !d.StageAsyncChunk(s) {
				return false
			}
			talker = true
		}
	}
	return talker
}
