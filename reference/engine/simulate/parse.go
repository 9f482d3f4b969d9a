package simulate

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"
)

// Error is one problem in a profile file, with where it is.
type Error struct {
	File      string
	Line, Col int
	// Field is the dotted path of the offending field ("prefill.base").
	Field string
	Msg   string
}

func (e Error) Error() string {
	pos := fmt.Sprintf("%s:%d:%d: ", e.File, e.Line, e.Col)
	if e.Field == "" {
		return pos + e.Msg
	}
	return pos + e.Field + ": " + e.Msg
}

// Errors is every problem found in one profile, in file order.
type Errors []Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Parse reads a profile. file names it in errors and, when the profile has
// no name: field, gives it its name (the base name without extension).
// Parsing is strict: an unknown field, a value of the wrong kind or a
// number without its unit is an error carrying the line and column; every
// error found is returned, as Errors.
func Parse(file string, data []byte) (*Profile, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, syntaxError(file, err)
	}
	root := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	if root.Kind == 0 || root.Kind == yaml.DocumentNode || root.Tag == "!!null" {
		return nil, Errors{{File: file, Line: 1, Col: 1, Msg: "the profile is empty"}}
	}
	p := &parser{file: file}
	prof := &Profile{}
	p.mapping(root, "", []field{
		{"name", func(n *yaml.Node, path string) { prof.Name = p.str(n, path) }},
		{"description", func(n *yaml.Node, path string) { prof.Description = p.str(n, path) }},
		{"prefill", p.section([]field{
			{"base", p.duration(&prof.Prefill.Base)},
			{"per_token", p.duration(&prof.Prefill.PerUnit)},
		})},
		{"decode", p.section([]field{
			{"base", p.duration(&prof.Decode.Base)},
			{"per_sequence", p.duration(&prof.Decode.PerUnit)},
		})},
		{"kv_transfer", p.section([]field{
			{"setup", p.duration(&prof.KV.Setup)},
			{"bandwidth", func(n *yaml.Node, path string) {
				prof.KV.BytesPerSecond = p.bandwidth(n, path)
				p.bandwidthAt = n
			}},
		})},
		{"model", func(n *yaml.Node, path string) {
			p.modelAt = n
			p.section([]field{
				{"layers", p.count(&prof.Model.Layers, 1)},
				{"kv_heads", p.count(&prof.Model.KVHeads, 1)},
				{"head_dim", p.count(&prof.Model.HeadDim, 1)},
				{"kv_dtype", func(n *yaml.Node, path string) { prof.Model.DTypeBytes = p.dtype(n, path) }},
			})(n, path)
		}},
		{"limits", p.section([]field{
			{"max_num_seqs", p.count(&prof.MaxNumSeqs, 0)},
			{"max_num_batched_tokens", p.count(&prof.MaxNumBatchedTokens, 0)},
		})},
		{"talker", p.section([]field{
			{"first_frame", p.linear(&prof.Talker.FirstFrame)},
			{"frame", p.linear(&prof.Talker.Frame)},
			{"code_predictor", p.linear(&prof.Talker.CodePredictor)},
		})},
		{"code2wav", p.section([]field{
			{"chunk", p.linear(&prof.Code2Wav.Chunk)},
			{"frame", p.linear(&prof.Code2Wav.Frame)},
		})},
		{"encoder", p.section([]field{
			{EncoderAudio, p.encoderCost(&prof.Encoder.Audio)},
			{EncoderImage, p.encoderCost(&prof.Encoder.Image)},
			{EncoderVideo, p.encoderCost(&prof.Encoder.Video)},
		})},
	})
	p.checkModel(prof)
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	if prof.Name == "" {
		prof.Name = strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	}
	return prof, nil
}

