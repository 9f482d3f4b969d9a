package deploy_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// lmcachePDConfig is a thinker split with LMCache in PD mode: two decode
// instances of TP 2 on one host, so their receiver ports must not meet.
const lmcachePDConfig = `pipeline: qwen3_omni_moe_thinker
stages:
  - stage_id: 0
    tensor_parallel_size: 2
pd:
  connector: LMCacheConnectorV1
  devices: "0-5"
  decode: {num_replicas: 2}
  kv_connector_extra_config: {lmcache.enable_pd: true}
`

// The ports PD expansion writes on each LMCache receiver are the ones the
// router's contract names in disagg_spec for it: the decode Peer is built
// the way serve builds it, from the expanded config as printed and loaded
// back.
func TestLMCachePDReceiverPortsMatchContract(t *testing.T) {
	doc, _, err := deploy.Load("lmcache_pd.yaml", []byte(lmcachePDConfig), deploy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	printed, err := doc.Node().MarshalYAML()
	if err != nil {
		t.Fatal(err)
	}
	doc, _, err = deploy.Load("printed.yaml", printed, deploy.Options{PD: true})
	if err != nil {
		t.Fatalf("the printed config does not load: %v\n%s", err, printed)
	}
	prefill, decode := roleStage(doc, topology.RolePrefill), roleStage(doc, topology.RoleDecode)
	if prefill == nil || decode == nil {
		t.Fatalf("no prefill and decode stages:\n%s", printed)
	}
	contract, err := kvconnector.NewRegistry().Lookup(prefill.KV.Connector, extraOf(t, prefill))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := contract.(kvconnector.DoneNotifier); !ok {
		t.Fatalf("the prefill's extra config does not select PD mode:\n%s", printed)
	}
	dextra := extraOf(t, decode)
	if dextra["lmcache.pd_role"] != "receiver" || dextra["lmcache.enable_pd"] != true {
		t.Errorf("decode pd_role %v, enable_pd %v; want receiver, true", dextra["lmcache.pd_role"], dextra["lmcache.enable_pd"])
	}
	seen := map[int]string{}
	for i, r := range decode.Replicas {
		host := "127.0.0.1" // serve's kvHost: kv_ip, else loopback
		if decode.KV.IP != "" {
			host = decode.KV.IP
		}
		peer := kvconnector.Peer{EngineID: r.EngineID, KVHost: host, KVPort: r.KVPort, TP: decode.TensorParallelSize}
		h := kvconnector.NewHandoff("r1", kvconnector.Peer{TP: prefill.TensorParallelSize}, peer)
		spec, _ := contract.PrefillParams(h)["disagg_spec"].(map[string]any)
		if spec == nil {
			t.Fatalf("no disagg_spec in %v", contract.PrefillParams(h))
		}
		initPorts, allocPorts := deploy.LMCacheReceiverPorts(decode, r)
		if got := fmt.Sprint(spec["receiver_init_port"]); got != fmt.Sprint(initPorts) {
			t.Errorf("decode %d: disagg_spec receiver_init_port %s, the receiver's pd_peer_init_port %v", i, got, initPorts)
		}
		if got := fmt.Sprint(spec["receiver_alloc_port"]); got != fmt.Sprint(allocPorts) {
			t.Errorf("decode %d: disagg_spec receiver_alloc_port %s, the receiver's pd_peer_alloc_port %v", i, got, allocPorts)
		}
		if spec["receiver_host"] != dextra["lmcache.pd_peer_host"] {
			t.Errorf("decode %d: disagg_spec receiver_host %v, the receiver's pd_peer_host %v", i, spec["receiver_host"], dextra["lmcache.pd_peer_host"])
		}
		if i == 0 {
			// The stage's own extra config is its first instance's.
			if fmt.Sprint(dextra["lmcache.pd_peer_init_port"]) != fmt.Sprint(spec["receiver_init_port"]) ||
				fmt.Sprint(dextra["lmcache.pd_peer_alloc_port"]) != fmt.Sprint(spec["receiver_alloc_port"]) {
				t.Errorf("decode stage writes pd_peer_init_port %v, pd_peer_alloc_port %v; the contract sends %v, %v",
					dextra["lmcache.pd_peer_init_port"], dextra["lmcache.pd_peer_alloc_port"], spec["receiver_init_port"], spec["receiver_alloc_port"])
			}
		}
		if len(initPorts) != decode.TensorParallelSize || len(allocPorts) != decode.TensorParallelSize {
			t.Errorf("decode %d: %d init and %d alloc ports for TP %d", i, len(initPorts), len(allocPorts), decode.TensorParallelSize)
		}
		for _, p := range slices.Concat(initPorts, allocPorts) {
			if owner, ok := seen[p]; ok {
				t.Errorf("decode %d: port %d is also %s's", i, p, owner)
			}
			seen[p] = "decode " + strconv.Itoa(i)
		}
	}
	pextra := extraOf(t, prefill)
	if pextra["lmcache.pd_role"] != "sender" || pextra["lmcache.pd_proxy_host"] == nil || pextra["lmcache.pd_proxy_port"] == nil {
		t.Errorf("prefill pd_role %v, pd_proxy_host %v, pd_proxy_port %v; want sender and serve's notice address",
			pextra["lmcache.pd_role"], pextra["lmcache.pd_proxy_host"], pextra["lmcache.pd_proxy_port"])
	}
	for _, s := range []*deploy.Stage{prefill, decode} {
		if s.Env == nil || s.Env.Get("PYTHONHASHSEED") == nil {
			t.Errorf("stage %d has no PYTHONHASHSEED: LMCache's chunk keys differ between engines", s.ID)
		}
	}
	if a, b := prefill.Env.Get("PYTHONHASHSEED"), decode.Env.Get("PYTHONHASHSEED"); a != nil && b != nil && a.Value != b.Value {
		t.Errorf("PYTHONHASHSEED %s on the prefill, %s on the decode", a.Value, b.Value)
	}
}

func roleStage(doc *deploy.Document, role topology.Role) *deploy.Stage {
	for _, s := range doc.Stages {
		if s.Role == role {
			return s
		}
	}
	return nil
}

func extraOf(t *testing.T, s *deploy.Stage) map[string]any {
	t.Helper()
	extra := map[string]any{}
	if s.KV.ExtraConfig != nil {
		raw, err := s.KV.ExtraConfig.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &extra); err != nil {
			t.Fatal(err)
		}
	}
	return extra
}
