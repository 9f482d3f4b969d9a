package mmproc

import (
	"errors"
	"slices"
	"testing"
)

// Qwen3-Omni's split, by hand from transformers' Qwen3OmniMoeThinkerText
// RotaryEmbedding.recomposition_frequencies (start from t everywhere, then
// h at indices 1,4,…,<60 and w at 2,5,…,<60) and vLLM's
// apply_interleaved_rope (same masks): over 64 frequencies j = 0..59 cycle
// t,h,w and 60..63 are t — 24 t, 20 h, 20 w.
func TestQwen3OmniFrequencyRows(t *testing.T) {
	rows, err := Qwen3OmniRotarySections().FrequencyRows(64)
	if err != nil {
		t.Fatalf("FrequencyRows: %v", err)
	}
	spots := map[int]Row{
		0: RowTemporal, 1: RowHeight, 2: RowWidth, 3: RowTemporal, 4: RowHeight, 5: RowWidth,
		57: RowTemporal, 58: RowHeight, 59: RowWidth,
		60: RowTemporal, 61: RowTemporal, 62: RowTemporal, 63: RowTemporal,
	}
	for j, want := range spots {
		if rows[j] != want {
			t.Errorf("frequency %d uses %v, want %v", j, rows[j], want)
		}
	}
	var count [3]int
	for _, r := range rows {
		count[r]++
	}
	if count != [3]int{24, 20, 20} {
		t.Errorf("row counts %v, want [24 20 20]", count)
	}
}

func TestFrequencyRows(t *testing.T) {
	T, H, W := RowTemporal, RowHeight, RowWidth
	tests := []struct {
		name     string
		sections RotarySections
		half     int
		want     []Row
	}{
		{
			// Tiny head_dim 16: h at 1, 4 (< 3·2), w at 2, 5 (< 3·2),
			// the rest t.
			name:     "tiny interleaved 4/2/2",
			sections: RotarySections{4, 2, 2, true},
			half:     8,
			want:     []Row{T, H, W, T, H, W, T, T},
		},
		{
			// Equal thirds end exactly on the pattern: h 1, 4; w 2, 5.
			name:     "interleaved 2/2/2",
			sections: RotarySections{2, 2, 2, true},
			half:     6,
			want:     []Row{T, H, W, T, H, W},
		},
		{
			// vLLM's non-interleaved branch (Qwen2-VL layout): chunks in
			// t, h, w order.
			name:     "chunked 2/3/3",
			sections: RotarySections{2, 3, 3, false},
			half:     8,
			want:     []Row{T, T, H, H, H, W, W, W},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.sections.FrequencyRows(tc.half)
			if err != nil {
				t.Fatalf("FrequencyRows: %v", err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("FrequencyRows = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFrequencyRowsRejectsSplitsThatDoNotFit(t *testing.T) {
	tests := []struct {
		name     string
		sections RotarySections
		half     int
	}{
		{"sum too large", Qwen3OmniRotarySections(), 32},
		{"sum too small", RotarySections{1, 1, 1, true}, 8},
		// [2,3,3] sums to 8, but interleaving leaves w only 2, 5.
		{"interleave cannot realise it", RotarySections{2, 3, 3, true}, 8},
		{"negative share", RotarySections{10, -1, -1, false}, 8},
		{"no frequencies", RotarySections{}, 0},
	}
	for _, tc := range tests {
		if _, err := tc.sections.FrequencyRows(tc.half); !errors.Is(err, ErrInvalidRotary) {
			t.Errorf("%s: error = %v, want ErrInvalidRotary", tc.name, err)
		}
	}
}
