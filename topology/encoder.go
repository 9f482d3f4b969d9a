package topology

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The encoder stage of E/P/D: the Thinker's multimodal encoders run in an
// instance of their own, which hands each media item's outputs to the
// prefill through an EC connector (vLLM's ECTransferConfig). The prefill
// then encodes nothing; the decode rebuilds the request without running
// any encoder and needs no EC connector at all.
//
// An encoder needs the prefill/decode split: its one consumer is the
// prefill stage, the stage whose prompt computation the encoder outputs
// feed. (vLLM itself also runs an encoder in front of a colocated
// Thinker, its 1E1PD example; omnipd routes the encoder leg as part of its
// prefill/decode control path and refuses that shape rather than serve it
// without the encoder.)

func validECRole(r string) bool { return r == ECProducer || r == ECConsumer || r == ECBoth }

func (v *validator) encoders() {
	stages := v.t.Stages
	var encs, prefills, pd []int
	for i, s := range stages {
		switch s.Role {
		case RoleEncoder:
			encs = append(encs, i)
		case RolePrefill:
			prefills = append(prefills, i)
			pd = append(pd, i)
		case RoleDecode:
			pd = append(pd, i)
		}
	}
	if len(encs) == 0 {
		return
	}
	for _, i := range encs[1:] {
		v.add(i, "is_encoder_only", CodeEncoderDuplicate, "stage %d is already the encoder stage; a topology has at most one (run more encoder instances with its num_replicas)", stages[encs[0]].ID)
	}
	e := encs[0]
	es := &stages[e]
	if !es.DisaggregationCapable {
		// As for a prefill or decode role on such a stage: the role is the
		// mistake, and what follows from it would only add noise.
		v.add(e, "is_encoder_only", CodeEncoderNotCapable, "stage %d (%s) cannot be an encoder stage; only the pipeline's multimodal Thinker can have its encoders split off",
			es.ID, cmp.Or(es.ModelStage, "unnamed"))
		return
	}
	if len(prefills) == 0 {
		v.add(e, "is_encoder_only", CodeEncoderWithoutPD, "an encoder stage hands its outputs to the prefill stage, and this topology has none; split the Thinker into prefill and decode stages as well, or drop the encoder stage")
	}
	if es.FinalOutput {
		v.add(e, "final_output", CodeEncoderFinalOutput, "the encoder stage makes no output for the client (one throwaway token per media item); make the decode stage final instead")
	}
	if len(es.InputSources) > 0 {
		v.add(e, "input_sources", CodeEncoderHasInputs, "the encoder stage takes each request's media from the client itself and reads from no stage; drop its input_sources")
	}
	if es.EC == nil {
		v.add(e, "ec_transfer_config", CodeEncoderECMissing, "an encoder stage needs an ec_transfer_config (ec_role ec_producer) to hand its outputs to the prefill")
	} else {
		if validECRole(es.EC.Role) && es.EC.Role != ECProducer {
			v.add(e, "ec_transfer_config.ec_role", CodeEncoderECRole, "%q on an encoder stage; want ec_producer (only an ec_producer instance is encoder-only in vLLM: ec_both also runs the language model and allocates a KV cache)", es.EC.Role)
		}
		if c := es.EC.Connector; c != "" && !slices.Contains(v.t.Supported.EC, c) {
			v.add(e, "ec_transfer_config.ec_connector", CodeEncoderECConnectorUnknown, "ec_connector %q is not one omnipd can run an encoder stage over; use one of %s",
				c, strings.Join(v.t.Supported.EC, ", "))
		}
	}

	fed := false
	for i, s := range stages {
		if i == e {
			continue
		}
		for k, src := range s.InputSources {
			if j, ok := v.byID[src]; !ok || j != e || src == s.ID {
				continue
			}
			if s.Role == RolePrefill {
				fed = true
				continue
			}
			instead := "take input from the decode stage instead"
			if s.Role == RoleDecode {
				instead = "the decode reads from the prefill alone"
			}
			v.add(i, fmt.Sprintf("input_sources[%d]", k), CodeEncoderFeedsNonPrefill,
				"stage %d reads from encoder stage %d, which only the prefill stage may do: the encoder's outputs reach the prefill through the EC connector, and it makes no tokens; %s", s.ID, src, instead)
		}
	}
	if len(prefills) > 0 && !fed {
		v.add(e, "", CodeEncoderFeedsNothing, "the prefill stage does not read from encoder stage %d, so the encoder's outputs reach no one; list %d in the prefill's input_sources", es.ID, es.ID)
	}
	if fed && len(prefills) == 1 {
		v.encoderPrefill(e, prefills[0])
	}
	v.encoderDevices(e, pd)
	v.encoderEngineIDs(e, pd)
}

