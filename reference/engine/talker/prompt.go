package talker

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/omnipd/omnipd/reference/engine/kernel"
)

// ErrInvalidConditioning is wrapped by every error about a malformed
// Conditioning or Segmenter; a bad request must never panic a worker.
var ErrInvalidConditioning = errors.New("talker: invalid conditioning")

// Conditioning is what the Thinker hands the Talker for one request.
type Conditioning struct {
	Embed          [][]float32 // layer-0 rows, one per Thinker position (prompt + generated - 1)
	Hidden         [][]float32 // accept-layer rows, same length
	TokenIDs       []int       // all Thinker tokens: prompt + generated
	PromptTokenIDs []int       // a prefix of TokenIDs

	// Word embeddings (Thinker layer 0) of the TTS special tokens.
	TTSPad, TTSBos, TTSEos []float32
}

// Role names a Segmenter must know.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Segmenter says how to find ChatML turns in Thinker token ids:
// <|im_start|> role-word ... (up to the next <|im_start|>).
type Segmenter struct {
	IMStart, IMEnd int
	// Roles maps a role name (RoleSystem, RoleUser, RoleAssistant) to the
	// token ids of its role word, which follow IMStart.
	Roles map[string][]int
	// Multimodal lists placeholder ids (audio, image, video) whose positions
	// the Talker reads through the hidden projection of the Hidden rows
	// instead of the text projection of the Embed rows, as the real Talker
	// does. Empty for the text-only reference tokenizer.
	Multimodal []int
}

// DefaultSegmenter is for the reference Thinker's byte-level tokenizer:
// <|im_start|> 257, <|im_end|> 258, role words spelled in bytes, and its
// placeholders <|audio_pad|> 261, <|image_pad|> 264, <|video_pad|> 265
// (reference/engine/tokenizer.Default).
func DefaultSegmenter() Segmenter {
	return Segmenter{
		IMStart: 257,
		IMEnd:   258,
		Roles: map[string][]int{
			RoleSystem:    bytesOf(RoleSystem),
			RoleUser:      bytesOf(RoleUser),
			RoleAssistant: bytesOf(RoleAssistant),
		},
		Multimodal: []int{261, 264, 265},
	}
}

// QwenSegmenter is for the real Qwen3-Omni tokenizer (<|im_start|> 151644,
// <|im_end|> 151645, system 8948, user 872, assistant 77091). Its
// multimodal positions are the placeholders audio_token_id 151675,
// image_token_id 151655 and video_token_id 151656, the mask transformers'
// Qwen3-Omni builds before the Talker's prefill (multimodal_mask in
// modeling_qwen3_omni_moe.py; ids in docs/multimodal/processor.md).
func QwenSegmenter() Segmenter {
	return Segmenter{
		IMStart: 151644,
		IMEnd:   151645,
		Roles: map[string][]int{
			RoleSystem:    {8948},
			RoleUser:      {872},
			RoleAssistant: {77091},
		},
		Multimodal: []int{151675, 151655, 151656},
	}
}

func bytesOf(s string) []int {
	ids := make([]int, len(s))
	for i := range len(s) {
		ids[i] = int(s[i])
	}
	return ids
}

func (s Segmenter) validate() error {
	for _, r := range []string{RoleSystem, RoleUser, RoleAssistant} {
		if len(s.Roles[r]) == 0 {
			return fmt.Errorf("%w: segmenter has no token ids for role %q", ErrInvalidConditioning, r)
		}
	}
	return nil
}

// role names the role whose word starts at ids[i:], preferring the longest
// match so that one role word may prefix another.
func (s Segmenter) role(ids []int, i int) (string, bool) {
	best, bestLen := "", 0
	for name, word := range s.Roles {
		if len(word) > bestLen && i+len(word) <= len(ids) && slices.Equal(ids[i:i+len(word)], word) {
			best, bestLen = name, len(word)
		}
	}
	return best, bestLen > 0
}

// segment is one ChatML turn: rows [start, end) of the conditioning.
type segment struct {
	role       string
	start, end int
}

