package mmproc

import "fmt"

// Expand returns the prompt with every media placeholder widened to its
// item's token count, as the Qwen3-Omni processor does.
//
// The prompt must hold each item as the chat template renders it:
//
//	audio:  <|audio_start|> <|audio_pad|> <|audio_end|>
//	image:  <|vision_start|> <|image_pad|> <|vision_end|>
//	video:  <|vision_start|> <|video_pad|> <|vision_end|>
//
// and items must list the media in the order their placeholders appear. The
// pad is repeated AudioTokens or VisionTokens times. With
// Options.UseAudioInVideo a video's pad becomes
// <|audio_start|> ... <|audio_end|> around its frames' tokens and its
// soundtrack's tokens merged by time (see soundtrackOrder), so the video reads
// <|vision_start|><|audio_start|>…<|audio_end|><|vision_end|>.
//
// Placeholders that do not pair with items in order and kind give
// ErrPlaceholderMismatch; pads or delimiters outside those shapes give
// ErrMalformedPrompt.
func Expand(prompt []int, items []Item, opts Options) ([]int, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	tk := opts.Tokens
	out := make([]int, 0, len(prompt))
	cur := &itemCursor{items: items, opts: opts}
	take := cur.take

	for i := 0; i < len(prompt); {
		tok := prompt[i]
		switch {
		case tok == tk.AudioStart:
			if !hasAt(prompt, i+1, tk.AudioPad) || !hasAt(prompt, i+2, tk.AudioEnd) {
				return nil, fmt.Errorf("audio start at token %d is not followed by one audio pad and the audio end: %w", i, ErrMalformedPrompt)
			}
			s, err := take(i, Audio)
			if err != nil {
				return nil, err
			}
			out = append(out, tk.AudioStart)
			out = appendRun(out, tk.AudioPad, s.audioTokens)
			out = append(out, tk.AudioEnd)
			i += 3
		case tok == tk.VisionStart:
			if !hasAt(prompt, i+2, tk.VisionEnd) {
				return nil, fmt.Errorf("vision start at token %d is not followed by one pad and the vision end: %w", i, ErrMalformedPrompt)
			}
			var kind Kind
			switch prompt[i+1] {
			case tk.ImagePad:
				kind = Image
			case tk.VideoPad:
				kind = Video
			default:
				return nil, fmt.Errorf("vision start at token %d is followed by %d, not an image or video pad: %w", i, prompt[i+1], ErrMalformedPrompt)
			}
			s, err := take(i, kind)
			if err != nil {
				return nil, err
			}
			out = append(out, tk.VisionStart)
			switch {
			case kind == Image:
				out = appendRun(out, tk.ImagePad, s.visionTokens)
			case !s.interleavedWithAudio:
				out = appendRun(out, tk.VideoPad, s.visionTokens)
			default:
				out = append(out, tk.AudioStart)
				for _, isVideo := range soundtrackOrder(s, opts.PositionIDPerSecond) {
					if isVideo {
						out = append(out, tk.VideoPad)
					} else {
						out = append(out, tk.AudioPad)
					}
				}
				out = append(out, tk.AudioEnd)
			}
			out = append(out, tk.VisionEnd)
			i += 3
		case tk.isDelimiter(tok):
			return nil, fmt.Errorf("token %d (id %d) is outside any media placeholder: %w", i, tok, ErrMalformedPrompt)
		default:
			out = append(out, tok)
			i++
		}
	}
	if cur.next != len(items) {
		return nil, fmt.Errorf("prompt has %d media placeholders but %d items were given: %w", cur.next, len(items), ErrPlaceholderMismatch)
	}
	return out, nil
}

// soundtrackOrder returns, for a video whose soundtrack is interleaved, the
// kind of each token between <|audio_start|> and <|audio_end|>: true for a
// video token, false for an audio token. Video token k of frame f carries
// the time f·secondsPerGrid·positionIDPerSecond, audio token a the time a;
// walking both in order, the video token goes first while its time is ≤ the
// audio token's, and whichever is left over follows. Like every upstream
// processor this compares the unrounded float64 time (computed in the same
// order of operations), which is not what the positions compare when the
// time is fractional; see interleavedPositions.
func soundtrackOrder(s itemShape, positionIDPerSecond float64) []bool {
	perFrame := s.height * s.width
	order := make([]bool, 0, s.visionTokens+s.audioTokens)
	video, audio := 0, 0
	for video < s.visionTokens && audio < s.audioTokens {
		frame := video / perFrame
		// Two explicit roundings: (f·spg)·pips, as numpy evaluates it.
		time := float64(float64(frame)*s.secondsPerGrid) * positionIDPerSecond
		if time <= float64(audio) {
			order = append(order, true)
			video++
		} else {
			order = append(order, false)
			audio++
		}
	}
	for ; video < s.visionTokens; video++ {
		order = append(order, true)
	}
	for ; audio < s.audioTokens; audio++ {
		order = append(order, false)
	}
	return order
}

func hasAt(tokens []int, i, tok int) bool {
	return i < len(tokens) && tokens[i] == tok
}

func appendRun(out []int, tok, n int) []int {
	for range n {
		out = append(out, tok)
	}
	return out
}
