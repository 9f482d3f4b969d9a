package talker

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// stepFeed hands out a finished conditioning's rows the way a decoding
// Thinker does, in steps of step rows, and records for each ask how many
// frames the Talker had emitted: what it waited for, and when.
type stepFeed struct {
	c       *Conditioning
	step    int
	frames  *int
	asks    [][2]int // rows held, frames emitted
	afterUp bool     // asked again after it was told the rows ended
	ended   bool
}

func (f *stepFeed) Next(have int) ([][]float32, [][]float32, bool, error) {
	if f.ended {
		f.afterUp = true
	}
	f.asks = append(f.asks, [2]int{have, *f.frames})
	end := min(have+f.step, len(f.c.Embed))
	f.ended = end == len(f.c.Embed)
	return f.c.Embed[have:end], f.c.Hidden[have:end], f.ended, nil
}

func feedFrames(t *testing.T, c *Conditioning, headRows, step int, p Params) ([][]int, *stepFeed) {
	t.Helper()
	var frames [][]int
	n := 0
	f := &stepFeed{c: c, step: step, frames: &n}
	head := &Conditioning{Embed: c.Embed[:headRows], Hidden: c.Hidden[:headRows], PromptTokenIDs: c.PromptTokenIDs,
		TTSPad: c.TTSPad, TTSBos: c.TTSBos, TTSEos: c.TTSEos}
	err := Default().GenerateFeed(head, f, DefaultSegmenter(), p, func(fr []int) bool {
		frames = append(frames, slices.Clone(fr))
		n++
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return frames, f
}

// Conditioning fed a row at a time gives Generate's frames on the finished
// conditioning, greedy and seeded, for a reply shorter than the prompt
// needs and long ones; the Talker asks for a row only when the step that
// reads it comes, and never again once told the rows ended.
func TestGenerateFeedEqualsGenerate(t *testing.T) {
	seed := int64(11)
	prompt := chat([2]string{"system", "Be brief."}, [2]string{"user", "Say hello."})
	for _, reply := range []string{"", "a", "ab", "Hello there!", strings.Repeat("A longer answer. ", 6)} {
		c := thinkerConditioning(t, prompt, reply)
		first := len(prompt) // the first reply row
		for _, p := range []Params{{}, {Temperature: 0.9, TopK: 50, Seed: &seed}, {MaxFrames: 5}} {
			want := collect(t, Default(), c, p)
			for _, shape := range [][2]int{{0, 1}, {len(prompt), 1}, {len(prompt) - 3, 4}, {len(c.Embed), 1}} {
				got, f := feedFrames(t, c, shape[0], shape[1], p)
				if !slices.EqualFunc(got, want, slices.Equal) {
					t.Errorf("reply %q, params %+v, head %d step %d: %d frames fed, %d whole; they differ", reply, p, shape[0], shape[1], len(got), len(want))
				}
				if f.afterUp {
					t.Errorf("reply %q: asked for rows after the end", reply)
				}
				for _, a := range f.asks {
					if wantFrames := max(0, a[0]-first); a[1] != wantFrames {
						t.Errorf("reply %q, head %d step %d: asked with %d rows after %d frames; want after %d", reply, shape[0], shape[1], a[0], a[1], wantFrames)
					}
				}
			}
		}
	}
}

// errFeed fails: the Thinker failed mid-answer.
type errFeed struct{}

func (errFeed) Next(int) ([][]float32, [][]float32, bool, error) {
	return nil, nil, false, errors.New("thinker failed")
}

func TestGenerateFeedRefuses(t *testing.T) {
	c := thinkerConditioning(t, chat([2]string{"user", "hi"}), "Hello")
	head := &Conditioning{PromptTokenIDs: c.PromptTokenIDs, TTSPad: c.TTSPad, TTSBos: c.TTSBos, TTSEos: c.TTSEos}
	emit := func([]int) bool { return true }
	if err := Default().GenerateFeed(head, errFeed{}, DefaultSegmenter(), Params{}, emit); err == nil || err.Error() != "thinker failed" {
		t.Errorf("failed feed: %v", err)
	}
	short := &stepFeed{c: &Conditioning{Embed: c.Embed[:3], Hidden: c.Hidden[:3]}, step: 1, frames: new(int)}
	if err := Default().GenerateFeed(head, short, DefaultSegmenter(), Params{}, emit); !errors.Is(err, ErrInvalidConditioning) {
		t.Errorf("rows ending inside the prompt: %v", err)
	}
	bad := &stepFeed{c: &Conditioning{Embed: [][]float32{{1}}, Hidden: [][]float32{{1}}}, step: 1, frames: new(int)}
	if err := Default().GenerateFeed(head, bad, DefaultSegmenter(), Params{}, emit); !errors.Is(err, ErrInvalidConditioning) {
		t.Errorf("narrow row: %v", err)
	}
	noTTS := *head
	noTTS.TTSEos = nil
	if err := Default().GenerateFeed(&noTTS, short, DefaultSegmenter(), Params{}, emit); !errors.Is(err, ErrInvalidConditioning) {
		t.Errorf("missing tts_eos: %v", err)
	}
}
