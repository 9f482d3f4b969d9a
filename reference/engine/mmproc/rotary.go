package mmproc

import "fmt"

// Row names one of the three position rows.
type Row int

const (
	RowTemporal Row = iota // 0: t
	RowHeight              // 1: h
	RowWidth               // 2: w
)

func (r Row) String() string {
	switch r {
	case RowTemporal:
		return "t"
	case RowHeight:
		return "h"
	case RowWidth:
		return "w"
	}
	return fmt.Sprintf("Row(%d)", int(r))
}

// RotarySections is how the language model's rotary frequencies are shared
// among the three position rows (rope_parameters.mrope_section, and
// interleaved / mrope_interleaved).
//
// Frequency j (0 ≤ j < head_dim/2) is inv_freq[j] = rope_theta^(−2j/head_dim)
// and rotates, NeoX style, the pair of dimensions (j, j+head_dim/2) by angle
// position·inv_freq[j], where position is the token's position on the row
// FrequencyRows assigns to j.
//
// Interleaved (Qwen3-Omni, as Qwen3-VL): j takes the height row when
// j mod 3 = 1 and j < 3·Height, the width row when j mod 3 = 2 and
// j < 3·Width, and the temporal row otherwise — t,h,w,t,h,w,… from the
// highest frequency, with the lowest frequencies left to t. Not interleaved
// (Qwen2-VL, Qwen2.5-Omni): the first Temporal frequencies take t, the next
// Height take h, the rest w.
type RotarySections struct {
	Temporal, Height, Width int
	Interleaved             bool
}

// Qwen3OmniRotarySections is the thinker's split: mrope_section [24, 20, 20]
// over head_dim 128 (64 frequencies), interleaved.
func Qwen3OmniRotarySections() RotarySections {
	return RotarySections{Temporal: 24, Height: 20, Width: 20, Interleaved: true}
}

// FrequencyRows returns, for each of the halfDim = head_dim/2 rotary
// frequencies, the position row it rotates by.
//
// The sections must sum to halfDim (vLLM asserts it). For the interleaved
// layout this also requires that the pattern realises exactly the stated
// counts — upstream does not check, but a split like [2, 3, 3] over 8
// frequencies would silently give w only 2 of them. For a tiny head_dim of
// 16 (8 frequencies) use {4, 2, 2}: t,h,w,t,h,w,t,t — the real split
// scaled by 8/64 is [3, 2.5, 2.5]; h and w are rounded down to 2 each,
// the largest equal share the interleave can realise in 8 frequencies, and
// t keeps the rest, as t keeps the lowest frequencies in [24, 20, 20].
func (s RotarySections) FrequencyRows(halfDim int) ([]Row, error) {
	if halfDim <= 0 {
		return nil, fmt.Errorf("rotary half dimension %d: %w", halfDim, ErrInvalidRotary)
	}
	if s.Temporal < 0 || s.Height < 0 || s.Width < 0 {
		return nil, fmt.Errorf("sections %+v: negative share: %w", s, ErrInvalidRotary)
	}
	if s.Temporal+s.Height+s.Width != halfDim {
		return nil, fmt.Errorf("sections %d+%d+%d do not sum to %d frequencies: %w", s.Temporal, s.Height, s.Width, halfDim, ErrInvalidRotary)
	}
	rows := make([]Row, halfDim)
	for j := range rows {
		rows[j] = s.rowOf(j)
	}
	if s.Interleaved {
		var count [3]int
		for _, r := range rows {
			count[r]++
		}
		if count != [3]int{s.Temporal, s.Height, s.Width} {
			return nil, fmt.Errorf("interleaving sections %d/%d/%d over %d frequencies gives %d/%d/%d: %w",
				s.Temporal, s.Height, s.Width, halfDim, count[0], count[1], count[2], ErrInvalidRotary)
		}
	}
	return rows, nil
}

func (s RotarySections) rowOf(j int) Row {
	if !s.Interleaved {
		switch {
		case j < s.Temporal:
			return RowTemporal
		case j < s.Temporal+s.Height:
			return RowHeight
		}
		return RowWidth
	}
	switch {
	case j%3 == 1 && j < 3*s.Height:
		return RowHeight
	case j%3 == 2 && j < 3*s.Width:
		return RowWidth
	}
	return RowTemporal
}
