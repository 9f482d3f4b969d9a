package deploy_test

import (
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
)

// writtenCase is a config with several independent mistakes and every error
// one Load must report for them, each as
// file:line:column: field.path: message, with the path, the position and the
// stage ids as the user wrote them (in the file they wrote them in), whatever
// the overlays, the platform and the PD expansion made of the stages.
type writtenCase struct {
	name  string
	cfg   string
	files map[string]string
	opts  deploy.Options
	// want are the errors in order; each line matches an error's prefix.
	want []string
}

var writtenCases = []writtenCase{
	{
		// A missing pipeline stage does not hide the mistakes in the
		// stages that are there.
		name: "missing Code2Wav beside a bad input source and a bad engine argument",
		cfg: `
pd: {}
stages:
  - stage_id: 0
    max_num_seqs: "lots"
  - stage_id: 1
    input_sources: [6]
`,
		want: []string{
			`deploy.yaml:3:3: stages: pipeline qwen3_omni_moe needs stages for "code2wav" too`,
			`deploy.yaml:4:19: stages[0].max_num_seqs: "lots" is a string; want an integer`,
			`deploy.yaml:6:21: stages[1].input_sources[0]: input source 6 names no stage; stage ids are 0,1`,
		},
	},
	{
		name: "PD expansion renumbers nothing the user sees",
		cfg: `
pd: {}
stages:
  - stage_id: 0
  - stage_id: 1
    input_sources: [6]
  - stage_id: 2
    final_output_type: video
`,
		want: []string{
			`deploy.yaml:5:21: stages[1].input_sources[0]: input source 6 names no stage; stage ids are 0,1,2`,
			`deploy.yaml:7:24: stages[2].final_output_type: final_output_type "video" is unknown`,
		},
	},
	{
		// E/P/D shifts the stages after the Thinker by two, and the list is
		// not written in id order.
		name: "E/P/D with stages written out of id order",
		cfg: `
pd:
  encoder: {}
stages:
  - stage_id: 2
    final_output_type: video
  - stage_id: 0
  - stage_id: 1
    input_connectors:
      from_stage_0: shm
`,
		want: []string{
			`deploy.yaml:5:24: stages[0].final_output_type: final_output_type "video" is unknown`,
			`deploy.yaml:9:21: stages[2].input_connectors.from_stage_0: connector "shm" is not defined`,
		},
	},
	{
		name: "errors in an overlay and in its base_config, each in its own file",
		files: map[string]string{"base.yaml": `
stages:
  - stage_id: 0
  - stage_id: 1
    max_num_seqs: many
  - stage_id: 2
`},
		cfg: `
base_config: base.yaml
pd: {}
stages:
  - stage_id: 2
    gpu_memory_utilization: high
    input_sources: [9]
`,
		want: []string{
			`base.yaml:4:19: stages[1].max_num_seqs: "many" is a string; want an integer`,
			`deploy.yaml:5:29: stages[0].gpu_memory_utilization: "high" is a string; want a number`,
			`deploy.yaml:6:21: stages[0].input_sources[0]: input source 9 names no stage; stage ids are 0,1,2`,
		},
	},
	{
		name: "a platform section's value, with the platform chosen",
		opts: deploy.Options{Platform: "npu"},
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
platforms:
  npu:
    stages:
      - stage_id: 1
        max_num_seqs: "x"
`,
		want: []string{
			`deploy.yaml:9:23: platforms.npu.stages[0].max_num_seqs: "x" is a string; want an integer`,
		},
	},
	{
		// The platform section is part of the file whether or not this run
		// uses it.
		name: "a platform section's value, with no platform chosen",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
platforms:
  npu:
    stages:
      - stage_id: 1
        max_num_seqs: "x"
`,
		want: []string{
			`deploy.yaml:9:23: platforms.npu.stages[0].max_num_seqs: "x" is a string; want an integer`,
		},
	},
	{
		name: "a legacy stage_args: config names its own keys",
		cfg: `
stage_args:
  - stage_id: 0
    runtime:
      max_batch_size: lots
  - stage_id: 1
    engine_input_source: [5]
  - stage_id: 2
`,
		want: []string{
			`deploy.yaml:4:23: stage_args[0].runtime.max_batch_size: "lots" is a string; want an integer`,
			`deploy.yaml:6:27: stage_args[1].engine_input_source[0]: input source 5 names no stage; stage ids are 0,1,2`,
		},
	},
	{
		// The unknown model stage may be the one the pipeline misses, so
		// no "needs stages for" error; the other stages are still checked.
		name: "an unknown model stage beside independent mistakes",
		cfg: `
stages:
  - stage_id: 0
  - stage_id: 1
    model_stage: talkr
  - stage_id: 2
    input_sources: [7]
    max_num_seqs: 1.5
`,
		want: []string{
			`deploy.yaml:4:18: stages[1].model_stage: pipeline qwen3_omni_moe has no model stage "talkr"`,
			`deploy.yaml:6:21: stages[2].input_sources[0]: input source 7 names no stage; stage ids are 0,1,2`,
			`deploy.yaml:7:19: stages[2].max_num_seqs: 1.5 is a number; want an integer`,
		},
	},
	{
		// The second stage 1 is probably the missing Code2Wav: that is
		// not reported again, the Thinker's own mistake is.
		name: "a duplicate stage id beside an independent mistake",
		cfg: `
stages:
  - stage_id: 0
    tensor_parallel_size: 2
    devices: "0"
  - stage_id: 1
  - stage_id: 1
`,
		want: []string{
			`deploy.yaml:4:14: stages[0].devices: device 0 for tensor_parallel_size 2`,
			`deploy.yaml:6:15: stages[2].stage_id: stage 1 is defined twice`,
		},
	},
	{
		name: "a stage without an id beside independent mistakes",
		cfg: `
stages:
  - stage_id: 0
    enforce_eager: "yes"
  - model_stage: talker
  - stage_id: 2
    final_output_type: video
`,
		want: []string{
			`deploy.yaml:3:20: stages[0].enforce_eager: "yes" is a string; want true or false`,
			`deploy.yaml:4:5: stages[1].stage_id: missing: every stage needs a stage_id`,
			`deploy.yaml:6:24: stages[2].final_output_type: final_output_type "video" is unknown`,
		},
	},
	{
		// An unknown pipeline cannot match the stages, but their own
		// values are still checked.
		name: "an unknown pipeline beside a bad engine argument",
		cfg: `
pipeline: qwen9
stages:
  - stage_id: 0
    max_num_seqs: [1]
`,
		want: []string{
			`deploy.yaml:1:11: pipeline: unknown pipeline "qwen9"`,
			`deploy.yaml:4:19: stages[0].max_num_seqs: the value is a list; want an integer`,
		},
	},
	{
		// A base_config that cannot be read leaves the stages incomplete:
		// what the topology would say about them follows from it, the
		// values in this file do not.
		name: "an unreadable base_config beside a bad engine argument",
		cfg: `
base_config: nowhere.yaml
stages:
  - stage_id: 0
    max_num_seqs: "lots"
`,
		want: []string{
			`deploy.yaml:1:14: base_config: cannot read "nowhere.yaml"`,
			`deploy.yaml:4:19: stages[0].max_num_seqs: "lots" is a string; want an integer`,
		},
	},
	{
		// Too few devices for the layout leaves the expansion undone; the
		// stages' own mistakes are still reported.
		name: "a pd: layout that does not fit beside a stage mistake",
		cfg: `
pd:
  devices: "0,1"
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
    final_output_type: video
    input_sources: [4]
`,
		want: []string{
			`deploy.yaml:2:12: pd.devices: need 3 devices`,
			`deploy.yaml:7:24: stages[2].final_output_type: final_output_type "video" is unknown`,
			`deploy.yaml:8:21: stages[2].input_sources[0]: input source 4 names no stage; stage ids are 0,1,2`,
		},
	},
	{
		// Devices pinned to the encoder are all used or refused; none is
		// dropped.
		name: "pinned encoder devices that do not fit the encoder",
		cfg: `
pd:
  encoder:
    devices: "6,7"
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		want: []string{
			`deploy.yaml:3:14: pd.encoder.devices: devices 6,7 for 1 encoder instance(s) of 1 device(s) each; want 1 device`,
		},
	},
	{
		name: "pinned prefill and decode devices that overlap",
		cfg: `
pd:
  prefill:
    devices: "0"
  decode:
    devices: "0"
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		want: []string{
			`deploy.yaml:5:14: pd.decode.devices: prefill and decode both use device 0`,
		},
	},
	{
		name: "a pinned encoder over the prefill's pinned devices",
		cfg: `
pd:
  prefill:
    devices: "3"
  encoder:
    devices: "3"
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		want: []string{
			`deploy.yaml:5:14: pd.encoder.devices: the encoder and the prefill both use device 3`,
		},
	},
	{
		// The prefill is the expansion's stage 1, the user's stages[1] is
		// the Talker: the message names the prefill.
		name: "an encoder engine id taken by the prefill",
		cfg: `
pd:
  encoder:
    engine_id: thinker-prefill
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		want: []string{
			`deploy.yaml:3:16: pd.encoder.engine_id: engine_id "thinker-prefill" is already used by the prefill's replicas[0]`,
		},
	},
	{
		name: "two prefill stages written out of id order",
		cfg: `
stages:
  - stage_id: 1
    model_stage: thinker
    is_prefill_only: true
    kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}
  - stage_id: 0
    model_stage: thinker
    is_prefill_only: true
    kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}
  - stage_id: 2
  - stage_id: 3
`,
		// The two share the default engine id thinker-prefill only
		// because both are prefills: that is not reported again.
		want: []string{
			`deploy.yaml:4:22: stages[0].is_prefill_only: stage 0 is already the prefill stage`,
			`deploy.yaml:8:22: stages[1].is_prefill_only: a prefill stage needs a decode stage`,
		},
	},
	{
		// The pd: section's own settings are checked against its
		// connector whether or not the layout fits.
		name: "a pd: layout that does not fit beside a setting the connector refuses",
		cfg: `
pd:
  connector: P2pNcclConnector
  devices: "0"
  min_prefill_tokens: 8
stages:
  - stage_id: 0
  - stage_id: 1
  - stage_id: 2
`,
		want: []string{
			`deploy.yaml:3:12: pd.devices: need 3 devices`,
			`deploy.yaml:4:23: pd.min_prefill_tokens: 8 sends short prompts to the decode alone`,
		},
	},
	{
		name: "a missing stage beside a pd: setting the connector refuses",
		cfg: `
pd:
  connector: P2pNcclConnector
  fallback: local
stages:
  - stage_id: 0
  - stage_id: 1
`,
		want: []string{
			`deploy.yaml:3:13: pd.fallback: local sends the request to the decode alone when the prefill failed`,
			`deploy.yaml:5:3: stages: pipeline qwen3_omni_moe needs stages for "code2wav" too`,
		},
	},
}

func TestLoadReportsWhatWasWritten(t *testing.T) {
	for _, c := range writtenCases {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.ReadFile = memFS(c.files)
			_, _, errs := loadInline(t, c.cfg, opts)
			var got []string
			for _, e := range errs {
				got = append(got, e.Error())
			}
			ok := len(got) == len(c.want)
			for i := 0; ok && i < len(got); i++ {
				ok = strings.HasPrefix(got[i], c.want[i])
			}
			if !ok {
				t.Errorf("errors:\n  %s\nwant (prefixes):\n  %s\nconfig:\n%s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "), numberLines(c.cfg))
			}
		})
	}
}
