package kvconnector

// Spec is one connector's registry entry as plain data: everything a
// package other than the router needs to know about it — which kv_role
// each side takes, which side listens on which port and where the engine
// reads it, the environment vllm serve needs, which parallelism omnipd can
// route, and what a decode sent alone does. topology validates against it,
// deploy expands PD from it, vllmplan and kube render engines from it and
// serve builds its handoff peers from it; none of them keeps a list of
// connector names. Adding a connector is one Spec (and, for a KV
// connector, one Factory) in one file of this package, listed in builtins.
type Spec struct {
	// Name is the connector class as kv_transfer_config.kv_connector (or
	// ec_transfer_config.ec_connector) spells it.
	Name string
	// Transfer is what the connector moves: a prompt's KV cache from the
	// prefill to the decode, or encoder outputs from the encoder to the
	// prefill.
	Transfer Transfer
	// VLLM: the connector is one of vLLM's, which vllm serve runs. The
	// others are omnipd's own, which only its reference workers run.
	VLLM bool
	// Expandable: PD expansion can write both sides' kv_transfer_config
	// from this entry. MultiConnector is not: its children are the
	// config's to name, so its prefill and decode stages are written by
	// hand.
	Expandable bool
	// Roles are the kv_role values PD expansion gives the prefill and the
	// decode: the ones vLLM's own examples use for the connector.
	Roles Roles
	// BufferDevice is the kv_buffer_device PD expansion writes when the
	// config names none; "" leaves it to the engine.
	BufferDevice string
	// KVIP is the kv_ip PD expansion writes when the config names none; ""
	// leaves it to the engine.
	KVIP string
	// ExtraConfig are kv_connector_extra_config (ec_connector_extra_config)
	// entries PD or encoder expansion adds, in this order, when the config
	// has none of that key.
	ExtraConfig []Setting
	// Ports says where the engines listen and how their ports are laid out.
	Ports Ports
	// ExpansionEnv are variables PD expansion writes into both sides' env
	// when absent: defaults the config may override.
	ExpansionEnv []Setting
	// Env are the variables the plan sets on every vllm serve instance of
	// the sides they name, over the stage's own env.
	Env []EnvVar
	// DataParallel: omnipd can route a PD stage of data_parallel_size > 1
	// over the connector, pinning each leg to a DP rank
	// (X-data-parallel-rank). That needs a handoff built from the prefill
	// rank's answer (NIXL's names its rank's engine id and side channel);
	// the others' decode parameters are built before the prefill answers
	// and name no rank.
	DataParallel bool
	// EngineIDFromAnswer: the prefill's answer names its engine id
	// (remote_engine_id), so the router need not know it in advance and
	// every instance may take its own (on Kubernetes: the pod's name).
	// Otherwise every instance of a role answers to the stage's one id,
	// which the router names from configuration.
	EngineIDFromAnswer bool
	// ClaimsEveryPrompt: the consumer claims every prompt's KV from a
	// remote producer, whatever the decode leg carries
	// (PromptClaimer), so a decode must never be sent without its prefill.
	// DecodeAlone says what such a decode does, for errors.
	ClaimsEveryPrompt bool
	DecodeAlone       string
	// SharedAddress, when set, says why several instances of one role
	// behind one address (a Kubernetes Service) get the handoff wrong: the
	// router names an instance's own side channel from configuration, so
	// the address must lead to the one instance that served the leg.
	SharedAddress string
	// SharedStore is where an EC connector's producer leaves encoder
	// outputs for its consumer to find; zero when it has no such place.
	SharedStore SharedStore
}

// Transfer is what a connector moves between engines.
type Transfer int

const (
	// KV: a prompt's KV cache, prefill to decode (kv_transfer_config).
	KV Transfer = iota
	// EC: encoder outputs, encoder to prefill (ec_transfer_config).
	EC
)

func (t Transfer) String() string {
	if t == EC {
		return "EC"
	}
	return "KV"
}

// Sides is a set of the two ends of a prefill/decode pair.
type Sides uint8

const (
	// PrefillSide is the prefill stage (the KV producer).
	PrefillSide Sides = 1 << iota
	// DecodeSide is the decode stage (the KV consumer).
	DecodeSide
	// BothSides is every stage of the connector, colocated ones too.
	BothSides = PrefillSide | DecodeSide
)

// Has reports whether s holds every side of o.
func (s Sides) Has(o Sides) bool { return s&o == o }

// Roles are the kv_role values of the two sides.
type Roles struct {
	Producer, Consumer string
}

// Setting is one key and its default: a string, bool or int.
type Setting struct {
	Key   string
	Value any
}

