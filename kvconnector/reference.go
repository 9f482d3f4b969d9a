package kvconnector

import "fmt"

// reference is omnipd's own connector (package worker). Its
// kv_connector_extra_config.handshake picks the shape; absent means pull, as
// the worker defaults.
func reference(extra map[string]any) (Contract, error) {
	h, ok := extra["handshake"]
	if !ok {
		return &referenceContract{pull(ReferenceConnector)}, nil
	}
	switch h {
	case "pull":
		return &referenceContract{pull(ReferenceConnector)}, nil
	case "push":
		return &referenceContract{push(ReferenceConnector)}, nil
	}
	return nil, fmt.Errorf("%w: kv_connector_extra_config.handshake is %s; want \"pull\" or \"push\"", ErrInvalidConfig, describe(h))
}

// referenceContract is the reference connector's contract, which also names
// the key its producer leases a request's KV under.
type referenceContract struct{ *contract }

var _ Releaser = (*referenceContract)(nil)

// LeaseKey: the transfer id the push legs rendezvous on, or the prefill
// leg's request id, which keys a pull (the worker's kv_transfer_params
// remote_request_id).
func (c *referenceContract) LeaseKey(h Handoff) string {
	if c.dispatch == Concurrent {
		return h.TransferID
	}
	pid, _ := c.RequestIDs(h)
	return pid
}

// referenceSpec: omnipd's own connector (package worker), which reference
// workers run without a GPU; both sides listen on loopback from 17100.
func referenceSpec() Spec {
	return Spec{
		Name: ReferenceConnector, Transfer: KV, Expandable: true,
		Roles:       kvRoles,
		KVIP:        "127.0.0.1",
		ExtraConfig: []Setting{{"handshake", "pull"}},
		Ports:       Ports{Key: "kv_port", Base: 17100, Listens: BothSides},
	}
}
