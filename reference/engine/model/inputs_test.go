package model

import (
	"testing"
)

// A multimodal prompt's inputs: rotary positions equal on all three rows
// are plain RoPE (a text prompt computes the same with or without them);
// rows that differ move the result, and so does an encoder row in place of
// a token's embedding; and the chunking of a prompt with such inputs does
// not change a bit of it.
func TestForwardInputs(t *testing.T) {
	m := Default()
	tokens := prompt(12, m.Config.VocabSize, 5)
	run := func(in Inputs, chunk int) []float32 {
		c := newCache(t, m, 4, 8)
		table := alloc(t, c, len(tokens))
		var logits []float32
		for start := 0; start < len(tokens); start += chunk {
			end := min(start+chunk, len(tokens))
			part := Inputs{}
			if in.Positions != nil {
				part.Positions = in.Positions[start:end]
			}
			if in.Embeds != nil {
				part.Embeds = in.Embeds[start:end]
			}
			logits = m.ForwardInputs(c, table, start, tokens[start:end], part, nil)
		}
		return logits
	}
	plain := run(Inputs{}, len(tokens))
	same := make([][3]int, len(tokens))
	for i := range same {
		same[i] = [3]int{i, i, i}
	}
	if !bitsEqual(run(Inputs{Positions: same}, len(tokens)), plain) {
		t.Error("positions equal on the three rows differ from plain RoPE")
	}
	// An image's grid: the temporal row holds, height and width vary.
	grid := make([][3]int, len(tokens))
	for i := range grid {
		grid[i] = same[i]
		if i >= 3 && i < 7 {
			grid[i] = [3]int{3, 3 + (i-3)/2, 3 + (i-3)%2}
		}
	}
	withGrid := run(Inputs{Positions: grid}, len(tokens))
	if bitsEqual(withGrid, plain) {
		t.Error("a 2-D grid of positions gives plain RoPE's logits: the height and width rows are ignored")
	}
	embeds := make([][]float32, len(tokens))
	for i := 3; i < 7; i++ {
		embeds[i] = make([]float32, m.Config.HiddenSize)
		for j := range embeds[i] {
			embeds[i][j] = float32((i*31+j*7)%13)/13 - 0.5
		}
	}
	mm := Inputs{Positions: grid, Embeds: embeds}
	whole := run(mm, len(tokens))
	if bitsEqual(whole, withGrid) {
		t.Error("encoder rows in place of embeddings change nothing")
	}
	for _, chunk := range []int{1, 2, 5} {
		if !bitsEqual(run(mm, chunk), whole) {
			t.Errorf("chunks of %d give different logits", chunk)
		}
	}
}
