package deploy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/topology"
)

// Top-level keys omnipd interprets. Any other top-level key is a
// pipeline-wide engine setting applied to every stage that does not set it.
var topKnownKeys = []string{"pipeline", "async_chunk", "connectors", "stages", "pd", "edges"}

// Stage keys omnipd interprets. Any other stage key is an engine argument.
var stageKnownKeys = []string{
	"stage_id", "model_stage", "is_prefill_only", "is_decode_only", "is_encoder_only", "input_sources",
	"engine_input_source", "final_output", "final_output_type", "devices", "tensor_parallel_size",
	"num_replicas", "replicas", "endpoints", "kv_transfer_config", "ec_transfer_config", "input_connectors",
	"output_connectors", "default_sampling_params", "env", "async_chunk", "engine_args", "runtime",
}

// engineArgsNearStageKeys are vLLM engine arguments spelled within two
// edits of a stage key, which get no "did you mean" warning:
// mm_encoder_only (vLLM's --mm-encoder-only, which an encoder instance may
// take) is not a misspelt is_encoder_only.
var engineArgsNearStageKeys = []string{"mm_encoder_only"}

// rawStage is a stage as written, before the pipeline fills it in.
type rawStage struct {
	node         *Node
	path         string
	id           int
	idOK         bool
	modelStage   string
	prefillOnly  bool
	decodeOnly   bool
	encoderOnly  bool
	inputSources []int
	hasInputs    bool
	finalOutput  *bool
	finalType    string
	devices      []int
	tp           int
	dp           int // data_parallel_size, also kept in engineArgs
	numReplicas  int
	replicas     []topology.Replica
	hasReplicas  bool
	endpoints    []string
	kv           *KVConfig
	ec           *ECConfig
	inConns      []StageConnector
	outConns     []StageConnector
	sampling     *Node
	env          *Node
	asyncChunk   *bool
	engineArgs   *Node
}

func resolve(root *Node, opts Options, p *problems) *Document {
	doc := &Document{AsyncChunk: false}
	pipelineName := DefaultPipeline
	pipelineNode := root
	var stagesNode, pdNode *Node
	pipelineWide := newMap(root.Pos)
	for i, k := range root.Keys {
		v := root.Values[i]
		switch k.Value {
		case "pipeline":
			if s, ok := p.strOf(v, "pipeline"); ok {
				pipelineName, pipelineNode = s, v
			}
		case "async_chunk":
			doc.AsyncChunk, _ = p.boolOf(v, "async_chunk")
		case "connectors":
			doc.Connectors = p.connectorsOf(v)
		case "stages":
			stagesNode = v
		case "pd":
			pdNode = v
		case "edges":
			p.warnf(k, "edges", "ignored: edges follow from each stage's input sources")
		default:
			if slices.Contains(stageKnownKeys, k.Value) {
				p.errorf(k, writtenPath(k, k.Value), "%s is a stage key; set it on the stages it applies to", k.Value)
				continue
			}
			if s := closest(k.Value, topKnownKeys); s != "" && editDistance(k.Value, s) <= 1 {
				p.warnf(k, writtenPath(k, k.Value), "unknown key %q is applied to every stage as an engine argument; did you mean %q?", k.Value, s)
			}
			if k.Value == "data_parallel_size" {
				// Pipeline-wide in vllm-omni's DeployConfig; omnipd lays
				// out and routes the ranks, so it must be a size.
				if _, ok := p.boundedIntOf(v, writtenPath(v, k.Value), topology.MaxDevices); !ok {
					continue
				}
			}
			p.engineArg(k.Value, v, writtenPath(v, k.Value))
			pipelineWide.Set(k.Value, v)
		}
	}
	pipe, pipeOK := LookupPipeline(pipelineName)
	if !pipeOK {
		p.errorf(pipelineNode, "pipeline", "unknown pipeline %q; omnipd has %s", pipelineName, quoteAll(Pipelines()))
	}
	if stagesNode == nil {
		if !p.incomplete {
			p.errorf(root, "stages", "missing: a deploy config needs a stages: list")
		}
		p.pdOf(pdNode, opts) // still report the pd: section's own mistakes
		return nil
	}
	if stagesNode.Kind != KindSeq || len(stagesNode.Items) == 0 {
		p.errorf(stagesNode, "stages", "want a non-empty list of stages, got %s", describe(stagesNode))
		p.pdOf(pdNode, opts)
		return nil
	}
	// Every stage's own values are read whatever else is wrong: they are
	// mistakes of their own.
	var raws []*rawStage
	var gaps stageGaps
	seen := map[int]*rawStage{}
	for i, sn := range stagesNode.Items {
		r := p.rawStageOf(sn, writtenPath(sn, fmt.Sprintf("stages[%d]", i)))
		if r == nil || !r.idOK {
			// Without an id a stage cannot be matched to the pipeline;
			// guessing would only add misleading errors.
			gaps.unidentified = true
			continue
		}
		if prev, dup := seen[r.id]; dup {
			p.errorf(r.node.Get("stage_id"), writtenPath(r.node.Get("stage_id"), r.path+".stage_id"), "stage %d is defined twice (first at %s)", r.id, prev.node.Pos)
			gaps.duplicate = true
			continue
		}
		seen[r.id] = r
		raws = append(raws, r)
	}
	slices.SortStableFunc(raws, func(a, b *rawStage) int { return a.id - b.id })
	pd := p.pdOf(pdNode, opts)
	if !pipeOK || p.incomplete || len(raws) == 0 {
		return nil
	}

	// Keep going after mistakes in single fields: the stages still resolve
	// with defaults in their place, and the topology check finds the rest.
	doc.Stages = p.applyPipeline(pipe, stagesNode, raws, pipelineWide, doc, &gaps)
	if doc.Stages == nil {
		return nil
	}
	doc.stagesKey = root.KeyNode("stages")
	p.checkTopology(doc, pd, opts, &gaps)
	return doc
}

