package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptrace"
	"reflect"
	"sync"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/stageapi"
)

// A decode refused at connect. Under PD the decode instance is chosen
// before the prefill runs, and the prefill leg may already have addressed
// the KV to it. When that decode then refuses the connection, nothing
// reached it, and what happens next depends on whether the prefill's leg
// named it (boundToDecode):
//
//   - It did not (NIXL, Mooncake, LMCache storage mode, omnipd's reference
//     connector, either handshake): the exported KV waits, keyed by the
//     handoff, for whichever decode comes with its params. The decode leg
//     goes to another decode instance with the same handoff, its params
//     rebuilt for that instance; under concurrent dispatch the prefill runs
//     on meanwhile.
//   - It did (P2pNccl, whose request id carries the decode's address;
//     MoRIIO, whose prefill params name the decode's host and ports;
//     LMCache's PD mode, whose sender pushes to the receiver named in
//     disagg_spec): the KV went, or waits, for the instance that refused.
//     The request is planned again on another decode instance: a new
//     handoff (a transfer id of its own, the prefill's conditioning under a
//     key of its own), the prefill run again. What the first prefill
//     exported is released when the connector has a release call, and
//     otherwise left to the prefill engine's own handling of a transfer no
//     decode completes.
//
// Either way the refused instance sits out until seen healthy, and the move
// is counted (omnipd_stage_refused_retries_total, and
// omnipd_pd_replans_total for a new plan) and logged. The client sees an
// error only when no decode instance can be reached.

// pdPlan is a PD request's legs as planned: the decode instance its KV is
// addressed to, onto which the decode leg is counted, and the handoff.
type pdPlan struct {
	n   int // 1, and one more each time the request is planned again
	dec *Instance
	h   kvconnector.Handoff
	// refusing are the decode instances that refused this request's legs,
	// over every plan.
	refusing map[*Instance]bool
}

func newPDPlan(req *Request, dec *Instance) *pdPlan {
	return &pdPlan{n: 1, dec: dec, h: kvconnector.Handoff{RequestID: req.ID, TransferID: "xfer-" + req.ID, Decode: dec.Peer, DecodeRank: dec.nextRank()}}
}

func (pl *pdPlan) refusedDecodes() map[*Instance]bool {
	if pl.refusing == nil {
		pl.refusing = map[*Instance]bool{}
	}
	return pl.refusing
}

// errReplanned ends a plan whose decode refused the connection after the
// prefill had addressed the KV to it: the request runs again on the plan's
// new decode.
var errReplanned = errors.New("the request is planned again on another decode instance")

// boundToDecode reports whether the prefill leg of h is addressed to h's
// decode instance: whether it would have been another leg had moved's
// decode been chosen — another request id or other kv_transfer_params. A
// pure function of the contract, so every connector, MultiConnector
// included, answers for itself.
func boundToDecode(c kvconnector.Contract, h, moved kvconnector.Handoff) bool {
	a, _ := c.RequestIDs(h)
	b, _ := c.RequestIDs(moved)
	return a != b || !reflect.DeepEqual(c.PrefillParams(h), c.PrefillParams(moved))
}

// redecode takes a decode leg that pl.dec refused at connect onto another
// decode instance. It returns that instance, with pl moved to it and the
// leg's params for it (params builds them); or nil and errReplanned, pl
// holding the next plan, when the prefill was addressed to the instance
// that refused (pre, the prefill instance of a sequential plan, is told to
// release what it exported, if the connector can); or nil and the error
// the client sees when no decode instance is left.
func (o *Orchestrator) redecode(req *Request, pl *pdPlan, pre *Instance, params func(kvconnector.Handoff) (map[string]any, error), err error, log *slog.Logger) (*Instance, map[string]any, error) {
	next, ferr := o.failover(o.cfg.Decode, "decode", pl.dec, pl.refusedDecodes(), err, log)
	if next == nil {
		return nil, nil, ferr
	}
	moved := pl.h
	moved.Decode, moved.DecodeRank = next.Peer, next.nextRank()
	if boundToDecode(o.cfg.Contract, pl.h, moved) {
		o.replan(req, pl, pre, next, log)
		return nil, nil, errReplanned
	}
	p, perr := params(moved)
	if perr != nil {
		o.track(o.cfg.Decode, next, -1)
		return nil, nil, &Error{Status: 502, Code: "invalid_prefill_handoff", Msg: "the prefill's kv_transfer_params cannot start the decode", Cause: perr}
	}
	pl.dec, pl.h = next, moved
	return next, p, nil
}

// replan makes pl the request's next plan, on the decode instance next
// (already counted onto it): a handoff of its own, so that the new legs
// meet no transfer, lease or stash of the plan before.
func (o *Orchestrator) replan(req *Request, pl *pdPlan, pre, next *Instance, log *slog.Logger) {
	if pre != nil {
		o.releaseKV(pre, pl.h, log)
	}
	from := pl.dec
	pl.n++
	pl.dec = next
	pl.h = kvconnector.Handoff{RequestID: req.ID, TransferID: fmt.Sprintf("xfer-%s-%d", req.ID, pl.n), Decode: next.Peer, DecodeRank: next.nextRank()}
	if req.keep != nil {
		// A worker refuses a stash key it holds, or was told to release.
		if old, ok := req.keep.rekeyPrefill(fmt.Sprintf("%s/prefill-%d", req.ID, pl.n)); ok {
			o.freeStashes([]stageapi.ConditioningHandle{old}, log)
		}
	}
	o.cfg.Metrics.RecordReplan()
	log.Warn("the decode instance the prefill addressed the KV to refused the connection; the request runs again on another decode instance",
		"connector", o.cfg.Contract.Name(), "decode", from.Client.BaseURL(), "to", next.Client.BaseURL(), "plan", pl.n)
}

// refusedRetry counts and logs a leg moved from one instance of p, which
// refused the connection, to another. A prefill leg counts as a prefill
// retry too, as every prefill leg sent again does.
func (o *Orchestrator) refusedRetry(p *Pool, from, to *Instance, err error, log *slog.Logger) {
	o.cfg.Metrics.RecordRefusedRetry(p.Name)
	if p == o.cfg.Prefill {
		o.cfg.Metrics.RecordPrefillRetry()
	}
	log.Warn("a stage instance refused the connection; the leg goes to another instance",
		"stage", p.Name, "instance", from.Client.BaseURL(), "to", to.Client.BaseURL(), "err", err)
}

// onWritten returns ctx with a trace that calls f once, when a request sent
// under it has been written to its instance (stageclient reports it as
// net/http does). A leg refused at connect never calls it.
func onWritten(ctx context.Context, f func()) context.Context {
	var once sync.Once
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(w httptrace.WroteRequestInfo) {
		if w.Err == nil {
			once.Do(f)
		}
	}})
}
