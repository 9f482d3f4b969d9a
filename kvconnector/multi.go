package kvconnector

import (
	"fmt"
	"strings"
)

// multiContract is vLLM's MultiConnector as the router sees it: the contract
// of its one PD child. vLLM hands every child the same kv_transfer_params and
// merges what the children return (a key two return is an error:
// multi_connector.py _aggregate_request_finished, at 00f4240e), so the other
// children (typically an LMCache offload tier) must be invisible to the
// router.
type multiContract struct {
	Contract // the PD child
}

var (
	_ Contract      = multiContract{}
	_ PromptClaimer = multiContract{}
)

// ClaimsEveryPrompt is the PD child's: vLLM's MultiConnector gives a
// request to the first child that matches tokens for it
// (multi_connector.py get_num_new_matched_tokens, at 00f4240e), so a child
// that claims every prompt claims it inside a MultiConnector too.
func (m multiContract) ClaimsEveryPrompt() bool {
	pc, ok := m.Contract.(PromptClaimer)
	return ok && pc.ClaimsEveryPrompt()
}

// Name names the PD child too, so that logs say which contract routed.
func (m multiContract) Name() string {
	return MultiConnector + "(" + m.Contract.Name() + ")"
}

// multi builds MultiConnector from kv_connector_extra_config.connectors, a
// list of child kv_transfer_configs ({"kv_connector": ..., "kv_connector_extra_config": {...}}),
// each built through this registry.
//
// The PD child is the one child that involves the router: one that sends or
// requires kv_transfer_params, or couples the request ids. When every child
// is content-addressed, the first one's (sequential, no params) is used.
func (r *Registry) multi(extra map[string]any) (Contract, error) {
	raw, ok := extra["connectors"]
	if !ok {
		return nil, fmt.Errorf("%w: kv_connector_extra_config.connectors is unset; list the child connectors", ErrInvalidConfig)
	}
	list, ok := raw.([]any)
	if !ok || len(list) == 0 {
		return nil, fmt.Errorf("%w: kv_connector_extra_config.connectors is %s; want a non-empty list of child kv_transfer_configs", ErrInvalidConfig, describe(raw))
	}
	var children []Contract
	var pd []int
	for i, item := range list {
		field := fmt.Sprintf("kv_connector_extra_config.connectors[%d]", i)
		cfg, ok := item.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%w: %s is %s; want an object with kv_connector", ErrInvalidConfig, field, describe(item))
		}
		name, ok := cfg["kv_connector"].(string)
		if !ok || name == "" {
			return nil, fmt.Errorf("%w: %s.kv_connector is %s; want a connector name", ErrInvalidConfig, field, describe(cfg["kv_connector"]))
		}
		var childExtra map[string]any
		if x, ok := cfg["kv_connector_extra_config"]; ok && x != nil {
			if childExtra, ok = x.(map[string]any); !ok {
				return nil, fmt.Errorf("%w: %s.kv_connector_extra_config is %s; want an object", ErrInvalidConfig, field, describe(x))
			}
		}
		c, err := r.Lookup(name, childExtra)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		children = append(children, c)
		if !passive(c) {
			pd = append(pd, i)
		}
	}
	switch len(pd) {
	case 0:
		return multiContract{children[0]}, nil
	case 1:
		return multiContract{children[pd[0]]}, nil
	}
	names := make([]string, len(pd))
	for i, j := range pd {
		names[i] = fmt.Sprintf("connectors[%d] %s", j, children[j].Name())
	}
	return nil, fmt.Errorf("%w: %s all hand KV off through the router; vLLM lets only one MultiConnector child return kv_transfer_params", ErrInvalidConfig, strings.Join(names, " and "))
}

// passive reports whether a contract leaves the router nothing to do but
// order the legs: no params either way, one plain request id, sequential.
func passive(c Contract) bool {
	probe := NewHandoff("probe",
		Peer{EngineID: "prefill", KVHost: "prefill", KVPort: 1, TP: 1},
		Peer{EngineID: "decode", KVHost: "decode", KVPort: 2, TP: 1})
	p, d := c.RequestIDs(probe)
	dp, err := c.DecodeParams(probe, nil)
	return c.Dispatch() == Sequential && c.PrefillParams(probe) == nil && len(c.Required()) == 0 &&
		p == probe.RequestID && d == probe.RequestID && dp == nil && err == nil
}

// multiSpec: routed as its PD child, whose facts come with the child's own
// config, so PD expansion cannot write it and omnipd routes no
// data-parallel stage over it.
func multiSpec() Spec {
	return Spec{Name: MultiConnector, Transfer: KV, VLLM: true}
}
