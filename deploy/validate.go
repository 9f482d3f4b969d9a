package deploy

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/topology"
)

// report turns the topology violations of stages (doc's stages as they
// were when vs was computed) whose code keep accepts into errors at the
// place in the config they came from.
func (p *problems) report(doc *Document, stages []*Stage, vs []topology.Violation, gaps *stageGaps, keep func(code string) bool) {
	// A field already reported as malformed was resolved to a default;
	// what the topology says about that default would only confuse.
	malformed := map[string]bool{}
	for _, e := range p.errs {
		if e.Code == "" {
			malformed[e.Path] = true
		}
	}
	if p.violations == nil {
		p.violations = map[string]bool{}
	}
	for _, v := range vs {
		if !keep(v.Code) || gaps.hides(v, stages) {
			continue
		}
		if v.Stage >= 0 && v.Stage < len(stages) {
			s := stages[v.Stage]
			if s.unmatched || s.roleGuessed && strings.HasPrefix(v.Code, "pd-") {
				continue
			}
		}
		e := violationError(doc, stages, v)
		key := e.Code + "\x00" + e.Path
		if malformed[e.Path] || p.violations[key] {
			continue
		}
		p.violations[key] = true
		p.errs = append(p.errs, e)
	}
}

// encoderEngineFlags warns about a vLLM encoder stage without the engine
// arguments vLLM's disaggregated-encoder README calls required for an
// encoder instance (--enforce-eager, --no-enable-prefix-caching). Encoder
// expansion sets both; a stage written by hand may not.
func (p *problems) encoderEngineFlags(doc *Document) {
	e := doc.EncoderStage()
	if e == nil || e.EC == nil || !IsVLLMECConnector(e.EC.Connector) {
		return
	}
	for _, want := range []struct {
		key   string
		value bool
		why   string
	}{
		{"enforce_eager", true, "vLLM's encoder disaggregation supports only encoder instances in eager mode"},
		{"enable_prefix_caching", false, "an encoder instance keeps no KV cache"},
	} {
		v := e.EngineArgs.Get(want.key)
		if v != nil && v.Kind == KindScalar && v.Tag == "!!bool" && strings.EqualFold(v.Value, strconv.FormatBool(want.value)) {
			continue
		}
		at, path := fieldAt(e, want.key)
		p.warnf(at, path, "an encoder instance needs %s: %t (%s)", want.key, want.value, want.why)
	}
}

// fieldAlias is where the user wrote what a resolved field came from,
// when the resolved form does not exist in the file. source: the alias
// holds the value itself (devices for the replicas' devices), so an error
// names it; otherwise it is only the nearest place to point at (a missing
// field's container, or the key that gave the stage its role).
type fieldAlias struct {
	path   string
	source bool
}

var fieldAliases = map[string][]fieldAlias{
	"replicas":      {{"devices", true}, {"num_replicas", true}},
	"num_replicas":  {{"replicas", true}},
	"input_sources": {{"engine_input_source", true}},
	"engine_id": {
		{"kv_transfer_config.engine_id", true}, {"ec_transfer_config.engine_id", true},
		{"kv_transfer_config", false}, {"ec_transfer_config", false},
	},
	"kv_port": {
		{"kv_transfer_config.kv_port", true}, {"kv_transfer_config.kv_connector_extra_config.mooncake_bootstrap_port", true},
		{"kv_transfer_config.kv_connector_extra_config", false}, {"kv_transfer_config", false},
	},
	"is_prefill_only": {{"kv_transfer_config.kv_role", true}},
	"is_decode_only":  {{"kv_transfer_config.kv_role", true}},
	"is_encoder_only": {{"ec_transfer_config.ec_role", true}},
	// A missing ec_transfer_config is reported where the stage says what
	// it is.
	"ec_transfer_config": {{"is_encoder_only", false}, {"is_prefill_only", false}, {"kv_transfer_config.kv_role", false}},
}