func syntaxError(file string, err error) error {
	var le *yaml.LoadError
	if errors.As(err, &le) {
		msg := le.Message
		if le.ContextMsg != "" {
			msg = le.ContextMsg + ": " + msg
		}
		return Errors{{File: file, Line: max(le.Mark.Line, 1), Col: max(le.Mark.Column, 1), Msg: "invalid YAML: " + msg}}
	}
	return Errors{{File: file, Line: 1, Col: 1, Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
}

type parser struct {
	file string
	errs Errors
	// Where model: and kv_transfer.bandwidth were, for the checks that
	// relate them.
	modelAt, bandwidthAt *yaml.Node
}

// field is one known key of a mapping and what to do with its value.
type field struct {
	name string
	set  func(n *yaml.Node, path string)
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	p.errs = append(p.errs, Error{File: p.file, Line: n.Line, Col: n.Column, Field: path, Msg: fmt.Sprintf(format, args...)})
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// mapping applies fields to a mapping node; any other key is an error.
func (p *parser) mapping(n *yaml.Node, path string, fields []field) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a mapping of %s", names(fields))
		return
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		at := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			p.errorf(k, at, "given twice (first at line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		known := false
		for _, f := range fields {
			if f.name == k.Value {
				f.set(v, at)
				known = true
				break
			}
		}
		if !known {
			p.errorf(k, at, "unknown field; want %s", names(fields))
		}
	}
}

// linear reads an audio stage's cost: base, and per_request for each
// request in flight on the worker.
func (p *parser) linear(dst *Linear) func(n *yaml.Node, path string) {
	return p.section([]field{
		{"base", p.duration(&dst.Base)},
		{"per_request", p.duration(&dst.PerUnit)},
	})
}

// encoderCost reads one modality's encoder cost.
func (p *parser) encoderCost(dst *EncoderCost) func(n *yaml.Node, path string) {
	return p.section([]field{
		{"base", p.duration(&dst.Base)},
		{"per_item", p.duration(&dst.PerItem)},
		{"per_token", p.duration(&dst.PerToken)},
		{"attention_1k", p.duration(&dst.Attention1K)},
	})
}

func (p *parser) section(fields []field) func(n *yaml.Node, path string) {
	return func(n *yaml.Node, path string) { p.mapping(n, path, fields) }
}

func names(fields []field) string {
	s := make([]string, len(fields))
	for i, f := range fields {
		s[i] = f.name
	}
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// scalar returns a scalar node's text, or false after recording an error.
func (p *parser) scalar(n *yaml.Node, path string) (string, bool) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch {
	case n.Kind != yaml.ScalarNode:
		p.errorf(n, path, "want a single value, not a list or mapping")
		return "", false
	case n.Tag == "!!null":
		p.errorf(n, path, "missing value")
		return "", false
	}
	return strings.TrimSpace(n.Value), true
}

func (p *parser) str(n *yaml.Node, path string) string {
	s, _ := p.scalar(n, path)
	return s
}

// maxDuration bounds every modeled duration, which keeps the cost
// arithmetic far from overflow and catches unit slips (5h for 5ms).
const maxDuration = time.Hour

func (p *parser) duration(dst *time.Duration) func(n *yaml.Node, path string) {
	return func(n *yaml.Node, path string) {
		s, ok := p.scalar(n, path)
		if !ok {
			return
		}
		d, err := ParseDuration(s)
		if err != nil {
			p.errorf(n, path, "%v", err)
			return
		}
		*dst = d
	}
}

// ParseDuration reads a non-negative duration with its unit (ns, us, µs,
// ms, s; "0" needs none), at most an hour.
func ParseDuration(s string) (time.Duration, error) {
	if s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil && strings.Contains(err.Error(), "missing unit"):
		return 0, fmt.Errorf("%q has no unit; want a duration such as 5ms or 27us (units ns, us, ms, s)", s)
	case err != nil:
		return 0, fmt.Errorf("%q is not a duration; want a number with a unit such as 5ms or 27us (units ns, us, ms, s)", s)
	case d < 0:
		return 0, fmt.Errorf("%s is negative; a cost is 0 or more", s)
	case d > maxDuration:
		return 0, fmt.Errorf("%s is more than an hour; check the unit", s)
	}
	return d, nil
}

// bandwidthUnits are the accepted bandwidth units, in bytes per second.
var bandwidthUnits = map[string]float64{
	"B/s": 1, "kB/s": 1e3, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
	"KiB/s": 1 << 10, "MiB/s": 1 << 20, "GiB/s": 1 << 30, "TiB/s": 1 << 40,
	"bit/s": 1.0 / 8, "kbit/s": 1e3 / 8, "Kbit/s": 1e3 / 8, "Mbit/s": 1e6 / 8, "Gbit/s": 1e9 / 8, "Tbit/s": 1e12 / 8,
	"Mbps": 1e6 / 8, "Gbps": 1e9 / 8,
}

func (p *parser) bandwidth(n *yaml.Node, path string) float64 {
	s, ok := p.scalar(n, path)
	if !ok {
		return 0
	}
	bw, err := ParseBandwidth(s)
	if err != nil {
		p.errorf(n, path, "%v", err)
	}
	return bw
}

// ParseBandwidth reads a positive bandwidth with its unit (GB/s, GiB/s,
// Gbit/s, Gbps, MB/s, ...) into bytes per second.
func ParseBandwidth(s string) (float64, error) {
	i := strings.IndexFunc(s, func(r rune) bool { return !(r >= '0' && r <= '9' || r == '.') })
	num, unit := s, ""
	if i >= 0 {
		num, unit = strings.TrimSpace(s[:i]), strings.TrimSpace(s[i:])
	}
	scale, known := bandwidthUnits[unit]
	v, err := strconv.ParseFloat(num, 64)
	switch {
	case unit == "" && err == nil:
		return 0, fmt.Errorf("%q has no unit; want a bandwidth such as 25GB/s or 200Gbit/s", s)
	case err != nil || i == 0:
		return 0, fmt.Errorf("%q is not a bandwidth; want a number with a unit such as 25GB/s or 200Gbit/s", s)
	case !known:
		return 0, fmt.Errorf("%q: unknown unit %q; want B/s, MB/s, GB/s, GiB/s, Mbit/s, Gbit/s or Gbps", s, unit)
	case !(v > 0) || math.IsInf(v*scale, 0):
		return 0, fmt.Errorf("%q: a bandwidth must be positive; leave bandwidth out for transfers whose bytes cost nothing", s)
	}
	return v * scale, nil
}

func (p *parser) count(dst *int, min int) func(n *yaml.Node, path string) {
	return func(n *yaml.Node, path string) {
		s, ok := p.scalar(n, path)
		if !ok {
			return
		}
		v, err := strconv.Atoi(s)
		switch {
		case err != nil:
			p.errorf(n, path, "%q is not a whole number", s)
		case v < min:
			p.errorf(n, path, "%d is less than %d", v, min)
		case v > 1<<24:
			p.errorf(n, path, "%d is implausibly large", v)
		default:
			*dst = v
		}
	}
}

// dtypeBytes are the accepted KV cache element types.
var dtypeBytes = map[string]int{
	"float32": 4, "fp32": 4,
	"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
	"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
}

func (p *parser) dtype(n *yaml.Node, path string) int {
	s, ok := p.scalar(n, path)
	if !ok {
		return 0
	}
	b, known := dtypeBytes[strings.ToLower(s)]
	if !known {
		p.errorf(n, path, "unknown dtype %q; want bfloat16, float16, float32 or fp8", s)
	}
	return b
}

// checkModel relates model: to the transfer: a model is all four fields or
// none, and a bandwidth needs a model to know how many bytes move.
func (p *parser) checkModel(prof *Profile) {
	m := prof.Model
	if p.modelAt != nil && p.modelAt.Kind == yaml.MappingNode {
		var missing []string
		for _, f := range []struct {
			name string
			set  bool
		}{{"layers", m.Layers > 0}, {"kv_heads", m.KVHeads > 0}, {"head_dim", m.HeadDim > 0}, {"kv_dtype", m.DTypeBytes > 0}} {
			if !f.set {
				missing = append(missing, f.name)
			}
		}
		if len(missing) > 0 && len(p.errs) == 0 {
			p.errorf(p.modelAt, "model", "missing %s; the KV bytes per token need layers, kv_heads, head_dim and kv_dtype", strings.Join(missing, ", "))
		}
	}
	if p.bandwidthAt != nil && prof.KV.BytesPerSecond > 0 && m.BytesPerToken() == 0 && p.modelAt == nil {
		p.errorf(p.bandwidthAt, "kv_transfer.bandwidth", "a bandwidth needs model: (layers, kv_heads, head_dim, kv_dtype) to size a transfer")
	}
}
