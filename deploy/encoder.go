package deploy

import (
	"fmt"
	"slices"

	"github.com/omnipd/omnipd/topology"
)

// Encoder disaggregation (E/P/D): pd.encoder splits the Thinker's
// multimodal encoders off into a stage of their own in front of the
// prefill. vLLM runs such an encoder as a vllm serve instance of the same
// model with an ec_transfer_config of ec_role ec_producer; the prefill
// takes its outputs with ec_role ec_consumer, the decode has no EC
// connector (examples/online_serving/disaggregated_encoder in vLLM).

var encoderKnownKeys = []string{
	"enabled", "num_replicas", "devices", "tensor_parallel_size", "ec_connector",
	"ec_connector_extra_config", "engine_id", "engine_args",
}

// encoderRequest is pd.encoder as written.
type encoderRequest struct {
	node          *Node
	replicas      int
	devices       []int
	tp            int
	connector     string
	connectorNode *Node
	extra         *Node
	engineID      string
	engineArgs    *Node
	// Where num_replicas, devices, tensor_parallel_size and engine_id
	// were written, for errors.
	replicasNode, devicesNode, tpNode, engineIDNode *Node
}

// devicesNodeOrNil is where pd.encoder.devices was written; nil without
// an encoder or pinned devices.
func (r *encoderRequest) devicesNodeOrNil() *Node {
	if r == nil {
		return nil
	}
	return r.devicesNode
}

// origins are the pd.encoder values the encoder stage took its fields
// from.
func (r *encoderRequest) origins() map[string]*Node {
	o := map[string]*Node{}
	for field, n := range map[string]*Node{
		"devices": r.devicesNode, "replicas.devices": r.devicesNode, "num_replicas": r.replicasNode,
		"tensor_parallel_size": r.tpNode, "replicas.engine_id": r.engineIDNode,
		"ec_transfer_config.ec_connector": r.connectorNode,
	} {
		if n != nil {
			o[field] = n
		}
	}
	return o
}

// encoderEngineDefaults are the engine arguments an encoder instance gets
// over the Thinker's: the flags vLLM's disaggregated-encoder README calls
// required (--enforce-eager, --no-enable-prefix-caching: the encoder keeps
// no KV cache) and a token budget as large as its example scripts give it
// (--max-num-batched-tokens 114688: the budget is per decoding step, which
// an encoder-only instance does not have, and the encoder cache manager
// bounds the real one). pd.encoder.engine_args overrides any of them.
var encoderEngineDefaults = []param{
	{"enforce_eager", func() *Node { return newBool(true, Pos{}) }},
	{"enable_prefix_caching", func() *Node { return newBool(false, Pos{}) }},
	{"max_num_batched_tokens", func() *Node { return newInt(114688, Pos{}) }},
}

// encoderOf reads pd.encoder; nil when it is absent, null or disabled.
func (p *problems) encoderOf(n *Node, path string) *encoderRequest {
	if n.Kind == KindNull {
		return nil
	}
	if !p.mapOf(n, path) {
		return nil
	}
	req := &encoderRequest{node: n}
	enabled := true
	for i, k := range n.Keys {
		v := n.Values[i]
		fp := writtenPath(v, path+"."+k.Value)
		switch k.Value {
		case "enabled":
			if b, ok := p.boolOf(v, fp); ok {
				enabled = b
			}
		case "num_replicas":
			req.replicas, _ = p.boundedIntOf(v, fp, maxReplicas)
			req.replicasNode = v
		case "devices":
			req.devices, _ = p.devicesOf(v, fp)
			req.devicesNode = v
		case "tensor_parallel_size":
			req.tp, _ = p.boundedIntOf(v, fp, topology.MaxDevices)
			req.tpNode = v
		case "ec_connector":
			if s, ok := p.strOf(v, fp); ok {
				if _, known := lookupECConnector(s); !known {
					p.errorf(v, fp, "unknown EC connector %q; omnipd can configure %s", s, quoteAll(ECConnectors()))
				} else {
					req.connector, req.connectorNode = s, v
				}
			}
		case "ec_connector_extra_config":
			if v.Kind != KindNull && p.mapOf(v, fp) {
				req.extra = v
			}
		case "engine_id":
			if s, ok := p.strOf(v, fp); ok {
				if s == "" {
					p.errorf(v, fp, "want a non-empty engine id")
				}
				req.engineID, req.engineIDNode = s, v
			}
		case "engine_args":
			if v.Kind != KindNull && p.mapOf(v, fp) {
				for j, ak := range v.Keys {
					av := v.Values[j]
					p.engineArg(ak.Value, av, writtenPath(av, fp+"."+ak.Value))
				}
				req.engineArgs = v
			}
		default:
			p.unknownKey(k, fp, encoderKnownKeys)
		}
	}
	if !enabled {
		return nil
	}
	return req
}