// encoderPrefill checks that the prefill can take what the encoder hands it.
func (v *validator) encoderPrefill(e, p int) {
	es, ps := &v.t.Stages[e], &v.t.Stages[p]
	if ps.EC == nil {
		v.add(p, "ec_transfer_config", CodeEncoderPrefillECMissing, "the prefill reads from encoder stage %d but has no ec_transfer_config; give it one with ec_role ec_consumer and the encoder's ec_connector, or it encodes every item again", es.ID)
		return
	}
	if ps.EC.Role == ECProducer {
		v.add(p, "ec_transfer_config.ec_role", CodeEncoderPrefillECRole, "%q on a prefill stage that reads from the encoder; want ec_consumer or ec_both", ps.EC.Role)
	}
	if es.EC == nil {
		return // encoder-ec-missing says what to add
	}
	a, b := es.EC.Connector, ps.EC.Connector
	if a != "" && b != "" && a != b {
		v.add(p, "ec_transfer_config.ec_connector", CodeEncoderECConnectorMismatch, "ec_connector %q differs from the encoder's %q; both ends must use the same connector", b, a)
		return
	}
	if a == b && es.EC.Store != ps.EC.Store {
		field := cmp.Or(ps.EC.StoreField, es.EC.StoreField, "ec_transfer_config")
		v.add(p, field, CodeEncoderECStoreMismatch, "%q differs from the encoder's %q; the prefill finds the encoder's outputs only where the encoder puts them, so set both the same", ps.EC.Store, es.EC.Store)
	}
}

// encoderDevices checks that the encoder runs on devices of its own: it
// keeps the Thinker's weights loaded and is scheduled on its own, apart
// from the prefill and decode engines.
func (v *validator) encoderDevices(e int, pd []int) {
	edev := stageDevices(&v.t.Stages[e])
	for _, j := range pd {
		var shared []int
		for _, d := range stageDevices(&v.t.Stages[j]) {
			if slices.Contains(edev, d) {
				shared = append(shared, d)
			}
		}
		if len(shared) > 0 {
			slices.Sort(shared)
			v.add(e, "devices", CodeEncoderDevicesOverlap, "the encoder and the %s both use %s; give the encoder devices of its own",
				v.t.Stages[j].Role, devs(shared))
		}
	}
}

// encoderEngineIDs checks that every encoder instance has an engine id of
// its own, distinct from the prefill and decode instances' too: vLLM
// names an instance's transfers by it, and the summary and logs name the
// instance by it.
func (v *validator) encoderEngineIDs(e int, pd []int) {
	es := &v.t.Stages[e]
	if es.EC == nil {
		return // encoder-ec-missing says what to add
	}
	owner := map[string]string{}
	for _, j := range pd {
		for r, rep := range v.t.Stages[j].Replicas {
			if _, ok := owner[rep.EngineID]; rep.EngineID != "" && !ok {
				owner[rep.EngineID] = v.instance(j, r)
			}
		}
	}
	for r, rep := range es.Replicas {
		field := fmt.Sprintf("replicas[%d].engine_id", r)
		if rep.EngineID == "" {
			v.add(e, field, CodeEncoderEngineIDMissing, "an encoder replica needs an engine_id (vLLM would make up a random one)")
			continue
		}
		if o, ok := owner[rep.EngineID]; ok {
			v.add(e, field, CodeEncoderEngineIDDuplicate, "engine_id %q is already used by %s; every encoder, prefill and decode instance needs its own", rep.EngineID, o)
			continue
		}
		owner[rep.EngineID] = v.instance(e, r)
	}
}
