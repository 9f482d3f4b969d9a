package deploy

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/topology"
)

// Typed reads of nodes. Each reports a problem at the node and returns ok
// false when the value has the wrong type, so one pass finds every mistake.

func (p *problems) intOf(n *Node, path string) (int, bool) {
	if n.Kind == KindScalar && n.Tag == "!!int" {
		v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err == nil && v >= math.MinInt32 && v <= math.MaxInt32 {
			return int(v), true
		}
		p.errorf(n, path, "%s is out of range", n.Value)
		return 0, false
	}
	p.errorf(n, path, "want an integer, got %s", describe(n))
	return 0, false
}

func (p *problems) nonNegIntOf(n *Node, path string) (int, bool) {
	v, ok := p.intOf(n, path)
	if ok && v < 0 {
		p.errorf(n, path, "want a non-negative integer, got %d", v)
		return 0, false
	}
	return v, ok
}

func (p *problems) boolOf(n *Node, path string) (bool, bool) {
	if n.Kind == KindScalar && n.Tag == "!!bool" {
		v, err := strconv.ParseBool(strings.ToLower(n.Value))
		if err == nil {
			return v, true
		}
	}
	p.errorf(n, path, "want true or false, got %s", describe(n))
	return false, false
}

func (p *problems) strOf(n *Node, path string) (string, bool) {
	if n.Kind == KindScalar {
		return n.Value, true
	}
	p.errorf(n, path, "want a string, got %s", describe(n))
	return "", false
}

func (p *problems) mapOf(n *Node, path string) bool {
	if n.Kind == KindMap {
		return true
	}
	p.errorf(n, path, "want a mapping, got %s", describe(n))
	return false
}

// devicesOf reads a device list: "0,1", "0-3", 2, or [0, 1].
func (p *problems) devicesOf(n *Node, path string) ([]int, bool) {
	var s string
	switch n.Kind {
	case KindScalar:
		s = n.Value
	case KindSeq:
		parts := make([]string, 0, len(n.Items))
		for i, it := range n.Items {
			v, ok := p.nonNegIntOf(it, writtenPath(it, fmt.Sprintf("%s[%d]", path, i)))
			if !ok {
				return nil, false
			}
			parts = append(parts, strconv.Itoa(v))
		}
		s = strings.Join(parts, ",")
	case KindNull:
		return nil, true
	default:
		p.errorf(n, path, "want a device list such as \"0,1\", got %s", describe(n))
		return nil, false
	}
	d, err := topology.ParseDevices(s)
	if err != nil {
		p.errorf(n, path, "%v", err)
		return nil, false
	}
	return d, true
}

func (p *problems) intListOf(n *Node, path string) ([]int, bool) {
	if n.Kind == KindNull {
		return []int{}, true
	}
	if n.Kind == KindScalar && n.Tag == "!!int" {
		v, ok := p.intOf(n, path)
		return []int{v}, ok
	}
	if n.Kind != KindSeq {
		p.errorf(n, path, "want a list of stage ids, got %s", describe(n))
		return nil, false
	}
	out := []int{}
	ok := true
	for i, it := range n.Items {
		v, good := p.intOf(it, writtenPath(it, fmt.Sprintf("%s[%d]", path, i)))
		ok = ok && good
		out = append(out, v)
	}
	return out, ok
}

func (p *problems) stringListOf(n *Node, path string) ([]string, bool) {
	if n.Kind == KindScalar {
		return []string{n.Value}, true
	}
	if n.Kind != KindSeq {
		p.errorf(n, path, "want a list of strings, got %s", describe(n))
		return nil, false
	}
	var out []string
	ok := true
	for i, it := range n.Items {
		v, good := p.strOf(it, writtenPath(it, fmt.Sprintf("%s[%d]", path, i)))
		ok = ok && good
		out = append(out, v)
	}
	return out, ok
}

// describe names a value in an error message.
func describe(n *Node) string {
	switch n.Kind {
	case KindScalar:
		kind := map[string]string{"!!int": "integer", "!!float": "number", "!!bool": "boolean"}[n.Tag]
		if kind == "" {
			kind = "string"
		}
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "…"
		}
		return fmt.Sprintf("%s %q", kind, v)
	default:
		return n.Kind.String()
	}
}

// unknownKey reports or warns about a key a strict section does not know,
// suggesting the closest known key when there is one.
func (p *problems) unknownKey(k *Node, path string, known []string) {
	msg := fmt.Sprintf("unknown key %q", k.Value)
	if s := closest(k.Value, known); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	} else {
		msg += "; known keys: " + strings.Join(known, ", ")
	}
	p.errorf(k, path, "%s", msg)
}

