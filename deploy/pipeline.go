package deploy

import (
	"slices"
	"sort"
	"strings"
)

// PipelineStage is the frozen contract of one stage of a model's pipeline:
// what it is and how it connects. Deploy configs only add deployment options.
type PipelineStage struct {
	ID               int
	ModelStage       string
	ExecutionType    string // llm_ar or llm_generation
	InputSources     []int
	FinalOutput      bool
	FinalOutputType  string
	OwnsTokenizer    bool
	EngineOutputType string
	// SamplingConstraints are sampling parameters the model needs whatever
	// the deploy config says; they override its default_sampling_params.
	SamplingConstraints []param
}

// Disaggregatable reports whether the stage can be split into prefill and
// decode: an autoregressive LLM that owns the tokenizer (the Thinker).
func (s PipelineStage) Disaggregatable() bool {
	return s.ExecutionType == "llm_ar" && s.OwnsTokenizer
}

type param struct {
	key   string
	value func() *Node
}

// Pipeline is a frozen, named model pipeline.
type Pipeline struct {
	Name string
	// Family groups a full pipeline with its variants (subsets of its stages).
	Family string
	Stages []PipelineStage
}

func (p *Pipeline) stage(modelStage string) (PipelineStage, bool) {
	for _, s := range p.Stages {
		if s.ModelStage == modelStage {
			return s, true
		}
	}
	return PipelineStage{}, false
}

func (p *Pipeline) stageByID(id int) (PipelineStage, bool) {
	for _, s := range p.Stages {
		if s.ID == id {
			return s, true
		}
	}
	return PipelineStage{}, false
}

// DefaultPipeline is used when a deploy config names none.
const DefaultPipeline = "qwen3_omni_moe"

var qwen3OmniThinker = PipelineStage{
	ID: 0, ModelStage: "thinker", ExecutionType: "llm_ar",
	FinalOutput: true, FinalOutputType: "text", OwnsTokenizer: true, EngineOutputType: "latent",
}

// Qwen3-Omni facts: the Talker emits codec frames until code 2150 and its
// output is never detokenized.
const talkerStopToken = 2150

var pipelines = []*Pipeline{
	{
		Name: "qwen3_omni_moe", Family: "qwen3_omni_moe",
		Stages: []PipelineStage{
			qwen3OmniThinker,
			{
				ID: 1, ModelStage: "talker", ExecutionType: "llm_ar", InputSources: []int{0},
				EngineOutputType: "latent",
				SamplingConstraints: []param{
					{"detokenize", func() *Node { return newBool(false, Pos{}) }},
					{"stop_token_ids", func() *Node {
						s := newSeq(Pos{})
						s.Items = append(s.Items, newInt(talkerStopToken, Pos{}))
						return s
					}},
				},
			},
			{
				ID: 2, ModelStage: "code2wav", ExecutionType: "llm_generation", InputSources: []int{1},
				FinalOutput: true, FinalOutputType: "audio", EngineOutputType: "audio",
			},
		},
	},
	{
		Name: "qwen3_omni_moe_thinker", Family: "qwen3_omni_moe",
		Stages: []PipelineStage{qwen3OmniThinker},
	},
}

// Pipelines returns the names of the embedded pipelines.
func Pipelines() []string {
	var names []string
	for _, p := range pipelines {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return names
}

// LookupPipeline returns the embedded pipeline with the given name.
func LookupPipeline(name string) (*Pipeline, bool) {
	for _, p := range pipelines {
		if p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// variantFor returns the pipeline of p's family whose model stages are exactly
// the given set, preferring p itself; nil when none is.
func variantFor(p *Pipeline, modelStages []string) *Pipeline {
	want := slices.Clone(modelStages)
	slices.Sort(want)
	want = slices.Compact(want)
	match := func(q *Pipeline) bool {
		var have []string
		for _, s := range q.Stages {
			have = append(have, s.ModelStage)
		}
		slices.Sort(have)
		return slices.Equal(have, want)
	}
	if match(p) {
		return p
	}
	for _, q := range pipelines {
		if q.Family == p.Family && match(q) {
			return q
		}
	}
	return nil
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = `"` + n + `"`
	}
	return strings.Join(q, ", ")
}
