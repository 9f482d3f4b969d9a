package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/omnipd/omnipd/reference/engine/safetensors"
)

// Checkpoint file names, as Hugging Face writes them.
const (
	configFile = "config.json"
	weightFile = "model.safetensors"
	indexFile  = "model.safetensors.index.json"
)

// Load reads a Hugging Face Qwen3 checkpoint: dir holds config.json and
// either model.safetensors, or shards listed by model.safetensors.index.json,
// or, without an index, every *.safetensors file in dir. Weights of any
// float dtype are widened to float32.
//
// Every tensor the config implies must be present with its exact shape,
// and no other tensor may be, since an unexpected one (a bias, an extra
// layer) means the checkpoint is not the architecture this engine computes.
func Load(dir string) (*Model, error) {
	c, err := LoadConfig(filepath.Join(dir, configFile))
	if err != nil {
		return nil, err
	}
	files, err := shardFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", dir, err)
	}
	tensors := map[string]*safetensors.Tensor{}
	from := map[string]string{} // tensor name → file, for error messages
	for _, file := range files.names {
		f, err := safetensors.Read(filepath.Join(dir, file))
		if err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
		for _, name := range f.Names() {
			if prev, dup := from[name]; dup {
				return nil, fmt.Errorf("model: %s: tensor %q is in both %s and %s", dir, name, prev, file)
			}
			tensors[name], _ = f.Tensor(name)
			from[name] = file
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files.weightMap)) {
		if file := files.weightMap[name]; from[name] != file {
			return nil, fmt.Errorf("model: %s: %s maps tensor %q to %s, which does not hold it", dir, indexFile, name, file)
		}
	}

	m := newModel(c)
	for _, p := range m.params() {
		t, ok := tensors[p.name]
		if !ok {
			return nil, fmt.Errorf("model: %s: missing tensor %q (want shape %v)", dir, p.name, p.shape)
		}
		if !slices.Equal(t.Shape, p.shape) {
			return nil, fmt.Errorf("model: %s: tensor %q has shape %v, want %v", filepath.Join(dir, from[p.name]), p.name, t.Shape, p.shape)
		}
		if *p.w, err = t.Float32s(); err != nil {
			return nil, fmt.Errorf("model: %s: %w", filepath.Join(dir, from[p.name]), err)
		}
		delete(tensors, p.name)
	}
	if c.TieWordEmbeddings {
		delete(tensors, "lm_head.weight") // some exporters write the tied copy; transformers ignores it too
	}
	var extra []string
	for name := range tensors {
		// Old checkpoints saved the rotary frequencies, which derive from the config.
		if !strings.HasSuffix(name, ".rotary_emb.inv_freq") {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		more := ""
		if len(extra) > 3 {
			more = fmt.Sprintf(" and %d more", len(extra)-3)
			extra = extra[:3]
		}
		return nil, fmt.Errorf("model: %s: unexpected tensors %q%s: not part of a Qwen3 decoder with this config", dir, extra, more)
	}
	m.tie()
	return m, nil
}

type shards struct {
	names     []string          // files to read, sorted
	weightMap map[string]string // from the index, when there is one
}

// shardFiles finds the safetensors files of a checkpoint.
func shardFiles(dir string) (shards, error) {
	b, err := os.ReadFile(filepath.Join(dir, indexFile))
	switch {
	case err == nil:
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil {
			return shards{}, fmt.Errorf("%s: %w", indexFile, err)
		}
		if len(idx.WeightMap) == 0 {
			return shards{}, fmt.Errorf("%s: empty weight_map", indexFile)
		}
		var names []string
		for name, file := range idx.WeightMap {
			// The index is input too: it must not point outside dir.
			if !filepath.IsLocal(file) {
				return shards{}, fmt.Errorf("%s: tensor %q maps to %q, outside the checkpoint directory", indexFile, name, file)
			}
			names = append(names, file)
		}
		slices.Sort(names)
		return shards{names: slices.Compact(names), weightMap: idx.WeightMap}, nil
	case !errors.Is(err, os.ErrNotExist):
		return shards{}, err
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return shards{}, err
	}
	if len(names) == 0 {
		return shards{}, fmt.Errorf("no %s, %s or other *.safetensors file", weightFile, indexFile)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
	}
	slices.Sort(names)
	return shards{names: names}, nil
}

// Save writes the model as a Hugging Face checkpoint, config.json and
// model.safetensors, with weights in dtype "float32", "bfloat16" or
// "float16" (rounded to nearest even). It exists for tests and tooling: a
// saved model loads in transformers as Qwen3ForCausalLM.
func (m *Model) Save(dir, dtype string) error {
	var dt safetensors.DType
	switch dtype {
	case "float32":
		dt = safetensors.F32
	case "bfloat16":
		dt = safetensors.BF16
	case "float16":
		dt = safetensors.F16
	default:
		return fmt.Errorf("model: save dtype %q: want float32, bfloat16 or float16", dtype)
	}
	cfg, err := m.Config.marshal(dtype)
	if err != nil {
		return fmt.Errorf("model: %w", err)
	}
	ps := m.params()
	tensors := make([]safetensors.Tensor, len(ps))
	for i, p := range ps {
		if tensors[i], err = safetensors.FromFloat32s(p.name, dt, p.shape, *p.w); err != nil {
			return fmt.Errorf("model: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	if err := safetensors.Write(filepath.Join(dir, weightFile), tensors); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), cfg, 0o644); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}
