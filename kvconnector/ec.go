package kvconnector

// EC (encoder cache) connectors, which move an encoder stage's outputs to
// the prefill. The router sends nothing for them: both ends find an item's
// outputs by its content hash. They have facts (Spec) and no Contract.
const (
	// ECExampleConnector is vLLM's example EC connector
	// (vllm/distributed/ec_transfer): the producer writes each item's
	// outputs to <shared_storage_path>/<mm_hash>/encoder_cache.safetensors
	// and the consumer loads them from there (example_connector.py,
	// default "/tmp").
	ECExampleConnector = "ECExampleConnector"
	// ReferenceECConnector is omnipd's reference encoder cache: the encoder
	// worker keeps each item's rows under its content hash and serves them
	// on its own HTTP API (package eccache).
	ReferenceECConnector = "ReferenceECConnector"
)

// ECExampleStoragePath is the shared_storage_path encoder expansion gives
// ECExampleConnector when the config names none: the directory vLLM's
// example scripts use (EC_SHARED_STORAGE_PATH).
const ECExampleStoragePath = "/tmp/ec_cache"

func ecExampleSpec() Spec {
	return Spec{
		Name: ECExampleConnector, Transfer: EC, VLLM: true, Expandable: true,
		ExtraConfig: []Setting{{"shared_storage_path", ECExampleStoragePath}},
		SharedStore: SharedStore{Key: "shared_storage_path", Default: "/tmp"},
	}
}

// referenceECSpec needs no setting of its own.
func referenceECSpec() Spec {
	return Spec{Name: ReferenceECConnector, Transfer: EC, Expandable: true}
}
