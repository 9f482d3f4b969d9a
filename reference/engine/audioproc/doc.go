// Package audioproc owns the audio input path of the reference engine: it
// turns the bytes of a WAV or MP3 file (or raw s16le PCM from a container's
// audio track) into 16 kHz mono float32 samples, and those samples into the
// 128-bin log-mel features Qwen3-Omni's audio encoder reads, computed the
// way transformers' WhisperFeatureExtractor computes them with the values
// in Qwen3-Omni's preprocessor_config.json.
//
// The pipeline is
//
//	Decode / DecodePCM16LE  bytes → Audio (native rate, interleaved channels)
//	Mono16k                 Audio → mono samples at SampleRate (16 kHz)
//	LogMel                  samples → Features [NumMelBins][Frames]
//
// Every function is pure: no IO, no goroutines, no clocks, no package
// state. Every arithmetic result that reaches the model is rounded
// explicitly (float32(a*b), float64(a*b)) so the compiler cannot fuse a
// multiply-add, and the transcendental functions the pipeline needs (sine,
// cosine, exp, log) are computed here with basic IEEE operations only,
// because the standard library's versions use assembly or FMA on some
// machines. The same bytes in therefore give the same floats out on every
// run and every architecture.
//
// docs/multimodal/audio.md lists every formula and constant with the
// upstream file it comes from.
package audioproc
