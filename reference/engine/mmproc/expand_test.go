package mmproc

import (
	"errors"
	"slices"
	"testing"
)

func TestExpand(t *testing.T) {
	for _, tc := range processorCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Expand(tc.prompt, tc.items, tc.opts)
			if err != nil {
				t.Fatalf("Expand: %v", err)
			}
			if !slices.Equal(got, tc.expanded) {
				t.Errorf("Expand =\n%v\nwant\n%v", got, tc.expanded)
			}
		})
	}
}

// vLLM's own test of the audio-in-video placeholder
// (tests/model_executor/test_qwen3_omni.py, test_qwen3_omni_get_updates_
// use_audio_in_video): an 85-token soundtrack, video grid [6, 36, 64],
// 2.0 s per grid, position_id_per_seconds 12.5 in its mock config. Its
// comment gives the expected layout, "aligned with the HF implementation":
//
//	<|audio_start|>, V·576, A·25, V·576, A·25, V·576, A·25, V·576, A·10,
//	V·1152, <|audio_end|>
//
// (frames at times 25·f; 650 mel frames give the 85 tokens).
func TestExpandMatchesVLLMAudioInVideoTest(t *testing.T) {
	tk := Qwen3Omni()
	opts := Options{Tokens: tk, SpatialMergeSize: 2, PositionIDPerSecond: 12.5, UseAudioInVideo: true}
	prompt := []int{9, tk.VisionStart, tk.VideoPad, tk.VisionEnd, 9}
	items := []Item{NewVideoWithAudio(Grid{6, 36, 64}, 2.0, 650)}

	got, err := Expand(prompt, items, opts)
	if err != nil {
		t.Fatalf("Expand: %v", err)
	}
	v, a := tk.VideoPad, tk.AudioPad
	want := cat(
		[]int{9, tk.VisionStart, tk.AudioStart},
		rep(v, 576), rep(a, 25), rep(v, 576), rep(a, 25), rep(v, 576), rep(a, 25),
		rep(v, 576), rep(a, 10), rep(v, 1152),
		[]int{tk.AudioEnd, tk.VisionEnd, 9},
	)
	if !slices.Equal(got, want) {
		t.Fatalf("Expand gave %d tokens, want the %d of vLLM's layout (first difference at %d)", len(got), len(want), firstDifference(got, want))
	}
}

func firstDifference(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestExpandRejectsMismatchedOrMalformedPrompts(t *testing.T) {
	plain := tinyOptions(13, false)
	withAudio := tinyOptions(13, true)
	tests := []struct {
		name   string
		prompt []int
		items  []Item
		opts   Options
		want   error
	}{
		{"placeholder without item", []int{aS, aP, aE}, nil, plain, ErrPlaceholderMismatch},
		{"item without placeholder", []int{1, 2}, []Item{NewAudio(9)}, plain, ErrPlaceholderMismatch},
		{"two placeholders one item", []int{aS, aP, aE, aS, aP, aE}, []Item{NewAudio(9)}, plain, ErrPlaceholderMismatch},
		{"kind mismatch", []int{vS, iP, vE}, []Item{NewVideo(Grid{1, 2, 2}, 1)}, plain, ErrPlaceholderMismatch},
		{"items out of order", []int{vS, iP, vE, aS, aP, aE}, []Item{NewAudio(9), NewImage(Grid{1, 2, 2})}, plain, ErrPlaceholderMismatch},
		{"pad outside a placeholder", []int{1, aP, 2}, []Item{NewAudio(9)}, plain, ErrMalformedPrompt},
		{"missing end", []int{aS, aP, 2}, []Item{NewAudio(9)}, plain, ErrMalformedPrompt},
		{"stray end", []int{1, vE}, nil, plain, ErrMalformedPrompt},
		{"stray start", []int{1, aS, 2}, nil, plain, ErrMalformedPrompt},
		{"already expanded", []int{aS, aP, aP, aE}, []Item{NewAudio(9)}, plain, ErrMalformedPrompt},
		{"audio pad inside vision", []int{vS, aP, vE}, []Item{NewAudio(9)}, plain, ErrMalformedPrompt},
		{"prompt ends in a placeholder", []int{vS, iP}, []Item{NewImage(Grid{1, 2, 2})}, plain, ErrMalformedPrompt},
		{"empty audio", []int{aS, aP, aE}, []Item{NewAudio(0)}, plain, ErrInvalidSize},
		{"odd image grid", []int{vS, iP, vE}, []Item{NewImage(Grid{1, 3, 4})}, plain, ErrInvalidSize},
		{"video without timing", []int{vS, vP, vE}, []Item{NewVideo(Grid{1, 2, 2}, 0)}, plain, ErrInvalidSize},
		{"video timing out of range", []int{vS, vP, vE}, []Item{NewVideo(Grid{2, 2, 2}, 1e30)}, plain, ErrInvalidSize},
		{"audio in video without soundtrack", []int{vS, vP, vE}, []Item{NewVideo(Grid{1, 2, 2}, 1)}, withAudio, ErrInvalidSize},
		{"unknown kind", []int{aS, aP, aE}, []Item{{Kind: 0}}, plain, ErrPlaceholderMismatch},
		{"duplicate token ids", []int{1}, nil, Options{Tokens: Tokens{}, SpatialMergeSize: 2, PositionIDPerSecond: 13}, ErrInvalidTokens},
		{"no merge size", []int{1}, nil, Options{Tokens: tiny, PositionIDPerSecond: 13}, ErrInvalidOptions},
		{"no position rate", []int{1}, nil, Options{Tokens: tiny, SpatialMergeSize: 2}, ErrInvalidOptions},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Expand(tc.prompt, tc.items, tc.opts); !errors.Is(err, tc.want) {
				t.Errorf("Expand error = %v, want %v", err, tc.want)
			}
		})
	}
}

