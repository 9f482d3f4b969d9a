package mmproc

import "fmt"

// Positions are the TM-RoPE position ids of an expanded prompt: one
// temporal, height and width position per token, and the Delta that places
// every later token. Upstream calls Delta the rope delta
// (mrope_position_delta).
type Positions struct {
	Temporal, Height, Width []int
	// Delta is max(all positions) + 1 − len(prompt). A token at sequence
	// index i ≥ len(prompt) — every generated token — has position i+Delta
	// on all three rows. It is not 0 once media are present: a decode
	// worker that positions generated tokens by their sequence index alone
	// disagrees with the prefill.
	Delta int
}

// Len is the number of prompt tokens the positions cover.
func (p Positions) Len() int { return len(p.Temporal) }

// At returns the (temporal, height, width) position of the token at
// sequence index i ≥ 0: the prompt's own positions inside the prompt, and
// i+Delta on all rows after it.
func (p Positions) At(i int) [3]int {
	if i < p.Len() {
		return [3]int{p.Temporal[i], p.Height[i], p.Width[i]}
	}
	v := i + p.Delta
	return [3]int{v, v, v}
}

// ComputePositions returns the TM-RoPE positions of an expanded prompt (the
// output of Expand for the same items and options), as vLLM's Qwen3-Omni
// thinker get_mrope_input_positions assigns them:
//
//   - Text and every start/end token take the next position on all rows;
//     "next" is one past the largest position of the previous token or
//     media block.
//   - Audio tokens take consecutive positions on all rows (one per token).
//   - Image and video tokens take (start+t', start+h, start+w) over the
//     merged grid, t outermost and w innermost, where start is the position
//     after <|vision_start|> and t' = ⌊frame·factor⌋ with factor =
//     PositionIDPerSecond for images and SecondsPerGrid·PositionIDPerSecond
//     for videos. The end token takes the block's largest position + 1.
//   - With audio-in-video, <|vision_start|> and <|audio_start|> share one
//     position, frames and soundtrack interleave from the next one (audio
//     token a at start+a), and <|audio_end|>, <|vision_end|> share the
//     block's largest position + 1.
//
// transformers differs on audio-in-video (separate positions for the two
// start and the two end tokens, and an end after the last piece rather than
// the block maximum) and keeps fractional temporal positions; see
// docs/multimodal/processor.md.
func ComputePositions(expanded []int, items []Item, opts Options) (Positions, error) {
	if err := opts.Validate(); err != nil {
		return Positions{}, err
	}
	if len(expanded) == 0 {
		return Positions{}, fmt.Errorf("empty prompt: %w", ErrMalformedPrompt)
	}
	tk := opts.Tokens
	b := positionBuilder{
		t: make([]int, 0, len(expanded)),
		h: make([]int, 0, len(expanded)),
		w: make([]int, 0, len(expanded)),
	}
	cur := &itemCursor{items: items, opts: opts}
	take := cur.take

	for i := 0; i < len(expanded); {
		tok := expanded[i]
		switch {
		case tok == tk.AudioStart:
			s, err := take(i, Audio)
			if err != nil {
				return Positions{}, err
			}
			end := i + 1 + s.audioTokens
			if !isRun(expanded, i+1, tk.AudioPad, s.audioTokens) || !hasAt(expanded, end, tk.AudioEnd) {
				return Positions{}, fmt.Errorf("audio at token %d is not %d audio pads and the audio end: %w", i, s.audioTokens, ErrMalformedPrompt)
			}
			b.single()
			b.audioRun(s.audioTokens)
			b.single()
			i = end + 1
		case tok == tk.VisionStart:
			n, err := b.vision(expanded, i, take, opts)
			if err != nil {
				return Positions{}, err
			}
			i += n
		case tk.isDelimiter(tok):
			return Positions{}, fmt.Errorf("token %d (id %d) is outside any media placeholder: %w", i, tok, ErrMalformedPrompt)
		default:
			b.single()
			i++
		}
	}
	if cur.next != len(items) {
		return Positions{}, fmt.Errorf("prompt has %d media placeholders but %d items were given: %w", cur.next, len(items), ErrPlaceholderMismatch)
	}
	return Positions{
		Temporal: b.t,
		Height:   b.h,
		Width:    b.w,
		Delta:    b.max + 1 - len(expanded),
	}, nil
}

// positionBuilder appends positions chunk by chunk. next is one past the
// largest position of the last chunk appended — vLLM's
// llm_pos_ids_list[-1].max() + 1 — and max the largest position so far.
type positionBuilder struct {
	t, h, w   []int
	next, max int
}

func (b *positionBuilder) push(t, h, w int) {
	b.t, b.h, b.w = append(b.t, t), append(b.h, h), append(b.w, w)
	b.max = max(b.max, t, h, w)
}

// single appends one token at the next position on all rows: a text token
// or a start/end token.
func (b *positionBuilder) single() {
	p := b.next
	b.push(p, p, p)
	b.next = p + 1
}

// audioRun appends n audio tokens at consecutive positions.
func (b *positionBuilder) audioRun(n int) {
	for range n {
		b.single()
	}
}

