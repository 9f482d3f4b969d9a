package deploy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/topology"
)

// validate checks the resolved document's topology and reports each
// violation at the place in the config it came from.
func (p *problems) validate(doc *Document) {
	reported := map[string]bool{}
	for _, e := range p.errs {
		reported[e.Path] = true
	}
	for _, v := range topology.Validate(doc.Topology()) {
		if v.Stage >= 0 && v.Stage < len(doc.Stages) && doc.Stages[v.Stage].roleGuessed && strings.HasPrefix(v.Code, "pd-") {
			continue
		}
		e := violationError(doc, v)
		// A field already reported as malformed was resolved to a default;
		// what the topology says about that default would only confuse.
		if reported[e.Path] {
			continue
		}
		p.errs = append(p.errs, e)
	}
	p.moriioReadModes(doc)
	p.encoderEngineFlags(doc)
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
	i := slices.Index(doc.Stages, e)
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
		at := locate(e.src, want.key)
		p.warnf(at, fmt.Sprintf("stages[%d].%s", i, want.key), "an encoder instance needs %s: %t (%s)", want.key, want.value, want.why)
	}
}

// fieldAliases map a resolved field to where the user wrote its source when
// the resolved form does not exist in the file.
var fieldAliases = map[string][]string{
	"replicas":        {"devices", "num_replicas"},
	"num_replicas":    {"replicas"},
	"input_sources":   {"engine_input_source"},
	"engine_id":       {"kv_transfer_config.engine_id", "kv_transfer_config", "ec_transfer_config.engine_id", "ec_transfer_config"},
	"kv_port":         {"kv_transfer_config.kv_port", "kv_transfer_config.kv_connector_extra_config", "kv_transfer_config"},
	"is_prefill_only": {"kv_transfer_config.kv_role"},
	"is_decode_only":  {"kv_transfer_config.kv_role"},
	"is_encoder_only": {"ec_transfer_config.ec_role"},
	// A missing ec_transfer_config is reported where the stage says what
	// it is.
	"ec_transfer_config": {"is_encoder_only", "is_prefill_only", "kv_transfer_config.kv_role"},
}

func violationError(doc *Document, v topology.Violation) Error {
	if v.Stage < 0 || v.Stage >= len(doc.Stages) {
		path := v.Field
		if path == "" {
			path = "stages"
		}
		return Error{Pos: posOf(doc.stagesKey), Path: path, Msg: v.Msg, Code: v.Code}
	}
	s := doc.Stages[v.Stage]
	path := fmt.Sprintf("stages[%d]", v.Stage)
	if v.Field != "" {
		path += "." + v.Field
	}
	return Error{Pos: posOf(locate(s.src, v.Field)), Path: path, Msg: v.Msg, Code: v.Code}
}

// locate finds the node a field path names under n, falling back to
// aliases and then to the deepest part of the path that exists.
func locate(n *Node, field string) *Node {
	if field == "" || n == nil {
		return n
	}
	if found := lookupPath(n, field); found != nil {
		return found
	}
	// The deepest part of the path the user wrote, short of the stage itself.
	for prefix := field; ; {
		i := strings.LastIndexAny(prefix, ".[")
		if i < 0 {
			break
		}
		prefix = prefix[:i]
		if found := lookupPath(n, prefix); found != nil {
			return found
		}
	}
	last := field
	if i := strings.LastIndex(field, "."); i >= 0 {
		last = field[i+1:]
	}
	head, _, _ := strings.Cut(field, "[")
	head, _, _ = strings.Cut(head, ".")
	for _, key := range []string{last, head} {
		for _, alias := range fieldAliases[key] {
			if found := lookupPath(n, alias); found != nil {
				return found
			}
		}
	}
	return n
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
