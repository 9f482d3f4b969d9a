package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v4"
)

// Pos is where a value was written.
type Pos struct {
	File string
	Line int
	Col  int
}

func (p Pos) String() string {
	if p.Line == 0 {
		return p.File
	}
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col)
}

// Kind is the shape of a node.
type Kind int

// The node kinds.
const (
	KindNull Kind = iota
	KindScalar
	KindMap
	KindSeq
)

func (k Kind) String() string {
	switch k {
	case KindScalar:
		return "a scalar"
	case KindMap:
		return "a mapping"
	case KindSeq:
		return "a list"
	default:
		return "null"
	}
}

// Node is a YAML value that remembers the file, line and column it came from,
// so that errors found long after parsing (after overlays, migration and PD
// expansion) still point at what the user wrote. Mappings keep key order.
type Node struct {
	Kind Kind
	// Tag is the resolved YAML tag of a scalar: !!str, !!int, !!float, !!bool.
	Tag   string
	Value string
	// Keys and Values hold a mapping's entries in order; Items a list's.
	Keys   []*Node
	Values []*Node
	Items  []*Node
	Pos    Pos

	// path is where the value was written within its file, as the user
	// spells it ("stages[1].engine_args.max_num_seqs",
	// "platforms.npu.stages[0].devices", "stage_args[2].runtime.devices");
	// empty for values omnipd made. stage is the path of the stage entry
	// the value was written in ("stages[1]"), empty outside one. Errors
	// name these rather than where the value ended up after overlays,
	// migration and PD expansion.
	path, stage string
}

// maxNodes bounds the tree built from one document, so that alias expansion
// ("billion laughs") cannot exhaust memory.
const maxNodes = 1 << 20

// parseYAML parses one YAML document into a Node tree. An empty document is a
// null node.
func parseYAML(file string, data []byte) (*Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlSyntaxError(file, data, err)
	}
	if doc.Kind == 0 {
		return &Node{Kind: KindNull, Pos: Pos{File: file, Line: 1, Col: 1}}, nil
	}
	c := converter{file: file}
	root := &doc
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return &Node{Kind: KindNull, Pos: Pos{File: file, Line: 1, Col: 1}}, nil
		}
		root = doc.Content[0]
	}
	n, err := c.convert(root, "", 0)
	if err != nil {
		return nil, err
	}
	return n, nil
}

func yamlSyntaxError(file string, data []byte, err error) error {
	var le *yaml.LoadError
	if errors.As(err, &le) {
		msg := le.Message
		if le.ContextMsg != "" {
			msg = le.ContextMsg + ": " + msg
		}
		mark := le.Mark
		// At the end of the input (an unterminated string or flow
		// collection) the start of the construct is the useful place.
		if mark.Index >= len(data) && le.ContextMark.Line > 0 {
			mark = le.ContextMark
		}
		return Errors{{Pos: Pos{File: file, Line: mark.Line, Col: mark.Column}, Msg: "invalid YAML: " + msg}}
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ":"); ok {
			if l, err := strconv.Atoi(num); err == nil {
				line, msg = l, strings.TrimSpace(tail)
			}
		}
	}
	return Errors{{Pos: Pos{File: file, Line: line, Col: 1}, Msg: "invalid YAML: " + msg}}
}

type converter struct {
	file  string
	count int
}