// closest returns the known key within edit distance 2 of key, if any.
func closest(key string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if a == b {
		return 0
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// connectorKey parses "from_stage_3" / "to_stage_3".
func connectorKey(key, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

func (p *problems) stageConnectorsOf(n *Node, path, prefix string) []StageConnector {
	if n.Kind == KindNull {
		return nil
	}
	if !p.mapOf(n, path) {
		return nil
	}
	var out []StageConnector
	for i, k := range n.Keys {
		fp := writtenPath(n.Values[i], path+"."+k.Value)
		id, ok := connectorKey(k.Value, prefix)
		if !ok {
			p.errorf(k, fp, "want keys of the form %sN naming a stage id", prefix)
			continue
		}
		name, ok := p.strOf(n.Values[i], fp)
		if !ok {
			continue
		}
		out = append(out, StageConnector{Stage: id, Name: name})
	}
	return out
}

// canonicalNumber spells a number node so that equal values compare equal
// ("1e9" and 1000000000).
func canonicalNumber(n *Node) string {
	if n == nil {
		return ""
	}
	if f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64); err == nil {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return n.Value
}

var kvKnownKeys = []string{
	"kv_connector", "kv_role", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_rank",
	"kv_parallel_size", "kv_ip", "kv_port", "kv_load_failure_policy", "kv_connector_extra_config",
}

// kvConfigOf reads a kv_transfer_config mapping. Keys it does not know are
// kept and passed to the engine: vLLM adds fields between releases.
func (p *problems) kvConfigOf(n *Node, path string) *KVConfig {
	if n.Kind == KindNull {
		return nil
	}
	if !p.mapOf(n, path) {
		return nil
	}
	kv := &KVConfig{}
	for i, k := range n.Keys {
		v := n.Values[i]
		fp := writtenPath(v, path+"."+k.Value)
		switch k.Value {
		case "kv_connector":
			kv.Connector, _ = p.strOf(v, fp)
		case "kv_role":
			kv.Role, _ = p.strOf(v, fp)
		case "engine_id":
			kv.EngineID, _ = p.strOf(v, fp)
		case "kv_buffer_device":
			kv.BufferDevice, _ = p.strOf(v, fp)
		case "kv_buffer_size":
			if v.Kind != KindScalar || (v.Tag != "!!int" && v.Tag != "!!float" && !isNumber(v.Value)) {
				p.errorf(v, fp, "want a number of bytes such as 1e9, got %s", describe(v))
				continue
			}
			kv.BufferSize = v
		case "kv_rank":
			if r, ok := p.nonNegIntOf(v, fp); ok {
				kv.Rank = &r
			}
		case "kv_parallel_size":
			if r, ok := p.intOf(v, fp); ok {
				if r < 1 {
					p.errorf(v, fp, "want at least 1, got %d", r)
				}
				kv.ParallelSize = &r
			}
		case "kv_ip":
			kv.IP, _ = p.strOf(v, fp)
		case "kv_port":
			if port, ok := p.intOf(v, fp); ok {
				if port < 0 || port > 65535 {
					p.errorf(v, fp, "port %d is outside 0-65535", port)
					continue
				}
				kv.Port = port
			}
		case "kv_load_failure_policy":
			if s, ok := p.strOf(v, fp); ok {
				if s != "fail" && s != "recompute" {
					p.errorf(v, fp, "want fail or recompute, got %q", s)
				}
				kv.LoadFailurePolicy = s
			}
		case "kv_connector_extra_config":
			if v.Kind == KindNull {
				continue
			}
			if p.mapOf(v, fp) {
				kv.ExtraConfig = v.Clone()
			}
		default:
			if kv.Other == nil {
				kv.Other = newMap(n.Pos)
			}
			if s := closest(k.Value, kvKnownKeys); s != "" {
				p.warnf(k, fp, "unknown key %q passed to the engine as it is; did you mean %q?", k.Value, s)
			}
			kv.Other.Set(k.Value, v.Clone())
		}
	}
	return kv
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// ecKnownKeys are the fields of vLLM's ECTransferConfig
// (vllm/config/ec_transfer.py).
var ecKnownKeys = []string{
	"ec_connector", "ec_role", "engine_id", "ec_buffer_device", "ec_buffer_size", "ec_rank",
	"ec_parallel_size", "ec_ip", "ec_port", "ec_connector_extra_config", "ec_connector_module_path",
}

// ecConfigOf reads an ec_transfer_config mapping. The fields omnipd does
// not reason about are checked for their type and kept, in order, with any
// key it does not know: they are passed to the engine as written.
func (p *problems) ecConfigOf(n *Node, path string) *ECConfig {
	if n.Kind == KindNull {
		return nil
	}
	if !p.mapOf(n, path) {
		return nil
	}
	ec := &ECConfig{}
	keep := func(k, v *Node) {
		if ec.Other == nil {
			ec.Other = newMap(n.Pos)
		}
		ec.Other.Set(k.Value, v.Clone())
	}
	for i, k := range n.Keys {
		v := n.Values[i]
		fp := writtenPath(v, path+"."+k.Value)
		switch k.Value {
		case "ec_connector":
			ec.Connector, _ = p.strOf(v, fp)
		case "ec_role":
			ec.Role, _ = p.strOf(v, fp)
		case "engine_id":
			ec.EngineID, _ = p.strOf(v, fp)
		case "ec_connector_extra_config":
			if v.Kind != KindNull && p.mapOf(v, fp) {
				ec.ExtraConfig = v.Clone()
			}
		case "ec_buffer_device", "ec_ip", "ec_connector_module_path":
			if v.Kind == KindNull {
				continue
			}
			if _, ok := p.strOf(v, fp); ok {
				keep(k, v)
			}
		case "ec_buffer_size":
			if v.Kind != KindScalar || (v.Tag != "!!int" && v.Tag != "!!float" && !isNumber(v.Value)) {
				p.errorf(v, fp, "want a number of bytes such as 1e9, got %s", describe(v))
				continue
			}
			keep(k, v)
		case "ec_rank":
			if v.Kind == KindNull {
				continue
			}
			if _, ok := p.nonNegIntOf(v, fp); ok {
				keep(k, v)
			}
		case "ec_parallel_size":
			if _, ok := p.boundedIntOf(v, fp, topology.MaxDevices); ok {
				keep(k, v)
			}
		case "ec_port":
			if _, ok := p.portOf(v, fp); ok {
				keep(k, v)
			}
		default:
			if s := closest(k.Value, ecKnownKeys); s != "" {
				p.warnf(k, fp, "unknown key %q passed to the engine as it is; did you mean %q?", k.Value, s)
			}
			keep(k, v)
		}
	}
	return ec
}
