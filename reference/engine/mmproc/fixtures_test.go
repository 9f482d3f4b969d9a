package mmproc

// tiny is a small vocabulary like the reference model's: text ids stay
// below 100, the special ids sit at 100–106.
var tiny = Tokens{
	AudioStart:  100,
	AudioEnd:    101,
	AudioPad:    102,
	VisionStart: 103,
	VisionEnd:   104,
	ImagePad:    105,
	VideoPad:    106,
}

// Short names for the tiny ids, so expected token lists read like prompts.
const (
	aS = 100 // <|audio_start|>
	aE = 101 // <|audio_end|>
	aP = 102 // <|audio_pad|>
	vS = 103 // <|vision_start|>
	vE = 104 // <|vision_end|>
	iP = 105 // <|image_pad|>
	vP = 106 // <|video_pad|>
)

func tinyOptions(positionIDPerSecond float64, audioInVideo bool) Options {
	return Options{
		Tokens:              tiny,
		SpatialMergeSize:    2,
		PositionIDPerSecond: positionIDPerSecond,
		UseAudioInVideo:     audioInVideo,
	}
}

// cat concatenates token runs.
func cat(parts ...[]int) []int {
	var out []int
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// rep is n copies of tok.
func rep(tok, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = tok
	}
	return out
}

