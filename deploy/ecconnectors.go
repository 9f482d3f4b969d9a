package deploy

import (
	"slices"

	"github.com/omnipd/omnipd/topology"
)

// ecConnectorSpec is what encoder expansion writes into the encoder's and
// the prefill's ec_transfer_config for one EC connector, and what the two
// ends must agree on. Everything connector-specific about EC connectors in
// this package is here.
type ecConnectorSpec struct {
	name string
	// vllm: a connector of vLLM's (vllm/distributed/ec_transfer); the
	// others run only on omnipd's reference workers.
	vllm bool
	// extra is added to ec_connector_extra_config of both ends when absent.
	extra []param
	// storeKey is the ec_connector_extra_config key naming where the
	// producer leaves encoder outputs for the consumer to find, and
	// storeDefault the engine's value when it is absent; "" when the
	// connector has no such place.
	storeKey, storeDefault string
}

// ecConnectorSpecs are the EC connectors omnipd can run an encoder stage
// over (topology.KnownECConnectors; a test keeps the two lists equal).
var ecConnectorSpecs = []ecConnectorSpec{
	{
		// vLLM's example connector: the producer writes each item's
		// outputs to <shared_storage_path>/<mm_hash>/encoder_cache.safetensors
		// and the consumer loads them from there (example_connector.py,
		// default "/tmp"). The router needs to send nothing: both ends find
		// an item by its content hash. omnipd names the directory vLLM's
		// example scripts use, on both ends.
		name: "ECExampleConnector", vllm: true,
		extra:    []param{{"shared_storage_path", func() *Node { return newStr(ECExampleStoragePath, Pos{}) }}},
		storeKey: "shared_storage_path", storeDefault: "/tmp",
	},
	{
		// omnipd's reference encoder cache: the encoder worker keeps each
		// item's rows under its content hash and serves them on its own
		// HTTP API (package eccache), so it needs no setting of its own.
		name: DefaultECConnector,
	},
}

// DefaultECConnector is the EC connector an encoder stage gets when none
// is named and the Thinker's KV connector is omnipd's reference connector:
// omnipd's reference encoder cache, which runs on reference workers
// without a GPU.
const DefaultECConnector = "ReferenceECConnector"

// VLLMECConnector is the EC connector an encoder stage gets when none is
// named and the Thinker's KV connector is one of vLLM's: vLLM's own
// reference pathway for encoder disaggregation.
const VLLMECConnector = "ECExampleConnector"

// ECExampleStoragePath is the shared_storage_path encoder expansion gives
// ECExampleConnector when the config names none: the directory vLLM's
// example scripts use (EC_SHARED_STORAGE_PATH).
const ECExampleStoragePath = "/tmp/ec_cache"

func lookupECConnector(name string) (ecConnectorSpec, bool) {
	i := slices.IndexFunc(ecConnectorSpecs, func(s ecConnectorSpec) bool { return s.name == name })
	if i < 0 {
		return ecConnectorSpec{}, false
	}
	return ecConnectorSpecs[i], true
}

// ECConnectors lists the EC connectors encoder expansion can configure.
func ECConnectors() []string {
	var names []string
	for _, s := range ecConnectorSpecs {
		names = append(names, s.name)
	}
	return names
}

// defaultECConnector is the EC connector for a Thinker split over KV
// connector kv: the reference one for the reference KV connector, vLLM's
// otherwise, so that an encoder runs on the same kind of engine as the
// prefill it feeds.
func defaultECConnector(kv string) string {
	if kv == DefaultKVConnector {
		return DefaultECConnector
	}
	return VLLMECConnector
}

// IsVLLMECConnector reports whether name is an EC connector of vLLM's
// rather than omnipd's reference one.
func IsVLLMECConnector(name string) bool {
	spec, ok := lookupECConnector(name)
	return ok && spec.vllm
}

// ecStore is where ec's connector leaves encoder outputs for the other
// end (the engine's default when the config names none), and the field
// that says so; "", "" for connectors without such a setting.
func ecStore(ec *ECConfig) (store, field string) {
	spec, ok := lookupECConnector(ec.Connector)
	if !ok || spec.storeKey == "" {
		return "", ""
	}
	store = spec.storeDefault
	if v := ec.ExtraConfig.Get(spec.storeKey); v != nil && v.Kind == KindScalar {
		store = v.Value
	}
	return store, "ec_transfer_config.ec_connector_extra_config." + spec.storeKey
}

// ECSharedStorage is the directory stage s's EC connector shares with the
// other end (ECExampleConnector's shared_storage_path); ok is false when
// its connector shares none. Every instance of the encoder and the prefill
// must see the same directory: one host, or a shared filesystem.
func ECSharedStorage(s *Stage) (dir string, ok bool) {
	if s.EC == nil {
		return "", false
	}
	dir, _ = ecStore(s.EC)
	return dir, dir != ""
}

// ecRoles are the roles encoder expansion gives the two ends, as vLLM's
// example scripts do (disagg_1e1p1d_example.sh).
const (
	encoderECRole = topology.ECProducer
	prefillECRole = topology.ECConsumer
)