// checkTopology validates the stages as written and, when the Thinker is
// to be split, splits it and validates the result. Violations that concern
// references between stages (input sources, stage connectors) are taken
// from the stages as written, whose ids are the user's; the rest from the
// expanded stages, where PD's devices, KV settings and engine ids exist.
func (p *problems) checkTopology(doc *Document, pd *pdRequest, opts Options, gaps *stageGaps) {
	written := slices.Clone(doc.Stages)
	writtenViolations := topology.Validate(doc.Topology())
	split := pd != nil && !pd.invalid && !doc.Disaggregated()
	switch {
	case split && gaps.none():
		p.report(doc, written, writtenViolations, gaps, writtenCode)
		if expandPD(doc, pd, p) {
			p.report(doc, doc.Stages, topology.Validate(doc.Topology()), gaps, expandedCode)
		}
	case split:
		// The stages to split are not all there: report what the stages
		// as written show, and what the pd: section says on its own.
		p.report(doc, written, writtenViolations, gaps, writtenCode)
		if pd.connector != "" {
			p.decodeOnly(pd.connector, pd)
		}
	default:
		keep := func(string) bool { return true }
		if pd != nil && !pd.invalid {
			if encoderBesideUnsplit(doc) != nil {
				// Said by expandPD, in terms of the pd: section.
				keep = func(code string) bool { return code != topology.CodeEncoderWithoutPD }
			}
			expandPD(doc, pd, p)
		} else if doc.Disaggregated() {
			if opts.Colocated {
				p.errorf(doc.stagesKey, "stages", "the Thinker is already split into prefill and decode stages, so it cannot be served colocated; serve a config with one Thinker stage")
			}
			doc.PD = &PDSettings{Connector: pdConnectorOf(doc), PrefillRetries: defaultPrefillRetries, ECConnector: ecConnectorOf(doc)}
		}
		p.report(doc, written, writtenViolations, gaps, keep)
	}
	p.moriioReadModes(doc)
	p.encoderEngineFlags(doc)
}

// stageGaps records what kept some stages out of the topology, so that
// the violations that follow from it are not reported as mistakes of
// their own.
type stageGaps struct {
	// unidentified: a stage has no usable stage_id; any reference to a
	// stage id that does not exist may have meant it.
	unidentified bool
	// duplicate: a stage repeats another's stage_id and is left out.
	duplicate bool
	// unmatched: a stage matches no stage of the pipeline (it stays in the
	// topology, but nothing is checked about it).
	unmatched bool
	// absent: the config lacks stages the pipeline needs. missing are
	// the stage ids they would take (those no stage has), to which a
	// reference is no mistake of its own; missingFinal: one of them is a
	// final output.
	absent       bool
	missing      []int
	missingFinal bool
}

func (g *stageGaps) none() bool {
	return !g.unidentified && !g.duplicate && !g.unmatched && !g.absent
}

// unaccounted is whether a stage the config has is not in the topology as
// what it is: it may be the one a "missing" violation asks for.
func (g *stageGaps) unaccounted() bool { return g.unidentified || g.duplicate || g.unmatched }