func seq(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

// processorCase is one prompt with hand-derived expansion and positions.
// The derivations are in the comment of each case in processorCases.
type processorCase struct {
	name     string
	prompt   []int
	items    []Item
	opts     Options
	expanded []int
	t, h, w  []int
	delta    int
}

func processorCases() []processorCase {
	return []processorCase{
		{
			// Text only: positions are the indices, delta 0.
			name:     "text only",
			prompt:   []int{1, 2, 3},
			opts:     tinyOptions(13, false),
			expanded: []int{1, 2, 3},
			t:        []int{0, 1, 2}, h: []int{0, 1, 2}, w: []int{0, 1, 2},
			delta: 0,
		},
		{
			// 9 frames → 2 audio tokens. Audio is 1-D: every token,
			// start/end included, takes the next position on all rows.
			name:     "audio between text",
			prompt:   []int{1, aS, aP, aE, 2},
			items:    []Item{NewAudio(9)},
			opts:     tinyOptions(13, false),
			expanded: []int{1, aS, aP, aP, aE, 2},
			t:        seq(0, 6), h: seq(0, 6), w: seq(0, 6),
			delta: 0, // max 5 + 1 − 6
		},
		{
			// Exactly 100 frames → 13 tokens (one full window).
			name:     "audio of exactly one window",
			prompt:   []int{aS, aP, aE},
			items:    []Item{NewAudio(100)},
			opts:     tinyOptions(13, false),
			expanded: cat([]int{aS}, rep(aP, 13), []int{aE}),
			t:        seq(0, 15), h: seq(0, 15), w: seq(0, 15),
		},
		{
			// Grid (1,4,6) merges to 1×2×3 = 6 tokens. Text 1 at 0,
			// <|vision_start|> at 1, grid from start 2: t = 2+⌊0·13⌋,
			// h = 2+{0,0,0,1,1,1}, w = 2+{0,1,2,0,1,2}; the block max is
			// 4, so <|vision_end|> is 5 and the text continues 6, 7.
			// delta = 7 + 1 − 11 = −3.
			name:     "image grid 1x4x6",
			prompt:   []int{1, vS, iP, vE, 2, 3},
			items:    []Item{NewImage(Grid{1, 4, 6})},
			opts:     tinyOptions(13, false),
			expanded: cat([]int{1, vS}, rep(iP, 6), []int{vE, 2, 3}),
			t:        []int{0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7},
			h:        []int{0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7},
			w:        []int{0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7},
			delta:    -3,
		},
		{
			// Grid (3,2,2): 3 frames of one token; 2 s per grid at 13
			// ids/s → factor 26, frames at 1+0, 1+26, 1+52. End at 54,
			// text at 55; delta = 55 + 1 − 6 = 50.
			name:     "video 3 frames, 2 s per grid",
			prompt:   []int{vS, vP, vE, 5},
			items:    []Item{NewVideo(Grid{3, 2, 2}, 2.0)},
			opts:     tinyOptions(13, false),
			expanded: []int{vS, vP, vP, vP, vE, 5},
			t:        []int{0, 1, 27, 53, 54, 55},
			h:        []int{0, 1, 1, 1, 54, 55},
			w:        []int{0, 1, 1, 1, 54, 55},
			delta:    50,
		},
		{
			// 4 fps → 0.5 s per grid, factor 6.5: vLLM truncates the
			// scaled index, frames at 1+0, 1+⌊6.5⌋, 1+⌊13⌋ = 1, 7, 14
			// (transformers would keep 7.5). delta = 16 + 1 − 6 = 11.
			name:     "video with a fractional temporal step",
			prompt:   []int{vS, vP, vE, 5},
			items:    []Item{NewVideo(Grid{3, 2, 2}, 0.5)},
			opts:     tinyOptions(13, false),
			expanded: []int{vS, vP, vP, vP, vE, 5},
			t:        []int{0, 1, 7, 14, 15, 16},
			h:        []int{0, 1, 1, 1, 15, 16},
			w:        []int{0, 1, 1, 1, 15, 16},
			delta:    11,
		},
		{
			// Audio-in-video. Grid (2,2,2): 2 frames of 1 token at times
			// 0·1·2 = 0 and 1·1·2 = 2; soundtrack 32 frames → 4 tokens at
			// times 0..3. Video first while its time ≤ the audio's:
			// V(0≤0) A0 A1 V(2≤2) A2 A3.
			// Positions: text 0; <|vision_start|> and <|audio_start|> both
			// 1; block from 2: V(2,2,2) A 2, 3 V(4,2,2) A 4, 5; both ends
			// at max 5 + 1 = 6; text 7. delta = 7 + 1 − 12 = −4.
			name:     "audio in video, small",
			prompt:   []int{7, vS, vP, vE, 8},
			items:    []Item{NewVideoWithAudio(Grid{2, 2, 2}, 1.0, 32)},
			opts:     tinyOptions(2, true),
			expanded: []int{7, vS, aS, vP, aP, aP, vP, aP, aP, aE, vE, 8},
			t:        []int{0, 1, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7},
			h:        []int{0, 1, 1, 2, 2, 3, 2, 4, 5, 6, 6, 7},
			w:        []int{0, 1, 1, 2, 2, 3, 2, 4, 5, 6, 6, 7},
			delta:    -4,
		},
		{
			// Audio-in-video where the block's largest position is a
			// video token's, not the last (audio) token's: one frame of
			// 4×4 tokens, all at time 0, then the 2 audio tokens
			// (9 frames). Block from 1: video (1, 1+y, 1+x), max 4;
			// audio 1, 2. vLLM-new ends at block max + 1 = 5 (vLLM-old
			// ends after the last piece, the audio run: 3). delta =
			// 5 + 1 − 22.
			name:     "audio in video, end after the block maximum",
			prompt:   []int{vS, vP, vE},
			items:    []Item{NewVideoWithAudio(Grid{1, 8, 8}, 2.0, 9)},
			opts:     tinyOptions(13, true),
			expanded: cat([]int{vS, aS}, rep(vP, 16), []int{aP, aP, aE, vE}),
			t:        cat([]int{0, 0}, rep(1, 16), []int{1, 2, 5, 5}),
			h: cat([]int{0, 0}, rep(1, 4), rep(2, 4), rep(3, 4), rep(4, 4),
				[]int{1, 2, 5, 5}),
			w: cat([]int{0, 0}, seq(1, 4), seq(1, 4), seq(1, 4), seq(1, 4),
				[]int{1, 2, 5, 5}),
			delta: -16,
		},
		{
			// The order quirk of a fractional frame time: factor
			// 0.5·13 = 6.5, 2 frames of 1 token, 64 frames → 8 audio
			// tokens. Tokens (unrounded time, as the processors compare):
			// V(0) then frame 1 at 6.5 after audio 0..6, then A7:
			// V A×7 V A. Positions (truncated time 6, as vLLM compares):
			// from start 1, V(1,1,1), audio 1..6, V(7,1,1), audio 7, 8 —
			// so the 7th audio token gets the video position and the
			// video token the audio's. Ends at 9; delta = 9 + 1 − 14.
			name:     "audio in video, fractional frame time",
			prompt:   []int{vS, vP, vE},
			items:    []Item{NewVideoWithAudio(Grid{2, 2, 2}, 0.5, 64)},
			opts:     tinyOptions(13, true),
			expanded: cat([]int{vS, aS, vP}, rep(aP, 7), []int{vP, aP, aE, vE}),
			t:        []int{0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 9},
			h:        []int{0, 0, 1, 1, 2, 3, 4, 5, 6, 1, 7, 8, 9, 9},
			w:        []int{0, 0, 1, 1, 2, 3, 4, 5, 6, 1, 7, 8, 9, 9},
			delta:    -4,
		},
		{
			// Everything mixed. Audio 5 frames → 1 token; image (1,2,2) →
			// 1 token; video (2,2,4) → 2 frames of 1×2, factor 2·13 = 26.
			// 1:0 | aS 1 aP 2 aE 3 | vS 4 img (5,5,5) vE 6 | 2:7 |
			// vS 8, video from 9: (9,9,9) (9,9,10) (35,9,9) (35,9,10),
			// vE 36 | 3:37. delta = 37 + 1 − 15 = 23.
			name:   "text, audio, image and video",
			prompt: []int{1, aS, aP, aE, vS, iP, vE, 2, vS, vP, vE, 3},
			items: []Item{
				NewAudio(5),
				NewImage(Grid{1, 2, 2}),
				NewVideo(Grid{2, 2, 4}, 2.0),
			},
			opts:     tinyOptions(13, false),
			expanded: []int{1, aS, aP, aE, vS, iP, vE, 2, vS, vP, vP, vP, vP, vE, 3},
			t:        []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 35, 35, 36, 37},
			h:        []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 36, 37},
			w:        []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 9, 10, 36, 37},
			delta:    23,
		},
		{
			// A standalone clip and a video with its soundtrack in one
			// prompt (transformers pairs them by order; here each video
			// carries its own soundtrack). Audio 9 frames → 2 tokens at
			// 1, 2 (after aS 0), aE 3. Video (1,2,2): one token at time
			// 0; soundtrack 1 frame → 1 token at time 0: V then A.
			// vS 4, aS 4, V (5,5,5), A 5, ends 6, 6. delta = 6 + 1 − 10.
			name:     "audio clip then audio in video",
			prompt:   []int{aS, aP, aE, vS, vP, vE},
			items:    []Item{NewAudio(9), NewVideoWithAudio(Grid{1, 2, 2}, 2.0, 1)},
			opts:     tinyOptions(13, true),
			expanded: []int{aS, aP, aP, aE, vS, aS, vP, aP, aE, vE},
			t:        []int{0, 1, 2, 3, 4, 4, 5, 5, 6, 6},
			h:        []int{0, 1, 2, 3, 4, 4, 5, 5, 6, 6},
			w:        []int{0, 1, 2, 3, 4, 4, 5, 5, 6, 6},
			delta:    -3,
		},
	}
}
