package deploy

import (
	"fmt"
	"slices"
	"strings"
)

// Keys of the legacy stage_args: schema that the frozen pipeline now owns;
// migration drops them rather than forwarding them to the engine.
var legacyPipelineOwned = []string{
	"stage_type", "worker_type", "scheduler_cls", "model_arch", "engine_output_type",
	"hf_config_name", "custom_process_input_func", "is_comprehension",
}

// migrateLegacy rewrites a document in the removed stage_args: schema into
// the stages: schema, warning that it did. Other documents are returned as
// they are.
func migrateLegacy(root *Node, p *problems) *Node {
	args := root.Get("stage_args")
	if args == nil {
		return root
	}
	keyNode := root.KeyNode("stage_args")
	if root.Get("stages") != nil {
		p.errorf(keyNode, "stage_args", "both stage_args: (the removed legacy schema) and stages: are set; keep only stages:")
		return root
	}
	if args.Kind != KindSeq {
		p.errorf(args, "stage_args", "want a list of stages, got %s", args.Kind)
		return root
	}

	out := newMap(root.Pos)
	dropped := map[string]bool{}
	for i, k := range root.Keys {
		v := root.Values[i]
		switch k.Value {
		case "stage_args":
			stages := newSeq(v.Pos)
			stages.path = v.path
			for j, s := range v.Items {
				stages.Items = append(stages.Items, migrateStage(s, fmt.Sprintf("stage_args[%d]", j), dropped, p))
			}
			out.Keys = append(out.Keys, &Node{Kind: KindScalar, Tag: "!!str", Value: "stages", Pos: k.Pos})
			out.Values = append(out.Values, stages)
		case "runtime":
			// Legacy runtime: carried connectors and edges; edges are implied
			// by the stages' input sources now.
			if v.Kind != KindMap {
				dropped["runtime"] = true
				continue
			}
			for ri, rk := range v.Keys {
				if rk.Value == "connectors" {
					out.Set("connectors", mergeNodes(out.Get("connectors"), v.Values[ri]))
				} else {
					dropped["runtime."+rk.Value] = true
				}
			}
		default:
			out.Keys = append(out.Keys, k)
			out.Values = append(out.Values, v)
		}
	}
	msg := "the legacy stage_args: schema was removed from vllm-omni; migrated it to stages: (print the result with `omnipd expand --migrate FILE`)"
	if len(dropped) > 0 {
		var names []string
		for n := range dropped {
			names = append(names, n)
		}
		slices.Sort(names)
		msg += "; dropped keys the pipeline now owns: " + strings.Join(names, ", ")
	}
	p.warnf(keyNode, "stage_args", "%s", msg)
	return out
}

func migrateStage(s *Node, path string, dropped map[string]bool, p *problems) *Node {
	if s.Kind != KindMap {
		p.errorf(s, path, "want a mapping, got %s", s.Kind)
		return s
	}
	out := newMap(s.Pos)
	// The migrated stage is still the stage_args: entry the user wrote.
	out.path, out.stage = s.path, s.stage
	add := func(k *Node, v *Node, name string) {
		if out.Get(name) != nil {
			return
		}
		out.Keys = append(out.Keys, &Node{Kind: KindScalar, Tag: "!!str", Value: name, Pos: k.Pos, path: k.path, stage: k.stage})
		out.Values = append(out.Values, v)
	}
	var engineArgs, runtime *Node
	for i, k := range s.Keys {
		v := s.Values[i]
		switch {
		case k.Value == "engine_args":
			engineArgs = v
		case k.Value == "runtime":
			runtime = v
		case k.Value == "engine_input_source":
			add(k, v, "input_sources")
		case slices.Contains(legacyPipelineOwned, k.Value):
			dropped[k.Value] = true
		default:
			add(k, v, k.Value)
		}
	}
	if runtime != nil {
		if runtime.Kind != KindMap {
			p.errorf(runtime, path+".runtime", "want a mapping, got %s", runtime.Kind)
		} else {
			for i, k := range runtime.Keys {
				v := runtime.Values[i]
				switch k.Value {
				case "devices", "num_replicas", "env":
					add(k, v, k.Value)
				case "max_batch_size":
					// The legacy per-stage batch bound is vLLM's max_num_seqs.
					if engineArgs.Get("max_num_seqs") == nil {
						add(k, v, "max_num_seqs")
					}
				default:
					dropped["runtime."+k.Value] = true
				}
			}
		}
	}
	if engineArgs != nil {
		if engineArgs.Kind != KindMap {
			p.errorf(engineArgs, path+".engine_args", "want a mapping, got %s", engineArgs.Kind)
		} else {
			for i, k := range engineArgs.Keys {
				if slices.Contains(legacyPipelineOwned, k.Value) {
					dropped[k.Value] = true
					continue
				}
				add(k, engineArgs.Values[i], k.Value)
			}
		}
	}
	// stage_id and model_stage first, as users write them.
	moveTo(out, "model_stage", 0)
	moveTo(out, "stage_id", 0)
	return out
}

// moveTo moves key's entry in mapping n to position at.
func moveTo(n *Node, key string, at int) {
	idx := slices.IndexFunc(n.Keys, func(k *Node) bool { return k.Value == key })
	if idx < 0 {
		return
	}
	k, v := n.Keys[idx], n.Values[idx]
	n.Keys = slices.Insert(slices.Delete(n.Keys, idx, idx+1), at, k)
	n.Values = slices.Insert(slices.Delete(n.Values, idx, idx+1), at, v)
}
