package deploy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// Options select how a deploy config is resolved.
type Options struct {
	// Platform selects a section of platforms: (npu, rocm, xpu, ...).
	Platform string
	// PD asks for prefill/decode disaggregation even when the config has no
	// pd: section (omnipd expand --pd).
	PD bool
	// Connector overrides pd.connector.
	Connector string
	// Devices overrides pd.devices: the device pool PD expansion lays out.
	Devices string
	// Colocated ignores the pd: section: the Thinker stays one stage, so
	// the same pipeline can be served with and without PD (serve --pd=false).
	Colocated bool
	// ReadFile reads base_config files; os.ReadFile when nil. Tests and the
	// fuzzer replace it.
	ReadFile func(name string) ([]byte, error)
}

func (o Options) readFile(name string) ([]byte, error) {
	if o.ReadFile != nil {
		return o.ReadFile(name)
	}
	return os.ReadFile(name)
}

// maxBaseDepth bounds base_config chains.
const maxBaseDepth = 16

// LoadFile loads, resolves, expands and validates the deploy config at path.
// The returned error, when not nil, is Errors: every problem found, each with
// file:line:column and field path. Warnings are returned even on success.
func LoadFile(path string, opts Options) (*Document, []Warning, error) {
	data, err := opts.readFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read deploy config: %w", err)
	}
	return Load(path, data, opts)
}

// Load is LoadFile for a document already in memory; name is used in
// positions and to find base_config files relative to it.
func Load(name string, data []byte, opts Options) (*Document, []Warning, error) {
	p := &problems{}
	root := readDocument(name, data, opts, p, nil)
	if root == nil {
		return nil, p.warnings, p.errs.sorted()
	}
	// A base_config that could not be read leaves the document
	// incomplete: what it says about the topology may follow from the
	// missing part, what it says about the values written here does not.
	p.incomplete = len(p.errs) > 0
	root = applyPlatform(root, opts.Platform, p)
	doc := resolve(root, opts, p)
	if len(p.errs) > 0 {
		return nil, p.warnings, p.errs.sorted()
	}
	return doc, p.warnings, nil
}

// MigrateFile reads a config and returns it in the stages: schema: legacy
// stage_args: documents are rewritten, current ones returned as they are.
// base_config and platforms are left for Load to apply.
func MigrateFile(path string, opts Options) (*Node, []Warning, error) {
	data, err := opts.readFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read deploy config: %w", err)
	}
	p := &problems{}
	root, err := parseYAML(path, data)
	if err != nil {
		return nil, nil, err
	}
	root = migrateLegacy(root, p)
	if len(p.errs) > 0 {
		return nil, p.warnings, p.errs.sorted()
	}
	return root, p.warnings, nil
}

