package vllmplan

import (
	"cmp"
	"fmt"

	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/topology"
)

// Encoder disaggregation (E/P/D) on vllm serve: everything the vllm plan
// does for EC connectors is here. vLLM starts the encoder instance with
// --ec-transfer-config (ec_role ec_producer), the prefill with
// --ec-transfer-config (ec_role ec_consumer) beside its
// --kv-transfer-config, and the decode with its --kv-transfer-config
// alone (examples/online_serving/disaggregated_encoder/disagg_1e1p1d_example.sh).

// checkECConnector refuses EC connectors vllm serve does not have.
func checkECConnector(s *deploy.Stage) error {
	if s.EC == nil || deploy.IsVLLMECConnector(s.EC.Connector) {
		return nil
	}
	return fmt.Errorf("stage %d: ec_connector %s is not a vLLM EC connector; use %s (pd.encoder.ec_connector), or run reference workers with omnipd serve",
		s.ID, s.EC.Connector, deploy.VLLMECConnector)
}

// ECTransferJSON is the --ec-transfer-config of replica r of stage s: the
// stage's ec_transfer_config with the instance's engine id, which is the
// replica's for an encoder, and for a prefill the config's own engine_id
// or else the replica's (its KV engine id). It is "" for a stage without
// an EC connector. omnipd serve gives reference workers the same JSON.
func ECTransferJSON(s *deploy.Stage, r topology.Replica) (string, error) {
	ec := s.EC
	if ec == nil {
		return "", nil
	}
	n := &deploy.Node{Kind: deploy.KindMap}
	n.Set("ec_connector", str(ec.Connector))
	n.Set("ec_role", str(ec.Role))
	engineID := cmp.Or(ec.EngineID, r.EngineID)
	if s.KV == nil {
		engineID = cmp.Or(r.EngineID, ec.EngineID)
	}
	if engineID != "" {
		n.Set("engine_id", str(engineID))
	}
	if ec.ExtraConfig != nil {
		n.Set("ec_connector_extra_config", ec.ExtraConfig.Clone())
	}
	if ec.Other != nil {
		for i, k := range ec.Other.Keys {
			n.Set(k.Value, ec.Other.Values[i].Clone())
		}
	}
	b, err := n.MarshalJSON()
	return string(b), err
}

// ecNotes says where a shared-storage EC connector keeps the encoder
// outputs: vLLM's ECExampleConnector writes each item's outputs to
// <shared_storage_path>/<mm_hash>/ and never deletes them, so every
// encoder and prefill instance must see one directory, which grows until
// it is cleared.
func ecNotes(doc *deploy.Document) []string {
	var notes []string
	for _, s := range doc.Stages {
		if s.Role != topology.RoleEncoder {
			continue
		}
		dir, ok := deploy.ECSharedStorage(s)
		if !ok {
			continue
		}
		notes = append(notes, fmt.Sprintf("stage %d: %s keeps every encoder output under %s (shared_storage_path), one directory per media item, and never deletes one: every encoder and prefill instance must see that directory, and it grows until you clear it",
			s.ID, s.EC.Connector, dir))
	}
	return notes
}
