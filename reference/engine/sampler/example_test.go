package sampler_test

import (
	"fmt"

	"github.com/omnipd/omnipd/reference/engine/sampler"
)

// A decode loop. The printed tokens are pinned on purpose: a seeded
// request must yield the same tokens across omnipd versions, so any change
// to the random stream or the order of operations shows up here.
func Example() {
	const eos = 7
	// A stand-in for the model: tokens near (last+3) mod 8 are likely.
	model := func(prompt, output []int) []float32 {
		last := prompt[len(prompt)-1]
		if len(output) > 0 {
			last = output[len(output)-1]
		}
		logits := make([]float32, 8)
		for j := range logits {
			d := j - (last+3)%8
			logits[j] = -float32(d * d)
		}
		return logits
	}

	p := sampler.Defaults()
	p.Temperature = 0.8
	p.TopP = 0.95
	p.MaxTokens = 12
	p.MinTokens = 4
	seed := int64(42)
	p.Seed = &seed
	if err := p.Validate(); err != nil {
		fmt.Println(err)
		return
	}

	prompt := []int{1, 2}
	s := sampler.New(p, []int{eos})
	var output []int
	for len(output) < p.MaxTokens {
		tok := s.Sample(model(prompt, output), prompt, output)
		output = append(output, tok)
		if s.IsStop(tok, len(output)) {
			break
		}
	}
	fmt.Println(output)
	// Output: [4 6 1 5 0 3 6 1 3 7]
}
