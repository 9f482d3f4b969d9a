package model

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLoadConfigQwen3(t *testing.T) {
	c, err := LoadConfig("testdata/qwen3-0.6b-config.json")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		VocabSize: 151936, HiddenSize: 1024, IntermediateSize: 3072, NumLayers: 28,
		NumHeads: 16, NumKVHeads: 8, HeadDim: 128, MaxPositionEmbeddings: 40960,
		RopeTheta: 1e6, RMSNormEps: 1e-6, TieWordEmbeddings: true,
		BOSTokenID: 151643, EOSTokenIDs: []int{151645},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
}

// minimal is a config.json with only the required keys.
const minimal = `{"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4`

func TestParseConfigDefaultsAndVariants(t *testing.T) {
	for _, tc := range []struct {
		name  string
		json  string
		check func(Config) bool
	}{
		{"defaults", minimal + `}`, func(c Config) bool {
			return c.NumKVHeads == 4 && c.HeadDim == 8 && c.RopeTheta == 10000 && c.RMSNormEps == 1e-6 &&
				!c.TieWordEmbeddings && c.MaxPositionEmbeddings == 32768 && c.BOSTokenID == -1 && c.EOSTokenIDs == nil
		}},
		{"eos list", minimal + `, "eos_token_id": [7, 9], "bos_token_id": null}`, func(c Config) bool {
			return reflect.DeepEqual(c.EOSTokenIDs, []int{7, 9}) && c.BOSTokenID == -1
		}},
		{"eos int", minimal + `, "eos_token_id": 3, "bos_token_id": 0}`, func(c Config) bool {
			return reflect.DeepEqual(c.EOSTokenIDs, []int{3}) && c.BOSTokenID == 0
		}},
		{"explicit head_dim", minimal + `, "head_dim": 16, "num_key_value_heads": 1}`, func(c Config) bool {
			return c.HeadDim == 16 && c.NumKVHeads == 1
		}},
		{"rope_parameters", minimal + `, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "dtype": "bfloat16"}`, func(c Config) bool {
			return c.RopeTheta == 5e5
		}},
		{"default rope_scaling", minimal + `, "rope_scaling": {"type": "default"}, "rope_theta": 123}`, func(c Config) bool {
			return c.RopeTheta == 123
		}},
		{"no TTS tokens", minimal + `}`, func(c Config) bool { return c.TTSTokenIDs == nil }},
		// Qwen3-Omni's config carries them at its top level (Qwen3OmniMoeConfig).
		{"TTS tokens", minimal + `, "tts_pad_token_id": 97, "tts_bos_token_id": 98, "tts_eos_token_id": 99}`, func(c Config) bool {
			return reflect.DeepEqual(c.TTSTokenIDs, []int{97, 98, 99})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{`, "unexpected end"},
		{`{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}`, "vocab_size: missing"},
		{minimal + `, "num_key_value_heads": 3}`, "num_key_value_heads: 3 does not divide num_attention_heads 4"},
		{minimal + `, "head_dim": 7}`, "head_dim: must be even"},
		{`{"vocab_size": 100, "hidden_size": 30, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}`, "hidden_size 30 is not a multiple of num_attention_heads 4"},
		{`{"vocab_size": 100, "hidden_size": 32, "intermediate_size": 0, "num_hidden_layers": 2, "num_attention_heads": 4}`, "intermediate_size: must be positive, got 0"},
		{minimal + `, "num_key_value_heads": 0}`, "num_key_value_heads: must be positive"},
		{minimal + `, "rope_theta": -1}`, "rope_theta: must be positive"},
		{minimal + `, "rms_norm_eps": 0}`, "rms_norm_eps: must be positive"},
		{minimal + `, "rope_scaling": {"rope_type": "yarn", "factor": 4}}`, `rope_scaling: rope_type "yarn" is not supported`},
		{minimal + `, "attention_bias": true}`, "attention_bias"},
		{minimal + `, "hidden_act": "gelu"}`, `hidden_act: "gelu"`},
		{minimal + `, "use_sliding_window": true}`, "use_sliding_window"},
		{minimal + `, "torch_dtype": "int8"}`, `torch_dtype: "int8"`},
		{minimal + `, "eos_token_id": 100}`, "eos_token_id: 100 is outside the vocabulary (size 100)"},
		{minimal + `, "eos_token_id": "x"}`, "eos_token_id: want an integer or a list"},
		{minimal + `, "bos_token_id": [1]}`, "bos_token_id: want an integer"},
		{minimal + `, "max_position_embeddings": -5}`, "max_position_embeddings: must be positive"},
		{minimal + `, "tts_pad_token_id": 97, "tts_eos_token_id": 99}`, "tts_bos_token_id: missing; give all three TTS token ids or none"},
		{minimal + `, "tts_pad_token_id": 97, "tts_bos_token_id": 100, "tts_eos_token_id": 99}`, "tts_bos_token_id: 100 is outside the vocabulary (size 100)"},
		{minimal + `, "tts_pad_token_id": 97, "tts_bos_token_id": 98, "tts_eos_token_id": 97}`, "tts_eos_token_id: 97 is tts_pad_token_id too"},
		{minimal + `, "tts_pad_token_id": "x", "tts_bos_token_id": 98, "tts_eos_token_id": 99}`, "tts_pad_token_id"},
		{`{"vocab_size": 4611686018427387904, "hidden_size": 4611686018427387904, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}`, "too large"},
	} {
		_, err := ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%s):\n err = %v\nwant it to contain %q", tc.json, err, tc.want)
		}
	}
}

func TestLoadConfigNamesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(path, []byte(minimal+`, "head_dim": 3}`), 0o644)
	_, err := LoadConfig(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "head_dim") {
		t.Errorf("err = %v, want it to name the file and the key", err)
	}
}

func TestConfigMarshalRoundTrip(t *testing.T) {
	for _, c := range []Config{DefaultConfig(), tinyConfig(false)} {
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		b, err := c.marshal("bfloat16")
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseConfig(b)
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, c)
		}
	}
}
