package wiring

import (
	"github.com/omnipd/omnipd/deploy"
	"github.com/omnipd/omnipd/orchestrator"
)

// referenceConditioningLayer is the hidden layer the reference Talker reads
// when the config names none: the middle of the reference Thinker's four.
const referenceConditioningLayer = 2

// omniConfig reads the audio stages' settings from the deploy config: the
// Thinker layer the Talker reads, the Talker's sampling defaults, and the
// codec chunking from the stage connector that feeds Code2Wav, as vllm-omni
// reads them.
func omniConfig(doc *deploy.Document, talkerPool, c2wPool *orchestrator.Pool) *orchestrator.Omni {
	om := &orchestrator.Omni{Talker: talkerPool, Code2Wav: c2wPool, ConditioningLayer: referenceConditioningLayer, AsyncChunk: doc.StreamsConditioning()}
	for _, s := range doc.Stages {
		switch s.ModelStage {
		case "thinker":
			if l, ok := s.EngineArgs.Number("accept_hidden_layer"); ok {
				om.ConditioningLayer = int(l)
			}
		case "talker":
			if t, ok := s.DefaultSamplingParams.Number("temperature"); ok {
				om.Temperature = t
			}
			if k, ok := s.DefaultSamplingParams.Number("top_k"); ok {
				om.TopK = int(k)
			}
			if m, ok := s.DefaultSamplingParams.Number("max_tokens"); ok {
				om.MaxFrames = int(m)
			}
		case "code2wav":
			for _, in := range s.InputConnectors {
				for _, c := range doc.Connectors {
					if c.Name != in.Name || c.Extra == nil {
						continue
					}
					if v, ok := c.Extra.Number("initial_codec_chunk_frames"); ok {
						om.Chunking.Initial = int(v)
					}
					if v, ok := c.Extra.Number("codec_chunk_frames"); ok {
						om.Chunking.Size = int(v)
					}
					if v, ok := c.Extra.Number("codec_left_context_frames"); ok {
						om.Chunking.LeftContext = int(v)
					}
				}
			}
		}
	}
	return om
}