// plan is the Talker prompt's layout, computed from token ids alone.
type plan struct {
	users     []segment
	assistant segment
	header    int // assistant rows before the first reply token: <|im_start|>, role word, separator
}

// promptLen is Σ(user segment lengths) + AssistantRows.
func (p *plan) promptLen() int {
	n := AssistantRows
	for _, u := range p.users {
		n += u.end - u.start
	}
	return n
}

// check validates c against the model's widths and returns the prompt
// layout. It never panics on any input.
func (m *Model) check(c *Conditioning, s Segmenter) (*plan, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil", ErrInvalidConditioning)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	rows, np := len(c.Embed), len(c.PromptTokenIDs)
	switch {
	case len(c.Hidden) != rows:
		return nil, fmt.Errorf("%w: %d embed rows but %d hidden rows", ErrInvalidConditioning, rows, len(c.Hidden))
	case np == 0:
		return nil, fmt.Errorf("%w: no prompt tokens", ErrInvalidConditioning)
	case len(c.TokenIDs) <= np:
		return nil, fmt.Errorf("%w: %d tokens for a %d-token prompt; want at least one generated token", ErrInvalidConditioning, len(c.TokenIDs), np)
	case rows != len(c.TokenIDs)-1:
		return nil, fmt.Errorf("%w: %d rows for %d tokens; want one row per token but the last", ErrInvalidConditioning, rows, len(c.TokenIDs))
	case !slices.Equal(c.TokenIDs[:np], c.PromptTokenIDs):
		return nil, fmt.Errorf("%w: prompt token ids are not a prefix of the token ids", ErrInvalidConditioning)
	}
	w := m.Config.ThinkerHidden
	for _, v := range []struct {
		name string
		rows [][]float32
	}{{"embed", c.Embed}, {"hidden", c.Hidden}, {"tts", [][]float32{c.TTSPad, c.TTSBos, c.TTSEos}}} {
		for i, r := range v.rows {
			if len(r) != w {
				return nil, fmt.Errorf("%w: %s row %d has width %d; want %d", ErrInvalidConditioning, v.name, i, len(r), w)
			}
			for _, x := range r {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return nil, fmt.Errorf("%w: %s row %d is not finite", ErrInvalidConditioning, v.name, i)
				}
			}
		}
	}
	return s.plan(c.PromptTokenIDs, rows)
}

// plan splits the prompt at each <|im_start|> (as vllm-omni does, a turn
// runs to the next <|im_start|>, so it includes its <|im_end|> and the
// newline after it; the last turn runs to the end of the rows, taking in the
// reply). Tokens before the first <|im_start|> belong to no turn and are
// skipped. The last turn must be the assistant's; earlier assistant turns
// (history) are skipped, as vllm-omni skips them.
func (s Segmenter) plan(prompt []int, rows int) (*plan, error) {
	var starts []int
	for i, id := range prompt {
		if id == s.IMStart {
			starts = append(starts, i)
		}
	}
	if len(starts) == 0 {
		return nil, fmt.Errorf("%w: prompt has no <|im_start|> (id %d)", ErrInvalidConditioning, s.IMStart)
	}
	p := &plan{}
	for k, st := range starts {
		end := rows
		if k+1 < len(starts) {
			end = starts[k+1]
		}
		role, ok := s.role(prompt, st+1)
		if !ok {
			return nil, fmt.Errorf("%w: no known role after <|im_start|> at position %d", ErrInvalidConditioning, st)
		}
		last := k == len(starts)-1
		switch {
		case role == RoleUser:
			if last {
				return nil, fmt.Errorf("%w: the last turn is the user's; want an assistant turn to speak", ErrInvalidConditioning)
			}
			p.users = append(p.users, segment{role, st, end})
		case role == RoleAssistant && last:
			// The header is <|im_start|>, the role word and one separator
			// (the newline of "assistant\n"); all must be in the prompt.
			header := 1 + len(s.Roles[RoleAssistant]) + 1
			if st+header > len(prompt) {
				return nil, fmt.Errorf("%w: assistant turn at position %d is shorter than its header (%d tokens)", ErrInvalidConditioning, st, header)
			}
			p.assistant, p.header = segment{role, st, end}, header
		case last:
			return nil, fmt.Errorf("%w: the last turn is the %s's; want an assistant turn to speak", ErrInvalidConditioning, role)
		}
	}
	return p, nil
}