// Ports is a connector's side-channel port layout.
type Ports struct {
	// Key is where the engine's config holds the instance's KV port:
	// "kv_port" of kv_transfer_config, or, InExtraConfig, a key of
	// kv_connector_extra_config. "" when the connector has no port.
	Key           string
	InExtraConfig bool
	// EnvOnly: the engine reads the port only from an Env variable
	// (EnvKVPort), so the plan leaves Key out of --kv-transfer-config
	// (the deploy config keeps it there for omnipd serve to read).
	EnvOnly bool
	// Base is the first instance's port PD expansion gives when the config
	// chooses none: the engine's own default where it has one, counted up
	// per instance so that several share a host.
	Base int
	// Listens are the sides whose engines listen on the port; the other
	// side connects to the address the handoff names.
	Listens Sides
	// PerRank: each TP rank of an instance listens on this many ports
	// counted from the instance's port (the engine adds its rank), so
	// instances are PerRank × TP ports apart; 0: one port per engine
	// whatever its TP (the handshake names the rank). Every DP rank is an
	// engine of its own and counts on from there.
	PerRank int
	// NotifyKey is a second per-instance port of kv_connector_extra_config
	// (MoRIIO's notify_port), TP ports after the first; "" for none.
	NotifyKey string
	// HTTPPortKey is a key of kv_connector_extra_config where the engine
	// reads its own HTTP port (MoRIIO's http_port, which it has no default
	// for); "" for none.
	HTTPPortKey string
	// EngineDefault and NotifyEngineDefault are the ports an engine listens
	// on when its config names none, for a connector whose handoff the
	// router builds from configuration: an engine omnipd did not start is
	// reached there. 0 where the prefill's answer names its own side
	// channel (NIXL) or the connector has no port.
	EngineDefault, NotifyEngineDefault int
}

// EnvVar is one variable of a vllm serve instance.
type EnvVar struct {
	Name string
	// From says how the value derives from the instance.
	From EnvSource
	// Value is the value when From is EnvLiteral.
	Value string
	// Sides are the stages that get it: the prefill, the decode, or
	// BothSides for every stage of the connector.
	Sides Sides
}

// EnvSource is where an EnvVar's value comes from.
type EnvSource int

const (
	// EnvLiteral: Value, on every instance.
	EnvLiteral EnvSource = iota
	// EnvKVPort: the instance's KV port; unset when it has none.
	EnvKVPort
	// EnvListenHost: the address the instance listens on.
	EnvListenHost
	// EnvKVHost: the instance's kv_ip (127.0.0.1 when unset), the address
	// the router names for it in a handoff.
	EnvKVHost
)

// IsAddress reports whether e holds the instance's own address, which a
// renderer that cannot know it in advance (a Kubernetes pod) fills in at
// start.
func (e EnvVar) IsAddress() bool { return e.From == EnvListenHost || e.From == EnvKVHost }

// SharedStore is where an EC connector's producer leaves encoder outputs
// for its consumer to find.
type SharedStore struct {
	// Key is the ec_connector_extra_config key naming the place, and
	// Default the engine's value when it is absent.
	Key, Default string
}

// Specs returns every built-in connector's entry, KV connectors first, in
// the order errors list them. Each call returns new values.
func Specs() []Spec {
	bs := builtins(nil)
	out := make([]Spec, len(bs))
	for i, b := range bs {
		out[i] = b.spec
	}
	return out
}

// SpecOf returns the built-in entry of the connector name; ok is false for
// a name no built-in has.
func SpecOf(name string) (spec Spec, ok bool) {
	for _, s := range Specs() {
		if s.Name == name {
			return s, true
		}
	}
	return Spec{}, false
}

// Names lists the built-in connectors that move transfer t and satisfy
// keep (nil keeps every one), in the order errors list them.
func Names(t Transfer, keep func(Spec) bool) []string {
	var names []string
	for _, s := range Specs() {
		if s.Transfer == t && (keep == nil || keep(s)) {
			names = append(names, s.Name)
		}
	}
	return names
}

// EngineDefaultPorts are the ports an engine of the connector listens on
// when its kv_transfer_config names none (Ports.EngineDefault and
// Ports.NotifyEngineDefault); zero for a connector whose prefill answers
// with its own side channel (NIXL) or that needs none.
func EngineDefaultPorts(connector string) (kvPort, notifyPort int) {
	s, _ := SpecOf(connector)
	return s.Ports.EngineDefault, s.Ports.NotifyEngineDefault
}

// entry is one built-in: its facts and, for a KV connector, the factory of
// its contract.
type entry struct {
	spec    Spec
	factory Factory
}

// builtins is the one list of built-in connectors, in the order errors
// list them. r is the registry MultiConnector builds its children through
// (nil when only the specs are wanted).
func builtins(r *Registry) []entry {
	return []entry{
		{mooncakeSpec(), mooncake},
		{nixlSpec(), nixl},
		{p2pNcclSpec(), p2pNccl},
		{lmcacheSpec(), lmcache},
		{moriioSpec(), moriio},
		{multiSpec(), r.multi},
		{referenceSpec(), reference},
		{ecExampleSpec(), nil},
		{referenceECSpec(), nil},
	}
}

// keepRequestIDs: connectors that match a transfer by the request id
// string need vLLM to keep the id the router sent instead of appending a
// random suffix.
const keepRequestIDs = "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"

// kvRoles are the roles of a connector with a one-way producer and
// consumer.
var kvRoles = Roles{Producer: "kv_producer", Consumer: "kv_consumer"}
