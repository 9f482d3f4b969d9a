package deploy

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/omnipd/omnipd/kvconnector"
)

// P2pNccl and MoRIIO decodes claim the prompt's KV on every request, so a
// pd: setting that sends a request to the decode alone is refused where it
// is written; the other connectors' decodes prefill such requests.
func TestDecodeOnlyRefusedForRequestIDConnectors(t *testing.T) {
	for _, tc := range []struct {
		connector, setting string
		want               string // "" : accepted
	}{
		{"P2pNcclConnector", "min_prefill_tokens: 64", "cfg.yaml:4:23: pd.min_prefill_tokens: 64 sends short prompts to the decode alone, and a P2pNccl decode waits forever"},
		{"P2pNcclConnector", "fallback: local", "cfg.yaml:4:13: pd.fallback: local sends the request to the decode alone"},
		{"MoRIIOConnector", "min_prefill_tokens: 64", "cfg.yaml:4:23: pd.min_prefill_tokens: 64 sends short prompts to the decode alone, and a MoRIIO decode claims KV"},
		{"MoRIIOConnector", "fallback: local", "cfg.yaml:4:13: pd.fallback: local"},
		{"MoRIIOConnector", "fallback: none", ""},
		{"NixlConnector", "min_prefill_tokens: 64", ""},
		{"MooncakeConnector", "fallback: local", ""},
	} {
		t.Run(tc.connector+"/"+tc.setting, func(t *testing.T) {
			cfg := "pipeline: qwen3_omni_moe_thinker\npd:\n  connector: " + tc.connector + "\n  " + tc.setting + `
stages:
  - stage_id: 0
    devices: "0,1"
`
			_, _, err := Load("cfg.yaml", []byte(cfg), Options{})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant one containing %q", err, tc.want)
			}
		})
	}
}

// decodeOnlyHangs names, with a message, exactly the built-in connectors
// whose contract claims every prompt (kvconnector.PromptClaimer): a new
// claimer must be refused here too, and a connector that stops claiming
// must no longer be refused.
func TestDecodeOnlyHangsMatchPromptClaimers(t *testing.T) {
	reg := kvconnector.NewRegistry()
	var claimers []string
	for _, name := range reg.Names() {
		c, err := reg.Lookup(name, nil)
		if err != nil {
			continue // needs extra config (MultiConnector): claims as its PD child does
		}
		if pc, ok := c.(kvconnector.PromptClaimer); ok && pc.ClaimsEveryPrompt() {
			claimers = append(claimers, name)
		}
	}
	got := slices.Sorted(maps.Keys(decodeOnlyHangs))
	if len(claimers) == 0 || !slices.Equal(got, claimers) {
		t.Fatalf("decodeOnlyHangs names %v; the prompt-claiming connectors are %v", got, claimers)
	}
}