// counterpartCodes are violations that say a stage is missing its
// counterpart, which may be a stage left out of the topology.
var counterpartCodes = []string{
	topology.CodePDPrefillMissing, topology.CodePDDecodeMissing, topology.CodeEncoderWithoutPD,
	topology.CodeEncoderFeedsNothing, topology.CodePDDecodeInputMissing,
}

// hides is whether v may follow from a gap rather than be a mistake of its
// own.
func (g *stageGaps) hides(v topology.Violation, stages []*Stage) bool {
	switch {
	case v.Code == topology.CodeNoFinalOutput:
		return g.missingFinal || g.unaccounted()
	case slices.Contains(counterpartCodes, v.Code):
		return g.unaccounted()
	case v.Code == topology.CodeInputSourceUnknown || v.Code == topology.CodeOutputConnectorUnknownStage:
		if g.unidentified {
			return true
		}
		id, ok := referencedStage(v, stages)
		return ok && slices.Contains(g.missing, id)
	}
	return false
}

// referencedStage is the stage id an input-source or output-connector
// violation names.
func referencedStage(v topology.Violation, stages []*Stage) (int, bool) {
	if v.Stage < 0 || v.Stage >= len(stages) {
		return 0, false
	}
	if rest, ok := strings.CutPrefix(v.Field, "input_sources["); ok {
		k, err := strconv.Atoi(strings.TrimSuffix(rest, "]"))
		if err != nil || k < 0 || k >= len(stages[v.Stage].InputSources) {
			return 0, false
		}
		return stages[v.Stage].InputSources[k], true
	}
	if rest, ok := strings.CutPrefix(v.Field, "output_connectors."); ok {
		return connectorKey(rest, "to_stage_")
	}
	return 0, false
}

// referenceCodes are the violations about references between stages. They
// are read off the stages as written: PD expansion renumbers the stages
// after the Thinker and rewires what read from it, and an error about a
// reference must name the ids the user wrote.
var referenceCodes = []string{
	topology.CodeInputSourceUnknown, topology.CodeInputSourceSelf, topology.CodeInputSourceDuplicate,
	topology.CodeInputCycle, topology.CodeInputConnectorNotInput, topology.CodeOutputConnectorUnknownStage,
	topology.CodeOutputConnectorNotInput, topology.CodeConnectorUndefined,
}

// writtenCode is whether the stages as written are where a violation with
// this code is read when the Thinker is to be split: references, and the
// final output types, which expansion keeps as they are (and so can be
// reported even when the split cannot be made).
func writtenCode(code string) bool {
	return slices.Contains(referenceCodes, code) ||
		code == topology.CodeFinalOutputTypeMissing || code == topology.CodeFinalOutputTypeUnknown
}

// expandedCode is whether a violation with this code is read off the
// expanded stages.
func expandedCode(code string) bool { return !slices.Contains(referenceCodes, code) }

// Disaggregated reports whether d has a prefill or decode stage.
func (d *Document) Disaggregated() bool {
	for _, s := range d.Stages {
		if s.Role != topology.RoleFull {
			return true
		}
	}
	return false
}

func pdConnectorOf(d *Document) string {
	for _, s := range d.Stages {
		if s.Role == topology.RolePrefill && s.KV != nil {
			return s.KV.Connector
		}
	}
	return ""
}

// ecConnectorOf is the EC connector of d's encoder stage; "" without one.
func ecConnectorOf(d *Document) string {
	if e := d.EncoderStage(); e != nil && e.EC != nil {
		return e.EC.Connector
	}
	return ""
}

func (p *problems) connectorsOf(n *Node) []Connector {
	if n.Kind == KindNull || !p.mapOf(n, "connectors") {
		return nil
	}
	var out []Connector
	for i, k := range n.Keys {
		v := n.Values[i]
		path := writtenPath(v, "connectors."+k.Value)
		if !p.mapOf(v, path) {
			continue
		}
		c := Connector{Name: k.Value}
		for j, ck := range v.Keys {
			cv := v.Values[j]
			switch ck.Value {
			case "name":
				c.Class, _ = p.strOf(cv, writtenPath(cv, path+".name"))
			case "extra":
				if cv.Kind != KindNull && p.mapOf(cv, writtenPath(cv, path+".extra")) {
					c.Extra = cv.Clone()
				}
			default:
				p.unknownKey(ck, writtenPath(ck, path+"."+ck.Value), []string{"name", "extra"})
			}
		}
		if c.Class == "" {
			p.errorf(v, path+".name", "missing: the connector class, e.g. SharedMemoryConnector")
		}
		out = append(out, c)
	}
	return out
}

