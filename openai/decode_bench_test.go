package openai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The benchmarks below are the request path every omnipd process runs: the
// orchestrator, the prefill worker and the decode worker each decode the
// client's body, and the orchestrator encodes one body per leg.

// benchText is about 170 tokens of ordinary prose, the size of a short chat turn.
const benchText = "I am planning a week-long trip through the north of Portugal in late September " +
	"and would like some help putting together a realistic itinerary. I will be arriving in Porto by " +
	"train from Lisbon on a Sunday afternoon, and I would prefer not to rent a car, so everything should " +
	"be reachable by train or bus. I enjoy walking, old churches, small wine producers and quiet places " +
	"to read in the evening, but I am not very interested in nightlife or large museums. Could you suggest " +
	"how many nights to spend in each town, which day trips are worth the effort, and roughly what the " +
	"transport between them will cost? Please also mention anything that is usually closed on Mondays."

var (
	benchChatBody = []byte(`{"model":"qwen3-omni","messages":[` +
		`{"role":"system","content":"You are a helpful travel assistant.\nAnswer in short paragraphs and keep lists brief."},` +
		`{"role":"user","content":"` + benchText + `"}],` +
		`"max_tokens":512,"stream":true,"stream_options":{"include_usage":true},"temperature":0.7,"seed":1234}`)
	benchCompletionBody = []byte(`{"model":"qwen3","prompt":"` + benchText + `",` +
		`"max_tokens":512,"stream":true,"stream_options":{"include_usage":true},"temperature":0.7,"seed":1234}`)
)

func BenchmarkDecodeChat(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchChatBody)))
	for b.Loop() {
		if _, err := DecodeChatRequest(bytes.NewReader(benchChatBody), 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

// benchDecodeLegBody is the chat request as a decode worker receives it
// under PD: the client's body plus the reference connector's
// kv_transfer_params.
var benchDecodeLegBody = append(benchChatBody[:len(benchChatBody)-1:len(benchChatBody)-1],
	`,"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"thinker-prefill","remote_host":"127.0.0.1",`+
		`"remote_port":17100,"transfer_id":"xfer-chatcmpl-0123456789abcdef","remote_block_ids":[0,1,2,3,4,5,6,7,8,9,10,11]}}`...)

func BenchmarkDecodeChatDecodeLeg(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchDecodeLegBody)))
	for b.Loop() {
		if _, err := DecodeChatRequest(bytes.NewReader(benchDecodeLegBody), 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeCompletion(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchCompletionBody)))
	for b.Loop() {
		if _, err := DecodeCompletionRequest(bytes.NewReader(benchCompletionBody), 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPrefillParams is what a NIXL-shaped connector puts on the prefill leg.
func benchPrefillParams() map[string]any {
	return map[string]any{"do_remote_decode": true, "do_remote_prefill": false}
}

// benchDecodeParams is what the prefill answered, decoded as the orchestrator
// decodes it (numbers as float64).
func benchDecodeParams() map[string]any {
	return map[string]any{
		"do_remote_decode": false, "do_remote_prefill": true,
		"remote_block_ids": []any{1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0},
		"remote_engine_id": "0f0e8d1c-6a3b-4d52-9a57-2b8f5c7d9e10", "remote_host": "10.0.0.2", "remote_port": 5600.0,
	}
}

// BenchmarkMarshalChat builds the two leg bodies the way orchestrator/legs.go
// edits them (clone, edit), encoded with json.Marshal.
func BenchmarkMarshalChat(b *testing.B) { benchChatLegs(b, json.Marshal) }

// BenchmarkMarshalChatMethod calls MarshalJSON itself, as legs.go does, which
// spares encoding/json's validation and compaction of what MarshalJSON
// returns.
func BenchmarkMarshalChatMethod(b *testing.B) {
	benchChatLegs(b, func(v any) ([]byte, error) { return v.(json.Marshaler).MarshalJSON() })
}

func BenchmarkMarshalCompletion(b *testing.B) { benchCompletionLegs(b, json.Marshal) }

func BenchmarkMarshalCompletionMethod(b *testing.B) {
	benchCompletionLegs(b, func(v any) ([]byte, error) { return v.(json.Marshaler).MarshalJSON() })
}

func benchChatLegs(b *testing.B, marshal func(any) ([]byte, error)) {
	req, err := DecodeChatRequest(bytes.NewReader(benchChatBody), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		one, yes, no := 1, true, false
		p := req.Clone()
		p.MaxTokens, p.N, p.IgnoreEOS, p.IncludeStopStrInOutput = &one, &one, &yes, &no
		p.Stream, p.StreamOptions = &no, nil
		p.KVTransferParams = benchPrefillParams()
		p.Modalities, p.Audio, p.Speaker = nil, nil, nil
		if _, err := marshal(p); err != nil {
			b.Fatal(err)
		}
		d := req.Clone()
		d.KVTransferParams = benchDecodeParams()
		d.Modalities, d.Audio, d.Speaker = nil, nil, nil
		if _, err := marshal(d); err != nil {
			b.Fatal(err)
		}
	}
}

func benchCompletionLegs(b *testing.B, marshal func(any) ([]byte, error)) {
	req, err := DecodeCompletionRequest(bytes.NewReader(benchCompletionBody), 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		one, yes, no := 1, true, false
		p := req.Clone()
		p.MaxTokens, p.N, p.IgnoreEOS, p.IncludeStopStrInOutput = &one, &one, &yes, &no
		p.Stream, p.StreamOptions = &no, nil
		p.KVTransferParams = benchPrefillParams()
		if _, err := marshal(p); err != nil {
			b.Fatal(err)
		}
		d := req.Clone()
		d.KVTransferParams = benchDecodeParams()
		if _, err := marshal(d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidLongPrompt is the validation every process runs over a
// long prompt's body (about 2,000 tokens of prose): mostly plain string
// bytes, which the validator skips eight at a time.
func BenchmarkValidLongPrompt(b *testing.B) {
	doc := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat(benchText+" ", 12) + `"}]}`)
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		if !valid(doc) {
			b.Fatal("the body is valid JSON")
		}
	}
}
