package vllmplan_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
	"github.com/omnipd/omnipd/vllmplan"
)

const lmcachePD = `pipeline: qwen3_omni_moe_thinker
pd:
  connector: LMCacheConnectorV1
  devices: "0-5"
  kv_connector_extra_config: {lmcache.enable_pd: true}
  decode:
    num_replicas: 2
stages:
  - stage_id: 0
    tensor_parallel_size: 2
`

// Each LMCache PD receiver instance binds the ports the router names for it
// in disagg_spec (KVPort+r and KVPort+TP+r of its own replica), not its
// stage's first instance's; and every engine hashes chunk keys with the
// same PYTHONHASHSEED.
func TestPlanVLLMLMCachePDReceiverPorts(t *testing.T) {
	doc := loadText(t, "lmcache_pd.yaml", lmcachePD, deploy.Options{})
	plan, err := vllmplan.PlanVLLM(doc, vllmplan.VLLMOptions{})
	if err != nil {
		t.Fatalf("PlanVLLM: %v", err)
	}
	var decode *deploy.Stage
	for _, s := range doc.Stages {
		if s.Role == topology.RoleDecode {
			decode = s
		}
	}
	seeds := map[string]bool{}
	decodes := 0
	for _, c := range plan.Commands {
		for _, e := range c.Env {
			if v, ok := strings.CutPrefix(e, "PYTHONHASHSEED="); ok {
				seeds[v] = true
			}
		}
		if c.Role != "decode" {
			continue
		}
		decodes++
		extra := kvExtra(t, c)
		r := decode.Replicas[c.Replica]
		peer := kvconnector.Peer{KVPort: r.KVPort, TP: decode.TensorParallelSize}
		var wantInit, wantAlloc []int
		for rank := range decode.TensorParallelSize {
			i, a := kvconnector.LMCacheReceiverPorts(peer, rank)
			wantInit, wantAlloc = append(wantInit, i), append(wantAlloc, a)
		}
		if got := fmt.Sprint(extra["lmcache.pd_peer_init_port"]); got != fmt.Sprint(wantInit) {
			t.Errorf("%s: pd_peer_init_port %s, the router sends %v", c.Name, got, wantInit)
		}
		if got := fmt.Sprint(extra["lmcache.pd_peer_alloc_port"]); got != fmt.Sprint(wantAlloc) {
			t.Errorf("%s: pd_peer_alloc_port %s, the router sends %v", c.Name, got, wantAlloc)
		}
		if extra["lmcache.pd_role"] != "receiver" {
			t.Errorf("%s: pd_role %v, want receiver", c.Name, extra["lmcache.pd_role"])
		}
	}
	if decodes != 2 {
		t.Fatalf("%d decode commands, want 2", decodes)
	}
	if len(seeds) != 1 || seeds[""] {
		t.Errorf("PYTHONHASHSEED values %v; want one, the same on every engine", slices.Collect(maps.Keys(seeds)))
	}
}

func kvExtra(t *testing.T, c vllmplan.VLLMCommand) map[string]any {
	t.Helper()
	i := slices.Index(c.Argv, "--kv-transfer-config")
	if i < 0 || i+1 >= len(c.Argv) {
		t.Fatalf("%s has no --kv-transfer-config", c.Name)
	}
	var kv struct {
		Extra map[string]any `json:"kv_connector_extra_config"`
	}
	if err := json.Unmarshal([]byte(c.Argv[i+1]), &kv); err != nil {
		t.Fatal(err)
	}
	return kv.Extra
}
