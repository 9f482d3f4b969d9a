package kvconnector

import (
	"maps"
	"net"
	"strconv"
)

// Connector names, as kv_transfer_config.kv_connector spells them.
const (
	NixlConnector      = "NixlConnector"
	MooncakeConnector  = "MooncakeConnector"
	P2pNcclConnector   = "P2pNcclConnector"
	LMCacheConnectorV1 = "LMCacheConnectorV1"
	MoRIIOConnector    = "MoRIIOConnector"
	MultiConnector     = "MultiConnector"
	ReferenceConnector = "ReferenceConnector"
)

// contract is the table-driven Contract every built-in is a value of: the
// connectors differ only in data, so the data is what each factory states.
type contract struct {
	name     string
	dispatch Dispatch
	// prefill builds the prefill leg's kv_transfer_params; nil sends none.
	prefill func(h Handoff) map[string]any
	// rules are the keys the prefill response must carry, in report order.
	rules []rule
	// optional are keys the prefill response carries on some engine
	// versions only (see Absent); when present they are checked like rules.
	optional []rule
	// decode says whether the decode leg carries kv_transfer_params at all.
	decode bool
	// seed is what the router knows from configuration for the decode leg;
	// the prefill's response overrides it (vllm-omni's order). nil: the
	// decode gets the prefill's object verbatim.
	seed func(h Handoff) map[string]any
	// requestIDs overrides the default of the one request id on both legs.
	requestIDs func(h Handoff) (prefill, decode string)
	// claimsEveryPrompt: the consumer loads remote KV for every request
	// (PromptClaimer).
	claimsEveryPrompt bool
}

var (
	_ Contract      = (*contract)(nil)
	_ PromptClaimer = (*contract)(nil)
)

func (c *contract) ClaimsEveryPrompt() bool { return c.claimsEveryPrompt }

func (c *contract) Name() string       { return c.name }
func (c *contract) Dispatch() Dispatch { return c.dispatch }

func (c *contract) PrefillParams(h Handoff) map[string]any {
	if c.prefill == nil {
		return nil
	}
	return c.prefill(h)
}

func (c *contract) RequestIDs(h Handoff) (prefill, decode string) {
	if c.requestIDs != nil {
		return c.requestIDs(h)
	}
	return h.RequestID, h.RequestID
}

func (c *contract) Required() []string {
	if len(c.rules) == 0 {
		return nil
	}
	keys := make([]string, len(c.rules))
	for i, r := range c.rules {
		keys[i] = r.key
	}
	return keys
}

func (c *contract) DecodeParams(h Handoff, prefillResponse any) (map[string]any, error) {
	if !c.decode {
		// The connector finds the KV without the router's help (by request id
		// or by content), so whatever the prefill returned is not needed.
		return nil, nil
	}
	resp, err := checkResponse(c.name, c.rules, prefillResponse)
	if err == nil {
		err = checkOptional(c.name, c.optional, resp)
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]any, len(resp)+6)
	if c.seed != nil {
		maps.Copy(out, c.seed(h))
	}
	maps.Copy(out, resp)
	// Forced last: a prefill echoing its own do_remote_decode: true would make
	// the decode export instead of import.
	out["do_remote_prefill"] = true
	out["do_remote_decode"] = false
	return out, nil
}

// pull is the NIXL-shaped handoff: sequential, the decode gets the prefill's
// object verbatim.
func pull(name string) *contract {
	return &contract{
		name:     name,
		dispatch: Sequential,
		prefill: func(Handoff) map[string]any {
			return map[string]any{"do_remote_decode": true, "do_remote_prefill": false}
		},
		rules:  pullRules,
		decode: true,
	}
}

// push is the Mooncake-shaped handoff: both legs rendezvous on transfer_id,
// and the decode learns where the prefill is from configuration, so it can be
// sent before the prefill answers (which answers null).
func push(name string) *contract {
	return &contract{
		name:     name,
		dispatch: Concurrent,
		prefill: func(h Handoff) map[string]any {
			return map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": h.TransferID}
		},
		decode: true,
		seed: func(h Handoff) map[string]any {
			return map[string]any{
				"transfer_id": h.TransferID,
				// http:// is required: Mooncake's decode appends "/query".
				"remote_bootstrap_addr": "http://" + net.JoinHostPort(h.Prefill.KVHost, strconv.Itoa(h.Prefill.KVPort)),
				"remote_engine_id":      h.Prefill.EngineID,
			}
		},
	}
}

// tp is a peer's tensor-parallel size, 1 when the config leaves it unset.
func tp(p Peer) int {
	if p.TP <= 0 {
		return 1
	}
	return p.TP
}
