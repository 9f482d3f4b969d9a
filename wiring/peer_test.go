package wiring

import (
	"testing"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

func TestThinkerPeerCarriesDataParallelSize(t *testing.T) {
	s := &deploy.Stage{ID: 1, ModelStage: "thinker", TensorParallelSize: 2, DataParallelSize: 4,
		KV: &deploy.KVConfig{Connector: "NixlConnector", IP: "10.0.0.7"}}
	r := topology.Replica{EngineID: "decode-0", KVPort: 5600}
	got := thinkerPeer(s, r, "http://127.0.0.1:8001")
	want := kvconnector.Peer{EngineID: "decode-0", KVHost: "10.0.0.7", KVPort: 5600, HTTPAddr: "127.0.0.1:8001", TP: 2, DP: 4}
	if got != want {
		t.Errorf("peer %+v, want %+v", got, want)
	}
}

// An engine omnipd did not start listens where its own defaults say when
// its config names no port: the handoff must name that port, not 0.
func TestThinkerPeerOfAnEngineWithoutPortsUsesVLLMDefaults(t *testing.T) {
	for _, tt := range []struct {
		connector        string
		kvPort, notifyAt int
	}{
		{connector: "MooncakeConnector", kvPort: 8998},
		{connector: "P2pNcclConnector", kvPort: 14579},
		{connector: "MoRIIOConnector", kvPort: 6301, notifyAt: 61005},
	} {
		s := &deploy.Stage{ID: 0, ModelStage: "thinker", TensorParallelSize: 1, KV: &deploy.KVConfig{Connector: tt.connector}}
		r := topology.Replica{EngineID: "p0", Endpoint: "http://127.0.0.1:8100"}
		got := thinkerPeer(s, r, r.Endpoint)
		if got.KVPort != tt.kvPort || got.NotifyPort != tt.notifyAt {
			t.Errorf("%s engine without ports: KVPort %d, NotifyPort %d; want %d, %d", tt.connector, got.KVPort, got.NotifyPort, tt.kvPort, tt.notifyAt)
		}
	}
	// A port the config names, and a worker omnipd starts, keep theirs.
	s := &deploy.Stage{ModelStage: "thinker", KV: &deploy.KVConfig{Connector: "MooncakeConnector"}}
	if got := thinkerPeer(s, topology.Replica{Endpoint: "http://h:1", KVPort: 9000}, "http://h:1"); got.KVPort != 9000 {
		t.Errorf("configured port: KVPort %d, want 9000", got.KVPort)
	}
}
