package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	vllmomnistage "github.com/omnipd/omnipd/vllm-omni-stage"
	"github.com/omnipd/omnipd/vllmplan"
)

// validate reports every independent mistake of a config in one run, each
// where and as the user wrote it, whatever the base_config, the platform
// and the PD expansion make of the stages.
func TestValidateReportsEverythingInOneRun(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string // beside deploy.yaml, which is files["deploy.yaml"]
		args  []string
		// want are stderr's lines with FILE for the directory's path.
		want []string
	}{
		{
			name: "a missing stage, an engine argument and an input source",
			files: map[string]string{"deploy.yaml": `pd: {}
stages:
  - stage_id: 0
    engine_args:
      max_num_seqs: "lots"
  - stage_id: 1
    input_sources: [6]
`},
			want: []string{
				`DIR/deploy.yaml:3:3: stages: pipeline qwen3_omni_moe needs stages for "code2wav" too; add them, or keep only the Thinker for a text-only deployment`,
				`DIR/deploy.yaml:5:21: stages[0].engine_args.max_num_seqs: "lots" is a string; want an integer`,
				`DIR/deploy.yaml:7:21: stages[1].input_sources[0]: input source 6 names no stage; stage ids are 0,1`,
				`DIR/deploy.yaml: 3 error(s)`,
			},
		},
		{
			name: "an overlay over its base, split into E/P/D",
			files: map[string]string{
				"base.yaml": `stages:
  - stage_id: 0
  - stage_id: 1
    gpu_memory_utilization: lots
  - stage_id: 2
`,
				"deploy.yaml": `base_config: base.yaml
pd:
  encoder:
    devices: "6,7"
stages:
  - stage_id: 2
    input_sources: [6]
`,
			},
			want: []string{
				`DIR/base.yaml:4:29: stages[1].gpu_memory_utilization: "lots" is a string; want a number`,
				`DIR/deploy.yaml:4:14: pd.encoder.devices: devices 6,7 for 1 encoder instance(s) of 1 device(s) each; want 1 device, one per rank of each instance`,
				`DIR/deploy.yaml:7:21: stages[0].input_sources[0]: input source 6 names no stage; stage ids are 0,1,2`,
				`DIR/deploy.yaml: 3 error(s)`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg := filepath.Join(dir, "deploy.yaml")
			code, out, errOut := run(t, append(append([]string{"validate"}, tt.args...), cfg)...)
			if code != 1 || out != "" {
				t.Errorf("exit %d, stdout %q; want 1 and nothing", code, out)
			}
			want := strings.ReplaceAll(strings.Join(tt.want, "\n")+"\n", "DIR", dir)
			if errOut != want {
				t.Errorf("stderr:\n%s\nwant:\n%s", errOut, want)
			}
		})
	}
}

// validate on the config a plan writes for a pipeline with a Talker (every
// stage a vllm-omni stage worker at an endpoint) says, a line each, what a
// real deployment of it still needs: the checkpoint, the vllm-omni release
// the worker is written against, python3 with vllm_omni, the GPUs of each
// stage. A config omnipd serves on its own workers says none of it.
func TestValidateNamesWhatAStageWorkerDeploymentNeeds(t *testing.T) {
	var script, errOut strings.Builder
	if err := runPlan(fixtures+"qwen3_omni_moe.yaml", configFlags{pd: true, connector: "NixlConnector"}, vllmplan.VLLMOptions{}, &script, &errOut); err != nil {
		t.Fatalf("plan: %v\n%s", err, errOut.String())
	}
	planned, ok := heredoc(script.String(), vllmplan.VLLMConfigFile)
	if !ok {
		t.Fatal("the plan writes no config")
	}
	cfg := filepath.Join(t.TempDir(), vllmplan.VLLMConfigFile)
	if err := os.WriteFile(cfg, planned, 0o644); err != nil {
		t.Fatal(err)
	}
	local := t.TempDir()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{nil, []string{
			"  checkpoint: Qwen/Qwen3-Omni-30B-A3B-Instruct (--model) from the Hugging Face Hub",
			"  vllm-omni " + vllmomnistage.VLLMOmniVersion + " on every stage host",
			"  python3 that imports vllm_omni on every stage host",
			"  GPUs: [0] thinker prefill 1 per instance x1 (devices 0); [1] thinker decode 1 per instance x1 (devices 1); [2] talker 1 per instance x1 (devices 2); [3] code2wav 1 per instance x1 (devices 2)\n",
		}},
		{[]string{"--model", local}, []string{"  checkpoint: the local directory " + local + " (--model): every stage host needs it at this path"}},
		{[]string{"--model", "/models/qwen3-omni"}, []string{"  checkpoint: /models/qwen3-omni (--model) is no directory here"}},
	} {
		code, out, errOut := run(t, append(append([]string{"validate"}, c.args...), cfg)...)
		if code != 0 {
			t.Fatalf("validate %v: exit %d\n%s", c.args, code, errOut)
		}
		if !strings.Contains(out, "still needs:\n") {
			t.Errorf("validate %v does not say what a deployment still needs:\n%s", c.args, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("validate %v lacks %q:\n%s", c.args, w, out)
			}
		}
	}
	code, out, _ := run(t, "validate", "--pd", fixtures+"qwen3_omni_moe.yaml")
	if code != 0 || strings.Contains(out, "still needs") {
		t.Errorf("validate of a config on omnipd's own workers: exit %d\n%s", code, out)
	}
}
