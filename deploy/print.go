package deploy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/topology"
)

// Node returns d as a deploy config: every stage spelled out, loadable again
// to the same Document.
func (d *Document) Node() *Node {
	var at Pos
	root := newMap(at)
	root.Set("pipeline", newStr(d.Pipeline, at))
	root.Set("async_chunk", newBool(d.AsyncChunk, at))
	conns := newMap(at)
	for _, c := range d.Connectors {
		cn := newMap(at)
		cn.Set("name", newStr(c.Class, at))
		if c.Extra != nil {
			cn.Set("extra", c.Extra.Clone())
		}
		conns.Set(c.Name, cn)
	}
	root.Set("connectors", conns)
	if d.PD != nil {
		pd := newMap(at)
		pd.Set("connector", newStr(d.PD.Connector, at))
		if len(d.PD.Devices) > 0 {
			pd.Set("devices", newStr(topology.FormatDevices(d.PD.Devices), at))
		}
		pd.Set("min_prefill_tokens", newInt(d.PD.MinPrefillTokens, at))
		pd.Set("prefill_retries", newInt(d.PD.PrefillRetries, at))
		fallback := d.PD.Fallback
		if fallback == "" {
			fallback = "none"
		}
		pd.Set("fallback", newStr(fallback, at))
		root.Set("pd", pd)
	}
	stages := newSeq(at)
	for _, s := range d.Stages {
		stages.Items = append(stages.Items, s.node())
	}
	root.Set("stages", stages)
	return root
}

func (s *Stage) node() *Node {
	var at Pos
	n := newMap(at)
	n.Set("stage_id", newInt(s.ID, at))
	n.Set("model_stage", newStr(s.ModelStage, at))
	switch s.Role {
	case topology.RolePrefill:
		n.Set("is_prefill_only", newBool(true, at))
	case topology.RoleDecode:
		n.Set("is_decode_only", newBool(true, at))
	case topology.RoleEncoder:
		n.Set("is_encoder_only", newBool(true, at))
	}
	n.Set("input_sources", intSeq(s.InputSources))
	n.Set("final_output", newBool(s.FinalOutput, at))
	if s.FinalOutputType != "" {
		n.Set("final_output_type", newStr(s.FinalOutputType, at))
	} else {
		n.Set("final_output_type", newNull(at))
	}
	n.Set("devices", newStr(topology.FormatDevices(s.Devices), at))
	n.Set("tensor_parallel_size", newInt(s.TensorParallelSize, at))
	n.Set("num_replicas", newInt(s.NumReplicas, at))
	if s.KV != nil || s.EC != nil || s.NumReplicas > 1 || len(s.Endpoints) > 0 {
		reps := newSeq(at)
		for _, r := range s.Replicas {
			rn := newMap(at)
			rn.Set("devices", newStr(topology.FormatDevices(r.Devices), at))
			if r.EngineID != "" {
				rn.Set("engine_id", newStr(r.EngineID, at))
			}
			if r.KVPort != 0 {
				rn.Set("kv_port", newInt(r.KVPort, at))
			}
			if r.Endpoint != "" {
				rn.Set("endpoint", newStr(r.Endpoint, at))
			}
			reps.Items = append(reps.Items, rn)
		}
		n.Set("replicas", reps)
	}
	if s.KV != nil {
		n.Set("kv_transfer_config", s.KV.node())
	} else {
		n.Set("kv_transfer_config", newNull(at))
	}
	// Written only where there is one, so that configs without an
	// encoder stage print as they always have.
	if s.EC != nil {
		n.Set("ec_transfer_config", s.EC.node())
	}
	n.Set("input_connectors", connectorMap(s.InputConnectors, "from_stage_"))
	n.Set("output_connectors", connectorMap(s.OutputConnectors, "to_stage_"))
	n.Set("default_sampling_params", orEmpty(s.DefaultSamplingParams))
	if s.Env != nil && len(s.Env.Keys) > 0 {
		n.Set("env", s.Env.Clone())
	}
	if s.AsyncChunk != nil {
		n.Set("async_chunk", newBool(*s.AsyncChunk, at))
	}
	n.Set("engine_args", orEmpty(s.EngineArgs))
	return n
}