// rawStageOf reads a stage entry; path is where it was written. nil when
// the entry is not a mapping.
func (p *problems) rawStageOf(n *Node, path string) *rawStage {
	if !p.mapOf(n, path) {
		return nil
	}
	r := &rawStage{node: n, path: path, engineArgs: newMap(n.Pos)}
	idNode := n.Get("stage_id")
	if idNode == nil {
		p.errorf(n, path+".stage_id", "missing: every stage needs a stage_id")
	} else if id, ok := p.nonNegIntOf(idNode, writtenPath(idNode, path+".stage_id")); ok {
		r.id, r.idOK = id, true
	}
	p.stageFields(r, n, path)
	return r
}

// stageFields reads the keys of stage entry n (all but stage_id) into r,
// reporting each value of the wrong type.
func (p *problems) stageFields(r *rawStage, n *Node, path string) {
	// runtime: and engine_args: are vllm-omni's nested spellings of stage
	// keys; flatten them first so that the stage's own keys win.
	flat := newMap(n.Pos)
	for _, nested := range []string{"engine_args", "runtime"} {
		if v := n.Get(nested); v != nil && v.Kind != KindNull && p.mapOf(v, writtenPath(v, path+"."+nested)) {
			for i, k := range v.Keys {
				flat.Keys = append(flat.Keys, k)
				flat.Values = append(flat.Values, v.Values[i])
			}
		}
	}
	for i, k := range n.Keys {
		if k.Value == "engine_args" || k.Value == "runtime" {
			continue
		}
		if flat.Get(k.Value) != nil {
			flat.Delete(k.Value)
		}
		flat.Keys = append(flat.Keys, k)
		flat.Values = append(flat.Values, n.Values[i])
	}
	for i, k := range flat.Keys {
		v := flat.Values[i]
		fp := writtenPath(v, path+"."+k.Value)
		switch k.Value {
		case "stage_id":
		case "model_stage":
			r.modelStage, _ = p.strOf(v, fp)
		case "is_prefill_only":
			r.prefillOnly, _ = p.boolOf(v, fp)
		case "is_decode_only":
			r.decodeOnly, _ = p.boolOf(v, fp)
		case "is_encoder_only":
			r.encoderOnly, _ = p.boolOf(v, fp)
		case "input_sources", "engine_input_source":
			r.inputSources, _ = p.intListOf(v, fp)
			r.hasInputs = true
		case "final_output":
			if b, ok := p.boolOf(v, fp); ok {
				r.finalOutput = &b
			}
		case "final_output_type":
			if v.Kind != KindNull {
				r.finalType, _ = p.strOf(v, fp)
			}
		case "devices":
			r.devices, _ = p.devicesOf(v, fp)
		case "tensor_parallel_size":
			r.tp, _ = p.boundedIntOf(v, fp, topology.MaxDevices)
		case "data_parallel_size":
			r.dp, _ = p.boundedIntOf(v, fp, topology.MaxDevices)
			r.engineArgs.Set(k.Value, v.Clone())
		case "num_replicas":
			r.numReplicas, _ = p.boundedIntOf(v, fp, maxReplicas)
		case "replicas":
			r.replicas, r.hasReplicas = p.replicasOf(v, fp)
		case "endpoints":
			r.endpoints, _ = p.stringListOf(v, fp)
		case "kv_transfer_config":
			r.kv = p.kvConfigOf(v, fp)
		case "ec_transfer_config":
			r.ec = p.ecConfigOf(v, fp)
		case "input_connectors":
			r.inConns = p.stageConnectorsOf(v, fp, "from_stage_")
		case "output_connectors":
			r.outConns = p.stageConnectorsOf(v, fp, "to_stage_")
		case "default_sampling_params":
			if v.Kind != KindNull && p.mapOf(v, fp) {
				r.sampling = v.Clone()
			}
		case "env":
			if v.Kind != KindNull && p.mapOf(v, fp) {
				for j, ek := range v.Keys {
					if ev := v.Values[j]; ev.Kind != KindScalar {
						p.errorf(ev, writtenPath(ev, fp+"."+ek.Value), "want a string value, got %s", describe(ev))
					}
				}
				r.env = v.Clone()
			}
		case "async_chunk":
			if b, ok := p.boolOf(v, fp); ok {
				r.asyncChunk = &b
			}
		default:
			if s := closest(k.Value, stageKnownKeys); s != "" && !slices.Contains(engineArgsNearStageKeys, k.Value) {
				p.warnf(k, fp, "unknown key %q is passed to the engine as an argument; did you mean %q?", k.Value, s)
			}
			p.engineArg(k.Value, v, fp)
			r.engineArgs.Set(k.Value, v.Clone())
		}
	}
	if r.prefillOnly && r.decodeOnly {
		at := flat.Get("is_decode_only")
		p.errorf(at, writtenPath(at, path+".is_decode_only"), "a stage cannot be both is_prefill_only and is_decode_only")
	}
	if r.encoderOnly && (r.prefillOnly || r.decodeOnly) {
		other := "is_prefill_only"
		if r.decodeOnly {
			other = "is_decode_only"
		}
		at := flat.Get("is_encoder_only")
		p.errorf(at, writtenPath(at, path+".is_encoder_only"), "a stage cannot be both is_encoder_only and %s: the encoder is a stage of its own, in front of the prefill", other)
	}
}

