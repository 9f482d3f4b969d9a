package kvconnector

// lmcache: content-addressed. The prefill stores KV under the hash of the
// token content and the decode finds it by the same hash; the router only
// orders the legs.
func lmcache(map[string]any) (Contract, error) {
	return &contract{name: LMCacheConnectorV1, dispatch: Sequential}, nil
}