func violationError(doc *Document, stages []*Stage, v topology.Violation) Error {
	if v.Stage < 0 || v.Stage >= len(stages) {
		path := v.Field
		if path == "" {
			path = "stages"
		}
		return Error{Pos: posOf(doc.stagesKey), Path: path, Msg: v.Msg, Code: v.Code}
	}
	at, path := fieldAt(stages[v.Stage], v.Field)
	return Error{Pos: posOf(at), Path: path, Msg: v.Msg, Code: v.Code}
}

// fieldAt is where an error about field (a path relative to stage s)
// belongs: the node to take the position from and the field path to name,
// both as the user wrote them. That is the field itself when written
// (under vllm-omni's engine_args: or runtime: nesting, in an overlay, in
// a platform section, in a legacy stage_args: entry); for a stage PD
// expansion made, the pd: setting it took the field from; otherwise the
// closest thing written, with the path of the stage entry it is in.
func fieldAt(s *Stage, field string) (*Node, string) {
	if o := s.origin(field); o != nil {
		return o, writtenPath(o, field)
	}
	n, named := locate(s.src, field)
	if named && n != nil && n.path != "" {
		return n, n.path
	}
	stage := ""
	if n != nil {
		stage = n.stage
	}
	if stage == "" && s.src != nil {
		stage = cmp.Or(s.src.stage, s.src.path)
	}
	stage = cmp.Or(stage, "stages")
	if field == "" {
		return n, stage
	}
	return n, stage + "." + field
}

// origin is the pd: value field of s came from, when PD expansion made s.
func (s *Stage) origin(field string) *Node {
	if s.origins == nil {
		return nil
	}
	return s.origins[dropIndices(field)]
}

// dropIndices turns "replicas[1].devices" into "replicas.devices".
func dropIndices(field string) string {
	var b strings.Builder
	depth := 0
	for _, c := range field {
		switch {
		case c == '[':
			depth++
		case c == ']':
			depth--
		case depth == 0:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// locate finds the node a field path names under n: the field itself or
// what the user wrote it as (named: the error names that node's path),
// or, falling back, the deepest part of the path that exists and at last
// n itself.
func locate(n *Node, field string) (node *Node, named bool) {
	if field == "" || n == nil {
		return n, true
	}
	if found := lookupPath(n, field); found != nil {
		return found, true
	}
	head, rest := field, ""
	if i := strings.IndexAny(field, ".["); i >= 0 {
		head, rest = field[:i], field[i:]
	}
	for _, a := range fieldAliases[head] {
		if found := lookupPath(n, a.path+rest); a.source && found != nil {
			return found, true
		}
	}
	// The deepest part of the path the user wrote, short of the stage itself.
	for prefix := field; ; {
		i := strings.LastIndexAny(prefix, ".[")
		if i < 0 {
			break
		}
		prefix = prefix[:i]
		if found := lookupPath(n, prefix); found != nil {
			return found, false
		}
	}
	last := field
	if i := strings.LastIndex(field, "."); i >= 0 {
		last = field[i+1:]
	}
	head, _, _ = strings.Cut(head, "[")
	for _, key := range []string{last, head} {
		for _, a := range fieldAliases[key] {
			if found := lookupPath(n, a.path); found != nil {
				return found, a.source
			}
		}
	}
	return n, false
}

// lookupPath follows "a.b[2].c" through n; nil when any step is missing.
// A stage's engine_args: and runtime: nesting is looked through.
func lookupPath(n *Node, path string) *Node {
	cur := n
	for _, part := range strings.Split(path, ".") {
		key, idx, hasIdx := strings.Cut(part, "[")
		next := cur.Get(key)
		if next == nil && cur == n {
			for _, nested := range []string{"engine_args", "runtime"} {
				if next = cur.Get(nested).Get(key); next != nil {
					break
				}
			}
		}
		if next == nil {
			return nil
		}
		cur = next
		if hasIdx {
			var i int
			if _, err := fmt.Sscanf(strings.TrimSuffix(idx, "]"), "%d", &i); err != nil || cur.Kind != KindSeq || i < 0 || i >= len(cur.Items) {
				return nil
			}
			cur = cur.Items[i]
		}
	}
	return cur
}