func (p *problems) replicasOf(n *Node, path string) ([]topology.Replica, bool) {
	if n.Kind != KindSeq {
		p.errorf(n, path, "want a list of replicas, got %s", describe(n))
		return nil, false
	}
	if len(n.Items) > maxReplicas {
		p.errorf(n, path, "%d replicas; omnipd accepts at most %d per stage", len(n.Items), maxReplicas)
		return nil, false
	}
	var out []topology.Replica
	for i, it := range n.Items {
		rp := writtenPath(it, fmt.Sprintf("%s[%d]", path, i))
		if !p.mapOf(it, rp) {
			continue
		}
		var r topology.Replica
		for j, k := range it.Keys {
			v := it.Values[j]
			fp := writtenPath(v, rp+"."+k.Value)
			switch k.Value {
			case "devices":
				r.Devices, _ = p.devicesOf(v, fp)
			case "engine_id":
				r.EngineID, _ = p.strOf(v, fp)
			case "kv_port":
				if port, ok := p.intOf(v, fp); ok {
					if port < 0 || port > 65535 {
						p.errorf(v, fp, "port %d is outside 0-65535", port)
					}
					r.KVPort = port
				}
			case "endpoint":
				r.Endpoint, _ = p.strOf(v, fp)
			default:
				p.unknownKey(k, fp, []string{"devices", "engine_id", "kv_port", "endpoint"})
			}
		}
		out = append(out, r)
	}
	return out, true
}

