package talker

import (
	"errors"
	"github.com/omnipd/omnipd/reference/engine/kernel"
	"math"
	"slices"
	"testing"

	"github.com/omnipd/omnipd/reference/engine/kvcache"
	"github.com/omnipd/omnipd/reference/engine/model"
)

const (
	imStart = 257
	imEnd   = 258
)

// chat renders turns as the reference tokenizer's ApplyChatTemplate does,
// with the generation prompt.
func chat(turns ...[2]string) []int {
	var ids []int
	for _, t := range turns {
		ids = append(ids, imStart)
		ids = append(ids, bytesOf(t[0]+"\n"+t[1])...)
		ids = append(ids, imEnd, '\n')
	}
	ids = append(ids, imStart)
	return append(ids, bytesOf("assistant\n")...)
}

// thinkerConditioning runs the reference Thinker over prompt+reply and
// captures its rows, the way a Thinker worker exports them.
func thinkerConditioning(t testing.TB, prompt []int, reply string) *Conditioning {
	t.Helper()
	th := model.Default()
	all := append(slices.Clone(prompt), bytesOf(reply)...)
	all = append(all, imEnd) // the Thinker's stop token: no row for it
	shape := th.KVShape(0)
	n := (len(all) + shape.BlockSize - 1) / shape.BlockSize
	cache, err := kvcache.New(shape, n)
	if err != nil {
		t.Fatal(err)
	}
	table, err := cache.Allocate(n)
	if err != nil {
		t.Fatal(err)
	}
	cp := &model.Capture{Layer: 2}
	th.Forward(cache, table, 0, all[:len(all)-1], cp)
	return &Conditioning{
		Embed: cp.Embeddings, Hidden: cp.Hidden,
		TokenIDs: all, PromptTokenIDs: prompt,
		TTSPad: th.Embedding(0), TTSBos: th.Embedding(1), TTSEos: th.Embedding(2),
	}
}

func TestDefaultConfigValid(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := Default().Config.ThinkerHidden, model.DefaultConfig().HiddenSize; got != want {
		t.Fatalf("ThinkerHidden %d, want the reference Thinker's %d", got, want)
	}
}

