package kvconnector

import (
	"slices"
	"testing"
)

// Every entry is consistent with itself and with its contract: the other
// packages read these fields without second-guessing them.
func TestSpecsAreConsistent(t *testing.T) {
	reg := NewRegistry()
	var kv []string
	seen := map[string]bool{}
	for _, s := range Specs() {
		t.Run(s.Name, func(t *testing.T) {
			if s.Name == "" || seen[s.Name] {
				t.Fatalf("name %q empty or listed twice", s.Name)
			}
			seen[s.Name] = true
			if s.Transfer == KV {
				kv = append(kv, s.Name)
				if s.Expandable && (s.Roles.Producer == "" || s.Roles.Consumer == "") {
					t.Errorf("expandable without kv_roles: %+v", s.Roles)
				}
			} else if s.Ports != (Ports{}) || len(s.Env) > 0 || s.ClaimsEveryPrompt || s.DataParallel {
				t.Errorf("an EC connector with KV facts: %+v", s)
			}
			if s.ClaimsEveryPrompt != (s.DecodeAlone != "") {
				t.Errorf("ClaimsEveryPrompt %v with DecodeAlone %q: say what a decode sent alone does exactly when it claims", s.ClaimsEveryPrompt, s.DecodeAlone)
			}
			p := s.Ports
			if p.Key == "" && (p.Base != 0 || p.Listens != 0 || p.PerRank != 0 || p.NotifyKey != "" || p.EnvOnly || p.EngineDefault != 0) {
				t.Errorf("port facts without a port key: %+v", p)
			}
			if p.Key != "" && (p.Base == 0 || p.Listens == 0) {
				t.Errorf("port key %q without a base port or a listening side: %+v", p.Key, p)
			}
			if (p.EnvOnly || p.NotifyKey != "") && !p.InExtraConfig {
				t.Errorf("EnvOnly or NotifyKey with the port outside kv_connector_extra_config: %+v", p)
			}
			envPort := slices.ContainsFunc(s.Env, func(e EnvVar) bool { return e.From == EnvKVPort })
			if p.EnvOnly && !envPort {
				t.Errorf("EnvOnly with no variable carrying the port: %+v", s.Env)
			}
			for _, e := range s.Env {
				if e.Name == "" || e.Sides == 0 || (e.From == EnvLiteral) != (e.Value != "") {
					t.Errorf("env %+v: want a name, sides, and a value exactly when literal", e)
				}
			}
			for _, set := range slices.Concat(s.ExtraConfig, s.ExpansionEnv) {
				switch set.Value.(type) {
				case string, bool, int:
				default:
					t.Errorf("setting %s holds a %T; want a string, bool or int", set.Key, set.Value)
				}
			}
			if s.Transfer != KV || s.Name == MultiConnector {
				return // no contract, or one that needs its children's config
			}
			c, err := reg.Lookup(s.Name, nil)
			if err != nil {
				t.Fatalf("Lookup: %v", err)
			}
			pc, ok := c.(PromptClaimer)
			if claims := ok && pc.ClaimsEveryPrompt(); claims != s.ClaimsEveryPrompt {
				t.Errorf("contract claims every prompt %v, entry says %v", claims, s.ClaimsEveryPrompt)
			}
		})
	}
	if got := reg.Names(); !slices.Equal(got, slices.Sorted(slices.Values(kv))) {
		t.Errorf("registry holds %v, entries name %v", got, kv)
	}
}

// The ports an engine listens on by default, which serve names for an
// engine it did not start.
func TestEngineDefaultPorts(t *testing.T) {
	for _, tc := range []struct {
		connector      string
		kvPort, notify int
	}{
		{MooncakeConnector, 8998, 0},
		{P2pNcclConnector, 14579, 0},
		{MoRIIOConnector, 6301, 61005},
		{NixlConnector, 0, 0},
		{ReferenceConnector, 0, 0},
		{"NoSuchConnector", 0, 0},
	} {
		if kv, notify := EngineDefaultPorts(tc.connector); kv != tc.kvPort || notify != tc.notify {
			t.Errorf("%s: %d, %d; want %d, %d", tc.connector, kv, notify, tc.kvPort, tc.notify)
		}
	}
}

// Names keeps the entries' order and filters by transfer.
func TestNames(t *testing.T) {
	if got, want := Names(EC, nil), []string{ECExampleConnector, ReferenceECConnector}; !slices.Equal(got, want) {
		t.Errorf("EC connectors %v, want %v", got, want)
	}
	dp := Names(KV, func(s Spec) bool { return s.DataParallel })
	if !slices.Equal(dp, []string{NixlConnector}) {
		t.Errorf("data-parallel connectors %v, want [%s]", dp, NixlConnector)
	}
	if _, ok := SpecOf(MultiConnector); !ok {
		t.Errorf("no entry for %s", MultiConnector)
	}
}