// applyPipeline matches each stage to its pipeline stage, picks the pipeline
// variant the stages make up, detects prefill/decode roles and fills in what
// the pipeline owns.
func (p *problems) applyPipeline(pipe *Pipeline, stagesNode *Node, raws []*rawStage, pipelineWide *Node, doc *Document, gaps *stageGaps) []*Stage {
	thinker := ""
	for _, ps := range pipe.Stages {
		if ps.Disaggregatable() {
			thinker = ps.ModelStage
		}
	}
	// A stage that says it is a prefill, decode or encoder, or carries a
	// producer or consumer KV role or a producer EC role, is a copy of the
	// Thinker.
	pdMarked := func(r *rawStage) bool {
		return r.prefillOnly || r.decodeOnly || r.encoderOnly ||
			(r.kv != nil && (r.kv.Role == topology.KVProducer || r.kv.Role == topology.KVConsumer)) ||
			(r.ec != nil && r.ec.Role == topology.ECProducer)
	}
	var thinkerIDs []int
	for _, r := range raws {
		if r.modelStage == thinker && thinker != "" || r.modelStage == "" && pdMarked(r) {
			thinkerIDs = append(thinkerIDs, r.id)
		}
	}
	full := fullPipelineOf(pipe)
	// A stage matched to no pipeline stage stays in the topology, so that
	// references to its id resolve, but nothing is checked about it.
	unmatched := map[*rawStage]bool{}
	var modelStages []string
	for _, r := range raws {
		switch {
		case r.modelStage != "":
			if _, ok := full.stage(r.modelStage); !ok {
				var names []string
				for _, s := range full.Stages {
					names = append(names, s.ModelStage)
				}
				at := r.node.Get("model_stage")
				p.errorf(at, writtenPath(at, r.path+".model_stage"), "pipeline %s has no model stage %q; it has %s", pipe.Name, r.modelStage, quoteAll(names))
				r.modelStage = ""
				unmatched[r] = true
				continue
			}
		case pdMarked(r) && thinker != "":
			r.modelStage = thinker
		default:
			// Without model_stage a stage is matched by its id, counting the
			// extra stage a PD split adds before it.
			shift := 0
			for _, id := range thinkerIDs {
				if id < r.id {
					shift++
				}
			}
			pid := r.id - max(0, shift-1)
			ps, ok := full.stageByID(pid)
			if !ok {
				at := r.node.Get("stage_id")
				msg := fmt.Sprintf("pipeline %s has no stage %d; set model_stage to say which stage this is", pipe.Name, pid)
				if pid != r.id {
					msg = fmt.Sprintf("stage %d would be stage %d of pipeline %s (counting the Thinker's copies as one), which has none; set model_stage to say which stage this is", r.id, pid, pipe.Name)
				}
				p.errorf(at, writtenPath(at, r.path+".stage_id"), "%s", msg)
				unmatched[r] = true
				continue
			}
			r.modelStage = ps.ModelStage
		}
		modelStages = append(modelStages, r.modelStage)
	}
	gaps.unmatched = len(unmatched) > 0
	variant := variantFor(full, modelStages)
	if variant != nil && pipe.Name != pipe.Family && variant != pipe {
		var names []string
		for _, s := range pipe.Stages {
			names = append(names, s.ModelStage)
		}
		p.errorf(stagesNode, "stages", "pipeline %s has only %s; name pipeline %s for the other stages", pipe.Name, quoteAll(names), variant.Name)
	}
	if variant == nil {
		// The stages that are there are still checked, against the full
		// pipeline; what the missing ones would be is left alone.
		var missing []string
		for _, s := range full.Stages {
			if slices.Contains(modelStages, s.ModelStage) {
				continue
			}
			missing = append(missing, s.ModelStage)
			gaps.missingFinal = gaps.missingFinal || s.FinalOutput
			id := s.ID
			if !s.Disaggregatable() {
				id += max(0, len(thinkerIDs)-1)
			}
			if _, taken := slices.BinarySearchFunc(raws, id, func(r *rawStage, id int) int { return r.id - id }); !taken {
				gaps.missing = append(gaps.missing, id)
			}
		}
		// A stage left out may be the one missing: then that is its
		// mistake, reported where it was written.
		if !gaps.unaccounted() {
			p.errorf(stagesNode, "stages", "pipeline %s needs stages for %s too; add them, or keep only the Thinker for a text-only deployment", full.Name, quoteAll(missing))
		}
		gaps.absent = true
		variant = full
	}
	doc.Pipeline = variant.Name

	// Roles. Explicit flags win, on any stage (a flag on a stage that
	// cannot be split is reported by validation); otherwise, when the
	// Thinker appears twice, the KV roles say which copy is which.
	roles := map[*rawStage]topology.Role{}
	guessed := map[*rawStage]bool{} // roles inferred after reporting a mistake
	var all []*rawStage
	for _, r := range raws {
		switch {
		case unmatched[r]:
			// What it is is unknown; so is its role.
		case r.prefillOnly && r.decodeOnly:
			// Reported when read; the stage stays as written otherwise.
		case r.prefillOnly:
			// is_encoder_only beside it is reported when read; the
			// prefill/decode flag says which copy of the pair this is.
			roles[r] = topology.RolePrefill
		case r.decodeOnly:
			roles[r] = topology.RoleDecode
		case r.encoderOnly:
			roles[r] = topology.RoleEncoder
		}
		if r.modelStage == thinker {
			all = append(all, r)
		}
	}
	// A further copy of the Thinker that only produces encoder outputs (an
	// ec_producer without KV) is its encoder stage; the prefill/decode
	// pair is found among the others.
	var copies []*rawStage
	for _, r := range all {
		if _, ok := roles[r]; !ok && len(all) > 1 && r.kv == nil && r.ec != nil && r.ec.Role == topology.ECProducer {
			roles[r] = topology.RoleEncoder
		}
		if roles[r] != topology.RoleEncoder {
			copies = append(copies, r)
		}
	}
	if len(copies) > 1 {
		for _, r := range copies {
			if _, ok := roles[r]; ok || r.kv == nil {
				continue
			}
			switch r.kv.Role {
			case topology.KVProducer:
				roles[r] = topology.RolePrefill
			case topology.KVConsumer:
				roles[r] = topology.RoleDecode
			}
		}
	}
	if len(copies) == 2 {
		a, b := copies[0], copies[1]
		_, aok := roles[a]
		_, bok := roles[b]
		switch {
		case !aok && !bok && a.kv != nil && b.kv != nil:
			// kv_both on both copies: the one that reads from the other decodes.
			if slices.Contains(a.inputSources, b.id) {
				roles[a], roles[b] = topology.RoleDecode, topology.RolePrefill
			} else {
				roles[a], roles[b] = topology.RolePrefill, topology.RoleDecode
			}
		case aok != bok:
			// One copy says what it is: the other is its counterpart. Still
			// an error (below), but only one.
			known, other := a, b
			if bok {
				known, other = b, a
			}
			if !(other.prefillOnly && other.decodeOnly) {
				p.errorf(other.node, other.path, "the Thinker appears 2 times but this copy is neither a prefill nor a decode: set is_prefill_only or is_decode_only, or kv_transfer_config.kv_role")
			}
			if roles[known] == topology.RolePrefill {
				roles[other] = topology.RoleDecode
			} else {
				roles[other] = topology.RolePrefill
			}
			guessed[other] = true
		}
	}
	if len(copies) > 1 {
		for _, r := range copies {
			if _, ok := roles[r]; !ok && !(r.prefillOnly && r.decodeOnly) {
				p.errorf(r.node, r.path, "the Thinker appears %d times but this copy is neither a prefill nor a decode: set is_prefill_only or is_decode_only, or kv_transfer_config.kv_role", len(copies))
			}
		}
	}

	// Where each pipeline stage's output now comes from: the Thinker's from
	// its decode copy when disaggregated.
	idOf := map[string]int{}
	prefillID, encoderID := -1, -1
	for _, r := range raws {
		switch roles[r] {
		case topology.RolePrefill:
			prefillID = r.id
		case topology.RoleEncoder:
			// Only the Thinker's encoder feeds its prefill; the role on
			// another stage is a mistake validation reports.
			if r.modelStage == thinker {
				encoderID = r.id
			}
		default:
			if _, taken := idOf[r.modelStage]; !taken || roles[r] == topology.RoleDecode {
				idOf[r.modelStage] = r.id
			}
		}
	}

	var out []*Stage
	for _, r := range raws {
		ps, _ := variant.stage(r.modelStage)
		s := &Stage{
			ID:               r.id,
			ModelStage:       r.modelStage,
			ExecutionType:    ps.ExecutionType,
			EngineOutputType: ps.EngineOutputType,
			Role:             roles[r],
			FinalOutput:      ps.FinalOutput,
			FinalOutputType:  ps.FinalOutputType,
			KV:               r.kv,
			EC:               r.ec,
			InputConnectors:  r.inConns,
			OutputConnectors: r.outConns,
			Env:              r.env,
			AsyncChunk:       r.asyncChunk,
			Endpoints:        r.endpoints,
			disaggregatable:  ps.Disaggregatable(),
			roleGuessed:      guessed[r],
			unmatched:        unmatched[r],
			src:              r.node,
		}
		switch {
		case r.hasInputs:
			s.InputSources = r.inputSources
		case s.Role == topology.RolePrefill:
			s.InputSources = []int{}
			if encoderID >= 0 {
				s.InputSources = []int{encoderID}
			}
		case s.Role == topology.RoleEncoder:
			s.InputSources = []int{}
		case s.Role == topology.RoleDecode:
			s.InputSources = []int{}
			if prefillID >= 0 {
				s.InputSources = []int{prefillID}
			}
		default:
			s.InputSources = []int{}
			for _, src := range ps.InputSources {
				if from, ok := variant.stageByID(src); ok {
					if id, ok := idOf[from.ModelStage]; ok {
						s.InputSources = append(s.InputSources, id)
					}
				}
			}
		}
		if s.Role == topology.RolePrefill || s.Role == topology.RoleEncoder {
			s.FinalOutput, s.FinalOutputType = false, ""
		}
		if r.finalOutput != nil {
			s.FinalOutput = *r.finalOutput
		}
		if r.finalType != "" {
			s.FinalOutputType = r.finalType
		}
		if !s.FinalOutput {
			s.FinalOutputType = ""
		}
		s.DefaultSamplingParams = r.sampling
		if s.DefaultSamplingParams == nil {
			s.DefaultSamplingParams = newMap(r.node.Pos)
		}
		for _, c := range ps.SamplingConstraints {
			s.DefaultSamplingParams.Set(c.key, c.value())
		}
		s.EngineArgs = r.engineArgs
		for i, k := range pipelineWide.Keys {
			if s.EngineArgs.Get(k.Value) == nil {
				s.EngineArgs.Set(k.Value, pipelineWide.Values[i].Clone())
			}
		}
		s.TensorParallelSize = max(r.tp, 1)
		s.DataParallelSize = max(r.dp, 1)
		if r.dp == 0 {
			s.DataParallelSize = max(intValue(pipelineWide.Get("data_parallel_size")), 1)
		}
		if r.tp == 0 && len(r.devices) > 0 && !r.hasReplicas {
			// vllm-omni configs often set devices without
			// tensor_parallel_size; TP defaults to 1 there too.
			s.TensorParallelSize = 1
		}
		if s.KV != nil && s.KV.EngineID == "" && s.Role != topology.RoleFull {
			s.KV.EngineID = s.ModelStage + "-" + s.Role.String()
		}
		if s.EC != nil && s.EC.EngineID == "" && s.Role == topology.RoleEncoder {
			s.EC.EngineID = s.ModelStage + "-" + s.Role.String()
		}
		p.resolveReplicas(s, r)
		out = append(out, s)
	}
	return out
}