// encoderOnSplit checks pd.encoder against a config whose stages are
// already split: as for pd.connector, the section cannot reshape the
// stages, only agree with them.
func (p *problems) encoderOnSplit(doc *Document, req *encoderRequest) {
	if req == nil {
		return
	}
	e := doc.EncoderStage()
	if e == nil {
		p.errorf(req.node, "pd.encoder", "the stages are already split into prefill and decode, without an encoder stage, so omnipd cannot add one; write it as well (is_encoder_only: true, an ec_transfer_config with ec_role ec_producer, and the prefill reading from it), or write one Thinker stage for omnipd to split")
		return
	}
	if req.connector != "" && e.EC != nil && e.EC.Connector != "" && req.connector != e.EC.Connector {
		p.errorf(req.connectorNode, "pd.encoder.ec_connector", "the encoder stage already uses %s; %s conflicts (edit the stages' ec_transfer_config instead)", e.EC.Connector, req.connector)
	}
}

// newEncoderStage makes the encoder stage of thinker (stage id thinker.ID):
// the Thinker's engine arguments and environment with the encoder's own on
// top, its own replicas and tensor parallelism, no inputs, no output for
// the client and no sampling defaults (the orchestrator asks it for one
// token per media item).
func newEncoderStage(thinker *Stage, req *encoderRequest) *Stage {
	e := cloneStage(thinker)
	e.Role = topology.RoleEncoder
	e.FinalOutput, e.FinalOutputType = false, ""
	e.InputSources = []int{}
	e.InputConnectors, e.OutputConnectors = nil, nil
	e.DefaultSamplingParams = newMap(thinker.src.Pos)
	e.KV = nil
	e.NumReplicas = max(req.replicas, 1)
	if req.tp > 0 {
		e.TensorParallelSize = req.tp
	}
	// Encoders scale out by instance (vLLM's proxy spreads media items
	// over them), not by DP ranks behind one API server.
	e.DataParallelSize = 1
	if e.EngineArgs == nil {
		e.EngineArgs = newMap(thinker.src.Pos)
	}
	e.EngineArgs.Delete("data_parallel_size")
	for _, a := range encoderEngineDefaults {
		e.EngineArgs.Set(a.key, a.value())
	}
	if req.engineArgs != nil {
		for i, k := range req.engineArgs.Keys {
			e.EngineArgs.Set(k.Value, req.engineArgs.Values[i].Clone())
		}
	}
	e.Endpoints = nil
	return e
}

// encoderECConnector picks the EC connector: pd.encoder's, else the one the
// Thinker's own ec_transfer_config names, else the one that runs on the
// same kind of engine as the KV connector kv.
func (p *problems) encoderECConnector(thinker *Stage, req *encoderRequest, kv string) (ecConnectorSpec, bool) {
	name := req.connector
	if name == "" && thinker.EC != nil && thinker.EC.Connector != "" {
		name = thinker.EC.Connector
		if _, ok := lookupECConnector(name); !ok {
			at, path := fieldAt(thinker, "ec_transfer_config.ec_connector")
			p.errorf(at, path, "unknown EC connector %q; omnipd can configure %s", name, quoteAll(ECConnectors()))
			return ecConnectorSpec{}, false
		}
	}
	if name == "" {
		name = defaultECConnector(kv)
	}
	spec, _ := lookupECConnector(name)
	return spec, true
}

// injectEC builds one end's ec_transfer_config: the Thinker's own settings
// for the connector (if it had any), then pd.encoder's extra config, then
// the connector's defaults, then the role.
func injectEC(base *ECConfig, spec ecConnectorSpec, role string, req *encoderRequest) *ECConfig {
	ec := base.clone()
	if ec == nil || ec.Connector != spec.name {
		ec = &ECConfig{}
	}
	ec.Connector = spec.name
	ec.Role = role
	ec.EngineID = ""
	if req.extra != nil {
		ec.ExtraConfig = mergeNodes(ec.ExtraConfig, req.extra)
	}
	for _, e := range spec.extra {
		if ec.ExtraConfig == nil {
			ec.ExtraConfig = newMap(Pos{})
		}
		if ec.ExtraConfig.Get(e.key) == nil {
			ec.ExtraConfig.Set(e.key, e.value())
		}
	}
	return ec
}

// setEncoderReplicas gives the encoder its instances: a device set each,
// and engine ids <engine_id>-<i> (just <engine_id> for one instance). EC
// connectors here listen on no port of their own.
func setEncoderReplicas(s *Stage, sets [][]int) {
	s.Replicas = make([]topology.Replica, s.NumReplicas)
	for i := range s.Replicas {
		r := &s.Replicas[i]
		if i < len(sets) {
			r.Devices = slices.Clone(sets[i])
		}
		r.EngineID = s.EC.EngineID
		if s.NumReplicas > 1 {
			r.EngineID = fmt.Sprintf("%s-%d", s.EC.EngineID, i)
		}
	}
	s.Devices = unionDevices(s.Replicas)
}