// Round trip: collapsing the expansion the way vLLM's _get_raw_input_ids
// does (an audio-in-video block back to one video pad, then every run of a
// pad to one pad) gives back the prompt, and each pad occurs exactly as
// often as the item counts say.
func TestExpandRoundTripsTheCounts(t *testing.T) {
	for _, tc := range processorCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Expand(tc.prompt, tc.items, tc.opts)
			if err != nil {
				t.Fatalf("Expand: %v", err)
			}
			if back := collapse(got); !slices.Equal(back, tc.prompt) {
				t.Errorf("collapse(Expand(prompt)) = %v, want the prompt %v", back, tc.prompt)
			}
			var wantAudio, wantImage, wantVideo int
			for _, it := range tc.items {
				switch it.Kind {
				case Audio:
					n, _ := AudioTokens(it.AudioFrames)
					wantAudio += n
				case Image:
					n, _ := VisionTokens(it.Grid, tc.opts.SpatialMergeSize)
					wantImage += n
				case Video:
					n, _ := VisionTokens(it.Grid, tc.opts.SpatialMergeSize)
					wantVideo += n
					if tc.opts.UseAudioInVideo {
						m, _ := AudioTokens(it.AudioFrames)
						wantAudio += m
					}
				}
			}
			count := func(tok int) int {
				n := 0
				for _, x := range got {
					if x == tok {
						n++
					}
				}
				return n
			}
			if g := count(aP); g != wantAudio {
				t.Errorf("%d audio pads, want %d", g, wantAudio)
			}
			if g := count(iP); g != wantImage {
				t.Errorf("%d image pads, want %d", g, wantImage)
			}
			if g := count(vP); g != wantVideo {
				t.Errorf("%d video pads, want %d", g, wantVideo)
			}
		})
	}
}

// collapse is an independent inverse of Expand for the tiny ids.
func collapse(expanded []int) []int {
	var out []int
	for i := 0; i < len(expanded); i++ {
		tok := expanded[i]
		if tok == vS && i+1 < len(expanded) && expanded[i+1] == aS {
			j := i + 2
			for j < len(expanded) && expanded[j] != aE {
				j++
			}
			out = append(out, vS, vP, vE)
			i = j + 1 // skip <|audio_end|>; the loop skips <|vision_end|>
			continue
		}
		if (tok == aP || tok == iP || tok == vP) && len(out) > 0 && out[len(out)-1] == tok {
			continue
		}
		out = append(out, tok)
	}
	return out
}

func TestExpandLeavesThePromptAlone(t *testing.T) {
	prompt := []int{1, aS, aP, aE, 2}
	before := slices.Clone(prompt)
	if _, err := Expand(prompt, []Item{NewAudio(300)}, tinyOptions(13, false)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(prompt, before) {
		t.Errorf("Expand changed its input: %v, was %v", prompt, before)
	}
}