func fullPipelineOf(p *Pipeline) *Pipeline {
	for _, q := range pipelines {
		if q.Family == p.Family && q.Name == q.Family {
			return q
		}
	}
	return p
}

// resolveReplicas fills in the stage's instances: explicit replicas: as
// written, otherwise devices split tensor_parallel_size at a time, engine ids
// suffixed with the replica index when there are several, and KV ports
// counted up from the stage's base port.
func (p *problems) resolveReplicas(s *Stage, r *rawStage) {
	s.NumReplicas = r.numReplicas
	if r.hasReplicas {
		if s.NumReplicas == 0 {
			s.NumReplicas = len(r.replicas)
		}
		if len(r.replicas) != s.NumReplicas {
			at := r.node.Get("replicas")
			p.errorf(at, writtenPath(at, r.path+".replicas"), "lists %d replicas but num_replicas is %d", len(r.replicas), s.NumReplicas)
			s.NumReplicas = len(r.replicas) // reported once, here
		}
		s.Replicas = r.replicas
	} else {
		if s.NumReplicas == 0 {
			s.NumReplicas = max(1, len(r.endpoints))
		}
		tp := s.TensorParallelSize * s.DataParallelSize
		base := kvBasePort(s.KV)
		for i := range s.NumReplicas {
			var rep topology.Replica
			switch {
			case len(r.devices) == tp*s.NumReplicas:
				rep.Devices = slices.Clone(r.devices[i*tp : (i+1)*tp])
			case len(r.devices) > 0:
				rep.Devices = slices.Clone(r.devices)
			}
			if id := replicaEngineIDBase(s); id != "" {
				rep.EngineID = id
				if s.NumReplicas > 1 {
					rep.EngineID += "-" + strconv.Itoa(i)
				}
			}
			if base > 0 {
				rep.KVPort = base + i
			}
			s.Replicas = append(s.Replicas, rep)
		}
	}
	if len(r.endpoints) > 0 {
		if len(r.endpoints) != len(s.Replicas) {
			at := r.node.Get("endpoints")
			p.errorf(at, writtenPath(at, r.path+".endpoints"), "lists %d endpoints for %d replicas; give one base URL per replica", len(r.endpoints), len(s.Replicas))
		}
		for i := range min(len(r.endpoints), len(s.Replicas)) {
			if s.Replicas[i].Endpoint == "" {
				s.Replicas[i].Endpoint = r.endpoints[i]
			}
		}
	}
	s.Endpoints = nil
	for _, rep := range s.Replicas {
		if rep.Endpoint != "" {
			s.Endpoints = append(s.Endpoints, rep.Endpoint)
		}
	}
	s.Devices = unionDevices(s.Replicas)
	if r.hasReplicas && len(r.devices) > 0 {
		// Both written: keep what the stage says, so that a disagreement
		// with its replicas is reported rather than resolved silently.
		s.Devices = r.devices
	}
}

