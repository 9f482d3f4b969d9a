package deploy

import (
	"fmt"
	"strconv"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// kvConnectorSpec is what PD expansion injects into the prefill's and the
// decode's kv_transfer_config for one KV connector: kvconnector's entry
// (kvconnector.Spec) as this package applies it.
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

// kvConnectorSpecOf is what PD expansion makes of connector entry s.
func kvConnectorSpecOf(s kvconnector.Spec) kvConnectorSpec {
	return kvConnectorSpec{
		name:          s.Name,
		producerRole:  s.Roles.Producer,
		consumerRole:  s.Roles.Consumer,
		basePort:      s.Ports.Base,
		decodeListens: s.Ports.Listens.Has(kvconnector.DecodeSide),
		portKey:       s.Ports.Key,
		portInExtra:   s.Ports.InExtraConfig,
		bufferDevice:  s.BufferDevice,
		extra:         params(s.ExtraConfig),
		ip:            s.KVIP,
		env:           params(s.ExpansionEnv),
		portsPerRank:  s.Ports.PerRank,
		notifyKey:     s.Ports.NotifyKey,
	}
}

// params are settings as nodes this package writes.
func params(settings []kvconnector.Setting) []param {
	var ps []param
	for _, s := range settings {
		ps = append(ps, param{s.Key, func() *Node { return settingNode(s.Value) }})
	}
	return ps
}

// settingNode is a setting's default as a node: a string, bool or int.
func settingNode(v any) *Node {
	switch v := v.(type) {
	case bool:
		return newBool(v, Pos{})
	case int:
		return newInt(v, Pos{})
	case string:
		return newStr(v, Pos{})
	}
	panic(fmt.Sprintf("deploy: a connector setting of type %T", v)) // kvconnector's entries hold strings, bools and ints
}

// DefaultKVConnector is the connector PD expansion uses when none is named:
// the reference connector, which runs without a GPU.
const DefaultKVConnector = kvconnector.ReferenceConnector

// lookupKVConnector is the spec of a KV connector PD expansion can
// configure.
func lookupKVConnector(name string) (kvConnectorSpec, bool) {
	s, ok := kvconnector.SpecOf(name)
	if !ok || s.Transfer != kvconnector.KV || !s.Expandable {
		return kvConnectorSpec{}, false
	}
	return kvConnectorSpecOf(s), true
}

// knownKVConnector reports whether omnipd routes KV connector name, whether
// or not PD expansion can write it.
func knownKVConnector(name string) bool {
	s, ok := kvconnector.SpecOf(name)
	return ok && s.Transfer == kvconnector.KV
}

// KVConnectors lists the connectors PD expansion can configure.
func KVConnectors() []string {
	return kvconnector.Names(kvconnector.KV, func(s kvconnector.Spec) bool { return s.Expandable })
}

// connectorSupport is what topology validation knows of the connectors:
// kvconnector's entries.
func connectorSupport() topology.ConnectorSupport {
	var c topology.ConnectorSupport
	for _, s := range kvconnector.Specs() {
		switch s.Transfer {
		case kvconnector.KV:
			c.KV = append(c.KV, topology.KVConnectorSupport{Name: s.Name, DataParallel: s.DataParallel})
		case kvconnector.EC:
			c.EC = append(c.EC, s.Name)
		}
	}
	return c
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

// NotifyPort is the second port (kvconnector.Ports.NotifyKey, MoRIIO's
// notify_port) of replica r of stage s: the stage's moved as far as the
// replica's KV port is from the stage's, or, when the config says none, TP
// ports after the replica's KV port (PD expansion's layout). 0 for
// connectors without one.
func NotifyPort(s *Stage, r topology.Replica) int {
	if s.KV == nil || r.KVPort == 0 {
		return 0
	}
	spec, ok := kvconnector.SpecOf(s.KV.Connector)
	if !ok || spec.Ports.NotifyKey == "" {
		return 0
	}
	notify, base := extraInt(s.KV, spec.Ports.NotifyKey), extraInt(s.KV, spec.Ports.Key)
	if notify == 0 || base == 0 {
		return kvconnector.MoRIIONotifyPort(kvconnector.Peer{KVPort: r.KVPort, TP: s.TensorParallelSize})
	}
	return notify + r.KVPort - base
}

// OnSides reports whether stage s takes what its connector gives sides:
// BothSides is every stage of the connector, a single side only the
// stage of that role.
func OnSides(s *Stage, sides kvconnector.Sides) bool {
	switch {
	case sides == kvconnector.BothSides:
		return true
	case s.Role == topology.RolePrefill:
		return sides.Has(kvconnector.PrefillSide)
	case s.Role == topology.RoleDecode:
		return sides.Has(kvconnector.DecodeSide)
	}
	return false
}

// KVHost is the address omnipd names for an instance of stage s in a
// handoff (a P2pNccl request id, a Mooncake bootstrap address): its kv_ip,
// or 127.0.0.1 when the config names none. Engines whose connector binds
// on an environment variable (kvconnector.EnvKVHost) are told it.
func KVHost(s *Stage) string {
	if s.KV != nil && s.KV.IP != "" {
		return s.KV.IP
	}
	return "127.0.0.1"
}

func extraInt(kv *KVConfig, key string) int {
	if v := kv.ExtraConfig.Get(key); v != nil {
		if n, err := strconv.Atoi(v.Value); err == nil {
			return n
		}
	}
	return 0
}
