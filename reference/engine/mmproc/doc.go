// Package mmproc owns the Qwen3-Omni multimodal processor arithmetic of the
// reference engine: how many placeholder tokens an audio clip, an image or a
// video occupies, how a prompt's single placeholders are expanded to those
// counts (including a video's own soundtrack interleaved with its frames), and
// the TM-RoPE position ids — three rows (temporal, height, width) for every
// prompt token plus the delta that places generated tokens.
//
// Everything here is a pure function of the prompt's token ids, the media
// items' sizes and timing, and Options: no pixels, samples, weights, IO or
// clocks. That is what lets a decode worker rebuild the exact tokens and
// positions a prefill worker computed without running any encoder; note in
// particular that a generated token at sequence index i sits at position
// i+Delta, not at i.
//
// The formulas follow vLLM's Qwen3-Omni thinker (it is what serves); where
// Hugging Face transformers differs, docs/multimodal/processor.md says how.
// Special token ids are always passed in (see Tokens): the package assumes
// nothing about the vocabulary, so the tiny reference model can use its own.
package mmproc
