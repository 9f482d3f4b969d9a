package mmproc

import (
	"errors"
	"reflect"
	"slices"
	"testing"
)

// Expected positions are derived by hand in processorCases from vLLM's
// Qwen3-Omni get_mrope_input_positions (qwen3_omni_moe_thinker.py).
func TestComputePositions(t *testing.T) {
	for _, tc := range processorCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ComputePositions(tc.expanded, tc.items, tc.opts)
			if err != nil {
				t.Fatalf("ComputePositions: %v", err)
			}
			if !slices.Equal(got.Temporal, tc.t) {
				t.Errorf("temporal = %v\nwant       %v", got.Temporal, tc.t)
			}
			if !slices.Equal(got.Height, tc.h) {
				t.Errorf("height = %v\nwant     %v", got.Height, tc.h)
			}
			if !slices.Equal(got.Width, tc.w) {
				t.Errorf("width = %v\nwant    %v", got.Width, tc.w)
			}
			if got.Delta != tc.delta {
				t.Errorf("delta = %d, want %d", got.Delta, tc.delta)
			}
		})
	}
}

// vLLM's audio-in-video test video (see TestExpandMatchesVLLMAudioInVideoTest)
// between two text tokens, positioned by hand:
//
//	index 0 text 0; 1 <|vision_start|> 1; 2 <|audio_start|> 1; block from 2.
//	Frame f (576 tokens of 18×32) at t = 2+25f, h = 2+y, w = 2+x;
//	audio token a at 2+a. Token order: frame0 [3,579), a0..24 [579,604),
//	frame1 [604,1180), a25..49, frame2 [1205,1781), a50..74, frame3
//	[1806,2382), a75..84 [2382,2392), frame4 [2392,2968), frame5
//	[2968,3544). Block max = frame 5's t = 127 (h ≤ 19, w ≤ 33, audio ≤ 86),
//	so both ends are 128 and the last text 129; 3547 tokens, delta
//	129 + 1 − 3547 = −3417.
func TestPositionsOfVLLMAudioInVideoTest(t *testing.T) {
	tk := Qwen3Omni()
	opts := Options{Tokens: tk, SpatialMergeSize: 2, PositionIDPerSecond: 12.5, UseAudioInVideo: true}
	prompt := []int{9, tk.VisionStart, tk.VideoPad, tk.VisionEnd, 9}
	items := []Item{NewVideoWithAudio(Grid{6, 36, 64}, 2.0, 650)}

	got, err := Prepare(prompt, items, opts)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	p := got.Positions
	if p.Len() != 3547 || len(got.Tokens) != 3547 {
		t.Fatalf("%d positions for %d tokens, want 3547", p.Len(), len(got.Tokens))
	}
	if p.Delta != -3417 {
		t.Errorf("delta = %d, want -3417", p.Delta)
	}
	checks := []struct {
		index int
		want  [3]int
		what  string
	}{
		{0, [3]int{0, 0, 0}, "leading text"},
		{1, [3]int{1, 1, 1}, "<|vision_start|>"},
		{2, [3]int{1, 1, 1}, "<|audio_start|> shares it"},
		{3, [3]int{2, 2, 2}, "frame 0, first token"},
		{578, [3]int{2, 19, 33}, "frame 0, last token"},
		{579, [3]int{2, 2, 2}, "audio 0"},
		{603, [3]int{26, 26, 26}, "audio 24"},
		{604, [3]int{27, 2, 2}, "frame 1, first token"},
		{2391, [3]int{86, 86, 86}, "audio 84, the last"},
		{2392, [3]int{102, 2, 2}, "frame 4, first token"},
		{3543, [3]int{127, 19, 33}, "frame 5, last token"},
		{3544, [3]int{128, 128, 128}, "<|audio_end|>"},
		{3545, [3]int{128, 128, 128}, "<|vision_end|>"},
		{3546, [3]int{129, 129, 129}, "trailing text"},
		{3547, [3]int{130, 130, 130}, "first generated token: 3547 + delta"},
		{3600, [3]int{183, 183, 183}, "a later generated token"},
	}
	for _, c := range checks {
		if g := p.At(c.index); g != c.want {
			t.Errorf("At(%d) (%s) = %v, want %v", c.index, c.what, g, c.want)
		}
	}
}

