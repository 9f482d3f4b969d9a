package mmproc

import "fmt"

// Tokens are the special token ids that delimit media in a prompt. A model
// with its own vocabulary (the tiny reference model) passes its own ids;
// nothing in this package assumes the real Qwen3-Omni values.
type Tokens struct {
	AudioStart  int // <|audio_start|>
	AudioEnd    int // <|audio_end|>
	AudioPad    int // <|audio_pad|>, one per audio embedding
	VisionStart int // <|vision_start|>
	VisionEnd   int // <|vision_end|>
	ImagePad    int // <|image_pad|>, one per merged image patch
	VideoPad    int // <|video_pad|>, one per merged video patch
}

// Qwen3Omni returns the ids of Qwen/Qwen3-Omni-30B-A3B-Instruct's thinker
// (thinker_config audio_start_token_id, audio_end_token_id, audio_token_id,
// vision_start_token_id, vision_end_token_id, image_token_id,
// video_token_id). The transformers config class defaults differ (151646,
// 151647 are Qwen2.5-Omni leftovers); the checkpoint's values are these.
func Qwen3Omni() Tokens {
	return Tokens{
		AudioStart:  151669,
		AudioEnd:    151670,
		AudioPad:    151675,
		VisionStart: 151652,
		VisionEnd:   151653,
		ImagePad:    151655,
		VideoPad:    151656,
	}
}

// Validate reports ErrInvalidTokens unless every id is non-negative and all
// seven are distinct: expansion and positions tell placeholders apart by id.
func (t Tokens) Validate() error {
	ids := t.all()
	for i, a := range ids {
		if a < 0 {
			return fmt.Errorf("token id %d is negative: %w", a, ErrInvalidTokens)
		}
		for _, b := range ids[:i] {
			if a == b {
				return fmt.Errorf("token id %d is used twice: %w", a, ErrInvalidTokens)
			}
		}
	}
	return nil
}

func (t Tokens) all() [7]int {
	return [7]int{t.AudioStart, t.AudioEnd, t.AudioPad, t.VisionStart, t.VisionEnd, t.ImagePad, t.VideoPad}
}

// isDelimiter reports whether tok may only appear as part of a placeholder.
func (t Tokens) isDelimiter(tok int) bool {
	for _, id := range t.all() {
		if tok == id {
			return true
		}
	}
	return false
}
