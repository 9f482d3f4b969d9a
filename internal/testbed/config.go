package testbed

import (
	"fmt"
	"strings"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// DeployConfig is the deploy config of the deployment opts describe, as
// omnipd serve --config would take it: the pipeline, the PD split over the
// reference connector, each stage's instances and the Talker's sampling.
// opts must have its defaults applied (see Start).
func DeployConfig(opts Options) string {
	var b strings.Builder
	pipeline := "qwen3_omni_moe_thinker"
	if opts.Omni {
		pipeline = "qwen3_omni_moe"
	}
	fmt.Fprintf(&b, "pipeline: %s\nasync_chunk: %t\n", pipeline, opts.AsyncChunk)
	if !opts.Colocated {
		fmt.Fprintf(&b, `pd:
  connector: %s
  prefill_retries: %d
  kv_connector_extra_config:
    handshake: %s
    lease_seconds: %g
    shared_memory: %t
  prefill:
    num_replicas: %d
  decode:
    num_replicas: %d
`, kvconnector.ReferenceConnector, opts.PrefillRetries, opts.Handshake, opts.LeaseSeconds, !opts.NoSharedMemory, opts.Prefills, opts.Decodes)
		if opts.Encoders > 0 {
			fmt.Fprintf(&b, "  encoder:\n    num_replicas: %d\n", opts.Encoders)
		}
	}
	b.WriteString("stages:\n  - stage_id: 0\n")
	if opts.Colocated {
		fmt.Fprintf(&b, "    num_replicas: %d\n", opts.Decodes)
	}
	if opts.Omni {
		// The reference Talker's sampling, as the embedded default config
		// gives it.
		fmt.Fprintf(&b, `  - stage_id: 1
    num_replicas: %d
    default_sampling_params:
      temperature: 0.9
      top_k: 50
  - stage_id: 2
    num_replicas: %d
`, opts.Talkers, opts.Code2Wavs)
	}
	return b.String()
}

// loadDeployConfig resolves DeployConfig(opts).
func loadDeployConfig(opts Options) (*deploy.Document, error) {
	doc, _, err := deploy.Load("<testbed>", []byte(DeployConfig(opts)), deploy.Options{})
	if err != nil {
		return nil, fmt.Errorf("testbed: the deploy config: %w", err)
	}
	return doc, nil
}

// poolName is the testbed's name of a stage's pool, the stage label the
// suites read metrics by: the role of a split Thinker (prefill, decode,
// encoder), else the model stage (thinker, talker, code2wav).
func poolName(s *deploy.Stage) string {
	if s.ModelStage == "thinker" && s.Role != topology.RoleFull {
		return s.Role.String()
	}
	return s.ModelStage
}