// replicaEngineIDBase is the engine id a stage's derived replicas are
// named from: its KV engine id, or an encoder's EC engine id.
func replicaEngineIDBase(s *Stage) string {
	switch {
	case s.KV != nil:
		return s.KV.EngineID
	case s.EC != nil && s.Role == topology.RoleEncoder:
		return s.EC.EngineID
	}
	return ""
}

func unionDevices(reps []topology.Replica) []int {
	var out []int
	for _, r := range reps {
		for _, d := range r.Devices {
			if !slices.Contains(out, d) {
				out = append(out, d)
			}
		}
	}
	return out
}

// maxReplicas bounds num_replicas: far above real deployments, low enough
// that a typo is an error rather than an allocation.
const maxReplicas = 1024

func (p *problems) boundedIntOf(n *Node, path string, most int) (int, bool) {
	v, ok := p.intOf(n, path)
	if !ok {
		return 0, false
	}
	if v < 1 {
		p.errorf(n, path, "want at least 1, got %d", v)
		return 0, false
	}
	if v > most {
		p.errorf(n, path, "want at most %d, got %d", most, v)
		return 0, false
	}
	return v, true
}

// intValue is the value of an integer node already checked to be one; 0
// for nil.
func intValue(n *Node) int {
	if n == nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	return int(v)
}