func TestPromptLen(t *testing.T) {
	seg := func(role, content string) int { return 1 + len(role) + 1 + len(content) + 2 }
	for _, tc := range []struct {
		name  string
		turns [][2]string
		want  int
	}{
		{"one user", [][2]string{{"user", "hi"}}, seg("user", "hi") + 9},
		{"system skipped", [][2]string{{"system", "be brief"}, {"user", "hi"}}, seg("user", "hi") + 9},
		{"two users, history skipped", [][2]string{
			{"system", "s"}, {"user", "hello"}, {"assistant", "hey there"}, {"user", "again?"},
		}, seg("user", "hello") + seg("user", "again?") + 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := thinkerConditioning(t, chat(tc.turns...), "ok!")
			got, err := Default().PromptLen(c, DefaultSegmenter())
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("PromptLen = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestQwenSegmenter checks the real Qwen ids: one-token role words give the
// same 3-row header as vllm-omni.
func TestQwenSegmenter(t *testing.T) {
	const (
		st, end, sys, user, asst, nl = 151644, 151645, 8948, 872, 77091, 198
	)
	prompt := []int{st, sys, nl, 5, 6, end, nl, st, user, nl, 7, 8, 9, end, nl, st, asst, nl}
	ids := append(slices.Clone(prompt), 11, 12, 13, end)
	p, err := QwenSegmenter().plan(prompt, len(ids)-1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.promptLen(), 8+9; got != want {
		t.Fatalf("prompt len %d, want %d", got, want)
	}
	if p.header != 3 || p.assistant.start != 15 || p.assistant.end != len(ids)-1 {
		t.Fatalf("assistant %+v header %d", p.assistant, p.header)
	}
}

func collect(t testing.TB, m *Model, c *Conditioning, p Params) [][]int {
	t.Helper()
	var frames [][]int
	err := m.Generate(c, DefaultSegmenter(), p, func(f []int) bool {
		frames = append(frames, slices.Clone(f))
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return frames
}

func checkFrames(t *testing.T, frames [][]int) {
	t.Helper()
	for i, f := range frames {
		if len(f) != Codebooks {
			t.Fatalf("frame %d has %d ids", i, len(f))
		}
		for j, id := range f {
			if id < 0 || id >= CodebookSize {
				t.Fatalf("frame %d codebook %d: id %d outside 0..%d", i, j, id, CodebookSize-1)
			}
		}
	}
}

func TestGenerateDeterministic(t *testing.T) {
	c := thinkerConditioning(t, chat([2]string{"user", "Say hello."}), "Hello there!")
	seed := int64(7)
	for _, p := range []Params{
		{},
		{Temperature: 0.9, TopK: 50, Seed: &seed},
		{Temperature: 1, Seed: &seed},
	} {
		a := collect(t, Default(), c, p)
		b := collect(t, Default(), c, p)
		if len(a) == 0 || !slices.EqualFunc(a, b, slices.Equal) {
			t.Fatalf("params %+v: runs differ or are empty (%d, %d frames)", p, len(a), len(b))
		}
		checkFrames(t, a)
	}
	other := int64(8)
	if a, b := collect(t, Default(), c, Params{Temperature: 1, Seed: &seed}),
		collect(t, Default(), c, Params{Temperature: 1, Seed: &other}); slices.EqualFunc(a, b, slices.Equal) {
		t.Fatal("different seeds gave the same frames")
	}
}

// TestGenerateLength pins the reference stop rule: one frame for the
// prompt, one per trailing text row (reply rows after the first, then
// tts_eos), then TailFrames on tts_pad, then the stop code.
func TestGenerateLength(t *testing.T) {
	for _, reply := range []string{"", "a", "ab", "Hello there!"} {
		c := thinkerConditioning(t, chat([2]string{"user", "hi"}), reply)
		trailing := max(len(reply)-1, 0) + 1
		want := 1 + trailing + DefaultConfig().TailFrames
		if got := len(collect(t, Default(), c, Params{})); got != want {
			t.Errorf("reply %q: %d frames, want %d", reply, got, want)
		}
	}
}

func TestGenerateLimits(t *testing.T) {
	c := thinkerConditioning(t, chat([2]string{"user", "hi"}), "a longer reply")
	if got := len(collect(t, Default(), c, Params{MaxFrames: 3})); got != 3 {
		t.Fatalf("MaxFrames 3: %d frames", got)
	}
	n := 0
	err := Default().Generate(c, DefaultSegmenter(), Params{}, func([]int) bool { n++; return n < 2 })
	if err != nil || n != 2 {
		t.Fatalf("emit returning false: %d frames, err %v", n, err)
	}
}

// TestStopCode forces the first-codebook head to choose the stop code at a
// chosen step k: the stop row becomes a large multiple of step k's
// normalised hidden state with its components along steps 0..k-1's states
// removed, so the stop logit is about 0 (below the best code) before step k
// and far above every code at step k.
func TestStopCode(t *testing.T) {
	c := thinkerConditioning(t, chat([2]string{"user", "hi"}), "a long enough reply")
	cfg := DefaultConfig()
	cfg.TailFrames = -1 // only the head may stop
	base, err := New(cfg, defaultSeed)
	if err != nil {
		t.Fatal(err)
	}
	full := collect(t, base, c, Params{MaxFrames: 12})
	if len(full) != 12 {
		t.Fatalf("untweaked model stopped after %d frames", len(full))
	}
	h := cfg.Hidden
	normed := func(k int) []float64 {
		x := make([]float32, h)
		kernel.RMSNorm(x, hiddenAt(t, base, c, full, k), base.norm, cfg.RMSNormEps)
		v := make([]float64, h)
		for i := range x {
			v[i] = float64(x[i])
		}
		return v
	}
	for _, k := range []int{0, 4} {
		var basis [][]float64
		for j := range k {
			v := normed(j)
			for _, b := range basis {
				sub(v, b)
			}
			basis = append(basis, unit(v))
		}
		v := normed(k)
		for _, b := range basis {
			sub(v, b)
		}
		v = unit(v)
		m := *base
		m.codecHead = slices.Clone(base.codecHead)
		for i := range h {
			m.codecHead[StopCode*h+i] = float32(100 * v[i])
		}
		got := collect(t, &m, c, Params{MaxFrames: 12})
		if len(got) != k || !slices.EqualFunc(got, full[:k], slices.Equal) {
			t.Fatalf("stop at step %d: got %d frames", k, len(got))
		}
	}
}

// sub removes from v its component along the unit vector b.
func sub(v, b []float64) {
	var d float64
	for i := range v {
		d += v[i] * b[i]
	}
	for i := range v {
		v[i] -= d * b[i]
	}
}

func unit(v []float64) []float64 {
	var n float64
	for _, x := range v {
		n += x * x
	}
	n = 1 / math.Sqrt(n)
	for i := range v {
		v[i] *= n
	}
	return v
}

// hiddenAt replays generation to the hidden state of step k.
func hiddenAt(t *testing.T, m *Model, c *Conditioning, frames [][]int, k int) []float32 {
	pl, err := m.check(c, DefaultSegmenter())
	if err != nil {
		t.Fatal(err)
	}
	pr := m.buildPrompt(c, pl, nil)
	st := m.newState(len(pr.rows) + k)
	var hid []float32
	for _, r := range pr.rows {
		hid = st.forward(r)
	}
	h := m.Config.Hidden
	for step := range k {
		in := slices.Clone(m.codecEmbed[frames[step][0]*h : (frames[step][0]+1)*h])
		for j := 1; j < Codebooks; j++ {
			kernel.Add(in, m.predEmbed[j-1][frames[step][j]*h:(frames[step][j]+1)*h])
		}
		if step < len(pr.trailing) {
			kernel.Add(in, pr.trailing[step])
		} else {
			kernel.Add(in, pr.pad)
		}
		hid = st.forward(in)
	}
	return slices.Clone(hid)
}

func TestConditioningChangesFrames(t *testing.T) {
	a := collect(t, Default(), thinkerConditioning(t, chat([2]string{"user", "Say hello."}), "Hello!"), Params{})
	b := collect(t, Default(), thinkerConditioning(t, chat([2]string{"user", "Say howdy."}), "Hello!"), Params{})
	if slices.EqualFunc(a, b, slices.Equal) {
		t.Fatal("different user turns gave the same frames")
	}
	c := collect(t, Default(), thinkerConditioning(t, chat([2]string{"user", "Say hello."}), "Howdy!"), Params{})
	if slices.EqualFunc(a, c, slices.Equal) {
		t.Fatal("different replies gave the same frames")
	}
}

func TestInvalid(t *testing.T) {
	good := func() *Conditioning {
		return thinkerConditioning(t, chat([2]string{"system", "s"}, [2]string{"user", "hi"}), "yo")
	}
	for _, tc := range []struct {
		name string
		edit func(*Conditioning, *Segmenter)
	}{
		{"nil-like: empty", func(c *Conditioning, _ *Segmenter) { *c = Conditioning{} }},
		{"hidden rows short", func(c *Conditioning, _ *Segmenter) { c.Hidden = c.Hidden[1:] }},
		{"rows do not match tokens", func(c *Conditioning, _ *Segmenter) {
			c.Embed, c.Hidden = c.Embed[:len(c.Embed)-1], c.Hidden[:len(c.Hidden)-1]
		}},
		{"no generated token", func(c *Conditioning, _ *Segmenter) { c.TokenIDs = c.PromptTokenIDs }},
		{"prompt not a prefix", func(c *Conditioning, _ *Segmenter) {
			c.PromptTokenIDs = slices.Clone(c.PromptTokenIDs)
			c.PromptTokenIDs[1] = 'x'
		}},
		{"wide embed row", func(c *Conditioning, _ *Segmenter) { c.Embed[3] = append(slices.Clone(c.Embed[3]), 0) }},
		{"narrow hidden row", func(c *Conditioning, _ *Segmenter) { c.Hidden[0] = c.Hidden[0][:5] }},
		{"missing tts_eos", func(c *Conditioning, _ *Segmenter) { c.TTSEos = nil }},
		{"missing assistant turn", func(c *Conditioning, _ *Segmenter) {
			p := chat([2]string{"user", "hi"})
			p = p[:len(p)-1-len("assistant\n")] // drop the generation prompt
			*c = *thinkerConditioning(t, p, "yo")
		}},
		{"unknown role", func(c *Conditioning, _ *Segmenter) {
			*c = *thinkerConditioning(t, chat([2]string{"tool", "x"}, [2]string{"user", "hi"}), "yo")
		}},
		{"no im_start", func(_ *Conditioning, s *Segmenter) { s.IMStart = 999 }},
		{"segmenter without roles", func(_ *Conditioning, s *Segmenter) { s.Roles = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := good(), DefaultSegmenter()
			tc.edit(c, &s)
			if _, err := Default().PromptLen(c, s); !errors.Is(err, ErrInvalidConditioning) {
				t.Fatalf("PromptLen: err %v, want ErrInvalidConditioning", err)
			}
			err := Default().Generate(c, s, Params{}, func([]int) bool { t.Fatal("emitted a frame"); return false })
			if !errors.Is(err, ErrInvalidConditioning) {
				t.Fatalf("Generate: err %v, want ErrInvalidConditioning", err)
			}
		})
	}
	if _, err := Default().PromptLen(nil, DefaultSegmenter()); !errors.Is(err, ErrInvalidConditioning) {
		t.Fatalf("nil conditioning: %v", err)
	}
	for _, p := range []Params{{Temperature: -1}, {TopK: -1}, {MaxFrames: -1}} {
		if err := Default().Generate(good(), DefaultSegmenter(), p, func([]int) bool { return true }); !errors.Is(err, ErrInvalidParams) {
			t.Fatalf("params %+v: err %v", p, err)
		}
	}
}

func BenchmarkGenerate(b *testing.B) {
	c := thinkerConditioning(b, chat([2]string{"user", "Tell me something."}), "Here is a reply of some length.")
	frames := 0
	for b.Loop() {
		frames = 0
		if err := Default().Generate(c, DefaultSegmenter(), Params{}, func([]int) bool { frames++; return true }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(frames), "frames/op")
}