// vision positions the image or video placeholder whose <|vision_start|> is
// at expanded[i] and returns how many tokens it spans.
func (b *positionBuilder) vision(expanded []int, i int, take func(int, Kind) (itemShape, error), opts Options) (int, error) {
	tk := opts.Tokens
	if i+1 >= len(expanded) {
		return 0, fmt.Errorf("vision start at token %d ends the prompt: %w", i, ErrMalformedPrompt)
	}
	var kind Kind
	switch expanded[i+1] {
	case tk.ImagePad:
		kind = Image
	case tk.VideoPad, tk.AudioStart:
		kind = Video
	default:
		return 0, fmt.Errorf("vision start at token %d is followed by %d, not an image, video or audio-in-video start: %w", i, expanded[i+1], ErrMalformedPrompt)
	}
	s, err := take(i, kind)
	if err != nil {
		return 0, err
	}
	if kind == Video && s.interleavedWithAudio != (expanded[i+1] == tk.AudioStart) {
		return 0, fmt.Errorf("video at token %d: audio-in-video is %v but the placeholder says otherwise: %w", i, opts.UseAudioInVideo, ErrMalformedPrompt)
	}

	if !s.interleavedWithAudio {
		pad := tk.ImagePad
		if kind == Video {
			pad = tk.VideoPad
		}
		end := i + 1 + s.visionTokens
		if !isRun(expanded, i+1, pad, s.visionTokens) || !hasAt(expanded, end, tk.VisionEnd) {
			return 0, fmt.Errorf("%v at token %d is not %d pads and the vision end: %w", kind, i, s.visionTokens, ErrMalformedPrompt)
		}
		b.single()
		start := b.next
		blockMax := start
		for _, p := range gridPositions(s, start) {
			b.push(p[0], p[1], p[2])
			blockMax = max(blockMax, p[0], p[1], p[2])
		}
		b.next = blockMax + 1
		b.single()
		return end - i + 1, nil
	}

	// Audio in video: check the tokens are exactly what Expand writes.
	order := soundtrackOrder(s, opts.PositionIDPerSecond)
	body := i + 2
	for k, isVideo := range order {
		want := tk.AudioPad
		if isVideo {
			want = tk.VideoPad
		}
		if !hasAt(expanded, body+k, want) {
			return 0, fmt.Errorf("video with audio at token %d: token %d is not the interleaving Expand writes: %w", i, body+k, ErrMalformedPrompt)
		}
	}
	audioEnd := body + len(order)
	if !hasAt(expanded, audioEnd, tk.AudioEnd) || !hasAt(expanded, audioEnd+1, tk.VisionEnd) {
		return 0, fmt.Errorf("video with audio at token %d does not close with the audio end and the vision end: %w", i, ErrMalformedPrompt)
	}
	b.single() // <|vision_start|>
	bos := b.next - 1
	b.push(bos, bos, bos) // <|audio_start|> shares it
	start := b.next
	blockMax := start
	for _, p := range interleavedPositions(s, start) {
		b.push(p[0], p[1], p[2])
		blockMax = max(blockMax, p[0], p[1], p[2])
	}
	eos := blockMax + 1
	b.push(eos, eos, eos) // <|audio_end|>
	b.push(eos, eos, eos) // <|vision_end|>
	b.next = eos + 1
	return audioEnd + 2 - i, nil
}

// gridPositions returns the merged grid's positions, frame by frame, row by
// row, offset by start. The temporal index is ⌊frame·temporalFactor⌋: vLLM
// casts the scaled index to int64.
func gridPositions(s itemShape, start int) [][3]int {
	out := make([][3]int, 0, s.visionTokens)
	for f := range s.frames {
		t := int(float64(f) * s.temporalFactor)
		for y := range s.height {
			for x := range s.width {
				out = append(out, [3]int{start + t, start + y, start + x})
			}
		}
	}
	return out
}

// interleavedPositions returns the positions of a video's frames merged
// with its soundtrack, in the order vLLM assigns them: the frame tokens'
// truncated temporal position is compared with the audio token's position,
// video first on a tie. When temporalFactor makes a frame time fractional
// this order can differ from soundtrackOrder's (which compares the
// unrounded time); vLLM then still emits the positions in this order, and
// so does this function, so that a prompt positions identically here and
// there.
func interleavedPositions(s itemShape, start int) [][3]int {
	video := gridPositions(s, start)
	out := make([][3]int, 0, len(video)+s.audioTokens)
	v, a := 0, 0
	for v < len(video) && a < s.audioTokens {
		if video[v][0] <= start+a {
			out = append(out, video[v])
			v++
		} else {
			p := start + a
			out = append(out, [3]int{p, p, p})
			a++
		}
	}
	out = append(out, video[v:]...)
	for ; a < s.audioTokens; a++ {
		p := start + a
		out = append(out, [3]int{p, p, p})
	}
	return out
}

func isRun(tokens []int, from, tok, n int) bool {
	if from+n > len(tokens) {
		return false
	}
	for _, t := range tokens[from : from+n] {
		if t != tok {
			return false
		}
	}
	return true
}

// Prepared is a prompt ready for the language model: its expanded tokens
// and their positions.
type Prepared struct {
	Tokens    []int
	Positions Positions
}

// Prepare expands the prompt and positions it: Expand then
// ComputePositions. It is what both a prefill and a decode worker call, from
// the same prompt, items and options, to agree on tokens and positions.
func Prepare(prompt []int, items []Item, opts Options) (Prepared, error) {
	expanded, err := Expand(prompt, items, opts)
	if err != nil {
		return Prepared{}, fmt.Errorf("expanding the prompt: %w", err)
	}
	pos, err := ComputePositions(expanded, items, opts)
	if err != nil {
		return Prepared{}, fmt.Errorf("positioning the expanded prompt: %w", err)
	}
	return Prepared{Tokens: expanded, Positions: pos}, nil
}
