package deploy_test

import (
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
)

// dpThinkerConfig is the 3-stage layout with a Thinker of two DP ranks
// behind one API server (devices 0 and 1, TP 1 each).
const dpThinkerConfig = `
stages:
  - stage_id: 0
    model_stage: thinker
    devices: "0,1"
    engine_args:
      data_parallel_size: 2
  - stage_id: 1
    model_stage: talker
    devices: "2"
    input_sources: [0]
  - stage_id: 2
    model_stage: code2wav
    devices: "2"
    input_sources: [1]
`

func TestLoadDataParallel(t *testing.T) {
	t.Run("colocated Thinker", func(t *testing.T) {
		doc, _, errs := loadInline(t, dpThinkerConfig, deploy.Options{})
		if errs != nil {
			t.Fatal(errs)
		}
		th := doc.Stages[0]
		if th.DataParallelSize != 2 || len(th.Replicas) != 1 || len(th.Replicas[0].Devices) != 2 {
			t.Fatalf("thinker: data_parallel_size %d, replicas %+v; want 2 and one replica on both devices", th.DataParallelSize, th.Replicas)
		}
		if got := doc.Topology().Stages[0].DataParallelSize; got != 2 {
			t.Errorf("topology data_parallel_size %d, want 2", got)
		}
	})
	// PD expansion copies the size to both halves. Over NIXL both are
	// served, their instances' side channels DP ports apart.
	t.Run("expanded with --pd over NixlConnector", func(t *testing.T) {
		doc, _, errs := loadInline(t, dpThinkerConfig, deploy.Options{PD: true, Connector: "NixlConnector"})
		if errs != nil {
			t.Fatal(errs)
		}
		for _, s := range doc.Stages[:2] {
			if s.DataParallelSize != 2 || len(s.Replicas) != 1 || len(s.Replicas[0].Devices) != 2 {
				t.Errorf("%s: data_parallel_size %d, replicas %+v; want 2 and one replica of two devices", s.Role, s.DataParallelSize, s.Replicas)
			}
		}
		if p, d := doc.Stages[0].Replicas[0].KVPort, doc.Stages[1].Replicas[0].KVPort; d-p != 2 {
			t.Errorf("prefill side channel %d, decode %d; want the decode past the prefill's two ranks", p, d)
		}
	})
	// Over the other connectors the size is refused once, at the line the
	// user wrote it on: both halves have it from that one line.
	t.Run("expanded with --pd", func(t *testing.T) {
		for _, conn := range []string{"MooncakeConnector", "P2pNcclConnector", "MoRIIOConnector"} {
			t.Run(conn, func(t *testing.T) {
				_, _, errs := loadInline(t, dpThinkerConfig, deploy.Options{PD: true, Connector: conn})
				if len(errs) != 1 {
					t.Fatalf("got %d errors, want one for the Thinker's data_parallel_size:\n%v", len(errs), errs)
				}
				for i, e := range errs {
					want := deploy.Pos{File: "deploy.yaml", Line: 6, Col: 27}
					if e.Code != topology.CodePDDataParallelUnroutable || e.Pos != want {
						t.Errorf("error %d: %v (code %q, at %s); want %s at %s", i, e, e.Code, e.Pos, topology.CodePDDataParallelUnroutable, want)
					}
				}
			})
		}
	})
}

// vllm-omni's data_parallel_size is pipeline-wide when written at the top
// (DeployConfig in vllm_omni/config/stage_config.py): every stage that
// sets none runs that many DP ranks, and the value is checked as the
// stage's is.
func TestLoadPipelineWideDataParallel(t *testing.T) {
	const cfg = `
data_parallel_size: 2
stages:
  - stage_id: 0
    devices: "0,1"
  - stage_id: 1
    devices: "2,3"
  - stage_id: 2
    devices: "4,5"
`
	doc, _, errs := loadInline(t, cfg, deploy.Options{})
	if errs != nil {
		t.Fatal(errs)
	}
	for _, s := range doc.Stages {
		if s.DataParallelSize != 2 || len(s.Replicas) != 1 || len(s.Replicas[0].Devices) != 2 {
			t.Errorf("%s: data_parallel_size %d, replicas %+v; want 2 and one replica of two devices", s.ModelStage, s.DataParallelSize, s.Replicas)
		}
	}
	_, _, errs = loadInline(t, "\ndata_parallel_size: null\nstages:\n  - stage_id: 0\n  - stage_id: 1\n  - stage_id: 2\n", deploy.Options{})
	if len(errs) != 1 || errs[0].Error() != "deploy.yaml:1:21: data_parallel_size: want an integer, got null" {
		t.Errorf("errors %v, want data_parallel_size: want an integer, got null", errs)
	}
}
