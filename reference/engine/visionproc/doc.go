// Package visionproc owns the vision side of multimodal input for the
// reference engine: it turns image bytes and cgo-free video containers into
// the flattened patches and (t, h, w) grid that Qwen3-Omni's vision encoder
// consumes, following the Qwen2-VL image and video processors that
// Qwen3-Omni's Hugging Face processor uses.
//
// The pipeline is
//
//	bytes → DecodeImage / ParseAVI → ToRGB (planar 8-bit RGB, PIL convert("RGB"))
//	      → SmartResize + ResizeBicubic → Patchify (rescale 1/255, normalize,
//	        flatten in the processor's merge-grouped order)
//
// Everything here is a pure function of its inputs: no IO, no goroutines, no
// clocks, no global state. Arithmetic whose result feeds the model rounds
// every product explicitly so compilers cannot fuse multiply-adds and output
// is bit-identical across runs and architectures. Resampling is fixed-point
// integer arithmetic for the same reason.
//
// The formulas, constants and their upstream sources are documented in
// docs/multimodal/vision.md.
package visionproc
