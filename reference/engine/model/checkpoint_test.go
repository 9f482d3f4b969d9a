package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/safetensors"
)

func logitsOf(t *testing.T, m *Model, tokens []int) []float32 {
	t.Helper()
	l, _, _ := runChunks(t, m, tokens, nil, 16, 0)
	return l
}

// rounded is m with every weight rounded through a narrower float type.
func rounded(t *testing.T, m *Model, round func(float32) float32) *Model {
	t.Helper()
	r := newModel(m.Config)
	for i, p := range r.params() {
		src := *m.params()[i].w
		w := make([]float32, len(src))
		for j, v := range src {
			w[j] = round(v)
		}
		*p.w = w
	}
	r.tie()
	return r
}

func TestSaveLoadRoundTrip(t *testing.T) {
	bf16 := func(v float32) float32 { return safetensors.BFloat16ToFloat32(safetensors.Float32ToBFloat16(v)) }
	f16 := func(v float32) float32 { return safetensors.Float16ToFloat32(safetensors.Float32ToFloat16(v)) }
	same := func(v float32) float32 { return v }
	for _, mc := range []struct {
		name string
		m    *Model
	}{
		{"default tied", Default()},
		{"untied", randomTestModel(t, tinyConfig(false), 20)},
	} {
		tokens := prompt(19, mc.m.Config.VocabSize, 21)
		orig := logitsOf(t, mc.m, tokens)
		for _, dc := range []struct {
			dtype string
			round func(float32) float32
			tol   float64 // of max |Δlogit| / max |logit| against the original
		}{
			{"float32", same, 0},
			{"bfloat16", bf16, 0.02},
			{"float16", f16, 0.005},
		} {
			t.Run(mc.name+"/"+dc.dtype, func(t *testing.T) {
				dir := t.TempDir()
				if err := mc.m.Save(dir, dc.dtype); err != nil {
					t.Fatal(err)
				}
				got, err := Load(dir)
				if err != nil {
					t.Fatal(err)
				}
				if !equalConfig(got.Config, mc.m.Config) {
					t.Errorf("config = %+v, want %+v", got.Config, mc.m.Config)
				}
				if mc.m.Config.TieWordEmbeddings != (&got.lmHead[0] == &got.embed[0]) {
					t.Error("loaded lm_head tying does not follow the config")
				}
				want := logitsOf(t, rounded(t, mc.m, dc.round), tokens)
				l := logitsOf(t, got, tokens)
				if !bitsEqual(l, want) {
					t.Errorf("logits differ from those of the model with %s-rounded weights", dc.dtype)
				}
				var scale, diff float64
				for i, v := range orig {
					scale = max(scale, math.Abs(float64(v)))
					diff = max(diff, math.Abs(float64(l[i]-v)))
				}
				if diff/scale > dc.tol {
					t.Errorf("logits moved by %.3g relative to the original, want ≤ %g", diff/scale, dc.tol)
				}
				b, _ := os.ReadFile(filepath.Join(dir, configFile))
				var cfg map[string]any
				json.Unmarshal(b, &cfg)
				if cfg["torch_dtype"] != dc.dtype || cfg["model_type"] != "qwen3" {
					t.Errorf("config.json torch_dtype %v, model_type %v", cfg["torch_dtype"], cfg["model_type"])
				}
			})
		}
	}
	if err := Default().Save(t.TempDir(), "int8"); err == nil || !strings.Contains(err.Error(), "int8") {
		t.Errorf("Save(int8) err = %v", err)
	}
}

func equalConfig(a, b Config) bool { return reflect.DeepEqual(a, b) }

// tensorsOf lists m's weights as safetensors, in checkpoint order.
func tensorsOf(t *testing.T, m *Model) []safetensors.Tensor {
	t.Helper()
	var ts []safetensors.Tensor
	for _, p := range m.params() {
		x, err := safetensors.FromFloat32s(p.name, safetensors.F32, p.shape, *p.w)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, x)
	}
	return ts
}

// writeCheckpoint writes config.json and the given files, with an index
// when index is not nil.
func writeCheckpoint(t *testing.T, c Config, files map[string][]safetensors.Tensor, index map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	b, err := c.marshal("float32")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, configFile), b, 0o644)
	for name, ts := range files {
		if err := safetensors.Write(filepath.Join(dir, name), ts); err != nil {
			t.Fatal(err)
		}
	}
	if index != nil {
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": index})
		os.WriteFile(filepath.Join(dir, indexFile), b, 0o644)
	}
	return dir
}

func TestLoadSharded(t *testing.T) {
	for _, m := range []*Model{Default(), randomTestModel(t, tinyConfig(false), 22)} {
		ts := tensorsOf(t, m)
		half := len(ts) / 2
		files := map[string][]safetensors.Tensor{
			"model-00001-of-00002.safetensors": ts[:half],
			"model-00002-of-00002.safetensors": ts[half:],
		}
		index := map[string]string{}
		for name, fts := range files {
			for _, x := range fts {
				index[x.Name] = name
			}
		}
		tokens := prompt(9, m.Config.VocabSize, 23)
		want := logitsOf(t, m, tokens)
		for _, withIndex := range []bool{true, false} {
			idx := index
			if !withIndex {
				idx = nil
			}
			got, err := Load(writeCheckpoint(t, m.Config, files, idx))
			if err != nil {
				t.Fatalf("index %v: %v", withIndex, err)
			}
			if !bitsEqual(logitsOf(t, got, tokens), want) {
				t.Errorf("index %v: sharded checkpoint gives different logits", withIndex)
			}
		}
	}
}

