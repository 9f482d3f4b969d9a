package deploy

import (
	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// ecConnectorSpec is what encoder expansion writes into the encoder's and
// the prefill's ec_transfer_config for one EC connector, and what the two
// ends must agree on: kvconnector's entry as this package applies it.
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

// DefaultECConnector is the EC connector an encoder stage gets when none
// is named and the Thinker's KV connector is omnipd's reference connector:
// omnipd's reference encoder cache, which runs on reference workers
// without a GPU.
const DefaultECConnector = kvconnector.ReferenceECConnector

// VLLMECConnector is the EC connector an encoder stage gets when none is
// named and the Thinker's KV connector is one of vLLM's: vLLM's own
// reference pathway for encoder disaggregation.
const VLLMECConnector = kvconnector.ECExampleConnector

// ECExampleStoragePath is the shared_storage_path encoder expansion gives
// ECExampleConnector when the config names none: the directory vLLM's
// example scripts use (EC_SHARED_STORAGE_PATH).
const ECExampleStoragePath = kvconnector.ECExampleStoragePath

func lookupECConnector(name string) (ecConnectorSpec, bool) {
	s, ok := kvconnector.SpecOf(name)
	if !ok || s.Transfer != kvconnector.EC || !s.Expandable {
		return ecConnectorSpec{}, false
	}
	return ecConnectorSpec{
		name:         s.Name,
		vllm:         s.VLLM,
		extra:        params(s.ExtraConfig),
		storeKey:     s.SharedStore.Key,
		storeDefault: s.SharedStore.Default,
	}, true
}

// ECConnectors lists the EC connectors encoder expansion can configure.
func ECConnectors() []string {
	return kvconnector.Names(kvconnector.EC, func(s kvconnector.Spec) bool { return s.Expandable })
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
