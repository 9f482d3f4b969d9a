package talker

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/omnipd/omnipd/reference/engine/kernel"
)

// Feed supplies conditioning rows as the Thinker computes them (async
// chunk): the Talker asks for more only when its next input needs a row it
// does not have.
type Feed interface {
	// Next returns rows after the first have (one embed and one hidden row
	// per position), waiting for at least one unless none follow; done
	// says none follow the rows returned.
	Next(have int) (embed, hidden [][]float32, done bool, err error)
}

// GenerateFeed is Generate on conditioning that grows: head holds the
// prompt ids, the TTS embeddings and the rows known already (perhaps none),
// feed the rest. It reads rows in the order and at the moment Generate's
// prompt and steps use them — the prompt once its rows (the first reply
// token's included) are in, each step's text row when that step needs it —
// and decides that the text ended (tts_eos, then tts_pad) only when feed
// says no row follows, so its frames are Generate's on the finished
// conditioning, frame for frame. head.TokenIDs is not read.
func (m *Model) GenerateFeed(head *Conditioning, feed Feed, s Segmenter, p Params, emit func(frame []int) bool) error {
	if err := p.validate(); err != nil {
		return err
	}
	if head == nil || feed == nil {
		return fmt.Errorf("%w: nil", ErrInvalidConditioning)
	}
	if err := s.validate(); err != nil {
		return err
	}
	if len(head.PromptTokenIDs) == 0 {
		return fmt.Errorf("%w: no prompt tokens", ErrInvalidConditioning)
	}
	if err := m.checkRows("tts", [][]float32{head.TTSPad, head.TTSBos, head.TTSEos}, 0); err != nil {
		return err
	}
	src := &feedRows{m: m, feed: feed}
	if err := src.add(head.Embed, head.Hidden); err != nil {
		return err
	}
	pl, err := s.plan(head.PromptTokenIDs, len(head.PromptTokenIDs))
	if err != nil {
		return err
	}
	return m.run(src, head, pl, s.Multimodal, p, emit)
}

// rowSource is the conditioning the Talker reads, whole or growing.
type rowSource interface {
	// row returns embed and hidden row i; ok is false when the
	// conditioning ends before row i.
	row(i int) (embed, hidden []float32, ok bool, err error)
}

// wholeRows is finished, already validated conditioning.
type wholeRows struct{ c *Conditioning }

func (w wholeRows) row(i int) ([]float32, []float32, bool, error) {
	if i >= len(w.c.Embed) {
		return nil, nil, false, nil
	}
	return w.c.Embed[i], w.c.Hidden[i], true, nil
}

// feedRows is conditioning that grows: it asks its feed for more only when
// a row past those it holds is asked for.
type feedRows struct {
	m             *Model
	feed          Feed
	embed, hidden [][]float32
	done          bool
}

func (f *feedRows) row(i int) ([]float32, []float32, bool, error) {
	for i >= len(f.embed) && !f.done {
		e, h, done, err := f.feed.Next(len(f.embed))
		if err != nil {
			return nil, nil, false, err
		}
		if err := f.add(e, h); err != nil {
			return nil, nil, false, err
		}
		f.done = done
	}
	if i >= len(f.embed) {
		return nil, nil, false, nil
	}
	return f.embed[i], f.hidden[i], true, nil
}

func (f *feedRows) add(embed, hidden [][]float32) error {
	if len(embed) != len(hidden) {
		return fmt.Errorf("%w: %d embed rows but %d hidden rows", ErrInvalidConditioning, len(embed), len(hidden))
	}
	if err := f.m.checkRows("embed", embed, len(f.embed)); err != nil {
		return err
	}
	if err := f.m.checkRows("hidden", hidden, len(f.hidden)); err != nil {
		return err
	}
	f.embed = append(f.embed, embed...)
	f.hidden = append(f.hidden, hidden...)
	return nil
}

// checkRows refuses rows of the wrong width or not finite; first is the
// index of rows[0], for the message.
func (m *Model) checkRows(name string, rows [][]float32, first int) error {
	w := m.Config.ThinkerHidden
	for i, r := range rows {
		if len(r) != w {
			return fmt.Errorf("%w: %s row %d has width %d; want %d", ErrInvalidConditioning, name, first+i, len(r), w)
		}
		for _, x := range r {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("%w: %s row %d is not finite", ErrInvalidConditioning, name, first+i)
			}
		}
	}
	return nil
}

