package deploy_test

import (
	"testing"

	"github.com/omnipd/omnipd/deploy"
)

// stagesWith is the three-stage Qwen3-Omni config with lines added to the
// Thinker (stage 0, at line 3 onwards) and, where given, at the top.
func stagesWith(top, thinker string) string {
	return "\n" + top + "stages:\n  - stage_id: 0\n" + thinker + "  - stage_id: 1\n  - stage_id: 2\n"
}

func TestEngineArgumentTypes(t *testing.T) {
	tests := []struct {
		name string
		cfg  string
		// want is the one error, as file:line:col: path: message; empty
		// when the config is valid.
		want string
	}{
		{"the nested engine_args form", stagesWith("", "    engine_args:\n      max_num_seqs: \"lots\"\n"),
			`deploy.yaml:4:21: stages[0].engine_args.max_num_seqs: "lots" is a string; want an integer`},
		{"an integer argument given a number", stagesWith("", "    max_num_seqs: 1.5\n"),
			`deploy.yaml:3:19: stages[0].max_num_seqs: 1.5 is a number; want an integer`},
		{"an integer argument given a quoted integer", stagesWith("", "    seed: \"7\"\n"),
			`deploy.yaml:3:11: stages[0].seed: "7" is a string; want an integer`},
		{"a number argument given a string", stagesWith("", "    gpu_memory_utilization: most\n"),
			`deploy.yaml:3:29: stages[0].gpu_memory_utilization: "most" is a string; want a number`},
		{"a boolean argument given YAML 1.1's yes", stagesWith("", "    enforce_eager: yes\n"),
			`deploy.yaml:3:20: stages[0].enforce_eager: "yes" is a string; want true or false`},
		{"a string argument given an integer", stagesWith("", "    dtype: 16\n"),
			`deploy.yaml:3:12: stages[0].dtype: 16 is an integer; want a string`},
		{"a mapping argument given a scalar", stagesWith("", "    compilation_config: 3\n"),
			`deploy.yaml:3:25: stages[0].compilation_config: 3 is an integer; want a mapping`},
		{"a list argument given a scalar", stagesWith("", "    cudagraph_capture_sizes: 8\n"),
			`deploy.yaml:3:30: stages[0].cudagraph_capture_sizes: 8 is an integer; want a list of integers`},
		{"a list argument with a bad item", stagesWith("", "    cudagraph_capture_sizes: [1, two]\n"),
			`deploy.yaml:3:34: stages[0].cudagraph_capture_sizes[1]: "two" is a string; want an integer`},
		{"a boolean-or-string argument", stagesWith("", "    hf_token: 5\n"),
			`deploy.yaml:3:15: stages[0].hf_token: 5 is an integer; want true or false, or a string`},
		{"a string-or-list argument given a mapping", stagesWith("", "    served_model_name: {a: 1}\n"),
			`deploy.yaml:3:24: stages[0].served_model_name: the value is a mapping; want a string or a list of strings`},
		{"a block size is an integer literal", stagesWith("", "    block_size: \"16\"\n"),
			`deploy.yaml:3:17: stages[0].block_size: "16" is a string; want an integer`},
		{"vllm-omni's own argument", stagesWith("", "    silence_ban_frames: some\n"),
			`deploy.yaml:3:25: stages[0].silence_ban_frames: "some" is a string; want an integer`},
		{"vllm-omni's list argument", stagesWith("", "    output_modalities: audio\n"),
			`deploy.yaml:3:24: stages[0].output_modalities: "audio" is a string; want a list of strings`},
		{"a pipeline-wide argument", stagesWith("trust_remote_code: 1\n", ""),
			`deploy.yaml:1:20: trust_remote_code: 1 is an integer; want true or false`},
		{"vllm-omni's nested runtime: form", "\nstages:\n  - stage_id: 0\n    runtime:\n      max_num_seqs: 2.5\n  - stage_id: 1\n  - stage_id: 2\n",
			`deploy.yaml:4:21: stages[0].runtime.max_num_seqs: 2.5 is a number; want an integer`},
		{"an encoder's own engine argument", stagesWith("pd:\n  encoder:\n    engine_args:\n      max_num_batched_tokens: big\n", ""),
			`deploy.yaml:4:31: pd.encoder.engine_args.max_num_batched_tokens: "big" is a string; want an integer`},

		{"valid values of every shape", stagesWith("trust_remote_code: true\n", `    max_num_seqs: 64
    gpu_memory_utilization: 1
    swap_space: 4.5
    enforce_eager: false
    dtype: bfloat16
    compilation_config: {cudagraph_mode: PIECEWISE}
    cudagraph_capture_sizes: [1, 2, 4]
    served_model_name: [a, b]
    hf_token: true
    ignore_patterns: "*.pt"
    block_size: 16
`), ""},
		{"null leaves any argument unset", stagesWith("", "    max_num_seqs: null\n    enforce_eager: ~\n    compilation_config: null\n"), ""},
		{"vLLM's human-readable token counts", stagesWith("", "    max_num_batched_tokens: 32k\n    max_model_len: 128K\n"), ""},
		{"an argument omnipd has no type for is passed on as written", stagesWith("", "    some_future_flag: [1, {a: b}]\n"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := loadInline(t, tt.cfg, deploy.Options{})
			if tt.want == "" {
				if errs != nil {
					t.Errorf("errors:\n%v\nconfig:\n%s", errs, numberLines(tt.cfg))
				}
				return
			}
			if len(errs) != 1 || errs[0].Error() != tt.want {
				t.Errorf("errors:\n%v\nwant exactly:\n%s\nconfig:\n%s", errs, tt.want, numberLines(tt.cfg))
			}
		})
	}
}