func TestLoadTolerates(t *testing.T) {
	m := Default()
	ts := tensorsOf(t, m)
	lm, _ := safetensors.FromFloat32s("lm_head.weight", safetensors.BF16, []int{m.Config.VocabSize, 64}, m.embed)
	inv, _ := safetensors.FromFloat32s("model.layers.0.self_attn.rotary_emb.inv_freq", safetensors.F32, []int{8}, make([]float32, 8))
	ts = append(ts, lm, inv)
	got, err := Load(writeCheckpoint(t, m.Config, map[string][]safetensors.Tensor{"model.safetensors": ts}, nil))
	if err != nil {
		t.Fatalf("a tied checkpoint carrying lm_head.weight and inv_freq buffers: %v", err)
	}
	if &got.lmHead[0] != &got.embed[0] {
		t.Error("tied model took the stored lm_head instead of the embeddings")
	}
}

func TestLoadErrors(t *testing.T) {
	m := Default()
	cfg := m.Config
	base := func() []safetensors.Tensor { return tensorsOf(t, m) }
	without := func(name string) []safetensors.Tensor {
		return slices.DeleteFunc(base(), func(x safetensors.Tensor) bool { return x.Name == name })
	}
	replace := func(name string, x safetensors.Tensor) []safetensors.Tensor {
		ts := base()
		for i := range ts {
			if ts[i].Name == name {
				x.Name = name
				ts[i] = x
			}
		}
		return ts
	}
	f32 := func(shape []int) safetensors.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		x, _ := safetensors.FromFloat32s("", safetensors.F32, shape, make([]float32, n))
		return x
	}
	named := func(name string, x safetensors.Tensor) safetensors.Tensor {
		x.Name = name
		return x
	}
	one := func(ts []safetensors.Tensor) map[string][]safetensors.Tensor {
		return map[string][]safetensors.Tensor{"model.safetensors": ts}
	}
	untied := cfg
	untied.TieWordEmbeddings = false
	badCfg := cfg
	badCfg.NumKVHeads = 3

	for _, tc := range []struct {
		name  string
		cfg   Config
		files map[string][]safetensors.Tensor
		index map[string]string
		want  []string
	}{
		{"missing", cfg, one(without("model.layers.1.self_attn.k_norm.weight")), nil,
			[]string{`missing tensor "model.layers.1.self_attn.k_norm.weight"`, "want shape [16]"}},
		{"missing lm_head", untied, one(base()), nil,
			[]string{`missing tensor "lm_head.weight"`, "want shape [269 64]"}},
		{"misshaped", cfg, one(replace("model.layers.2.self_attn.q_proj.weight", f32([]int{64, 63}))), nil,
			[]string{`"model.layers.2.self_attn.q_proj.weight" has shape [64 63], want [64 64]`, "model.safetensors"}},
		{"transposed", cfg, one(replace("model.layers.0.mlp.down_proj.weight", f32([]int{128, 64}))), nil,
			[]string{`"model.layers.0.mlp.down_proj.weight" has shape [128 64], want [64 128]`}},
		{"integer weights", cfg, one(replace("model.norm.weight", safetensors.Tensor{DType: safetensors.I32, Shape: []int{64}, Data: make([]byte, 256)})), nil,
			[]string{`"model.norm.weight"`, "I32"}},
		{"unexpected", cfg, one(append(base(), named("extra.a", f32([]int{64})), named("extra.b", f32([]int{2})))), nil,
			[]string{`unexpected tensors ["extra.a" "extra.b"]`}},
		{"bias", cfg, one(append(base(), func() safetensors.Tensor {
			x := f32([]int{64})
			x.Name = "model.layers.0.self_attn.q_proj.bias"
			return x
		}())), nil,
			[]string{`"model.layers.0.self_attn.q_proj.bias"`}},
		{"bad config", badCfg, one(base()), nil,
			[]string{"config.json", "num_key_value_heads: 3"}},
		{"no weights", cfg, nil, nil,
			[]string{"no model.safetensors"}},
		{"duplicate across shards", cfg, map[string][]safetensors.Tensor{"a.safetensors": base(), "b.safetensors": base()[:1]}, nil,
			[]string{`"model.embed_tokens.weight" is in both a.safetensors and b.safetensors`}},
		{"index escapes", cfg, one(base()), map[string]string{"model.norm.weight": "../model.safetensors"},
			[]string{`"../model.safetensors", outside`}},
		{"index wrong file", cfg, map[string][]safetensors.Tensor{"a.safetensors": base()[:3], "b.safetensors": base()[3:]}, map[string]string{"model.norm.weight": "a.safetensors", "model.embed_tokens.weight": "b.safetensors"},
			[]string{indexFile, `"model.embed_tokens.weight" to b.safetensors, which does not hold it`}},
		{"index missing file", cfg, one(base()), map[string]string{"model.norm.weight": "gone.safetensors"},
			[]string{"gone.safetensors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeCheckpoint(t, tc.cfg, tc.files, tc.index))
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %q\nwant it to contain %q", err, w)
				}
			}
		})
	}
}