func (kv *KVConfig) node() *Node {
	var at Pos
	n := newMap(at)
	n.Set("kv_connector", newStr(kv.Connector, at))
	n.Set("kv_role", newStr(kv.Role, at))
	if kv.EngineID != "" {
		n.Set("engine_id", newStr(kv.EngineID, at))
	}
	if kv.BufferDevice != "" {
		n.Set("kv_buffer_device", newStr(kv.BufferDevice, at))
	}
	if kv.BufferSize != nil {
		n.Set("kv_buffer_size", kv.BufferSize.Clone())
	}
	if kv.Rank != nil {
		n.Set("kv_rank", newInt(*kv.Rank, at))
	}
	if kv.ParallelSize != nil {
		n.Set("kv_parallel_size", newInt(*kv.ParallelSize, at))
	}
	if kv.IP != "" {
		n.Set("kv_ip", newStr(kv.IP, at))
	}
	if kv.Port != 0 {
		n.Set("kv_port", newInt(kv.Port, at))
	}
	if kv.LoadFailurePolicy != "" {
		n.Set("kv_load_failure_policy", newStr(kv.LoadFailurePolicy, at))
	}
	if kv.ExtraConfig != nil {
		n.Set("kv_connector_extra_config", kv.ExtraConfig.Clone())
	}
	if kv.Other != nil {
		for i, k := range kv.Other.Keys {
			n.Set(k.Value, kv.Other.Values[i].Clone())
		}
	}
	return n
}

func (ec *ECConfig) node() *Node {
	var at Pos
	n := newMap(at)
	n.Set("ec_connector", newStr(ec.Connector, at))
	n.Set("ec_role", newStr(ec.Role, at))
	if ec.EngineID != "" {
		n.Set("engine_id", newStr(ec.EngineID, at))
	}
	if ec.ExtraConfig != nil {
		n.Set("ec_connector_extra_config", ec.ExtraConfig.Clone())
	}
	if ec.Other != nil {
		for i, k := range ec.Other.Keys {
			n.Set(k.Value, ec.Other.Values[i].Clone())
		}
	}
	return n
}

func intSeq(xs []int) *Node {
	s := newSeq(Pos{})
	for _, x := range xs {
		s.Items = append(s.Items, newInt(x, Pos{}))
	}
	return s
}

func connectorMap(cs []StageConnector, prefix string) *Node {
	n := newMap(Pos{})
	for _, c := range cs {
		n.Set(prefix+strconv.Itoa(c.Stage), newStr(c.Name, Pos{}))
	}
	return n
}

func orEmpty(n *Node) *Node {
	if n == nil {
		return newMap(Pos{})
	}
	return n.Clone()
}