// readDocument parses one file, migrates it if it is legacy, and applies its
// base_config chain. seen holds the files already on the chain.
func readDocument(name string, data []byte, opts Options, p *problems, seen []string) *Node {
	root, err := parseYAML(name, data)
	if err != nil {
		var es Errors
		if errors.As(err, &es) {
			p.errs = append(p.errs, es...)
		} else {
			p.errs = append(p.errs, Error{Pos: Pos{File: name}, Msg: err.Error()})
		}
		return nil
	}
	if root.Kind == KindNull {
		p.errorf(root, "", "the deploy config is empty; want a mapping with stages:")
		return nil
	}
	if root.Kind != KindMap {
		p.errorf(root, "", "the deploy config is %s; want a mapping with stages:", root.Kind)
		return nil
	}
	markStages(root)
	root = migrateLegacy(root, p)

	base := root.Get("base_config")
	if base == nil {
		return root
	}
	root.Delete("base_config")
	if base.Kind != KindScalar || base.Value == "" {
		p.errorf(base, "base_config", "want a file path, relative to this file")
		return root
	}
	basePath := base.Value
	if !filepath.IsAbs(basePath) {
		basePath = filepath.Join(filepath.Dir(name), basePath)
	}
	chain := append(slices.Clone(seen), filepath.Clean(name))
	if slices.Contains(chain, filepath.Clean(basePath)) {
		p.errorf(base, "base_config", "%q is already on the base_config chain (%v): the chain loops", base.Value, chain)
		return root
	}
	if len(chain) > maxBaseDepth {
		p.errorf(base, "base_config", "base_config chain is deeper than %d files", maxBaseDepth)
		return root
	}
	baseData, err := opts.readFile(basePath)
	if err != nil {
		p.errorf(base, "base_config", "cannot read %q: %v", base.Value, unwrapPathError(err))
		return root
	}
	baseRoot := readDocument(basePath, baseData, opts, p, chain)
	if baseRoot == nil {
		return root
	}
	return overlay(baseRoot, root)
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// overlay merges a config over its base: mappings deep-merge, stages merge by
// stage_id (and so do the stages of each platform section), other values are
// replaced.
func overlay(base, over *Node) *Node {
	out := base.Clone()
	for i, k := range over.Keys {
		v := over.Values[i]
		switch k.Value {
		case "stages":
			out.Set(k.Value, mergeStageLists(out.Get("stages"), v))
		case "platforms":
			out.Set(k.Value, mergePlatforms(out.Get("platforms"), v))
		default:
			out.Set(k.Value, mergeNodes(out.Get(k.Value), v))
		}
	}
	return out
}

func mergePlatforms(base, over *Node) *Node {
	if base == nil || base.Kind != KindMap || over.Kind != KindMap {
		return over.Clone()
	}
	out := base.Clone()
	for i, k := range over.Keys {
		b, o := out.Get(k.Value), over.Values[i]
		if b != nil && b.Kind == KindMap && o.Kind == KindMap {
			out.Set(k.Value, overlay(b, o))
		} else {
			out.Set(k.Value, o.Clone())
		}
	}
	return out
}

// stageIDOf returns a stage node's stage_id, if it has a valid one.
func stageIDOf(n *Node) (int, bool) {
	id := n.Get("stage_id")
	if id == nil || id.Kind != KindScalar || id.Tag != "!!int" {
		return 0, false
	}
	v, err := strconv.Atoi(id.Value)
	return v, err == nil
}

// mergeStageLists merges two stages: lists by stage_id: a stage in both is
// deep-merged, a stage only in the overlay is appended.
func mergeStageLists(base, over *Node) *Node {
	if base == nil || base.Kind != KindSeq || over.Kind != KindSeq {
		return over.Clone()
	}
	out := base.Clone()
	for _, o := range over.Items {
		id, ok := stageIDOf(o)
		idx := -1
		if ok {
			idx = slices.IndexFunc(out.Items, func(b *Node) bool {
				bid, bok := stageIDOf(b)
				return bok && bid == id
			})
		}
		if idx < 0 {
			out.Items = append(out.Items, o.Clone())
			continue
		}
		out.Items[idx] = mergeNodes(out.Items[idx], o)
	}
	return out
}

// applyPlatform overlays the selected platforms: section and removes the
// platforms: key. Each platform stage must name an existing stage.
func applyPlatform(root *Node, platform string, p *problems) *Node {
	plats := root.Get("platforms")
	root = root.Clone()
	root.Delete("platforms")
	if plats != nil && plats.Kind != KindMap && plats.Kind != KindNull {
		p.errorf(plats, "platforms", "want a mapping of platform name to overrides, got %s", plats.Kind)
		p.incomplete = p.incomplete || platform != ""
		return root
	}
	p.otherPlatforms(plats, platform)
	if platform == "" {
		return root
	}
	sec := plats.Get(platform)
	if sec == nil {
		var names []string
		if plats != nil {
			for _, k := range plats.Keys {
				names = append(names, k.Value)
			}
		}
		at := plats
		if at == nil {
			at = root
		}
		if len(names) == 0 {
			p.errorf(at, "platforms", "--platform %s: the config has no platforms: section", platform)
		} else {
			p.errorf(at, "platforms", "--platform %s: no such platform section; the config has %s", platform, quoteAll(names))
		}
		p.incomplete = true
		return root
	}
	if sec.Kind != KindMap {
		p.errorf(sec, "platforms."+platform, "want a mapping with stages:, got %s", sec.Kind)
		p.incomplete = true
		return root
	}
	sec = sec.Clone()
	if ps := sec.Get("stages"); ps != nil && ps.Kind == KindSeq {
		stages := root.Get("stages")
		kept := ps.Items[:0]
		for i, s := range ps.Items {
			id, ok := stageIDOf(s)
			path := writtenPath(s, fmt.Sprintf("platforms.%s.stages[%d]", platform, i)) + ".stage_id"
			if !ok {
				p.errorf(s, path, "want an integer stage_id naming a stage to override")
				continue
			}
			found := false
			if stages != nil {
				for _, b := range stages.Items {
					if bid, ok := stageIDOf(b); ok && bid == id {
						found = true
					}
				}
			}
			if !found {
				p.errorf(s.Get("stage_id"), path, "no stage %d to override", id)
				continue
			}
			kept = append(kept, s)
		}
		ps.Items = kept
	}
	return overlay(root, sec)
}

// otherPlatforms checks the values written in the platform sections this
// run does not apply: they are part of the file, and a mistake in one
// should not wait for the run that selects it. The selected section's
// values are checked once merged into the stages.
func (p *problems) otherPlatforms(plats *Node, selected string) {
	if plats == nil || plats.Kind != KindMap {
		return
	}
	for i, name := range plats.Keys {
		sec := plats.Values[i]
		if name.Value == selected || sec.Kind != KindMap {
			continue
		}
		for j, k := range sec.Keys {
			v := sec.Values[j]
			path := writtenPath(v, "platforms."+name.Value+"."+k.Value)
			if k.Value != "stages" {
				p.engineArg(k.Value, v, path)
				continue
			}
			if v.Kind != KindSeq {
				continue
			}
			for si, st := range v.Items {
				sp := writtenPath(st, fmt.Sprintf("%s[%d]", path, si))
				if st.Kind == KindMap {
					p.stageFields(&rawStage{node: st, path: sp, engineArgs: newMap(st.Pos)}, st, sp)
				}
			}
		}
	}
}