// PromptLen returns the length of the Talker prompt for c:
// Σ(user segment lengths) + 9.
func (m *Model) PromptLen(c *Conditioning, s Segmenter) (int, error) {
	p, err := m.check(c, s)
	if err != nil {
		return 0, err
	}
	return p.promptLen(), nil
}

// prompt holds the Talker's input rows for one request.
type prompt struct {
	rows     [][]float32 // prefill inputs, PromptLen of them
	trailing [][]float32 // per-step text inputs: reply rows after the first, then tts_eos
	pad      []float32   // text input once trailing is used up
}

// buildPrompt builds the Talker prompt the way vllm-omni's
// _thinker_to_talker_prefill does:
//
//   - user turn: per position, textProj(embed) for text tokens and
//     hiddenProj(hidden) for multimodal placeholders;
//   - assistant turn, 9 rows, text channel + codec channel:
//     text  = [hdr0, hdr1, hdr2, pad, pad, pad, pad, bos, reply0]
//     codec = [0, 0, 0, nothink, think_bos, think_eos, speaker, codec_pad, codec_bos]
//     where hdr are the projected header rows (<|im_start|>, role, "\n"),
//     pad/bos the projected tts_pad/tts_bos, reply0 the projected first reply
//     token (zeros if the Thinker generated only one token, whose row is
//     not in the conditioning);
//   - trailing text: projected reply rows after the first, then tts_eos.
//
// One generalisation: Qwen's role word is one token, so the header is three
// rows; a byte-level role word spans several, and their projected rows are
// averaged into hdr1 so that the block stays 9 rows.
func (m *Model) buildPrompt(c *Conditioning, p *plan, mm []int) *prompt {
	h := m.Config.Hidden
	text := func(x []float32) []float32 {
		out := make([]float32, h)
		kernel.MatVec(out, m.textProj, x)
		return out
	}
	pr := &prompt{pad: text(c.TTSPad)}
	for _, u := range p.users {
		for i := u.start; i < u.end; i++ {
			if slices.Contains(mm, c.TokenIDs[i]) {
				out := make([]float32, h)
				kernel.MatVec(out, m.hiddenProj, c.Hidden[i])
				pr.rows = append(pr.rows, out)
			} else {
				pr.rows = append(pr.rows, text(c.Embed[i]))
			}
		}
	}
	a := p.assistant
	role := make([]float32, h)
	for i := a.start + 1; i < a.start+p.header-1; i++ {
		kernel.Add(role, text(c.Embed[i]))
	}
	kernel.Scale(role, 1/float32(p.header-2))
	reply0 := make([]float32, h)
	first := a.start + p.header
	if first < a.end {
		reply0 = text(c.Embed[first])
	}
	bos := text(c.TTSBos)
	textRows := [AssistantRows][]float32{
		text(c.Embed[a.start]), role, text(c.Embed[a.start+p.header-1]),
		pr.pad, pr.pad, pr.pad, pr.pad, bos, reply0,
	}
	codec := [AssistantRows]int{-1, -1, -1, codecNothink, codecThinkBos, codecThinkEos, codecSpeaker, codecPad, codecBos}
	for i, t := range textRows {
		row := slices.Clone(t)
		if codec[i] >= 0 {
			kernel.Add(row, m.codecEmbed[codec[i]*h:(codec[i]+1)*h])
		}
		pr.rows = append(pr.rows, row)
	}
	for i := first + 1; i < a.end; i++ {
		pr.trailing = append(pr.trailing, text(c.Embed[i]))
	}
	pr.trailing = append(pr.trailing, text(c.TTSEos))
	return pr
}