// convert copies a yaml.Node tree; path is the field path of y, for errors.
func (c *converter) convert(y *yaml.Node, path string, depth int) (*Node, error) {
	c.count++
	if c.count > maxNodes || depth > 200 {
		return nil, Errors{{Pos: Pos{File: c.file, Line: y.Line, Col: y.Column}, Msg: "document too large or too deeply nested (aliases expand to too many values)"}}
	}
	pos := Pos{File: c.file, Line: y.Line, Col: y.Column}
	switch y.Kind {
	case yaml.AliasNode:
		if y.Alias == nil {
			return &Node{Kind: KindNull, Pos: pos}, nil
		}
		n, err := c.convert(y.Alias, path, depth+1)
		if err != nil {
			return nil, err
		}
		return n, nil
	case yaml.ScalarNode:
		if y.Tag == "!!null" {
			return &Node{Kind: KindNull, Pos: pos, path: path}, nil
		}
		return &Node{Kind: KindScalar, Tag: y.Tag, Value: y.Value, Pos: pos, path: path}, nil
	case yaml.SequenceNode:
		n := &Node{Kind: KindSeq, Pos: pos, path: path}
		for i, item := range y.Content {
			v, err := c.convert(item, fmt.Sprintf("%s[%d]", path, i), depth+1)
			if err != nil {
				return nil, err
			}
			n.Items = append(n.Items, v)
		}
		return n, nil
	case yaml.MappingNode:
		n := &Node{Kind: KindMap, Pos: pos, path: path}
		var merges []*Node
		for i := 0; i+1 < len(y.Content); i += 2 {
			if y.Content[i].Tag == "!!merge" {
				// The merged entries belong to this mapping, so they
				// take its path, not one under "<<".
				v, err := c.convertMerge(y.Content[i+1], path, depth+1)
				if err != nil {
					return nil, err
				}
				merges = append(merges, v...)
				continue
			}
			k, err := c.convert(y.Content[i], joinPath(path, y.Content[i].Value), depth+1)
			if err != nil {
				return nil, err
			}
			v, err := c.convert(y.Content[i+1], joinPath(path, y.Content[i].Value), depth+1)
			if err != nil {
				return nil, err
			}
			if k.Kind != KindScalar {
				return nil, Errors{{Pos: k.Pos, Path: path, Msg: "mapping keys must be scalars"}}
			}
			if first := n.KeyNode(k.Value); first != nil {
				return nil, Errors{{Pos: k.Pos, Path: joinPath(path, k.Value), Msg: fmt.Sprintf("key %q is defined twice (first at line %d)", k.Value, first.Pos.Line)}}
			}
			n.Keys = append(n.Keys, k)
			n.Values = append(n.Values, v)
		}
		// YAML merge keys: explicit entries win over merged ones.
		for _, src := range merges {
			if src.Kind != KindMap {
				return nil, Errors{{Pos: src.Pos, Path: path, Msg: "a merge key (<<) must refer to a mapping"}}
			}
			for i, k := range src.Keys {
				if n.Get(k.Value) == nil {
					n.Keys = append(n.Keys, k)
					n.Values = append(n.Values, src.Values[i])
				}
			}
		}
		return n, nil
	}
	return &Node{Kind: KindNull, Pos: pos, path: path}, nil
}

