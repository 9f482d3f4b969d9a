package stageapi

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

func sample(rows, width int) *Conditioning {
	rng := rand.New(rand.NewPCG(1, 2))
	mk := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = rng.Float32()*2 - 1
		}
		return v
	}
	c := &Conditioning{TTSPad: mk(width), TTSBos: mk(width), TTSEos: mk(width)}
	for range rows {
		c.Embed = append(c.Embed, mk(width))
		c.Hidden = append(c.Hidden, mk(width))
	}
	for i := range rows + 1 {
		c.TokenIDs = append(c.TokenIDs, i*7)
	}
	c.PromptTokenIDs = c.TokenIDs[:rows/2+1]
	return c
}

func TestEncodeDecodeConditioningRoundTrip(t *testing.T) {
	for _, rows := range []int{0, 1, 17} {
		c := sample(rows, 8)
		b, err := EncodeConditioning(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeConditioning(b)
		if err != nil {
			t.Fatal(err)
		}
		if rows > 0 && !reflect.DeepEqual(got, c) {
			t.Errorf("%d rows: round trip differs", rows)
		}
		if rows == 0 && (len(got.Embed) != 0 || len(got.TokenIDs) != 1) {
			t.Errorf("empty stash: %+v", got)
		}
	}
}

func TestDecodeConditioningRefusesMalformed(t *testing.T) {
	good, _ := EncodeConditioning(sample(3, 4))
	for name, b := range map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("XXXX"), good[4:]...),
		"truncated": good[:len(good)-1],
		"extra":     append(append([]byte{}, good...), 0),
		"header":    good[:10],
	} {
		if _, err := DecodeConditioning(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := EncodeConditioning(&Conditioning{Embed: [][]float32{{1}}, Hidden: nil}); err == nil {
		t.Error("mismatched rows encoded")
	}
}

func FuzzDecodeConditioning(f *testing.F) {
	good, _ := EncodeConditioning(sample(3, 4))
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeConditioning(b)
		if err != nil {
			return
		}
		again, err := EncodeConditioning(c)
		if err != nil {
			t.Fatalf("decoded stash does not encode: %v", err)
		}
		if _, err := DecodeConditioning(again); err != nil {
			t.Fatalf("re-encoded stash does not decode: %v", err)
		}
	})
}

func rows(vals ...float32) [][]float32 {
	out := make([][]float32, len(vals))
	for i, v := range vals {
		out[i] = []float32{v}
	}
	return out
}

// The decode's first row recomputes the prompt's last position; the merge
// keeps the prefill's copy and drops the duplicate.
func TestMergeConditioningDropsTheDuplicateRow(t *testing.T) {
	// Prompt of 3 tokens; the prefill computed positions 0,1,2 (and its
	// throwaway sampled token never got a row); the decode computed 2 again,
	// then positions 3 and 4 for the tokens it generated.
	prefill := &Conditioning{Embed: rows(0, 1, 2), Hidden: rows(10, 11, 12), PromptTokenIDs: []int{5, 6, 7}, TokenIDs: []int{5, 6, 7, 99},
		TTSPad: []float32{1}, TTSBos: []float32{2}, TTSEos: []float32{3}}
	decode := &Conditioning{Embed: rows(2, 3, 4), Hidden: rows(12, 13, 14), PromptTokenIDs: []int{5, 6, 7}, TokenIDs: []int{5, 6, 7, 8, 9, 10}}
	got, err := MergeConditioning(prefill, decode)
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
	got, _ = MergeConditioning(prefill, decode)
	if got.TTSPad[0] != 7 || got.TTSEos[0] != 9 {
		t.Errorf("the decode's TTS embeddings win: %v %v", got.TTSPad, got.TTSEos)
	}
}

func TestMergeConditioningRefusesShortStashes(t *testing.T) {
	ok := &Conditioning{Embed: rows(0, 1), Hidden: rows(0, 1), PromptTokenIDs: []int{1, 2}}
	for name, c := range map[string][2]*Conditioning{
		"no prompt":       {{Embed: rows(0), Hidden: rows(0)}, ok},
		"prefill short":   {{Embed: rows(0), Hidden: rows(0), PromptTokenIDs: []int{1, 2}}, ok},
		"decode empty":    {ok, {}},
		"decode mismatch": {ok, {Embed: rows(1, 2), Hidden: rows(1)}},
	} {
		if _, err := MergeConditioning(c[0], c[1]); err == nil {
			t.Errorf("%s: merged", name)
		}
	}
}