// run is the Talker's decode on rows from src, laid out by pl (see
// buildPrompt for the prompt and Generate for the steps). Every row is read
// when first needed and never after the point it would be in a whole run.
func (m *Model) run(src rowSource, c *Conditioning, pl *plan, mm []int, p Params, emit func(frame []int) bool) error {
	h := m.Config.Hidden
	text := func(x []float32) []float32 {
		out := make([]float32, h)
		kernel.MatVec(out, m.textProj, x)
		return out
	}
	need := func(i int) ([]float32, []float32, error) {
		e, hid, ok, err := src.row(i)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			return nil, nil, fmt.Errorf("%w: the conditioning ends at row %d, inside the prompt", ErrInvalidConditioning, i)
		}
		return e, hid, nil
	}
	pad := text(c.TTSPad)
	var rows [][]float32
	for _, u := range pl.users {
		for i := u.start; i < u.end; i++ {
			e, hid, err := need(i)
			if err != nil {
				return err
			}
			if slices.Contains(mm, c.PromptTokenIDs[i]) {
				out := make([]float32, h)
				kernel.MatVec(out, m.hiddenProj, hid)
				rows = append(rows, out)
			} else {
				rows = append(rows, text(e))
			}
		}
	}
	a := pl.assistant
	hdr := make([][]float32, pl.header)
	for i := range hdr {
		e, _, err := need(a.start + i)
		if err != nil {
			return err
		}
		hdr[i] = e
	}
	role := make([]float32, h)
	for i := 1; i < pl.header-1; i++ {
		kernel.Add(role, text(hdr[i]))
	}
	kernel.Scale(role, 1/float32(pl.header-2))
	first := a.start + pl.header
	reply0 := make([]float32, h)
	e, _, ok, err := src.row(first)
	if err != nil {
		return err
	}
	if ok {
		reply0 = text(e)
	}
	bos := text(c.TTSBos)
	textRows := [AssistantRows][]float32{
		text(hdr[0]), role, text(hdr[pl.header-1]),
		pad, pad, pad, pad, bos, reply0,
	}
	codec := [AssistantRows]int{-1, -1, -1, codecNothink, codecThinkBos, codecThinkEos, codecSpeaker, codecPad, codecBos}
	for i, t := range textRows {
		row := slices.Clone(t)
		if codec[i] >= 0 {
			kernel.Add(row, m.codecEmbed[codec[i]*h:(codec[i]+1)*h])
		}
		rows = append(rows, row)
	}

	maxFrames := p.MaxFrames
	if maxFrames == 0 {
		maxFrames = m.Config.DefaultMaxFrames
	}
	var rng *rand.Rand
	if p.Temperature > 0 {
		seed := rand.Uint64()
		if p.Seed != nil {
			seed = uint64(*p.Seed)
		}
		rng = rand.New(rand.NewPCG(seed, seed^0x5deece66d))
	}
	st := m.newState(len(rows) + maxFrames)
	var hid []float32
	for _, row := range rows {
		hid = st.forward(row)
	}
	smp := sampler{p: p, rng: rng}
	frame := make([]int, Codebooks)
	in := make([]float32, h)
	textEnded := false // the reply rows are used up and tts_eos was fed
	padInputs := 0     // steps whose text input was tts_pad, counting the current one
	for step := 0; step < maxFrames; step++ {
		forceStop := m.Config.TailFrames >= 0 && padInputs > m.Config.TailFrames
		frame[0] = m.firstCode(&smp, hid, forceStop)
		if frame[0] == StopCode {
			return nil
		}
		m.predict(&smp, hid, frame)
		if !emit(frame) {
			return nil
		}
		if step+1 == maxFrames {
			return nil // the next input would be computed for nothing
		}
		copy(in, m.codecEmbed[frame[0]*h:(frame[0]+1)*h])
		for j := 1; j < Codebooks; j++ {
			kernel.Add(in, m.predEmbed[j-1][frame[j]*h:(frame[j]+1)*h])
		}
		// The text input: the next reply row while there is one (waiting
		// for it while the Thinker decodes), then tts_eos once, then tts_pad.
		switch {
		case textEnded:
			kernel.Add(in, pad)
			padInputs++
		default:
			e, _, ok, err := src.row(first + 1 + step)
			if err != nil {
				return err
			}
			if ok {
				kernel.Add(in, text(e))
			} else {
				kernel.Add(in, text(c.TTSEos))
				textEnded = true
			}
		}
		hid = st.forward(in)
	}
	return nil
}
