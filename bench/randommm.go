package bench

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
)

// RandomMM is the random-mm dataset, vLLM's RandomMultiModalDataset with
// vllm-omni's audio: the random dataset's text, and after it in the same
// user message a number of synthetic media items drawn per request. The
// count is uniform in the configured range; each item's bucket is drawn by
// weight, and a modality at its per-prompt limit drops out of the draw for
// the rest of that request (its weights renormalized), as vLLM does.
//
// Every bucket's media is synthesized once, when the dataset is made, and
// each request redraws only the first bytes of each item (see
// mediaTemplate), so a request costs a few hundred bytes of generation and
// memory stays one file per bucket whatever the number of requests.
type RandomMM struct {
	text      Random
	cfg       MMConfig
	plan      *mmPlan
	templates []mediaTemplate // one per plan bucket
}

var _ Dataset = (*RandomMM)(nil)

// Salts separating the random streams of one seed: the prompt's words
// (Random's, unsalted), the item draws, the items' per-request bytes and
// the bucket templates.
const (
	saltItems    = 0x6d6d2d6974656d73
	saltVariants = 0x6d6d2d7661726e74
	saltBuckets  = 0x6d6d2d62756b7473
)

// NewRandomMM validates cfg and synthesizes every bucket's media.
func NewRandomMM(text Random, cfg MMConfig) (*RandomMM, error) {
	plan, err := cfg.plan()
	if err != nil {
		return nil, err
	}
	d := &RandomMM{text: text, cfg: cfg, plan: plan}
	total := 0
	for i, bw := range plan.buckets {
		b := bw.Bucket
		size := 0
		switch b.Modality() {
		case ModalityAudio:
			size = 2 * b.Seconds() * b.Channels() * cfg.AudioSampleRate
		case ModalityImage:
			size = 3 * b.Width() * b.Height()
		}
		if total += size; total > maxItemBytes {
			return nil, fmt.Errorf("--random-mm-bucket-config: the buckets' media add up to more than %d MiB; use smaller items", maxItemBytes>>20)
		}
		rng := rand.New(rand.NewPCG(text.Seed^saltBuckets, uint64(i)))
		switch b.Modality() {
		case ModalityAudio:
			d.templates = append(d.templates, newWAVTemplate(b.Seconds(), b.Channels(), cfg.AudioSampleRate, cfg.AudioPart, rng))
		case ModalityImage:
			d.templates = append(d.templates, newPNGTemplate(b.Width(), b.Height(), rng))
		}
	}
	return d, nil
}

// MMSettings records a random-mm dataset's media for the report.
type MMSettings struct {
	BaseItemsPerRequest int            `json:"base_items_per_request"`
	NumItemsRangeRatio  float64        `json:"num_mm_items_range_ratio"`
	LimitPerPrompt      map[string]int `json:"limit_mm_per_prompt"`
	// BucketConfig is the buckets drawn from, with their weights as given,
	// written as the flag takes it.
	BucketConfig string `json:"bucket_config"`
	// ItemsPerRequest is the range a request's item count is drawn from.
	ItemsPerRequest [2]int `json:"items_per_request"`
	AudioSampleRate int    `json:"audio_sample_rate"`
	AudioPart       string `json:"audio_part"`
}

// Settings describes the dataset's media for the report.
func (d *RandomMM) Settings() *MMSettings {
	var b strings.Builder
	b.WriteByte('{')
	for i, bw := range d.cfg.Buckets {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %s", bw.Bucket, strconv.FormatFloat(bw.Weight, 'g', -1, 64))
	}
	b.WriteByte('}')
	return &MMSettings{
		BaseItemsPerRequest: d.cfg.BaseItemsPerRequest, NumItemsRangeRatio: d.cfg.NumItemsRangeRatio,
		LimitPerPrompt: maps.Clone(d.cfg.LimitPerPrompt), BucketConfig: b.String(),
		ItemsPerRequest: [2]int{d.plan.minItems, d.plan.maxItems},
		AudioSampleRate: d.cfg.AudioSampleRate, AudioPart: d.cfg.AudioPart,
	}
}

// Items reports the range of media items a request carries.
func (d *RandomMM) Items() (lo, hi int) { return d.plan.minItems, d.plan.maxItems }

// Buckets are the buckets drawn from, with their normalized probabilities.
func (d *RandomMM) Buckets() []BucketWeight { return append([]BucketWeight(nil), d.plan.buckets...) }

// Fit is the dataset with its text fitted to f, as Random.Fit fits it; the
// media's tokens come on top.
func (d *RandomMM) Fit(f *PromptFit) (Dataset, error) {
	text, err := d.text.fit(f)
	if err != nil {
		return nil, err
	}
	fitted := *d
	fitted.text = text
	return &fitted, nil
}

// Limits are the per-prompt limits of the modalities drawn.
func (d *RandomMM) Limits() map[string]int { return maps.Clone(d.plan.limits) }

// Prompt is the random dataset's prompt i with its media drawn from a
// generator seeded by (Seed, i): the same seed gives the same requests in
// any order.
func (d *RandomMM) Prompt(i int) Prompt {
	p := d.text.Prompt(i)
	rng := rand.New(rand.NewPCG(d.text.Seed^saltItems, uint64(i)))
	for j, b := range d.drawBuckets(rng) {
		v := rand.New(rand.NewPCG(d.text.Seed^saltVariants+uint64(j), uint64(i)))
		p.Media = append(p.Media, d.templates[b].part(v))
	}
	return p
}

// drawBuckets draws one request's items as vLLM's get_mm_item_iterator
// does: a count, then buckets by weight, a modality at its limit leaving the
// draw. It returns bucket indexes in draw order.
func (d *RandomMM) drawBuckets(rng *rand.Rand) []int {
	p := d.plan
	n := p.minItems + rng.IntN(p.maxItems-p.minItems+1)
	weights := make([]float64, len(p.buckets))
	for i, bw := range p.buckets {
		weights[i] = bw.Weight
	}
	count := map[string]int{}
	var out []int
	for len(out) < n {
		total := 0.0
		for _, w := range weights {
			total += w
		}
		if total == 0 {
			break // every modality at its limit
		}
		u, pick := rng.Float64()*total, -1
		for i, w := range weights {
			if w == 0 {
				continue
			}
			pick = i // the last live bucket, should rounding run past the end
			if u < w {
				break
			}
			u -= w
		}
		m := p.buckets[pick].Bucket.Modality()
		if count[m] < p.limits[m] {
			count[m]++
			out = append(out, pick)
			continue
		}
		for i, bw := range p.buckets {
			if bw.Bucket.Modality() == m {
				weights[i] = 0
			}
		}
	}
	return out
}