// Summary describes d in one screen: one line per stage.
func (d *Document) Summary() string {
	var b strings.Builder
	plural := "s"
	if len(d.Stages) == 1 {
		plural = ""
	}
	fmt.Fprintf(&b, "pipeline %s: %d stage%s", d.Pipeline, len(d.Stages), plural)
	if d.PD != nil {
		fmt.Fprintf(&b, ", prefill/decode disaggregated over %s", d.PD.Connector)
		if d.PD.ECConnector != "" {
			fmt.Fprintf(&b, ", encoder over %s", d.PD.ECConnector)
		}
	}
	if d.AsyncChunk {
		b.WriteString(", async chunking on")
	}
	b.WriteString("\n")
	for _, s := range d.Stages {
		name := s.ModelStage
		if s.Role != topology.RoleFull {
			name += " " + s.Role.String()
		}
		inputs := "-"
		if len(s.InputSources) > 0 {
			parts := make([]string, len(s.InputSources))
			for i, id := range s.InputSources {
				parts[i] = strconv.Itoa(id)
			}
			inputs = strings.Join(parts, ",")
		}
		devices := topology.FormatDevices(s.Devices)
		if devices == "" {
			devices = "-"
		}
		fmt.Fprintf(&b, "  [%d] %-16s inputs %-4s devices %-8s tp %d x%d", s.ID, name, inputs, devices, s.TensorParallelSize, s.NumReplicas)
		if s.FinalOutput {
			fmt.Fprintf(&b, "  -> %s", s.FinalOutputType)
		}
		if s.KV != nil {
			fmt.Fprintf(&b, "  kv %s %s", s.KV.Connector, s.KV.Role)
			var ids []string
			for _, r := range s.Replicas {
				id := r.EngineID
				if r.KVPort != 0 {
					id += fmt.Sprintf(":%d", r.KVPort)
				}
				ids = append(ids, id)
			}
			if len(ids) > 0 {
				fmt.Fprintf(&b, " [%s]", strings.Join(ids, " "))
			}
		}
		if s.EC != nil {
			fmt.Fprintf(&b, "  ec %s %s", s.EC.Connector, s.EC.Role)
			if s.KV == nil {
				// The instances' engine ids, which the kv part names otherwise.
				var ids []string
				for _, r := range s.Replicas {
					ids = append(ids, r.EngineID)
				}
				if len(ids) > 0 {
					fmt.Fprintf(&b, " [%s]", strings.Join(ids, " "))
				}
			}
		}
		if len(s.Endpoints) > 0 {
			fmt.Fprintf(&b, "  endpoints %s", strings.Join(s.Endpoints, " "))
		}
		b.WriteString("\n")
	}
	d.writeStreamedEdges(&b)
	return b.String()
}

// writeStreamedEdges says which edges of an audio pipeline stream: with
// async_chunk the Thinker's conditioning rows reach the Talker as they are
// made (under PD the prompt's rows from the prefill, the rest from the
// decode), without it once the Thinker has finished; a streamed answer's
// codec frames reach Code2Wav in chunks either way.
func (d *Document) writeStreamedEdges(b *strings.Builder) {
	var thinkers []string
	maker := "the Thinker"
	for _, s := range d.Stages {
		if s.ModelStage == "thinker" && s.Role != topology.RoleEncoder {
			thinkers = append(thinkers, fmt.Sprintf("[%d]", s.ID))
			if s.Role == topology.RoleDecode {
				maker = "the decode"
			}
		}
	}
	for _, s := range d.Stages {
		switch s.ModelStage {
		case "talker":
			from := strings.Join(thinkers, ",")
			switch {
			case d.StreamsConditioning():
				fmt.Fprintf(b, "  streams: %s -> [%d] conditioning rows as %s makes them, for streamed and whole answers\n", from, s.ID, maker)
			case d.AsyncChunk:
				fmt.Fprintf(b, "  waits: %s -> [%d] conditioning once the Thinker has finished (a stage sets async_chunk: false)\n", from, s.ID)
			default:
				fmt.Fprintf(b, "  waits: %s -> [%d] conditioning once the Thinker has finished (async_chunk: false)\n", from, s.ID)
			}
		case "code2wav":
			for _, in := range s.InputConnectors {
				first, size, left, ok := d.codecChunking(in.Name)
				if !ok {
					continue
				}
				fmt.Fprintf(b, "  streams: [%d] -> [%d] codec frames in chunks of %d, then %d (left context %d), for streamed answers\n", in.Stage, s.ID, first, size, left)
			}
		}
	}
}

// codecChunking reads the codec chunk sizes of the connector named name, as
// serve hands them to the orchestrator; ok is false when it sets none.
func (d *Document) codecChunking(name string) (first, size, left int, ok bool) {
	for _, c := range d.Connectors {
		if c.Name != name || c.Extra == nil {
			continue
		}
		get := func(key string) int {
			if v := c.Extra.Get(key); v != nil {
				n, _ := strconv.Atoi(v.Value)
				return n
			}
			return 0
		}
		size, left = get("codec_chunk_frames"), get("codec_left_context_frames")
		first = get("initial_codec_chunk_frames")
		if first == 0 {
			first = size
		}
		return first, size, left, size > 0
	}
	return 0, 0, 0, false
}
