package openai

import (
	"encoding/json"
	"io"
	"testing"
)

// The responses as the reference worker writes them: a streamed chunk with a
// one-token delta, the last chunk of a stream with its finish reason and
// usage, and a prefill's whole answer with kv_transfer_params.

func benchChunkDelta() ChatCompletionChunk {
	return ChatCompletionChunk{ID: "chatcmpl-0123456789abcdef0123456789abcdef", Object: ObjectChatCompletionChunk, Created: 1700000000, Model: "Qwen/Qwen2.5-Omni-7B",
		Choices: []ChatChunkChoice{{Delta: ChatDelta{Content: new(" token")}}}}
}

func benchChunkFinal() ChatCompletionChunk {
	return ChatCompletionChunk{ID: "chatcmpl-0123456789abcdef0123456789abcdef", Object: ObjectChatCompletionChunk, Created: 1700000000, Model: "Qwen/Qwen2.5-Omni-7B",
		Choices: []ChatChunkChoice{{Delta: ChatDelta{Content: new(".")}, FinishReason: new(FinishLength)}},
		Usage:   &Usage{PromptTokens: 512, CompletionTokens: 128, TotalTokens: 640, PromptTokensDetails: &PromptTokensDetails{CachedTokens: 0}}}
}

func benchChatCompletion() ChatCompletion {
	return ChatCompletion{ID: "chatcmpl-0123456789abcdef0123456789abcdef", Object: ObjectChatCompletion, Created: 1700000000, Model: "Qwen/Qwen2.5-Omni-7B",
		Choices: []ChatChoice{{Message: ResponseMessage{Role: "assistant", Content: new(" token")}, FinishReason: FinishLength}},
		Usage:   Usage{PromptTokens: 512, CompletionTokens: 1, TotalTokens: 513, PromptTokensDetails: &PromptTokensDetails{CachedTokens: 0}},
		KVTransferParams: map[string]any{
			"do_remote_prefill": true,
			"do_remote_decode":  false,
			"remote_engine_id":  "prefill-0",
			"remote_block_ids":  []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31},
			"remote_host":       "10.0.0.7",
			"remote_port":       5600,
			"remote_request_id": "0123456789abcdef0123456789abcdef",
			"tp_size":           1,
		}}
}

func BenchmarkResponseMarshal(b *testing.B) {
	for _, bm := range []struct {
		name string
		v    json.Marshaler
	}{
		{"chunk-delta", benchChunkDelta()},
		{"chunk-final", benchChunkFinal()},
		{"chat-completion-kv", benchChatCompletion()},
	} {
		// MarshalJSON is what the SSE writer calls for each chunk.
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bm.v.MarshalJSON(); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Through json.Encoder, as the worker used to write whole answers:
		// MarshalJSON, then encoding/json's pass over its output.
		b.Run(bm.name+"/encoder", func(b *testing.B) {
			b.ReportAllocs()
			enc := json.NewEncoder(io.Discard)
			for b.Loop() {
				if err := enc.Encode(bm.v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRelay is what the orchestrator does to every streamed chunk and
// every whole answer on its way to the client (Relay): a chunk already under
// the client's id, the common case; a chunk under a connector's encoded id;
// and a prefill-shaped whole answer carrying kv_transfer_params.
func BenchmarkRelay(b *testing.B) {
	const id = "chatcmpl-0123456789abcdef0123456789abcdef"
	delta, _ := benchChunkDelta().MarshalJSON()
	other := benchChunkDelta()
	other.ID = "chatcmpl-___prefill_addr_10.0.0.7:21001___decode_addr_10.0.0.8:22001_0123456789abcdef"
	encoded, _ := other.MarshalJSON()
	answer, _ := benchChatCompletion().MarshalJSON()
	for _, bm := range []struct {
		name string
		doc  []byte
	}{
		{"chunk-same-id", delta},
		{"chunk-other-id", encoded},
		{"chat-completion-kv", answer},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.SetBytes(int64(len(bm.doc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Relay(bm.doc, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
