package stageconn

import (
	"reflect"
	"testing"
)

func rows(vals ...float32) [][]float32 {
	out := make([][]float32, len(vals))
	for i, v := range vals {
		out[i] = []float32{v}
	}
	return out
}

// The decode's first row recomputes the prompt's last position; the merge
// keeps the prefill's copy and drops the duplicate.
func TestMergeDropsTheDuplicateRow(t *testing.T) {
	// Prompt of 3 tokens; the prefill computed positions 0,1,2 (and its
	// throwaway sampled token never got a row); the decode computed 2 again,
	// then positions 3 and 4 for the tokens it generated.
	prefill := &Stash{Embed: rows(0, 1, 2), Hidden: rows(10, 11, 12), PromptTokenIDs: []int{5, 6, 7}, TokenIDs: []int{5, 6, 7, 99},
		TTSPad: []float32{1}, TTSBos: []float32{2}, TTSEos: []float32{3}}
	decode := &Stash{Embed: rows(2, 3, 4), Hidden: rows(12, 13, 14), PromptTokenIDs: []int{5, 6, 7}, TokenIDs: []int{5, 6, 7, 8, 9, 10}}
	got, err := Merge(prefill, decode)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Embed, rows(0, 1, 2, 3, 4)) || !reflect.DeepEqual(got.Hidden, rows(10, 11, 12, 13, 14)) {
		t.Errorf("merged rows %v / %v; want each position once", got.Embed, got.Hidden)
	}
	if got.TTSPad[0] != 1 || !reflect.DeepEqual(got.TokenIDs, decode.TokenIDs) {
		t.Errorf("TTS embeddings fall back to the prefill's, token ids come from the decode: %+v", got)
	}
	decode.TTSPad, decode.TTSBos, decode.TTSEos = []float32{7}, []float32{8}, []float32{9}
	got, _ = Merge(prefill, decode)
	if got.TTSPad[0] != 7 || got.TTSEos[0] != 9 {
		t.Errorf("the decode's TTS embeddings win: %v %v", got.TTSPad, got.TTSEos)
	}
}

func TestMergeRefusesShortStashes(t *testing.T) {
	ok := &Stash{Embed: rows(0, 1), Hidden: rows(0, 1), PromptTokenIDs: []int{1, 2}}
	for name, c := range map[string][2]*Stash{
		"no prompt":       {{Embed: rows(0), Hidden: rows(0)}, ok},
		"prefill short":   {{Embed: rows(0), Hidden: rows(0), PromptTokenIDs: []int{1, 2}}, ok},
		"decode empty":    {ok, {}},
		"decode mismatch": {ok, {Embed: rows(1, 2), Hidden: rows(1)}},
	} {
		if _, err := Merge(c[0], c[1]); err == nil {
			t.Errorf("%s: merged", name)
		}
	}
}
