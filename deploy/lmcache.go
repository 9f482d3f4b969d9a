package deploy

import (
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// LMCache's PD mode, as PD expansion writes it. LMCache copies every
// "lmcache."-prefixed key of kv_connector_extra_config into its own config
// (vllm_v1_adapter.py _apply_extra_config), so both engines are configured
// here, where omnipd serve reads the same keys: the prefill's enable_pd
// selects the router's contract and its pd_proxy_host:pd_proxy_port is where
// serve receives the done notices.
const (
	// lmcachePDBasePort is a receiver's first port: its NIXL init ports
	// count up from the instance's KV port, its ZMQ alloc ports follow (the
	// example configs' pd_peer_init_port 7300 and pd_peer_alloc_port 7400
	// are one TP-1 receiver's; omnipd packs both ranges per instance).
	lmcachePDBasePort = 7300
	// LMCachePDProxyPort is where omnipd serve receives the senders' done
	// notices unless the config says otherwise: the example prefiller
	// config's pd_proxy_port. One per deployment: every prefill pushes
	// there.
	LMCachePDProxyPort = 7500
	lmcacheLoopback    = "127.0.0.1"
	// The example configs' buffers: 1 GB on the sender, 2 GB on the
	// receiver, which holds the pushed chunks until its decode reads them.
	lmcacheSenderBuffer   = 1 << 30
	lmcacheReceiverBuffer = 2 << 30
)

// lmcachePD reports whether kv selects LMCache's PD mode: lmcache.enable_pd
// true (or its spelling as a string) in its kv_connector_extra_config.
func lmcachePD(kv *KVConfig) bool {
	if kv == nil || kv.Connector != kvconnector.LMCacheConnectorV1 {
		return false
	}
	v := kv.ExtraConfig.Get("lmcache.enable_pd")
	if v == nil || v.Kind != KindScalar {
		return false
	}
	b, err := strconv.ParseBool(strings.ToLower(v.Value))
	return err == nil && b
}

// LMCachePD reports whether stage s runs LMCache's PD mode
// (lmcache.enable_pd), read as LMCache and omnipd serve read it.
func LMCachePD(s *Stage) bool { return lmcachePD(s.KV) }

// LMCacheReceiverPorts are the pd_peer_init_port and pd_peer_alloc_port of
// LMCache PD receiver replica r of stage s, one port per TP rank: the ports
// the router names in the prefill leg's disagg_spec for that instance
// (kvconnector.LMCacheReceiverPorts). Nil for any other stage.
func LMCacheReceiverPorts(s *Stage, r topology.Replica) (initPorts, allocPorts []int) {
	if s.Role != topology.RoleDecode || !lmcachePD(s.KV) || r.KVPort == 0 {
		return nil, nil
	}
	peer := kvconnector.Peer{KVPort: r.KVPort, TP: s.TensorParallelSize}
	for rank := range max(1, s.TensorParallelSize) {
		i, a := kvconnector.LMCacheReceiverPorts(peer, rank)
		initPorts, allocPorts = append(initPorts, i), append(allocPorts, a)
	}
	return initPorts, allocPorts
}

// lmcachePDSpec is LMCache's spec in PD mode. Only the receiver listens: per
// TP rank a NIXL init port and a ZMQ alloc port, so instances are 2 × TP
// ports apart; the sender connects to the receiver the prefill leg names.
func lmcachePDSpec(spec kvConnectorSpec) kvConnectorSpec {
	spec.basePort = lmcachePDBasePort
	spec.decodeListens = true
	spec.prefillConnects = true
	spec.portKey = "kv_port"
	spec.portsPerRank = 2
	return spec
}

// writeLMCachePD writes what LMCache's PD backend reads on each side
// (pd_backend.py PDConfig.from_cache_engine_config, config.py
// _validate_config), with the example configs' defaults for what the config
// leaves out. The roles, the receiver's host and its ports are the router's
// contract, so expansion always writes them: pd_peer_host is the decode's
// kv_ip as omnipd serve sends it (loopback when unset), and the ports are the
// first instance's (the vllm plan writes each instance its own).
func writeLMCachePD(prefill, decode *Stage) {
	for _, s := range []*Stage{prefill, decode} {
		if s.KV.ExtraConfig == nil {
			s.KV.ExtraConfig = newMap(Pos{})
		}
		x := s.KV.ExtraConfig
		setAbsent(x, "lmcache.enable_pd", newBool(true, Pos{}))
		setAbsent(x, "lmcache.transfer_channel", newStr("nixl", Pos{}))
		setAbsent(x, "lmcache.pd_buffer_device", newStr("cuda", Pos{}))
		// The PD buffer replaces LMCache's CPU cache, which the example
		// configs turn off.
		setAbsent(x, "lmcache.local_cpu", newBool(false, Pos{}))
		setAbsent(x, "lmcache.max_local_cpu_size", newInt(0, Pos{}))
		setAbsent(x, "lmcache.nixl_backends", strSeq("UCX"))
	}
	p := prefill.KV.ExtraConfig
	p.Set("lmcache.pd_role", newStr("sender", Pos{}))
	setAbsent(p, "lmcache.pd_buffer_size", newInt(lmcacheSenderBuffer, Pos{}))
	setAbsent(p, "lmcache.pd_proxy_host", newStr(lmcacheLoopback, Pos{}))
	setAbsent(p, "lmcache.pd_proxy_port", newInt(LMCachePDProxyPort, Pos{}))

	d := decode.KV.ExtraConfig
	d.Set("lmcache.pd_role", newStr("receiver", Pos{}))
	setAbsent(d, "lmcache.pd_buffer_size", newInt(lmcacheReceiverBuffer, Pos{}))
	host := decode.KV.IP
	if host == "" {
		host = lmcacheLoopback
	}
	d.Set("lmcache.pd_peer_host", newStr(host, Pos{}))
	if len(decode.Replicas) > 0 {
		initPorts, allocPorts := LMCacheReceiverPorts(decode, decode.Replicas[0])
		d.Set("lmcache.pd_peer_init_port", intSeq(initPorts))
		d.Set("lmcache.pd_peer_alloc_port", intSeq(allocPorts))
	}
}

func setAbsent(m *Node, key string, v *Node) {
	if m.Get(key) == nil {
		m.Set(key, v)
	}
}

func strSeq(xs ...string) *Node {
	n := newSeq(Pos{})
	for _, x := range xs {
		n.Items = append(n.Items, newStr(x, Pos{}))
	}
	return n
}
