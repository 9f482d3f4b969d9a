package deploy

import (
	"slices"
	"strconv"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// kvConnectorSpec is what PD expansion injects into the prefill's and the
// decode's kv_transfer_config for one vLLM KV connector.
type kvConnectorSpec struct {
	name string
	// producerRole and consumerRole are the kv_role values vLLM's own
	// examples use for the connector.
	producerRole string
	consumerRole string
	// basePort is the first side-channel port (0: the connector has none).
	basePort int
	// decodeListens: decode instances need a port of their own too.
	decodeListens bool
	// portKey is where the port goes in kv_transfer_config: "kv_port", or a
	// key of kv_connector_extra_config.
	portKey      string
	portInExtra  bool
	bufferDevice string
	// extra is added to kv_connector_extra_config when absent.
	extra []param
	// ip is the default kv_ip; empty leaves it to the engine.
	ip string
	// env is added to both sides' env when absent.
	env []param
	// portsPerRank: each TP rank of an instance listens on this many ports
	// counted from the instance's KV port (the engine adds its rank), so
	// instances are spaced portsPerRank × TP apart; 0 counts up by one.
	portsPerRank int
	// notifyKey is a second per-instance port of kv_connector_extra_config
	// (MoRIIO's notify_port), TP ports after the KV port.
	notifyKey string
	// prefillConnects: only the decode listens; the prefill connects to
	// the address its leg names (LMCache PD's sender).
	prefillConnects bool
}

// Connectors that match a transfer by the request id string need vLLM to
// keep the id the router sent instead of appending a random suffix.
var keepRequestIDs = []param{{"VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", func() *Node { return newStr("1", Pos{}) }}}

// kvConnectorSpecs are the connectors PD expansion knows. Default ports are
// the engines' own defaults (VLLM_MOONCAKE_BOOTSTRAP_PORT 8998,
// VLLM_NIXL_SIDE_CHANNEL_PORT 5600), counted up per instance so that several
// instances can share a host.
var kvConnectorSpecs = []kvConnectorSpec{
	{
		name: "MooncakeConnector", producerRole: topology.KVProducer, consumerRole: topology.KVConsumer,
		basePort: 8998, portKey: "mooncake_bootstrap_port", portInExtra: true,
	},
	{
		name: "NixlConnector", producerRole: topology.KVBoth, consumerRole: topology.KVBoth,
		basePort: 5600, decodeListens: true, portKey: "kv_port", bufferDevice: "cuda",
	},
	{
		// The engine binds tcp://<VLLM_HOST_IP>:<kv_port + TP rank>.
		name: "P2pNcclConnector", producerRole: topology.KVProducer, consumerRole: topology.KVConsumer,
		basePort: 21001, decodeListens: true, portKey: "kv_port", portsPerRank: 1,
		extra: []param{{"send_type", func() *Node { return newStr("PUT_ASYNC", Pos{}) }}},
		env:   keepRequestIDs,
	},
	{
		// PD mode (lmcache.enable_pd) adds its ports and keys: lmcache.go.
		name: "LMCacheConnectorV1", producerRole: topology.KVProducer, consumerRole: topology.KVConsumer,
		env: []param{lmcacheHashSeed},
	},
	{
		// vLLM's MoRIIO (moriio_common.py MoRIIOConfig) reads handshake_port
		// and notify_port (each TP rank adds its rank) and proxy_ip,
		// proxy_ping_port and http_port without defaults. READ mode is
		// routed sequentially, so a prefill that fails never leaves a decode
		// waiting for writes. An empty proxy_ip keeps the engine from
		// pinging a discovery proxy: omnipd routes from this config.
		name: "MoRIIOConnector", producerRole: topology.KVProducer, consumerRole: topology.KVConsumer,
		basePort: 6301, decodeListens: true, portKey: "handshake_port", portInExtra: true,
		portsPerRank: 2, notifyKey: "notify_port",
		extra: []param{
			{"read_mode", func() *Node { return newBool(true, Pos{}) }},
			{"proxy_ip", func() *Node { return newStr("", Pos{}) }},
			{"proxy_ping_port", func() *Node { return newInt(0, Pos{}) }},
		},
		env: keepRequestIDs,
	},
	{
		name: "ReferenceConnector", producerRole: topology.KVProducer, consumerRole: topology.KVConsumer,
		basePort: 17100, decodeListens: true, portKey: "kv_port", ip: "127.0.0.1",
		extra: []param{{"handshake", func() *Node { return newStr("pull", Pos{}) }}},
	},
}

// DefaultKVConnector is the connector PD expansion uses when none is named:
// the reference connector, which runs without a GPU.
const DefaultKVConnector = "ReferenceConnector"

func lookupKVConnector(name string) (kvConnectorSpec, bool) {
	i := slices.IndexFunc(kvConnectorSpecs, func(s kvConnectorSpec) bool { return s.name == name })
	if i < 0 {
		return kvConnectorSpec{}, false
	}
	return kvConnectorSpecs[i], true
}

// KVConnectors lists the connectors PD expansion can configure.
func KVConnectors() []string {
	var names []string
	for _, s := range kvConnectorSpecs {
		names = append(names, s.name)
	}
	return names
}

// kvBasePort is the port a stage's first instance listens on, as its
// kv_transfer_config says; 0 when it says none.
func kvBasePort(kv *KVConfig) int {
	if kv == nil {
		return 0
	}
	if spec, ok := lookupKVConnector(kv.Connector); ok && spec.portInExtra {
		if v := kv.ExtraConfig.Get(spec.portKey); v != nil && v.Tag == "!!int" {
			n, _ := strconv.Atoi(v.Value)
			return n
		}
		return 0
	}
	return kv.Port
}

// KVPortsChosen reports whether the stage's KV side-channel ports
// (Replicas[i].KVPort) are the config's choice — written in pd: (kv_port,
// prefill.kv_port, decode.kv_port), in the stage's kv_transfer_config or
// its replicas — rather than the connector's default ports that PD
// expansion counted up, or none at all. A host that runs several
// deployments can move the ports nobody chose; a chosen port is a promise
// to whoever configured the peers.
func (s *Stage) KVPortsChosen() bool {
	if s.kvPortsDefaulted {
		return false
	}
	for _, r := range s.Replicas {
		if r.KVPort == 0 {
			return false
		}
	}
	return len(s.Replicas) > 0
}

// kvPortStride is how far apart PD expansion puts the KV ports of a stage's
// instances: every TP rank's ports must be the instance's own, and so must
// every DP rank's. A DP rank is an engine of its own and listens where a
// whole instance of dp 1 would, counted on from the instance's port (NIXL:
// VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index, one side channel per
// engine whatever its TP, since the handshake names the TP rank).
func kvPortStride(spec kvConnectorSpec, tp, dp int) int {
	perEngine := 1
	if spec.portsPerRank != 0 {
		perEngine = spec.portsPerRank * max(1, tp)
	}
	return perEngine * max(1, dp)
}

// MoRIIONotifyPort is the notify_port of MoRIIO replica r of stage s: the
// stage's notify_port moved as far as the replica's handshake port is from
// the stage's, or, when the config says none, TP ports after the
// replica's handshake port (PD expansion's layout). 0 for other connectors.
func MoRIIONotifyPort(s *Stage, r topology.Replica) int {
	if s.KV == nil || s.KV.Connector != kvconnector.MoRIIOConnector || r.KVPort == 0 {
		return 0
	}
	notify, base := extraInt(s.KV, "notify_port"), extraInt(s.KV, "handshake_port")
	if notify == 0 || base == 0 {
		return kvconnector.MoRIIONotifyPort(kvconnector.Peer{KVPort: r.KVPort, TP: s.TensorParallelSize})
	}
	return notify + r.KVPort - base
}

func extraInt(kv *KVConfig, key string) int {
	if v := kv.ExtraConfig.Get(key); v != nil {
		if n, err := strconv.Atoi(v.Value); err == nil {
			return n
		}
	}
	return 0
}