// Properties over every case: a text token sits one past every position
// before it (so text after media continues from the media's maximum + 1),
// the first generated token sits one past the prompt's maximum on every
// row, and each later one a step further.
func TestPositionsContinueAfterMedia(t *testing.T) {
	for _, tc := range processorCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Prepare(tc.prompt, tc.items, tc.opts)
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			p := got.Positions
			if p.Len() != len(got.Tokens) {
				t.Fatalf("%d positions for %d tokens", p.Len(), len(got.Tokens))
			}
			seen := -1
			for i, tok := range got.Tokens {
				pos := p.At(i)
				if !tiny.isDelimiter(tok) && pos != [3]int{seen + 1, seen + 1, seen + 1} {
					t.Errorf("text token %d at %v, want %d on every row", i, pos, seen+1)
				}
				seen = max(seen, pos[0], pos[1], pos[2])
			}
			if want := seen + 1 - p.Len(); p.Delta != want {
				t.Errorf("delta = %d, want max %d + 1 − %d = %d", p.Delta, seen, p.Len(), want)
			}
			for k := range 3 {
				v := seen + 1 + k
				if g := p.At(p.Len() + k); g != [3]int{v, v, v} {
					t.Errorf("generated token %d at %v, want %d on every row", k, g, v)
				}
			}
		})
	}
}

// Prefill and decode each rebuild the request from the same prompt and
// sizes; they must agree exactly, and neither may change the inputs.
func TestPrepareIsRepeatable(t *testing.T) {
	for _, tc := range processorCases() {
		prompt := slices.Clone(tc.prompt)
		first, err := Prepare(prompt, tc.items, tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		second, err := Prepare(slices.Clone(tc.prompt), slices.Clone(tc.items), tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(first, second) {
			t.Errorf("%s: two Prepare calls disagree", tc.name)
		}
		if !slices.Equal(prompt, tc.prompt) {
			t.Errorf("%s: Prepare changed its prompt", tc.name)
		}
	}
}

func TestComputePositionsRejectsTokensThatDoNotFitTheItems(t *testing.T) {
	plain := tinyOptions(13, false)
	withAudio := tinyOptions(2, true)
	smallAiV := []Item{NewVideoWithAudio(Grid{2, 2, 2}, 1.0, 32)}
	tests := []struct {
		name     string
		expanded []int
		items    []Item
		opts     Options
		want     error
	}{
		{"empty", nil, nil, plain, ErrMalformedPrompt},
		{"too few audio pads", []int{aS, aP, aE}, []Item{NewAudio(9)}, plain, ErrMalformedPrompt},
		{"too many image pads", []int{vS, iP, iP, vE}, []Item{NewImage(Grid{1, 2, 2})}, plain, ErrMalformedPrompt},
		{"unexpanded video with audio-in-video on", []int{vS, vP, vE}, smallAiV, withAudio, ErrMalformedPrompt},
		{"audio-in-video tokens with it off", []int{vS, aS, vP, aP, aP, vP, aP, aP, aE, vE}, smallAiV, tinyOptions(2, false), ErrMalformedPrompt},
		{"interleaving out of order", []int{vS, aS, aP, vP, aP, vP, aP, aP, aE, vE}, smallAiV, withAudio, ErrMalformedPrompt},
		{"missing vision end", []int{vS, aS, vP, aP, aP, vP, aP, aP, aE}, smallAiV, withAudio, ErrMalformedPrompt},
		{"stray pad", []int{1, iP}, nil, plain, ErrMalformedPrompt},
		{"vision start at the end", []int{1, vS}, nil, plain, ErrMalformedPrompt},
		{"item missing", []int{aS, aP, aE}, nil, plain, ErrPlaceholderMismatch},
		{"item left over", []int{1}, []Item{NewAudio(1)}, plain, ErrPlaceholderMismatch},
		{"wrong kind", []int{vS, iP, vE}, []Item{NewAudio(1)}, plain, ErrPlaceholderMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ComputePositions(tc.expanded, tc.items, tc.opts); !errors.Is(err, tc.want) {
				t.Errorf("ComputePositions error = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestPrepareWrapsTheStepThatFailed(t *testing.T) {
	_, err := Prepare([]int{aS, aP, aE}, nil, tinyOptions(13, false))
	if !errors.Is(err, ErrPlaceholderMismatch) {
		t.Fatalf("Prepare error = %v, want ErrPlaceholderMismatch", err)
	}
}