// convertMerge converts the value of a merge key (<<): one mapping or a
// list of them, each converted as part of the mapping at path.
func (c *converter) convertMerge(y *yaml.Node, path string, depth int) ([]*Node, error) {
	if y.Kind == yaml.AliasNode && y.Alias != nil {
		y = y.Alias
	}
	if y.Kind != yaml.SequenceNode {
		n, err := c.convert(y, path, depth)
		if err != nil {
			return nil, err
		}
		return []*Node{n}, nil
	}
	var out []*Node
	for _, item := range y.Content {
		n, err := c.convert(item, path, depth+1)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Get returns the value under key in a mapping, or nil.
func (n *Node) Get(key string) *Node {
	if n == nil || n.Kind != KindMap {
		return nil
	}
	for i, k := range n.Keys {
		if k.Value == key {
			return n.Values[i]
		}
	}
	return nil
}

// Number returns the number under key in a mapping (engine_args,
// default_sampling_params, a connector's extra); false when it is absent or
// not a number.
func (n *Node) Number(key string) (float64, bool) {
	v := n.Get(key)
	if v == nil || v.Kind != KindScalar {
		return 0, false
	}
	f, err := strconv.ParseFloat(v.Value, 64)
	return f, err == nil
}

// KeyNode returns the key node for key in a mapping, or nil.
func (n *Node) KeyNode(key string) *Node {
	if n == nil || n.Kind != KindMap {
		return nil
	}
	for _, k := range n.Keys {
		if k.Value == key {
			return k
		}
	}
	return nil
}

// Set replaces the value under key, or appends the entry.
func (n *Node) Set(key string, v *Node) {
	for i, k := range n.Keys {
		if k.Value == key {
			n.Values[i] = v
			return
		}
	}
	n.Keys = append(n.Keys, &Node{Kind: KindScalar, Tag: "!!str", Value: key, Pos: v.Pos, path: v.path, stage: v.stage})
	n.Values = append(n.Values, v)
}

// Delete removes key from a mapping.
func (n *Node) Delete(key string) {
	for i, k := range n.Keys {
		if k.Value == key {
			n.Keys = append(n.Keys[:i:i], n.Keys[i+1:]...)
			n.Values = append(n.Values[:i:i], n.Values[i+1:]...)
			return
		}
	}
}

// Clone returns a deep copy of n.
func (n *Node) Clone() *Node {
	if n == nil {
		return nil
	}
	c := *n
	c.Keys = cloneAll(n.Keys)
	c.Values = cloneAll(n.Values)
	c.Items = cloneAll(n.Items)
	return &c
}

func cloneAll(ns []*Node) []*Node {
	if ns == nil {
		return nil
	}
	out := make([]*Node, len(ns))
	for i, n := range ns {
		out[i] = n.Clone()
	}
	return out
}

// Helpers that build nodes for generated values. Generated values carry the
// position of what they were derived from.

func newMap(pos Pos) *Node { return &Node{Kind: KindMap, Pos: pos} }

func newSeq(pos Pos) *Node { return &Node{Kind: KindSeq, Pos: pos} }

func newNull(pos Pos) *Node { return &Node{Kind: KindNull, Pos: pos} }

func newStr(s string, pos Pos) *Node {
	return &Node{Kind: KindScalar, Tag: "!!str", Value: s, Pos: pos}
}

func newInt(i int, pos Pos) *Node {
	return &Node{Kind: KindScalar, Tag: "!!int", Value: strconv.Itoa(i), Pos: pos}
}

func newBool(b bool, pos Pos) *Node {
	return &Node{Kind: KindScalar, Tag: "!!bool", Value: strconv.FormatBool(b), Pos: pos}
}

// mergeNodes overlays over onto base: mappings merge key by key (recursively),
// anything else is replaced by the overlay. Neither input is modified.
func mergeNodes(base, over *Node) *Node {
	if base == nil {
		return over.Clone()
	}
	if over == nil {
		return base.Clone()
	}
	if base.Kind != KindMap || over.Kind != KindMap {
		return over.Clone()
	}
	out := base.Clone()
	for i, k := range over.Keys {
		out.Set(k.Value, mergeNodes(out.Get(k.Value), over.Values[i]))
	}
	return out
}

// scalarValue returns the Go value of a scalar for JSON output.
func (n *Node) scalarValue() any {
	switch n.Tag {
	case "!!int":
		if i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64); err == nil {
			return i
		}
	case "!!float":
		if f, err := strconv.ParseFloat(n.Value, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		}
	case "!!bool":
		if b, err := strconv.ParseBool(strings.ToLower(n.Value)); err == nil {
			return b
		}
	}
	return n.Value
}

// toYAML converts n into a yaml.Node for printing.
func (n *Node) toYAML() *yaml.Node {
	switch n.Kind {
	case KindScalar:
		tag := n.Tag
		if tag == "" {
			tag = "!!str"
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: n.Value}
	case KindMap:
		y := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for i, k := range n.Keys {
			y.Content = append(y.Content, k.toYAML(), n.Values[i].toYAML())
		}
		if len(n.Keys) == 0 {
			y.Style = yaml.FlowStyle
		}
		return y
	case KindSeq:
		y := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		allScalar := true
		for _, it := range n.Items {
			y.Content = append(y.Content, it.toYAML())
			if it.Kind != KindScalar {
				allScalar = false
			}
		}
		if allScalar {
			y.Style = yaml.FlowStyle
		}
		return y
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
}

// MarshalYAML prints n as a YAML document with two-space indentation.
func (n *Node) MarshalYAML() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(n.toYAML()); err != nil {
		return nil, fmt.Errorf("encode YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode YAML: %w", err)
	}
	return buf.Bytes(), nil
}

// MarshalJSON prints n as JSON, keeping mapping order.
func (n *Node) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	if err := n.writeJSON(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (n *Node) writeJSON(buf *bytes.Buffer) error {
	switch n.Kind {
	case KindScalar:
		b, err := json.Marshal(n.scalarValue())
		if err != nil {
			return err
		}
		buf.Write(b)
	case KindMap:
		buf.WriteByte('{')
		for i, k := range n.Keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			b, _ := json.Marshal(k.Value)
			buf.Write(b)
			buf.WriteByte(':')
			if err := n.Values[i].writeJSON(buf); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case KindSeq:
		buf.WriteByte('[')
		for i, it := range n.Items {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := it.writeJSON(buf); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	default:
		buf.WriteString("null")
	}
	return nil
}

// markStages records, on every value of each stage entry a deploy file
// holds (stages:, the legacy stage_args:, each platform's stages:), the
// path of that entry, so that an error about a field the user did not
// write can still name the stage as they wrote it.
func markStages(root *Node) {
	mark := func(list *Node) {
		if list == nil || list.Kind != KindSeq {
			return
		}
		for _, it := range list.Items {
			it.setStage(it.path)
		}
	}
	mark(root.Get("stages"))
	mark(root.Get("stage_args"))
	if plats := root.Get("platforms"); plats != nil && plats.Kind == KindMap {
		for _, sec := range plats.Values {
			mark(sec.Get("stages"))
		}
	}
}

func (n *Node) setStage(stage string) {
	n.stage = stage
	for _, c := range slices.Concat(n.Keys, n.Values, n.Items) {
		c.setStage(stage)
	}
}

// writtenPath is the path of what the user wrote at n, or fallback when
// omnipd made the value.
func writtenPath(n *Node, fallback string) string {
	if n != nil && n.path != "" {
		return n.path
	}
	return fallback
}
