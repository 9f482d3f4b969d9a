// Package openai owns the wire format of the OpenAI-compatible HTTP API as vLLM
// serves it: chat and completions requests, their responses and stream chunks,
// OpenAI's error body, and Server-Sent Events framing in both directions.
//
// Both sides of omnipd use it. The public server and the reference worker
// decode requests and write responses; the orchestrator decodes client
// requests, edits them a little, and forwards them to vLLM or a reference
// worker, then reads the responses back. Because of that forwarding, request
// types are lossless: keys this package does not model are kept verbatim in
// Extra and written back out, optional scalars are pointers so that "absent"
// is not confused with zero, and keys are matched exactly (vLLM's pydantic
// models are case-sensitive; encoding/json is not).
//
// Everything here is a function of values except the SSE writer and reader,
// which wrap an http.ResponseWriter and an io.Reader. Nothing starts
// goroutines or reads the clock.
package openai
